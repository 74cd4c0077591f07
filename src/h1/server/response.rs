//! Responses: the head written by hand, the body framed by length or
//! chunked (close-delimited for HTTP/1.0), head and body in one write when
//! the body is ready (a small body copied behind the head, a larger one
//! beside it in a `writev`), every write under the send timeout.
use bytes::Buf;
use futures_util::FutureExt;
use http::header;
use http::StatusCode;
use http_body::Body as _;
use http_body_util::BodyExt;
use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::h1::codec::{chunk_tail, poll_write_buf, ChunkSize};
use crate::h1::codec::{has_token, parse_length};
use crate::http_core::body::Body;
use crate::http_core::relayed::RelayedFields;
use crate::http_core::service::{stamped_by, Reply, Stamp};

/// A first body piece up to this size, ready when the head is, is copied
/// behind the head so that both go out in one plain write (see
/// [`poll_write_buf`]); the copy costs less than a second I/O vector does
/// the kernel. Head and piece stay within what the spare buffer keeps.
const COALESCE: usize = 8 * 1024;

thread_local! {
    /// A spare buffer for response heads, so that writing one allocates
    /// nothing. Taken while a head is written (a connection whose write
    /// waits keeps it; another then makes its own) and given back after.
    static SPARE_HEAD: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// This thread's spare head buffer while it is in use; given back (empty)
/// when dropped, however the write ends.
struct SpareHead(Vec<u8>);

impl SpareHead {
    /// A spare head buffer bigger than this is not kept.
    const MAX: usize = 16 * 1024;

    fn take() -> Self {
        SpareHead(SPARE_HEAD.take())
    }
}

impl Drop for SpareHead {
    fn drop(&mut self) {
        if self.0.capacity() <= Self::MAX {
            let mut head = std::mem::take(&mut self.0);
            head.clear();
            SPARE_HEAD.set(head);
        }
    }
}

/// Writes `reply` (its head and body in one write when the body is ready);
/// returns whether the connection can carry another request.
///
/// The head is made before the returned future starts, so that the future
/// holds only the head's bytes and the body, not the response and its
/// stamp: it is part of every connection's task, idle or not.
pub(super) fn write_response<'a, S: AsyncWrite + Unpin, T: Stamp>(
    io: &'a mut S,
    reply: Reply<T>,
    head_request: bool,
    http10: bool,
    keep_alive: bool,
    send_timeout: Duration,
) -> impl Future<Output = io::Result<bool>> + 'a {
    let mut spare = SpareHead::take();
    let framed = frame(reply, head_request, http10, keep_alive, &mut spare.0);
    send_framed(io, spare, framed, send_timeout)
}

/// A response whose head is written: what sending it needs.
struct Framed {
    /// `None`: no body is sent (HEAD, 204, 304, 1xx).
    body: Option<Body>,
    declared: Option<u64>,
    chunked: bool,
    keep_alive: bool,
}

