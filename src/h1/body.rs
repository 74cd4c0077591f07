//! Request bodies: decoded off the connection's buffer (`Content-Length` or
//! `chunked`) and fed to the handler as it reads them.
use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify};

use super::head::Framing;
use super::read_more;
use super::response::send;
use crate::body::{BoxError, DRAIN_IDLE, DRAIN_MAX_BYTES, DRAIN_TIME};
use crate::server::Reply;

/// A chunk-size line (with its extensions) longer than this is refused.
const MAX_CHUNK_LINE: usize = 4096;
/// Trailer bytes after the last chunk (read and dropped) at most.
const MAX_TRAILERS: usize = 16 * 1024;

/// Decodes a message body (a request's here, a response's in the upstream
/// client) off the front of a connection's buffer.
#[derive(Debug)]
pub(crate) enum Decoder {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers(usize),
    Done,
    /// Abandoned after an error: never done.
    Broken,
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::ChunkSize,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// The next piece of body in `buf`: `Some` data, or `None` when more
    /// bytes are needed or the body is done ([`Decoder::is_done`]).
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, &'static str> {
        loop {
            match self {
                Decoder::Done | Decoder::Broken => return Ok(None),
                Decoder::Length(left) | Decoder::ChunkData(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = (*left).min(buf.len() as u64);
                    let data = buf.split_to(take as usize).freeze();
                    *left -= take;
                    if *left == 0 {
                        *self = match self {
                            Decoder::Length(_) => Decoder::Done,
                            _ => Decoder::ChunkEnd,
                        };
                    }
                    return Ok(Some(data));
                }
                Decoder::ChunkSize => {
                    let Some(line) = line_len(buf, MAX_CHUNK_LINE, "chunk size line too long")?
                    else {
                        return Ok(None);
                    };
                    let size = match httparse::parse_chunk_size(&buf[..line]) {
                        Ok(httparse::Status::Complete((used, size))) if used == line => size,
                        _ => return Err("invalid chunk size"),
                    };
                    buf.advance(line);
                    *self = if size == 0 {
                        Decoder::Trailers(0)
                    } else {
                        Decoder::ChunkData(size)
                    };
                }
                Decoder::ChunkEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("chunk data not followed by CRLF");
                    }
                    buf.advance(2);
                    *self = Decoder::ChunkSize;
                }
                Decoder::Trailers(seen) => {
                    let room = MAX_TRAILERS.saturating_sub(*seen);
                    let Some(line) = line_len(buf, room, "trailers too long")? else {
                        return Ok(None);
                    };
                    buf.advance(line);
                    *self = if line == 2 {
                        Decoder::Done
                    } else {
                        Decoder::Trailers(*seen + line)
                    };
                }
            }
        }
    }
}

