//! The request side of an exchange: the head encoded for the wire, and a
//! body that does not go out with it streamed after it (its length checked
//! against `Content-Length`, or chunked), while the response side is
//! watched for an early answer.
use bytes::{Buf, Bytes};
use http::header::{HeaderValue, CONTENT_LENGTH, COOKIE, HOST, TRANSFER_ENCODING};
use http::Method;
use http_body::Body as HttpBody;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;
use tokio::time::Sleep;

use super::conn::{poll_expired, Inner};
use super::error::ClientError;
use super::response::final_head_ready;
use super::socket::Io;
use crate::h1::codec::{chunk_tail, poll_read_more, poll_write_buf, ChunkSize};
use crate::http_core::body::Body;
use crate::http_core::fields::FieldLines;

/// How the request body streams after the head: the framing's bookkeeping.
pub(super) struct BodyWriter {
    length: Option<u64>,
    sent: u64,
}

impl BodyWriter {
    pub(super) fn new(length: Option<u64>) -> Self {
        BodyWriter { length, sent: 0 }
    }

    /// Counts `n` more bytes; a body longer or shorter than its declared
    /// length is an error (the target would misread the connection).
    pub(super) fn check(&mut self, n: usize, end: bool) -> Result<(), ClientError> {
        self.sent += n as u64;
        match self.length {
            Some(len) if self.sent > len || (end && self.sent != len) => Err(ClientError::Body(
                "request body length differs from its Content-Length".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Appends what goes before `n` data bytes (a chunk-size line).
    pub(super) fn frame(&self, out: &mut Vec<u8>, n: usize) {
        if self.length.is_none() && n > 0 {
            out.extend_from_slice(&ChunkSize::new(n));
        }
    }

    /// What follows a piece of data (`empty`: none) on the wire.
    pub(super) fn tail(&self, empty: bool, end: bool) -> &'static [u8] {
        match self.length {
            Some(_) => b"",
            None => chunk_tail(empty, end),
        }
    }
}

/// How a streamed request body ended.
pub(super) enum Streamed {
    /// Written to its end.
    Whole,
    /// The target answered before the body had gone: the rest is not sent.
    AnsweredEarly,
}

/// Writes the rest of a request body while watching for an early answer.
pub(super) async fn stream_body(
    inner: &mut Inner,
    body: &mut Body,
    mut writer: BodyWriter,
    deadline: Instant,
) -> Result<Streamed, ClientError> {
    let mut piece = Piece::default();
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
        if !piece.is_empty() {
            let written = poll_write_buf(&mut inner.io, cx, &piece.as_buf());
            match written {
                Poll::Ready(Ok(n)) if n > 0 => piece.advance(n),
                Poll::Ready(result) => return Poll::Ready(write_failed(inner, cx, result)),
                Poll::Pending => return poll_expired(&mut inner.timer, deadline, cx),
            }
            continue;
        }
        if ended {
            return Poll::Ready(Ok(Streamed::Whole));
        }
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers are not sent over HTTP/1.1
                };
                ended = body.is_end_stream();
                writer.check(data.len(), ended)?;
                piece.frame(&mut writer, data, ended);
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(ClientError::Body(e))),
            Poll::Ready(None) => {
                writer.check(0, true)?;
                piece.tail = writer.tail(true, true);
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

/// A write of a streamed body that failed or wrote nothing. A target that
/// answered and closed without reading the rest resets the connection; its
/// answer may still be there to read, and is then relayed.
fn write_failed(
    inner: &mut Inner,
    cx: &mut std::task::Context<'_>,
    result: io::Result<usize>,
) -> Result<Streamed, ClientError> {
    while let Poll::Ready(Ok(1..)) = poll_read_more(&mut inner.io, cx, &mut inner.buf) {}
    if final_head_ready(&mut inner.buf)? {
        return Ok(Streamed::AnsweredEarly);
    }
    let e = result
        .err()
        .unwrap_or_else(|| io::ErrorKind::WriteZero.into());
    Err(e.into())
}

/// The piece of a streamed body being written: its chunk-size line (or
/// nothing), its data, then CRLF or the last chunk; each part as far as it
/// has gone.
#[derive(Default)]
struct Piece {
    line: Vec<u8>,
    line_at: usize,
    data: Bytes,
    tail: &'static [u8],
}

impl Piece {
    /// Whether all of it has gone.
    fn is_empty(&self) -> bool {
        self.line_at == self.line.len() && self.data.is_empty() && self.tail.is_empty()
    }

    /// What is left to write, as one buffer.
    fn as_buf(&self) -> impl Buf + '_ {
        (&self.line[self.line_at..])
            .chain(&self.data[..])
            .chain(self.tail)
    }

    /// `n` more bytes have gone.
    fn advance(&mut self, mut n: usize) {
        let from_line = n.min(self.line.len() - self.line_at);
        self.line_at += from_line;
        n -= from_line;
        let from_data = n.min(self.data.len());
        self.data.advance(from_data);
        n -= from_data;
        self.tail = &self.tail[n.min(self.tail.len())..];
    }

    /// The next piece: `data` as `writer` frames it (the last if `end`).
    fn frame(&mut self, writer: &mut BodyWriter, data: Bytes, end: bool) {
        self.line.clear();
        self.line_at = 0;
        writer.frame(&mut self.line, data.len());
        self.tail = writer.tail(data.is_empty(), end);
        self.data = data;
    }
}

/// Writes some of `buf` ([`poll_write_buf`]) by `deadline`: how many bytes went.
pub(super) async fn write_some<B: Buf>(
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

/// The request line, its header fields and the fields added to it ([`FieldLines`]),
/// framed for `length` (`None`: chunked). `Content-Length` and
/// `Transfer-Encoding` are the framing's own.
pub(super) fn encode_head<A: FieldLines + ?Sized>(
    out: &mut Vec<u8>,
    parts: &http::request::Parts,
    host: &HeaderValue,
    length: Option<u64>,
    added: Option<&A>,
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
    let mut cookies_written = false;
    for (name, value) in &parts.headers {
        if name == CONTENT_LENGTH {
            declared = true;
            continue;
        }
        // The target's own `Host` went first.
        if name == TRANSFER_ENCODING || name == HOST {
            continue;
        }
        // HTTP/2 splits `cookie` into a field per crumb; an HTTP/1.1 request
        // carries one line, the crumbs joined with "; " (RFC 9113 §8.2.3).
        if name == COOKIE {
            if !cookies_written {
                cookies_written = true;
                write_cookies(out, &parts.headers);
            }
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(added) = added {
        added.write_lines(out);
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

/// Every `cookie` field of `headers` as one line.
fn write_cookies(out: &mut Vec<u8>, headers: &http::HeaderMap) {
    out.extend_from_slice(b"cookie: ");
    for (i, crumb) in headers.get_all(COOKIE).iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b"; ");
        }
        out.extend_from_slice(crumb.as_bytes());
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

    #[test]
    fn an_absolute_uri_or_another_version_goes_out_in_origin_form_over_http_1_1() {
        let (parts, ()) = http::Request::get("https://gw.example:8443/p?q=1")
            .version(http::Version::HTTP_2)
            .body(())
            .unwrap()
            .into_parts();
        let mut out = Vec::new();
        encode_head::<dyn FieldLines>(
            &mut out,
            &parts,
            &HeaderValue::from_static("t:1"),
            Some(0),
            None,
        );
        assert_eq!(out, b"GET /p?q=1 HTTP/1.1\r\nhost: t:1\r\n\r\n");
    }

    #[test]
    fn http2_cookie_crumbs_go_out_as_one_line() {
        let (parts, ()) = http::Request::get("/p")
            .version(http::Version::HTTP_2)
            .header("cookie", "a=1")
            .header("x-a", "1")
            .header("cookie", "b=2")
            .header("cookie", "c=3")
            .body(())
            .unwrap()
            .into_parts();
        let mut out = Vec::new();
        let host = HeaderValue::from_static("t:1");
        encode_head::<dyn FieldLines>(&mut out, &parts, &host, Some(0), None);
        let head = String::from_utf8(out).unwrap();
        assert_eq!(head.matches("cookie").count(), 1, "{head}");
        assert!(head.contains("\r\ncookie: a=1; b=2; c=3\r\n"), "{head}");
        assert!(head.contains("\r\nx-a: 1\r\n"), "{head}");
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
            encode_head::<dyn FieldLines>(
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
