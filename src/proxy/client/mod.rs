//! HTTP/1.1 to a target, driven by the task of the request it carries: the
//! request head (and a body that is ready) goes out in one write, the
//! response head is parsed with `httparse` into a header map that shares the
//! bytes read, and the response body is decoded as the client reads it. A
//! response that arrived whole with its head gives its connection back at
//! once.
//!
//! Why not hyper's client connection: it runs a task per connection and
//! hands each request over a channel and each response back over a oneshot.
//! In the load suite's layout that dispatch (two task wake-ups and the
//! channel work per request) and hyper's general-purpose encoder and parser
//! were a fifth of the gateway's user-space instructions per proxied
//! request. hyper-util's client still serves `http2 = true` targets.
//!
//! The framing rules are RFC 9112's and hyper's: no body for a `HEAD`
//! request or a 1xx/204/304 response; `Transfer-Encoding` ending in `chunked`
//! wins over `Content-Length` (any other coding: the body ends with the
//! connection); differing `Content-Length` values are an invalid response;
//! with neither, the body ends with the connection. Interim 1xx responses are
//! skipped (a `101` is refused: the gateway does not tunnel upgrades). While
//! a request body streams, the response side is watched: a target that
//! answers early (a `413` half-way through an upload) has its answer relayed,
//! and the connection is not reused.
mod response;
mod socket;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Method, Response};
use http_body::Body as HttpBody;
use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::Sleep;

use super::headers::Added;
use crate::h1::{
    after_queued_tasks, chunk_tail, poll_read_more, poll_write_buf, ChunkSize, Decoder, Framing,
};
use crate::http::body::{Body, BoxError};
pub(crate) use response::Incoming;
use response::{final_head_ready, Kind, Reader};
pub(crate) use response::{take_response, BodyFraming};
pub(crate) use socket::{io, Io};

