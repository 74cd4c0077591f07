//! The server side of HTTP/1.1 (RFC 9112): request heads parsed with
//! `httparse`, bodies framed by `Content-Length` or `chunked` and decoded as
//! the handler reads them, responses written with one `writev` when the body
//! is ready, keep-alive and pipelining. hyper serves HTTP/2 (a connection
//! that opens with the h2 preface is handed back to [`crate::server`]) and
//! is the upstream client.
//!
//! Why not hyper's HTTP/1 server: it keeps an 8 KiB read buffer and an
//! 8 KiB write buffer for the whole life of every connection. Here an idle
//! keep-alive connection holds no buffer at all — reads go through the stack
//! and only a request's own bytes are kept while it lives — so ten thousand
//! idle connections cost about 40 MiB instead of 200.
//!
//! The framing rules follow hyper's, which the adversarial tests pin: one
//! `Transfer-Encoding` that ends in `chunked` wins over `Content-Length` (and
//! the connection then closes after the answer); differing or malformed
//! lengths, other transfer codings, obs-fold and bare CR are 400; a
//! `Transfer-Encoding` in an HTTP/1.0 request is 400.
use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{mpsc, watch, Notify};

use crate::body::{Body, BoxError, RequestBody};
use crate::error::GatewayError;
use crate::server::{ConnInfo, Handler};

/// Header lines per request at most (hyper's default); more is 431.
const MAX_HEADERS: usize = 100;
/// One read from the socket, on the stack.
const READ_CHUNK: usize = 8192;
/// A chunk-size line (with its extensions) longer than this is refused.
const MAX_CHUNK_LINE: usize = 4096;
/// Trailer bytes after the last chunk (read and dropped) at most.
const MAX_TRAILERS: usize = 16 * 1024;
/// What an HTTP/2 client sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The limits one connection is served under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// A request head must be complete this long after its first byte (the
    /// first request's: after the accept).
    pub(crate) header_read_timeout: Duration,
    /// A connection waiting this long for a next request is closed; so is
    /// one whose client takes none of a response write for this long.
    pub(crate) idle_timeout: Duration,
    /// A request head longer than this is refused with 431. The pipeline
    /// answers the configured `max_header_bytes` itself; this is the
    /// backstop that bounds what a connection buffers.
    pub(crate) max_head_bytes: usize,
    /// The configured `max_header_bytes`, named in the 431 body.
    pub(crate) max_header_bytes: usize,
}

/// How a served connection ended.
pub(crate) enum Ended {
    /// Closed (by either side, a timeout, an error or shutdown).
    Closed,
    /// The client opened with the HTTP/2 preface: these bytes were read and
    /// the rest of the connection is HTTP/2's.
    H2(Bytes),
}