/// Writes the head of `reply` into `head`; the rest for [`send_framed`].
fn frame<T: Stamp>(
    reply: Reply<T>,
    head_request: bool,
    http10: bool,
    mut keep_alive: bool,
    head: &mut Vec<u8>,
) -> Framed {
    let Reply { res, stamp } = reply;
    let (parts, mut body) = res.into_parts();
    let status = parts.status;
    let no_length = status.is_informational() || status == StatusCode::NO_CONTENT;
    let bodyless = head_request || no_length || status == StatusCode::NOT_MODIFIED;
    let relayed = body.take_relayed();
    let relayed = relayed.as_ref();
    // The status line, framing fields and `Date` (about 120 bytes), the
    // stamped fields (about 150), then about 40 bytes a field.
    let fields = parts.headers.len() + relayed.map_or(0, RelayedFields::len);
    head.reserve(280 + fields * 40);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    let seen = write_fields(head, &parts.headers, relayed, &stamp);
    let (has_date, close, length_field) = (seen.date, seen.close, seen.length);
    if close {
        keep_alive = false;
    }
    let declared = match length_field {
        Some(parsed) => parsed,
        None => body.size_hint().exact(),
    };
    let chunked = !bodyless && declared.is_none() && !http10;
    if !bodyless && declared.is_none() && http10 {
        // HTTP/1.0 has no chunked coding: the body ends with the connection.
        keep_alive = false;
    }
    if let Some(n) = declared.filter(|_| !no_length) {
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if chunked {
        head.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !keep_alive {
        head.extend_from_slice(b"connection: close\r\n");
    } else if http10 {
        head.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !has_date {
        write_date(head);
    }
    head.extend_from_slice(b"\r\n");
    Framed {
        body: (!bodyless).then_some(body),
        declared,
        chunked,
        keep_alive,
    }
}

/// What [`write_fields`] read in the fields it walked.
struct FieldsSeen {
    /// A `Date` field was written.
    date: bool,
    /// `Connection: close`.
    close: bool,
    /// The first `Content-Length` (`Some(None)`: not a valid length).
    length: Option<Option<u64>>,
}

/// Writes a response's fields into `head`: a target's as they came (the
/// client left out its hop-by-hop and framing ones), then the map's, then
/// the stamped ones; a stamped name is written only from the stamp. The
/// framing fields are read in the same walk, and left for the writer to
/// write.
fn write_fields<T: Stamp>(
    head: &mut Vec<u8>,
    headers: &http::HeaderMap,
    relayed: Option<&RelayedFields>,
    stamp: &T,
) -> FieldsSeen {
    let stamped = stamped_by(stamp);
    let mut seen = FieldsSeen {
        date: relayed.is_some_and(|r| r.write_to(headers, &stamped, head)),
        close: false,
        length: None,
    };
    for (name, value) in headers {
        if name == header::CONNECTION {
            seen.close |= has_token(value.as_bytes(), "close");
            continue;
        }
        if name == header::CONTENT_LENGTH {
            seen.length
                .get_or_insert_with(|| parse_length(value.as_bytes()));
            continue;
        }
        if name == header::TRANSFER_ENCODING || name.as_str() == "keep-alive" {
            continue;
        }
        if stamped(name.as_str().as_bytes()) {
            continue;
        }
        seen.date |= name == header::DATE;
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    stamp.write_lines(head);
    seen
}

/// Sends the head in `spare` and the body of `framed`.
async fn send_framed<S: AsyncWrite + Unpin>(
    io: &mut S,
    mut spare: SpareHead,
    framed: Framed,
    send_timeout: Duration,
) -> io::Result<bool> {
    let Framed {
        body,
        declared,
        chunked,
        keep_alive,
    } = framed;
    let Some(mut body) = body else {
        send(io, &mut &spare.0[..], send_timeout).await?;
        return Ok(keep_alive);
    };
    // Whether the head is still to be written (with the first piece of the
    // body when that is ready now).
    let mut pending = true;
    let mut written = 0u64;
    loop {
        let next = if pending {
            // Head and body go out together when the body is ready now.
            match body.frame().now_or_never() {
                Some(next) => next,
                None => {
                    pending = false;
                    send(io, &mut &spare.0[..], send_timeout).await?;
                    continue;
                }
            }
        } else {
            body.frame().await
        };
        let data = match next {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => Some(data),
                _ => continue, // trailers are not sent over HTTP/1.1
            },
            Some(Err(e)) => return Err(io::Error::other(e)),
            None => None,
        };
        let end = data.is_none() || body.is_end_stream();
        let data = data.unwrap_or_default();
        written += data.len() as u64;
        if declared.is_some_and(|n| written > n || (end && written != n)) {
            return Err(io::Error::other(
                "response body length differs from its Content-Length",
            ));
        }
        // Only a chunked piece has a size line (made on the stack).
        let size_line = (chunked && !data.is_empty()).then(|| ChunkSize::new(data.len()));
        let size_line = size_line.as_deref().unwrap_or_default();
        let tail = match chunked {
            true => chunk_tail(data.is_empty(), end),
            false => b"",
        };
        let with_head = std::mem::take(&mut pending);
        if with_head && data.len() <= COALESCE {
            // A small piece is copied behind the head: one buffer, one `send`.
            let head = &mut spare.0;
            head.reserve(size_line.len() + data.len() + tail.len());
            head.extend_from_slice(size_line);
            head.extend_from_slice(&data);
            head.extend_from_slice(tail);
            send(io, &mut &head[..], send_timeout).await?;
        } else {
            let head: &[u8] = if with_head { &spare.0 } else { &[] };
            let mut out = head.chain(size_line).chain(data).chain(tail);
            send(io, &mut out, send_timeout).await?;
        }
        if end {
            return Ok(keep_alive);
        }
    }
}

/// Writes all of `buf` ([`poll_write_buf`]) and flushes; fails when the
/// client takes nothing for `limit` (a reader stalled, or gone without
/// closing: nginx's `send_timeout`), so that a client cannot hold its
/// connection, and the upstream response behind it, forever.
pub(super) async fn send<S: AsyncWrite + Unpin, B: Buf>(
    io: &mut S,
    buf: &mut B,
    limit: Duration,
) -> io::Result<()> {
    let stalled = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "the client took none of the response within idle_timeout",
        )
    };
    while buf.has_remaining() {
        let mut write = std::pin::pin!(poll_fn(|cx| poll_write_buf(&mut *io, cx, &*buf)));
        // Nearly every write completes at once: the timer (a clock read and
        // a timer entry) is armed only for one that has to wait.
        let written = match write.as_mut().now_or_never() {
            Some(done) => done,
            None => tokio::time::timeout(limit, write)
                .await
                .unwrap_or_else(|_| Err(stalled())),
        };
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf.advance(n),
            Err(e) => return Err(e),
        }
    }
    let mut flush = std::pin::pin!(io.flush());
    match flush.as_mut().now_or_never() {
        Some(done) => done,
        None => tokio::time::timeout(limit, flush)
            .await
            .unwrap_or_else(|_| Err(stalled())),
    }
}