/// A response head (status line and header fields) longer than this is refused.
const MAX_HEAD: usize = 256 * 1024;
/// A first request-body piece up to this size is copied behind the head,
/// so that both go out in one write.
const COALESCE: usize = 16 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// Reading or writing the connection failed.
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    /// The target closed the connection before a whole response.
    #[error("the upstream closed the connection before a complete response")]
    Closed,
    /// The target's response is not valid HTTP/1.1.
    #[error("invalid upstream response: {0}")]
    Invalid(&'static str),
    /// The request body could not be read (too large, malformed, stalled,
    /// or the client's connection failed): the client's doing, not the
    /// target's.
    #[error("request body: {0}")]
    Body(#[source] BoxError),
    /// No response head by the exchange's deadline.
    #[error("no response from the upstream in time")]
    TimedOut,
}

/// Why a request on a connection failed.
pub(crate) enum SendError {
    /// Nothing of the request was written or taken from its body (the
    /// connection had been closed): the body comes back, to go out with the
    /// head (which the caller kept) on another connection.
    Unsent(Body),
    /// The exchange failed after (part of) the request was written.
    Failed(ClientError),
}

/// One HTTP/1.1 connection to a target. Boxed inside, so that moving it in
/// and out of the pool and through the request's future copies a pointer
/// (a TLS session is over a kilobyte).
pub(crate) struct Conn {
    inner: Box<Inner>,
}

struct Inner {
    io: Io,
    /// Bytes read and not yet consumed (empty between exchanges).
    buf: BytesMut,
    /// The request head being written; kept for its capacity.
    out: Vec<u8>,
    /// The timer of the exchange's deadline, made once per connection (see
    /// [`poll_expired`]).
    timer: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    /// A connection over a connected (and, for TLS, handshaken) stream.
    pub(crate) fn new(io: Io) -> Conn {
        Conn {
            inner: Box::new(Inner {
                io,
                buf: BytesMut::new(),
                out: Vec::new(),
                timer: None,
            }),
        }
    }

    /// Whether an idle connection can carry a request: the target has not
    /// closed it and sent nothing unasked. Costs no system call unless the
    /// socket has become readable.
    pub(crate) fn is_usable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let mut one = [MaybeUninit::<u8>::uninit(); 1];
        let mut rb = ReadBuf::uninit(&mut one);
        // Ready means end of stream, an error, or bytes nobody asked for.
        Pin::new(&mut self.inner.io)
            .poll_read(&mut cx, &mut rb)
            .is_pending()
    }

    /// Sends the request `parts` (its path and query, and its fields with
    /// `host` for `Host`) with `body`, and reads the response head, failing
    /// with [`ClientError::TimedOut`] if that is not done by `deadline`.
    /// The head is borrowed: a caller that may send it again keeps it, and
    /// the request's future holds it once, not once per layer. The
    /// connection comes back with the response when the response is already
    /// whole and the connection can carry another request; otherwise the
    /// response body owns it until it ends.
    pub(crate) async fn send(
        mut self,
        parts: &http::request::Parts,
        host: &HeaderValue,
        mut body: Body,
        added: Option<&Added<'_>>,
        deadline: Instant,
    ) -> Result<(Response<Incoming>, Option<Conn>), SendError> {
        let head_request = parts.method == Method::HEAD;
        let length = if body.is_end_stream() {
            Some(0)
        } else {
            body.size_hint().exact()
        };
        let inner = &mut *self.inner;
        inner.out.clear();
        encode_head(&mut inner.out, parts, host, length, added);

        // A body piece that is ready now goes out with the head.
        let mut first = Bytes::new();
        let mut polled = false;
        let mut body_done = length == Some(0);
        if !body_done {
            polled = true;
            let cx = &mut Context::from_waker(Waker::noop());
            match Pin::new(&mut body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        first = data;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return Err(SendError::Failed(ClientError::Body(e)));
                }
                Poll::Ready(None) => body_done = true,
                Poll::Pending => {}
            }
            body_done |= body.is_end_stream();
        }
        let mut writer = BodyWriter::new(length);
        if let Err(e) = writer.check(first.len(), body_done) {
            return Err(SendError::Failed(e));
        }
        if !first.is_empty() && first.len() <= COALESCE && length.is_some() {
            inner.out.extend_from_slice(&first);
            first = Bytes::new();
        } else if !first.is_empty() {
            writer.frame(&mut inner.out, first.len());
        }
        let tail = writer.tail(first.is_empty(), body_done);

        // Written after the other ready requests: see `after_queued_tasks`.
        after_queued_tasks().await;
        let mut out = (&inner.out[..]).chain(first).chain(tail);
        let mut written = 0;
        while out.has_remaining() {
            match write_some(&mut inner.io, &mut inner.timer, &mut out, deadline).await {
                Ok(n) => written += n,
                Err(ClientError::Io(e))
                    if written == 0 && !polled && e.kind() != io::ErrorKind::WriteZero =>
                {
                    return Err(SendError::Unsent(body));
                }
                Err(e) => return Err(SendError::Failed(e)),
            }
        }
        let mut reusable = true;
        if !body_done {
            // Boxed: the usual request's future carries no room for this.
            match Box::pin(stream_body(inner, &mut body, writer, deadline)).await {
                Ok(Streamed::Whole) => {}
                Ok(Streamed::AnsweredEarly) => reusable = false,
                Err(e) => return Err(SendError::Failed(e)),
            }
        }
        drop(body);
        self.read_response(head_request, reusable, deadline)
            .await
            .map_err(SendError::Failed)
    }

    /// Reads the response head, skipping interim responses; frames its body.
    async fn read_response(
        mut self,
        head_request: bool,
        reusable: bool,
        deadline: Instant,
    ) -> Result<(Response<Incoming>, Option<Conn>), ClientError> {
        let inner = &mut *self.inner;
        let (mut res, framing, keep_alive) = loop {
            if let Some(taken) = take_response(&mut inner.buf, head_request)? {
                break taken;
            }
            if inner.buf.len() > MAX_HEAD {
                return Err(ClientError::Invalid("response head too large"));
            }
            let read = poll_fn(
                |cx| match poll_read_more(&mut inner.io, cx, &mut inner.buf) {
                    Poll::Pending => poll_expired(&mut inner.timer, deadline, cx),
                    done => done.map_err(ClientError::from),
                },
            );
            if read.await? == 0 {
                return Err(ClientError::Closed);
            }
        };
        let reusable = reusable && keep_alive;
        res.body_mut().kind = match framing {
            BodyFraming::None => Kind::Bodyless,
            BodyFraming::Known(Framing::Empty) => Kind::Empty,
            BodyFraming::Known(Framing::Length(n)) if inner.buf.len() as u64 >= n => {
                Kind::Full(Some(inner.buf.split_to(n as usize).freeze()))
            }
            framing => {
                if let BodyFraming::Known(chunked @ Framing::Chunked) = framing {
                    // Framing that is already here and broken is a 502, not
                    // a 200 whose body breaks off after its head has gone.
                    Decoder::new(chunked)
                        .check(&inner.buf)
                        .map_err(ClientError::Invalid)?;
                }
                let reader = Reader::new(self, framing, reusable);
                res.body_mut().kind = Kind::Reading(Box::new(reader));
                return Ok((res, None));
            }
        };
        // Bytes past the response: the target is out of step; not reused.
        let back = (reusable && inner.buf.is_empty()).then_some(self);
        Ok((res, back))
    }
}