/// Serves HTTP/1.1 requests on `io` until the connection ends.
pub(crate) async fn serve<S, H>(
    io: &mut S,
    handler: &Arc<H>,
    conn: &Arc<ConnInfo>,
    limits: Limits,
    stop: &mut watch::Receiver<bool>,
) -> io::Result<Ended>
where
    S: AsyncRead + AsyncWrite + Unpin,
    H: Handler,
{
    let mut rbuf = BytesMut::new();
    let mut first = true;
    // The current wait's deadline; the timer is armed no later than it and
    // re-armed only when it fires early, so a busy connection does not touch
    // the timer wheel per request.
    let mut deadline = Instant::now() + limits.header_read_timeout;
    let timer = tokio::time::sleep_until(deadline.into());
    tokio::pin!(timer);
    loop {
        // ---- a request head
        let head = loop {
            if !rbuf.is_empty() {
                if first && H2_PREFACE.starts_with(&rbuf[..rbuf.len().min(H2_PREFACE.len())]) {
                    if rbuf.len() >= H2_PREFACE.len() {
                        return Ok(Ended::H2(rbuf.freeze()));
                    }
                } else {
                    match parse_head(&mut rbuf) {
                        Ok(Some(head)) => break head,
                        Ok(None) if rbuf.len() > limits.max_head_bytes => {
                            return refuse(io, HeadError::TooLarge, limits).await;
                        }
                        Ok(None) => {}
                        Err(e) => return refuse(io, e, limits).await,
                    }
                }
            }
            let idle = rbuf.is_empty() && !first;
            if idle && *stop.borrow() {
                return Ok(Ended::Closed);
            }
            if timer.deadline().into_std() > deadline {
                timer.as_mut().reset(deadline.into());
            }
            tokio::select! {
                biased;
                read = read_more(io, &mut rbuf) => {
                    if read? == 0 {
                        return Ok(Ended::Closed);
                    }
                    if idle {
                        // A request head begins: it has header_read_timeout.
                        deadline = Instant::now() + limits.header_read_timeout;
                    }
                }
                () = &mut timer => {
                    if Instant::now() >= deadline {
                        tracing::debug!(peer = %conn.peer, idle, "HTTP/1 connection timed out waiting for a request");
                        return Ok(Ended::Closed);
                    }
                    timer.as_mut().reset(deadline.into());
                }
                changed = stop.changed(), if idle => {
                    if changed.is_err() {
                        return Ok(Ended::Closed);
                    }
                }
            }
        };
        first = false;

        // ---- the handler, with the body fed as it reads it
        let Head {
            req,
            framing,
            mut keep_alive,
            expect_continue,
        } = head;
        let head_request = req.method() == Method::HEAD;
        let http10 = req.version() == Version::HTTP_10;
        let res = match framing {
            Framing::Empty => {
                let req = req.map(|()| RequestBody::empty());
                // Boxed: the connection's own future stays small while idle.
                Box::pin(handler.handle(req, conn.clone())).await
            }
            // A small body usually arrives with its head: handed over whole,
            // it goes upstream with the request head in one write, and the
            // upstream connection never sees an answer before the body.
            Framing::Length(n) if rbuf.len() as u64 >= n => {
                let body = RequestBody::full(rbuf.split_to(n as usize).freeze());
                Box::pin(handler.handle(req.map(|()| body), conn.clone())).await
            }
            Framing::Length(_) | Framing::Chunked => {
                let (tx, rx) = mpsc::channel(1);
                let want = Arc::new(Notify::new());
                let length = match framing {
                    Framing::Length(n) => Some(n),
                    _ => None,
                };
                let req = req.map(|()| RequestBody::streamed(rx, want.clone(), length));
                let fut = Box::pin(handler.handle(req, conn.clone()));
                let feed = Feed {
                    tx: Some(tx),
                    want,
                    decoder: Decoder::new(framing),
                    expect_continue,
                };
                let (res, complete) = drive(io, &mut rbuf, fut, feed, limits.idle_timeout).await?;
                // Unread body bytes would be taken for the next request.
                keep_alive &= complete;
                res
            }
        };
        if *stop.borrow() {
            keep_alive = false;
        }
        let keep_alive = write_response(
            io,
            res,
            head_request,
            http10,
            keep_alive,
            limits.idle_timeout,
        )
        .await?;
        if !keep_alive {
            let _ = io.shutdown().await;
            return Ok(Ended::Closed);
        }
        if rbuf.is_empty() {
            // Drop the last request's allocation: idle, nothing is held.
            rbuf = BytesMut::new();
            deadline = Instant::now() + limits.idle_timeout;
        } else {
            // Pipelined: the next head has begun.
            deadline = Instant::now() + limits.header_read_timeout;
        }
    }
}

/// Reads what the socket has into `buf` (0 at end of stream). Through the
/// stack, so a connection waiting for bytes holds no buffer.
async fn read_more<S: AsyncRead + Unpin>(io: &mut S, buf: &mut BytesMut) -> io::Result<usize> {
    poll_fn(|cx| {
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
    })
    .await
}