/// The length of the CRLF-terminated line at the front of `buf` (CRLF
/// included); `None` while incomplete. A bare LF, or no line end within
/// `max` bytes, is an error.
fn line_len(buf: &[u8], max: usize, too_long: &'static str) -> Result<Option<usize>, &'static str> {
    match buf.iter().take(max).position(|&b| b == b'\n') {
        Some(0) => Err("bare LF in chunked framing"),
        Some(lf) if buf[lf - 1] != b'\r' => Err("bare LF in chunked framing"),
        Some(lf) => Ok(Some(lf + 1)),
        None if buf.len() >= max => Err(too_long),
        None => Ok(None),
    }
}

/// The request body's side of the connection while the handler runs.
pub(super) struct Feed {
    pub(super) tx: Option<mpsc::Sender<Result<Bytes, BoxError>>>,
    pub(super) want: Arc<Notify>,
    pub(super) decoder: Decoder,
    pub(super) expect_continue: bool,
}

/// The body could not be read to its end.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("request body framing: {0}")]
    Framing(&'static str),
    #[error("the connection ended inside the request body")]
    Eof,
    #[error("the client sent none of the request body within idle_timeout")]
    Stalled,
    #[error("reading the request body: {0}")]
    Io(#[from] io::Error),
    /// Not an error of the body's: the handler dropped it.
    #[error("the handler dropped the request body")]
    Unwanted,
}

/// What is left of the request body once the handler has answered.
#[derive(Debug)]
pub(super) enum Rest {
    /// Read to its end.
    Read,
    /// Not all read: the decoder where reading stopped, and whether the
    /// client still waits for a `100 Continue` it was never sent (and so
    /// may or may not send the body: the connection cannot be kept).
    Unread { decoder: Decoder, expecting: bool },
    /// Cut off (bad framing, the client gone or stalled): the connection
    /// cannot carry another request.
    Broken,
}

impl Rest {
    /// Whether the connection can carry another request once the rest is
    /// read past: within [`DRAIN_MAX_BYTES`] when its length is known.
    pub(super) fn keeps_alive(&self) -> bool {
        match self {
            Rest::Read => true,
            Rest::Unread {
                expecting: true, ..
            }
            | Rest::Broken => false,
            Rest::Unread {
                decoder: Decoder::Length(left),
                ..
            } => *left <= DRAIN_MAX_BYTES,
            Rest::Unread { .. } => true,
        }
    }
}

/// Runs the handler while feeding it the request body as it asks; returns
/// its response and what is left of the body. `idle_timeout` bounds each
/// wait for the client: to take the `100 Continue`, and to send more of a
/// body the handler is waiting for (nginx's `client_body_timeout`; nothing
/// else ends a stalled upload to the built-in key service).
pub(super) async fn drive<S>(
    io: &mut S,
    rbuf: &mut BytesMut,
    mut handler: Pin<Box<impl Future<Output = Reply>>>,
    mut feed: Feed,
    idle_timeout: Duration,
) -> io::Result<(Reply, Rest)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut wanted = false;
    loop {
        let feeding = wanted && feed.tx.is_some();
        tokio::select! {
            biased;
            res = &mut handler => {
                // A body that is already buffered is read past.
                while !feed.decoder.is_done() {
                    match feed.decoder.decode(rbuf) {
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(_) => feed.decoder = Decoder::Broken,
                    }
                }
                let rest = match feed.decoder {
                    Decoder::Done => Rest::Read,
                    Decoder::Broken => Rest::Broken,
                    decoder => Rest::Unread {
                        decoder,
                        expecting: feed.expect_continue && !wanted,
                    },
                };
                return Ok((res, rest));
            }
            () = feed.want.notified(), if !wanted => {
                wanted = true;
                if feed.expect_continue {
                    send(io, &mut &b"HTTP/1.1 100 Continue\r\n\r\n"[..], idle_timeout).await?;
                }
            }
            piece = next_piece(io, rbuf, &mut feed.decoder, feed.tx.as_ref(), idle_timeout), if feeding => {
                match piece {
                    Ok(()) => {}
                    // The rest is read past once the handler has answered.
                    Err(BodyError::Unwanted) => feed.tx = None,
                    Err(e) => {
                        tracing::debug!(error = %e, "request body not read to its end");
                        if let Some(tx) = feed.tx.take() {
                            let _ = tx.try_send(Err(Box::new(e)));
                        }
                        feed.decoder = Decoder::Broken;
                    }
                }
                if feed.decoder.is_done() {
                    // The body has ended: its receiver sees the end.
                    feed.tx = None;
                }
            }
        }
    }
}

/// Waits for room in the body channel, then decodes the next piece of body
/// and sends it, reading from the socket as needed (a read that waits
/// `idle_timeout` in vain fails). Cancel-safe: state changes only between
/// awaits.
async fn next_piece<S: AsyncRead + Unpin>(
    io: &mut S,
    rbuf: &mut BytesMut,
    decoder: &mut Decoder,
    tx: Option<&mpsc::Sender<Result<Bytes, BoxError>>>,
    idle_timeout: Duration,
) -> Result<(), BodyError> {
    let Some(tx) = tx else { return Ok(()) };
    let Ok(permit) = tx.reserve().await else {
        return Err(BodyError::Unwanted);
    };
    loop {
        match decoder.decode(rbuf).map_err(BodyError::Framing)? {
            Some(data) => {
                permit.send(Ok(data));
                return Ok(());
            }
            None if decoder.is_done() => return Ok(()),
            None => {
                let mut read = std::pin::pin!(read_more(io, rbuf));
                // Bytes usually wait in the socket: the timer (a clock read
                // and a timer entry) is armed only for a read that has to wait.
                let n = match read.as_mut().now_or_never() {
                    Some(n) => n?,
                    None => tokio::time::timeout(idle_timeout, read)
                        .await
                        .map_err(|_| BodyError::Stalled)??,
                };
                if n == 0 {
                    return Err(BodyError::Eof);
                }
            }
        }
    }
}

/// Reads the rest of a request body after its answer and throws it away,
/// within the drain bounds ([`DRAIN_MAX_BYTES`] read off the socket,
/// [`DRAIN_TIME`] in all, [`DRAIN_IDLE`] for each read). Returns whether
/// the body ended, and so the next request can be read; otherwise the
/// client stopped sending, closed, sent bad framing, or a bound was passed.
/// A shutdown does not cut it short: closing on a client still sending can
/// lose it the answer, and `shutdown_grace` bounds the wait.
pub(super) async fn discard<S: AsyncRead + Unpin>(
    io: &mut S,
    rbuf: &mut BytesMut,
    mut decoder: Decoder,
) -> bool {
    let deadline = crate::clock::now() + DRAIN_TIME;
    let mut left = DRAIN_MAX_BYTES;
    loop {
        loop {
            match decoder.decode(rbuf) {
                Ok(Some(_)) => {}
                Ok(None) if decoder.is_done() => return true,
                Ok(None) => break,
                Err(_) => return false,
            }
        }
        let by = deadline.min(crate::clock::now() + DRAIN_IDLE);
        match tokio::time::timeout_at(by.into(), read_more(io, rbuf)).await {
            Ok(Ok(n)) if n > 0 && n as u64 <= left => left -= n as u64,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: Framing, input: &[u8]) -> Result<(Vec<u8>, bool), &'static str> {
        let mut d = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        // One byte at a time: every state must cope with a split anywhere.
        for &b in input {
            buf.extend_from_slice(&[b]);
            while let Some(data) = d.decode(&mut buf)? {
                out.extend_from_slice(&data);
            }
        }
        Ok((out, d.is_done()))
    }

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        let body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
        assert_eq!(
            decode_all(Framing::Chunked, body),
            Ok((b"hello world".to_vec(), true))
        );
        assert_eq!(
            decode_all(Framing::Length(5), b"hello"),
            Ok((b"hello".to_vec(), true))
        );
        assert_eq!(
            decode_all(Framing::Chunked, b"5\r\nhel"),
            Ok((b"hel".to_vec(), false))
        );
        for bad in [
            &b"5;x\nhello\r\n0\r\n\r\n"[..],
            b"5\nhello\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"z\r\n",
            b"0\r\nX: a\n\r\n",
        ] {
            assert!(decode_all(Framing::Chunked, bad).is_err(), "{bad:?}");
        }
        let long = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert!(decode_all(Framing::Chunked, long.as_bytes()).is_err());
    }
}