/// How the request body streams after the head: the framing's bookkeeping.
struct BodyWriter {
    length: Option<u64>,
    sent: u64,
}

impl BodyWriter {
    fn new(length: Option<u64>) -> Self {
        BodyWriter { length, sent: 0 }
    }

    /// Counts `n` more bytes; a body longer or shorter than its declared
    /// length is an error (the target would misread the connection).
    fn check(&mut self, n: usize, end: bool) -> Result<(), ClientError> {
        self.sent += n as u64;
        match self.length {
            Some(len) if self.sent > len || (end && self.sent != len) => Err(ClientError::Body(
                "request body length differs from its Content-Length".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Appends what goes before `n` data bytes (a chunk-size line).
    fn frame(&self, out: &mut Vec<u8>, n: usize) {
        if self.length.is_none() && n > 0 {
            out.extend_from_slice(&ChunkSize::new(n));
        }
    }

    /// What follows a piece of data (`empty`: none) on the wire.
    fn tail(&self, empty: bool, end: bool) -> &'static [u8] {
        match self.length {
            Some(_) => b"",
            None => chunk_tail(empty, end),
        }
    }
}

/// How a streamed request body ended.
enum Streamed {
    /// Written to its end.
    Whole,
    /// The target answered before the body had gone: the rest is not sent.
    AnsweredEarly,
}

/// Writes the rest of a request body while watching for an early answer.
async fn stream_body(
    inner: &mut Inner,
    body: &mut Body,
    mut writer: BodyWriter,
    deadline: Instant,
) -> Result<Streamed, ClientError> {
    // The piece being written: chunk-size line (or nothing), data, CRLF or
    // the last chunk.
    let mut line = Vec::new();
    let mut data = Bytes::new();
    let mut tail: &'static [u8] = b"";
    let mut line_at = 0;
    let mut ended = false;
    poll_fn(|cx| loop {
        // An answer before the body has gone ends the upload.
        match poll_read_more(&mut inner.io, cx, &mut inner.buf) {
            Poll::Ready(Ok(n)) => {
                if final_head_ready(&mut inner.buf)? {
                    return Poll::Ready(Ok(Streamed::AnsweredEarly));
                }
                if n == 0 {
                    return Poll::Ready(Err(ClientError::Closed));
                }
                continue;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
            Poll::Pending => {}
        }
        if line_at < line.len() || !data.is_empty() || !tail.is_empty() {
            let out = (&line[line_at..]).chain(&data[..]).chain(tail);
            let n = match poll_write_buf(&mut inner.io, cx, &out) {
                Poll::Ready(Ok(n)) if n > 0 => n,
                Poll::Ready(result) => {
                    // A target that answered and closed without reading the
                    // rest resets the connection; its answer is still there.
                    while let Poll::Ready(Ok(1..)) =
                        poll_read_more(&mut inner.io, cx, &mut inner.buf)
                    {}
                    if final_head_ready(&mut inner.buf)? {
                        return Poll::Ready(Ok(Streamed::AnsweredEarly));
                    }
                    let e = result
                        .err()
                        .unwrap_or_else(|| io::ErrorKind::WriteZero.into());
                    return Poll::Ready(Err(e.into()));
                }
                Poll::Pending => return poll_expired(&mut inner.timer, deadline, cx),
            };
            let mut n = n;
            let from_line = n.min(line.len() - line_at);
            line_at += from_line;
            n -= from_line;
            let from_data = n.min(data.len());
            data.advance(from_data);
            n -= from_data;
            tail = &tail[n.min(tail.len())..];
            continue;
        }
        if ended {
            return Poll::Ready(Ok(Streamed::Whole));
        }
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(piece) = frame.into_data() else {
                    continue; // trailers are not sent over HTTP/1.1
                };
                let end = body.is_end_stream();
                writer.check(piece.len(), end)?;
                line.clear();
                line_at = 0;
                writer.frame(&mut line, piece.len());
                tail = writer.tail(piece.is_empty(), end);
                data = piece;
                ended = end;
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(ClientError::Body(e))),
            Poll::Ready(None) => {
                writer.check(0, true)?;
                tail = writer.tail(true, true);
                ended = true;
            }
            // Everything so far has gone: it is the client whose bytes are
            // late, not the target (whose health this must not count against).
            Poll::Pending => {
                return poll_expired(&mut inner.timer, deadline, cx).map_err(|_| {
                    ClientError::Body("the request body stalled past the deadline".into())
                })
            }
        }
    })
    .await
}

/// Writes some of `buf` ([`poll_write_buf`]) by `deadline`: how many bytes went.
async fn write_some<B: Buf>(
    io: &mut Io,
    timer: &mut Option<Pin<Box<Sleep>>>,
    buf: &mut B,
    deadline: Instant,
) -> Result<usize, ClientError> {
    let n = poll_fn(|cx| match poll_write_buf(&mut *io, cx, &*buf) {
        Poll::Pending => poll_expired(timer, deadline, cx),
        done => done.map_err(ClientError::from),
    })
    .await?;
    if n == 0 {
        return Err(io::Error::from(io::ErrorKind::WriteZero).into());
    }
    buf.advance(n);
    Ok(n)
}

/// `Ready(Err(TimedOut))` once `deadline` has passed; until then `Pending`,
/// with the task woken when it passes (for a wait that is pending itself).
///
/// Per connection, not per request: `timer` is made once and is armed no
/// later than the current deadline. A later deadline (the next request's)
/// leaves it alone, and when it fires early it is re-armed, so a busy
/// connection touches the timer wheel once per deadline's length instead
/// of twice per request (tokio's `timeout` registers and removes a timer
/// each time). An early firing wakes the task that polled last, at worst a
/// finished one: a spurious wake-up, once per deadline's length.
fn poll_expired<T>(
    timer: &mut Option<Pin<Box<Sleep>>>,
    deadline: Instant,
    cx: &mut Context<'_>,
) -> Poll<Result<T, ClientError>> {
    let at = tokio::time::Instant::from_std(deadline);
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
    if timer.deadline() > at {
        timer.as_mut().reset(at);
    }
    while timer.as_mut().poll(cx).is_ready() {
        if Instant::now() >= deadline {
            return Poll::Ready(Err(ClientError::TimedOut));
        }
        timer.as_mut().reset(at);
    }
    Poll::Pending
}

/// The request line, its header fields and the gateway's ([`Added`]),
/// framed for `length` (`None`: chunked). `Content-Length` and
/// `Transfer-Encoding` are the framing's own.
fn encode_head(
    out: &mut Vec<u8>,
    parts: &http::request::Parts,
    host: &HeaderValue,
    length: Option<u64>,
    added: Option<&Added<'_>>,
) {
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    out.reserve(64 + path.len() + parts.headers.len() * 48);
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut declared = false;
    for (name, value) in &parts.headers {
        if name == CONTENT_LENGTH {
            declared = true;
            continue;
        }
        // The target's own `Host` went first.
        if name == TRANSFER_ENCODING || name == HOST {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(added) = added {
        added.write_to(out);
    }
    match length {
        // An empty body is said only where one is expected.
        Some(0) if !declared && !expects_body(&parts.method) => {}
        Some(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Methods whose requests carry a body as a rule.
fn expects_body(m: &Method) -> bool {
    matches!(*m, Method::POST | Method::PUT | Method::PATCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_connection_timer_ends_each_exchange_at_its_own_deadline() {
        let mut timer = None;
        let expired = |timer: &mut Option<Pin<Box<Sleep>>>, deadline| {
            let mut cx = Context::from_waker(Waker::noop());
            poll_expired::<()>(timer, deadline, &mut cx).is_ready()
        };
        // The first exchange arms the timer for its deadline.
        let first = Instant::now() + Duration::from_millis(40);
        assert!(!expired(&mut timer, first));
        tokio::time::sleep(Duration::from_millis(80)).await;
        // The timer fired for the first exchange; the next one, due later,
        // is not expired by it, and the timer is re-armed for it.
        let second = Instant::now() + Duration::from_millis(120);
        assert!(!expired(&mut timer, second));
        assert_eq!(
            timer.as_ref().unwrap().deadline(),
            tokio::time::Instant::from_std(second)
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!expired(&mut timer, second));
        // An earlier deadline moves the timer forward.
        let third = Instant::now() + Duration::from_millis(20);
        assert!(!expired(&mut timer, third));
        let ended = poll_fn(|cx| poll_expired::<()>(&mut timer, third, cx)).await;
        assert!(matches!(ended, Err(ClientError::TimedOut)));
        assert!(Instant::now() >= third);
        // A deadline already past is expired at once.
        assert!(expired(&mut timer, Instant::now()));
    }

    #[test]
    fn an_absolute_uri_or_another_version_goes_out_in_origin_form_over_http_1_1() {
        let (parts, ()) = http::Request::get("https://gw.example:8443/p?q=1")
            .version(http::Version::HTTP_2)
            .body(())
            .unwrap()
            .into_parts();
        let mut out = Vec::new();
        encode_head(
            &mut out,
            &parts,
            &HeaderValue::from_static("t:1"),
            Some(0),
            None,
        );
        assert_eq!(out, b"GET /p?q=1 HTTP/1.1\r\nhost: t:1\r\n\r\n");
    }

    #[test]
    fn request_heads_carry_the_framing_of_their_body() {
        let head = |method: &str, length: Option<u64>, declared: bool| {
            let mut b = http::Request::builder()
                .method(method)
                .uri("/p?q=1")
                // The client's own `Host` gives way to the target's.
                .header("host", "client:9");
            if declared {
                b = b
                    .header("content-length", "0")
                    .header("transfer-encoding", "chunked");
            }
            let (parts, ()) = b.body(()).unwrap().into_parts();
            let mut out = Vec::new();
            encode_head(
                &mut out,
                &parts,
                &HeaderValue::from_static("t:1"),
                length,
                None,
            );
            String::from_utf8(out).unwrap()
        };
        let cases = [
            (
                ("GET", Some(0), false),
                "GET /p?q=1 HTTP/1.1\r\nhost: t:1\r\n\r\n",
            ),
            (
                ("POST", Some(0), false),
                "POST /p?q=1 HTTP/1.1\r\nhost: t:1\r\ncontent-length: 0\r\n\r\n",
            ),
            (
                ("GET", Some(0), true),
                "GET /p?q=1 HTTP/1.1\r\nhost: t:1\r\ncontent-length: 0\r\n\r\n",
            ),
            (
                ("PUT", Some(12), true),
                "PUT /p?q=1 HTTP/1.1\r\nhost: t:1\r\ncontent-length: 12\r\n\r\n",
            ),
            (
                ("POST", None, false),
                "POST /p?q=1 HTTP/1.1\r\nhost: t:1\r\ntransfer-encoding: chunked\r\n\r\n",
            ),
        ];
        for ((method, length, declared), want) in cases {
            assert_eq!(
                head(method, length, declared),
                want,
                "{method} {length:?} {declared}"
            );
        }
        let mut line = Vec::new();
        BodyWriter::new(None).frame(&mut line, 0x1a2b);
        assert_eq!(line, b"1a2b\r\n");
    }
}
