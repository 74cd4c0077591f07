//! The socket work both sides of HTTP/1.1 share, the server and the
//! upstream client: reads through the stack, writes in
//! one piece where they can, chunk-size lines built on the stack, and the
//! wait that lets a round of ready responses go out together.
use bytes::{Buf, BytesMut};
use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::Poll;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One read from the socket, on the stack.
const READ_CHUNK: usize = 8192;

/// Reads what the socket has into `buf` (0 at end of stream). Through the
/// stack, so a connection waiting for bytes holds no buffer.
pub(crate) async fn read_more<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    poll_fn(|cx| poll_read_more(io, cx, buf)).await
}

/// [`read_more`] as a poll function (the upstream client reads with it too).
pub(crate) fn poll_read_more<S: AsyncRead + Unpin>(
    io: &mut S,
    cx: &mut std::task::Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    let mut stack = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
    let mut rb = ReadBuf::uninit(&mut stack);
    match Pin::new(&mut *io).poll_read(cx, &mut rb) {
        Poll::Ready(Ok(())) => {
            buf.extend_from_slice(rb.filled());
            Poll::Ready(Ok(rb.filled().len()))
        }
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Pending,
    }
}

/// Writes what it can of `buf` and returns how many bytes went: a `buf` in
/// one piece with one plain write (`send` on a TCP socket), one in several
/// with a `writev` of them. A one-buffer `send` skips what `writev` costs
/// the kernel beside it (the I/O-vector copy and the VFS write path), on
/// every request. The server's responses and
/// the upstream client's requests both write through this.
pub(crate) fn poll_write_buf<S: AsyncWrite + Unpin, B: Buf>(
    io: &mut S,
    cx: &mut std::task::Context<'_>,
    buf: &B,
) -> Poll<io::Result<usize>> {
    let chunk = buf.chunk();
    if chunk.len() == buf.remaining() {
        return Pin::new(io).poll_write(cx, chunk);
    }
    let mut slices = [io::IoSlice::new(&[]); 8];
    let n = buf.chunks_vectored(&mut slices);
    Pin::new(io).poll_write_vectored(cx, &slices[..n])
}

/// The size line of a chunk of `n` bytes (`1a2b\r\n`), written on the
/// stack: the server's chunked responses and the upstream client's chunked
/// requests both frame with it.
///
/// By hand, not with the `hex` crate: this writes a number's significant
/// digits, the crate two for every byte, so going through it would about
/// double the work of every chunk's size line.
pub(crate) struct ChunkSize {
    buf: [u8; 18],
    start: usize,
}

impl ChunkSize {
    pub(crate) fn new(n: usize) -> Self {
        let mut buf = [0u8; 18];
        buf[16..].copy_from_slice(b"\r\n");
        let mut start = 16;
        let mut v = n;
        loop {
            start -= 1;
            buf[start] = b"0123456789abcdef"[v & 15];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        ChunkSize { buf, start }
    }
}

impl std::ops::Deref for ChunkSize {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// What follows a piece of chunked data (`empty`: none) on the wire: the
/// end of its chunk, and the last chunk when the body ends with it.
pub(crate) fn chunk_tail(empty: bool, end: bool) -> &'static [u8] {
    match (empty, end) {
        (true, true) => b"0\r\n\r\n",
        (true, false) => b"",
        (false, true) => b"\r\n0\r\n\r\n",
        (false, false) => b"\r\n",
    }
}

/// Returns once the tasks already queued to run have run: the caller goes
/// to the back of the scheduler's queue (no system call, unlike
/// `tokio::task::yield_now`, which waits for the I/O driver to be polled).
/// Socket writes wait on this, so that one round of ready requests reaches
/// the process on the other end (and the core it sleeps on) in a burst that
/// wakes it once, not once per request.
pub(crate) async fn after_queued_tasks() {
    let mut queued = false;
    poll_fn(|cx| {
        if queued {
            return Poll::Ready(());
        }
        queued = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    #[test]
    fn chunk_size_lines_are_lowercase_hex_from_zero_to_the_widest() {
        for (n, want) in [
            (0, &b"0\r\n"[..]),
            (1, b"1\r\n"),
            (0x1a2b, b"1a2b\r\n"),
            (usize::MAX, b"ffffffffffffffff\r\n"),
        ] {
            assert_eq!(&*super::ChunkSize::new(n), want, "{n}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn after_queued_tasks_lets_the_tasks_already_queued_run_first() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (a, b) = (order.clone(), order.clone());
        let first = tokio::spawn(async move {
            a.lock().unwrap().push("a: before");
            super::after_queued_tasks().await;
            a.lock().unwrap().push("a: after");
        });
        let second = tokio::spawn(async move { b.lock().unwrap().push("b") });
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["a: before", "b", "a: after"]);
    }
}