thread_local! {
    /// The `Date` header line of the current second.
    static DATE: RefCell<(u64, Vec<u8>)> = const { RefCell::new((u64::MAX, Vec::new())) };
}

/// Appends `date: <IMF-fixdate>\r\n`, formatted once a second per thread.
fn write_date(head: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            cached.0 = secs;
            cached.1 = format!("date: {}\r\n", httpdate::fmt_http_date(now)).into_bytes();
        }
        head.extend_from_slice(&cached.1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_core::service::FixedStamp;
    use bytes::Bytes;
    use http::{HeaderValue, Response};

    /// Records each write it is given: whether it came as one buffer or as
    /// I/O vectors (and how many), and its bytes.
    #[derive(Default)]
    struct Writes(Vec<(usize, Vec<u8>)>);

    impl AsyncWrite for Writes {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            self.0.push((1, buf.to_vec()));
            std::task::Poll::Ready(Ok(buf.len()))
        }

        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> std::task::Poll<io::Result<usize>> {
            let bytes: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = bytes.len();
            self.0.push((bufs.len(), bytes));
            std::task::Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// The writes that sending `body` as a 200 makes.
    async fn writes_of(body: Body, head_request: bool) -> Vec<(usize, Vec<u8>)> {
        let reply = Reply {
            res: Response::new(body),
            stamp: (),
        };
        let mut io = Writes::default();
        let keep = write_response(
            &mut io,
            reply,
            head_request,
            false,
            true,
            Duration::from_secs(1),
        );
        assert!(keep.await.unwrap());
        io.0
    }

    #[tokio::test]
    async fn a_small_ready_body_goes_out_behind_the_head_in_one_plain_write() {
        let writes = writes_of(crate::http_core::body::full("{\"ok\":true}"), false).await;
        assert_eq!(writes.len(), 1, "one write");
        let (pieces, bytes) = &writes[0];
        assert_eq!(*pieces, 1, "one buffer, not I/O vectors");
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("\r\ncontent-length: 11\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{\"ok\":true}"), "{text}");
    }

    #[tokio::test]
    async fn a_large_ready_body_goes_out_beside_the_head_uncopied() {
        let big = vec![b'x'; COALESCE + 1];
        let writes = writes_of(crate::http_core::body::full(big.clone()), false).await;
        assert_eq!(writes.len(), 1, "one write");
        let (pieces, bytes) = &writes[0];
        assert_eq!(*pieces, 2, "head and body as two I/O vectors");
        assert!(bytes.ends_with(&big));
        assert!(bytes.starts_with(b"HTTP/1.1 200 OK\r\n"));
    }

    #[tokio::test]
    async fn a_chunked_first_piece_is_copied_with_its_framing() {
        let stream = futures_util::stream::iter([Ok::<_, crate::http_core::body::BoxError>(
            http_body::Frame::data(Bytes::from_static(b"hello")),
        )]);
        let body = Body::new(http_body_util::StreamBody::new(stream));
        let writes = writes_of(body, false).await;
        let all: Vec<u8> = writes.iter().flat_map(|(_, b)| b.clone()).collect();
        let text = String::from_utf8(all).unwrap();
        assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), "{text}");
        assert_eq!(writes[0].0, 1, "the head and the first piece in one buffer");
        assert!(String::from_utf8_lossy(&writes[0].1).ends_with("5\r\nhello\r\n"));
    }

    #[tokio::test]
    async fn a_head_answer_is_the_head_alone() {
        let writes = writes_of(crate::http_core::body::full("{}"), true).await;
        assert_eq!(writes.len(), 1);
        let (pieces, bytes) = &writes[0];
        assert_eq!(*pieces, 1);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("\r\ncontent-length: 2\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "no body: {text}");
    }

    #[tokio::test]
    async fn stamped_fields_are_written_once_over_the_maps() {
        let mut res = Response::new(crate::http_core::body::full("{}"));
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("9"));
        h.insert("x-request-id", HeaderValue::from_static("theirs"));
        let stamp = FixedStamp::new(&[
            ("x-ratelimit-limit", "10"),
            ("retry-after", "3"),
            ("x-request-id", "ours"),
        ]);
        let mut out = Vec::new();
        let reply = Reply { res, stamp };
        let keep = write_response(&mut out, reply, false, false, true, Duration::from_secs(1));
        assert!(keep.await.unwrap());
        let text = String::from_utf8(out).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let lines: Vec<&str> = head.lines().collect();
        assert_eq!(lines[0], "HTTP/1.1 429 Too Many Requests");
        for want in [
            "content-type: application/json",
            "x-ratelimit-limit: 10",
            "retry-after: 3",
            "x-request-id: ours",
            "content-length: 2",
        ] {
            assert_eq!(
                lines.iter().filter(|l| **l == want).count(),
                1,
                "{want} in {head}"
            );
        }
        let named = |n: &str| lines.iter().filter(|l| l.starts_with(n)).count();
        assert_eq!(named("retry-after:"), 1);
        assert_eq!(named("x-request-id:"), 1);
        assert_eq!(body, "{}");
    }
}