/// Answers a head that cannot be served, then closes.
async fn refuse<S: AsyncWrite + Unpin>(
    io: &mut S,
    e: HeadError,
    limits: Limits,
) -> io::Result<Ended> {
    tracing::debug!(error = ?e, "refusing an HTTP/1 request head");
    let err = match e {
        HeadError::Bad(what) => GatewayError::BadRequest {
            message: format!("invalid request: {what}").into(),
            field: None,
        },
        HeadError::TooLarge => GatewayError::HeaderFieldsTooLarge {
            limit: limits.max_header_bytes,
        },
    };
    write_response(
        io,
        err.into_response(),
        false,
        false,
        false,
        limits.header_read_timeout,
    )
    .await?;
    let _ = io.shutdown().await;
    Ok(Ended::Closed)
}

// ---------------------------------------------------------------- heads

/// How a request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
}

/// A parsed request head and what it says about the connection.
#[derive(Debug)]
struct Head {
    req: Request<()>,
    framing: Framing,
    keep_alive: bool,
    expect_continue: bool,
}

/// Why a head is refused before any handler sees it.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// 400, saying what.
    Bad(&'static str),
    /// 431: too many header lines, or more bytes than the backstop.
    TooLarge,
}

/// Parses one request head off the front of `buf`; `None` until it is
/// complete.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, HeadError> {
    // (name start, name end, value start, value end) per header line.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
    let (len, method, path, version, count) = {
        let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let base = buf.as_ptr() as usize;
        let len = match req.parse_with_uninit_headers(buf, &mut slots) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
            Err(e) => return Err(HeadError::Bad(parse_error(e))),
        };
        let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        for (span, h) in spans.iter_mut().zip(req.headers.iter()) {
            let (n, v) = (offset(h.name.as_bytes()), offset(h.value));
            *span = (n, n + h.name.len() as u32, v, v + h.value.len() as u32);
        }
        let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
            .map_err(|_| HeadError::Bad("invalid method"))?;
        let path = req.path.unwrap_or_default();
        let path = (
            offset(path.as_bytes()),
            offset(path.as_bytes()) + path.len() as u32,
        );
        let version = match req.version {
            Some(1) => Version::HTTP_11,
            _ => Version::HTTP_10,
        };
        (len, method, path, version, req.headers.len())
    };
    let slice = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(slice.slice(path.0 as usize..path.1 as usize))
        .map_err(|_| HeadError::Bad("invalid request target"))?;
    let http11 = version == Version::HTTP_11;
    let mut keep_alive = http11;
    let mut expect_continue = false;
    let (mut length, mut saw_length, mut saw_te, mut te_chunked, mut saw_close) =
        (None, false, false, false, false);
    // Room for what the pipeline adds before forwarding (X-Forwarded-*,
    // X-Mpg-*, X-Request-Id): the map is not rehashed as it grows.
    let mut headers = HeaderMap::with_capacity(count + 12);
    for &(ns, ne, vs, ve) in &spans[..count] {
        let name = HeaderName::from_bytes(&slice[ns as usize..ne as usize])
            .map_err(|_| HeadError::Bad("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(slice.slice(vs as usize..ve as usize))
            .map_err(|_| HeadError::Bad("invalid header value"))?;
        if name == header::TRANSFER_ENCODING {
            if !http11 {
                return Err(HeadError::Bad("Transfer-Encoding in an HTTP/1.0 request"));
            }
            saw_te = true;
            if length.take().is_some() {
                headers.remove(header::CONTENT_LENGTH);
            }
            te_chunked = ends_in_chunked(&value);
        } else if name == header::CONTENT_LENGTH {
            saw_length = true;
            if saw_te {
                continue;
            }
            let n = parse_length(&value).ok_or(HeadError::Bad("invalid Content-Length"))?;
            match length {
                Some(prev) if prev != n => {
                    return Err(HeadError::Bad("differing Content-Length values"))
                }
                Some(_) => continue,
                None => length = Some(n),
            }
        } else if name == header::CONNECTION {
            if saw_close || has_token(&value, "close") {
                saw_close = true;
                keep_alive = false;
            } else if !keep_alive {
                keep_alive = has_token(&value, "keep-alive");
            }
        } else if name == header::EXPECT {
            // An HTTP/1.0 client's expectation is ignored (RFC 9110 §10.1.1).
            expect_continue = http11 && value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        }
        headers.append(name, value);
    }
    if saw_te && !te_chunked {
        return Err(HeadError::Bad("Transfer-Encoding other than chunked"));
    }
    if saw_te && saw_length {
        keep_alive = false;
    }
    let framing = match (saw_te, length) {
        (true, _) => Framing::Chunked,
        (false, Some(0) | None) => Framing::Empty,
        (false, Some(n)) => Framing::Length(n),
    };
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    *req.headers_mut() = headers;
    Ok(Some(Head {
        req,
        framing,
        keep_alive,
        expect_continue,
    }))
}

fn parse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Token => "invalid method or request target",
        httparse::Error::Version => "unsupported HTTP version",
        _ => "malformed request head",
    }
}

/// A `Content-Length` value: digits only (a list of equal values is one).
fn parse_length(value: &HeaderValue) -> Option<u64> {
    let mut found = None;
    for part in value.as_bytes().split(|&b| b == b',') {
        let digits = part.trim_ascii();
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        match found {
            Some(prev) if prev != n => return None,
            _ => found = Some(n),
        }
    }
    found
}

/// `chunked` must be the last transfer coding of a request (RFC 9112 §6.3).
fn ends_in_chunked(value: &HeaderValue) -> bool {
    value
        .as_bytes()
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Whether a comma-separated header value holds `token` (case-insensitive).
fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .as_bytes()
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

// ---------------------------------------------------------------- bodies

/// Decodes a request body off the front of the connection's buffer.
#[derive(Debug)]
enum Decoder {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers(usize),
    Done,
    /// Abandoned (an error, or the handler dropped the body): never done.
    Broken,
}

impl Decoder {
    fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::ChunkSize,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// The next piece of body in `buf`: `Some` data, or `None` when more
    /// bytes are needed or the body is done ([`Decoder::is_done`]).
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, &'static str> {
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
struct Feed {
    tx: Option<mpsc::Sender<Result<Bytes, BoxError>>>,
    want: Arc<Notify>,
    decoder: Decoder,
    expect_continue: bool,
}

/// The body could not be read to its end.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("request body framing: {0}")]
    Framing(&'static str),
    #[error("the connection ended inside the request body")]
    Eof,
    #[error("reading the request body: {0}")]
    Io(#[from] io::Error),
}

/// Runs the handler while feeding it the request body as it asks; returns
/// its response and whether the body was read to its end.
async fn drive<S>(
    io: &mut S,
    rbuf: &mut BytesMut,
    mut handler: Pin<Box<impl Future<Output = Response<Body>>>>,
    mut feed: Feed,
    send_timeout: Duration,
) -> io::Result<(Response<Body>, bool)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut wanted = false;
    loop {
        let feeding = wanted && feed.tx.is_some();
        tokio::select! {
            biased;
            res = &mut handler => {
                // A body that is already buffered is read past, so the
                // connection can stay open.
                while !feed.decoder.is_done() {
                    match feed.decoder.decode(rbuf) {
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
                return Ok((res, feed.decoder.is_done()));
            }
            () = feed.want.notified(), if !wanted => {
                wanted = true;
                if feed.expect_continue {
                    send(io, &mut &b"HTTP/1.1 100 Continue\r\n\r\n"[..], send_timeout).await?;
                }
            }
            piece = next_piece(io, rbuf, &mut feed.decoder, feed.tx.as_ref()), if feeding => {
                match piece {
                    Ok(()) => {}
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
/// and sends it, reading from the socket as needed. Cancel-safe: state
/// changes only between awaits.
async fn next_piece<S: AsyncRead + Unpin>(
    io: &mut S,
    rbuf: &mut BytesMut,
    decoder: &mut Decoder,
    tx: Option<&mpsc::Sender<Result<Bytes, BoxError>>>,
) -> Result<(), BodyError> {
    let Some(tx) = tx else { return Ok(()) };
    let Ok(permit) = tx.reserve().await else {
        // The handler dropped the body: read no further.
        *decoder = Decoder::Broken;
        return Ok(());
    };
    loop {
        match decoder.decode(rbuf).map_err(BodyError::Framing)? {
            Some(data) => {
                permit.send(Ok(data));
                return Ok(());
            }
            None if decoder.is_done() => return Ok(()),
            None => {
                if read_more(io, rbuf).await? == 0 {
                    return Err(BodyError::Eof);
                }
            }
        }
    }
}

// ---------------------------------------------------------------- responses

/// Writes `res` (its head and body in one write when the body is ready);
/// returns whether the connection can carry another request.
async fn write_response<S: AsyncWrite + Unpin>(
    io: &mut S,
    res: Response<Body>,
    head_request: bool,
    http10: bool,
    mut keep_alive: bool,
    send_timeout: Duration,
) -> io::Result<bool> {
    let (parts, mut body) = res.into_parts();
    let status = parts.status;
    let no_length = status.is_informational() || status == StatusCode::NO_CONTENT;
    let bodyless = head_request || no_length || status == StatusCode::NOT_MODIFIED;
    if parts
        .headers
        .get(header::CONNECTION)
        .is_some_and(|v| has_token(v, "close"))
    {
        keep_alive = false;
    }
    let declared = match parts.headers.get(header::CONTENT_LENGTH) {
        Some(v) => parse_length(v),
        None => body.size_hint().exact(),
    };
    let chunked = !bodyless && declared.is_none() && !http10;
    if !bodyless && declared.is_none() && http10 {
        // HTTP/1.0 has no chunked coding: the body ends with the connection.
        keep_alive = false;
    }

    let mut head = Vec::with_capacity(160 + parts.headers.len() * 40);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    let mut has_date = false;
    for (name, value) in &parts.headers {
        if name == header::CONNECTION
            || name == header::TRANSFER_ENCODING
            || name == header::CONTENT_LENGTH
            || name.as_str() == "keep-alive"
        {
            continue;
        }
        has_date |= name == header::DATE;
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
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
        write_date(&mut head);
    }
    head.extend_from_slice(b"\r\n");

    if bodyless {
        drop(body);
        send(io, &mut &head[..], send_timeout).await?;
        return Ok(keep_alive);
    }
    let mut pending = Some(Bytes::from(head));
    let mut written = 0u64;
    loop {
        let next = if pending.is_some() {
            // Head and body go out together when the body is ready now.
            match body.frame().now_or_never() {
                Some(next) => next,
                None => {
                    if let Some(mut head) = pending.take() {
                        send(io, &mut head, send_timeout).await?;
                    }
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
        let size_line = match chunked && !data.is_empty() {
            true => Bytes::from(format!("{:x}\r\n", data.len())),
            false => Bytes::new(),
        };
        let tail: &'static [u8] = match (chunked, end, data.is_empty()) {
            (false, _, _) => b"",
            (true, true, true) => b"0\r\n\r\n",
            (true, true, false) => b"\r\n0\r\n\r\n",
            (true, false, _) => b"\r\n",
        };
        let mut out = pending
            .take()
            .unwrap_or_default()
            .chain(size_line)
            .chain(data)
            .chain(tail);
        send(io, &mut out, send_timeout).await?;
        if end {
            return Ok(keep_alive);
        }
    }
}

/// Writes all of `buf` (vectored) and flushes; fails when the client takes
/// nothing for `limit` (a reader stalled, or gone without closing: nginx's
/// `send_timeout`), so that a client cannot hold its connection, and the
/// upstream response behind it, forever.
async fn send<S: AsyncWrite + Unpin, B: Buf>(
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
        let write = poll_fn(|cx| {
            let mut slices = [io::IoSlice::new(&[]); 8];
            let n = buf.chunks_vectored(&mut slices);
            Pin::new(&mut *io).poll_write_vectored(cx, &slices[..n])
        });
        match tokio::time::timeout(limit, write).await {
            Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => buf.advance(n),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(stalled()),
        }
    }
    tokio::time::timeout(limit, io.flush())
        .await
        .unwrap_or_else(|_| Err(stalled()))
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

    fn head(raw: &str) -> Result<Option<Head>, HeadError> {
        parse_head(&mut BytesMut::from(raw))
    }

    fn framing(raw: &str) -> Result<(Framing, bool), HeadError> {
        head(raw).map(|h| {
            let h = h.expect("complete head");
            (h.framing, h.keep_alive)
        })
    }

    #[test]
    fn parses_a_head_and_leaves_what_follows() {
        let mut buf = BytesMut::from(
            "GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Two: 1\r\nX-Two: 2\r\n\r\nGET /next",
        );
        let h = parse_head(&mut buf).unwrap().unwrap();
        assert_eq!(h.req.method(), Method::GET);
        assert_eq!(h.req.uri(), "/a?b=1");
        assert_eq!(h.req.version(), Version::HTTP_11);
        assert_eq!(h.req.headers()["host"], "x");
        assert_eq!(h.req.headers().get_all("x-two").iter().count(), 2);
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, true));
        assert_eq!(&buf[..], b"GET /next");
        assert!(head("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = |extra: &str| framing(&format!("POST / HTTP/1.1\r\nHost: x\r\n{extra}\r\n"));
        assert_eq!(h("Content-Length: 5\r\n"), Ok((Framing::Length(5), true)));
        assert_eq!(h("Content-Length: 0\r\n"), Ok((Framing::Empty, true)));
        assert_eq!(
            h("Content-Length: 5, 5\r\n"),
            Ok((Framing::Length(5), true))
        );
        assert_eq!(
            h("Transfer-Encoding: chunked\r\n"),
            Ok((Framing::Chunked, true))
        );
        assert_eq!(
            h("Transfer-Encoding: gzip, Chunked\r\n"),
            Ok((Framing::Chunked, true))
        );
        // Both: chunked wins, the length is dropped, the connection closes after.
        for both in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 60\r\n",
        ] {
            let parsed = head(&format!("POST / HTTP/1.1\r\nHost: x\r\n{both}\r\n"))
                .unwrap()
                .unwrap();
            assert_eq!(
                (parsed.framing, parsed.keep_alive),
                (Framing::Chunked, false)
            );
            assert!(parsed.req.headers().get("content-length").is_none());
        }
        for bad in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: 5, 6\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 0x5\r\n",
            "Content-Length: 5 5\r\n",
            "Content-Length: 99999999999999999999999\r\n",
            "Transfer-Encoding: xchunked\r\n",
            "Transfer-Encoding: chunked, identity\r\n",
            "Transfer-Encoding : chunked\r\n",
            "X-Folded: a\r\n Transfer-Encoding: chunked\r\n",
            "X-A: a\rContent-Length: 99\r\n",
        ] {
            assert!(matches!(h(bad), Err(HeadError::Bad(_))), "{bad:?}");
        }
        assert!(matches!(
            framing("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
    }

    #[test]
    fn keep_alive_by_version_and_connection_header() {
        assert_eq!(
            framing("GET / HTTP/1.0\r\n\r\n"),
            Ok((Framing::Empty, false))
        );
        assert_eq!(
            framing("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"),
            Ok((Framing::Empty, true))
        );
        assert_eq!(
            framing("GET / HTTP/1.1\r\nConnection: te, close\r\n\r\n"),
            Ok((Framing::Empty, false))
        );
        // A later keep-alive does not undo a close.
        assert_eq!(
            framing("GET / HTTP/1.0\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n"),
            Ok((Framing::Empty, false))
        );
    }

    #[test]
    fn too_many_headers_is_431_and_garbage_is_400() {
        let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
        assert_eq!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            HeadError::TooLarge
        );
        for bad in [
            "GARBAGE\r\n\r\n",
            "GET /x HTTP/9.9\r\n\r\n",
            "GET  / HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(head(bad), Err(HeadError::Bad(_))), "{bad:?}");
        }
    }

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

    #[test]
    fn length_parsing_is_strict() {
        let v = |s: &'static str| parse_length(&HeaderValue::from_static(s));
        assert_eq!(v("0"), Some(0));
        assert_eq!(v(" 42 "), Some(42));
        assert_eq!(v("7,7"), Some(7));
        for bad in ["", "+5", "5 5", "0x5", "7,8", "18446744073709551616000"] {
            assert_eq!(v(bad), None, "{bad:?}");
        }
    }
}
