//! The server side of HTTP/1.1 (RFC 9112): request heads parsed with
//! `httparse`, bodies framed by `Content-Length` or `chunked` and decoded as
//! the handler reads them, responses written in one write when the body is
//! ready, keep-alive and pipelining. hyper serves HTTP/2 (a connection that
//! opens with the h2 preface is handed back to [`crate::server`]).
//!
//! Why not hyper's HTTP/1 server: it keeps an 8 KiB read buffer and an
//! 8 KiB write buffer for the whole life of every connection. Here an idle
//! keep-alive connection holds no buffer at all — reads go through the stack
//! and only a request's own bytes are kept while it lives — so a gateway
//! holding many idle connections stays small (`benches/load/README.md` has
//! the figure for ten thousand).
//!
//! The framing rules follow hyper's, which the adversarial tests pin: one
//! `Transfer-Encoding` that ends in `chunked` wins over `Content-Length` (and
//! the connection then closes after the answer); differing or malformed
//! lengths, other transfer codings, obs-fold and bare CR are 400; a
//! `Transfer-Encoding` in an HTTP/1.0 request is 400.
mod body;
mod head;
mod response;

use bytes::{Bytes, BytesMut};
use http::{Method, Version};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, Notify};

use crate::clock;
use crate::h1::codec::{after_queued_tasks, read_more, Decoder, Framing};
use crate::http_core::body::RequestBody;
use crate::http_core::service::{ConnInfo, Handler, Refusal, Reply};
use body::{discard, drive, Feed, Rest};
pub(crate) use head::parse_head;
use head::{Head, HeadError};
use response::write_response;

/// During a drain, a connection with no request in flight is closed once it
/// has been quiet this long (at once if it already has): long enough for a
/// client's next request, sent on a response that did not announce the
/// close, to arrive and be answered with `Connection: close`.
const DRAIN_LINGER: Duration = Duration::from_secs(1);
/// What an HTTP/2 client sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The limits one HTTP/1.1 connection is served under: how long a head and
/// an idle wait may take, and how large a head may grow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// A request head must be complete this long after its first byte. The
    /// first request's is timed from the accept instead (TLS handshake
    /// included): its deadline is [`serve`]'s `first_head_by`.
    pub(crate) header_read_timeout: Duration,
    /// A connection waiting this long for a next request is closed; so is
    /// one whose client takes none of a response write, or sends none of a
    /// request body being read, for this long.
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

/// Serves HTTP/1.1 requests on `io` until the connection ends. The first
/// request's head (or the HTTP/2 preface) must be complete by
/// `first_head_by`: `header_read_timeout` after the accept, so that a TLS
/// handshake and the head share one allowance rather than getting one each.
///
/// One piece, read by its `// ----` sections: the loop is the hottest code in
/// the gateway, and split into awaited steps (a wait for the head, an answer)
/// it cost measurably more instructions per request, in the polls of the
/// nested futures (`benches/load/FINDINGS.md`).
pub(crate) async fn serve<S, H>(
    io: &mut S,
    handler: &Arc<H>,
    conn: &Arc<ConnInfo>,
    limits: ConnectionLimits,
    first_head_by: Instant,
    stop: &watch::Receiver<bool>,
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
    let mut deadline = first_head_by;
    let timer = tokio::time::sleep_until(deadline.into());
    tokio::pin!(timer);
    // Shutdown, watched by one future for the connection's life: a
    // `changed()` made for each wait would add and remove a waiter in the
    // channel on every request.
    let stopping = crate::http_core::service::stopped(stop.clone());
    tokio::pin!(stopping);
    // Set once the drain has been seen while waiting for a request: the
    // connection then closes at `deadline`, which is no later than
    // DRAIN_LINGER after it last went quiet.
    let mut draining = false;
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
                            return refuse(io, &**handler, HeadError::TooLarge, limits).await;
                        }
                        Ok(None) => {}
                        Err(e) => return refuse(io, &**handler, e, limits).await,
                    }
                }
            }
            // No byte of a request yet (a fresh connection's first, or a
            // keep-alive connection's next): nothing is in flight, so a drain
            // closes the connection here, once a read has found nothing and
            // it has been quiet for DRAIN_LINGER.
            let waiting = rbuf.is_empty();
            let idle = waiting && !first;
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
                        deadline = clock::now() + limits.header_read_timeout;
                    }
                }
                () = &mut timer => {
                    if clock::now() >= deadline {
                        tracing::debug!(peer = %conn.peer, idle, draining, "HTTP/1 connection timed out waiting for a request");
                        return Ok(Ended::Closed);
                    }
                    timer.as_mut().reset(deadline.into());
                }
                () = &mut stopping, if waiting && !draining => {
                    // Quiet since the accept or since the last response
                    // ended: what the deadline was counted from.
                    let counted = match first {
                        true => limits.header_read_timeout,
                        false => limits.idle_timeout,
                    };
                    let close_at = deadline
                        .checked_sub(counted)
                        .map_or(deadline, |quiet_since| quiet_since + DRAIN_LINGER);
                    if clock::now() >= close_at {
                        return Ok(Ended::Closed);
                    }
                    // A client that just had a response (one whose head
                    // went out before the drain, so without `Connection:
                    // close`) may be sending its next request already: it
                    // is answered, with `Connection: close`, not reset.
                    draining = true;
                    deadline = deadline.min(close_at);
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
        // A body the handler answered before reading to its end: read past
        // after the answer (see `crate::http_core::body::DRAIN_MAX_BYTES`).
        let mut unread = None;
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
                let (res, rest) = drive(io, &mut rbuf, fut, feed, limits.idle_timeout).await?;
                // Unread body bytes would be taken for the next request: the
                // connection is kept only for a rest that will be read past.
                keep_alive &= rest.keeps_alive();
                if let Rest::Unread { decoder, .. } = rest {
                    unread = Some(decoder);
                }
                res
            }
        };
        if *stop.borrow() {
            keep_alive = false;
        }
        // Written after the other ready requests: see `after_queued_tasks`.
        after_queued_tasks().await;
        let keep_alive = write_response(
            io,
            res,
            head_request,
            http10,
            keep_alive,
            limits.idle_timeout,
        )
        .await?;
        if let Some(decoder) = unread {
            // The client may still be sending: closing now, with its bytes
            // unread, would reset the connection, and a reset can reach the
            // client before it has read the answer. The rest is read and
            // thrown away (after our FIN when the connection is to close:
            // nginx's lingering close), then the connection goes on or closes.
            if !keep_alive {
                let _ = io.shutdown().await;
            }
            // Boxed: a connection's own future keeps no room for it.
            let ended = Box::pin(discard(io, &mut rbuf, decoder)).await;
            if !keep_alive || !ended {
                if keep_alive {
                    let _ = io.shutdown().await;
                }
                return Ok(Ended::Closed);
            }
        }
        if !keep_alive {
            let _ = io.shutdown().await;
            return Ok(Ended::Closed);
        }
        if rbuf.is_empty() {
            // Drop the last request's allocation: idle, nothing is held.
            rbuf = BytesMut::new();
            deadline = clock::now() + limits.idle_timeout;
        } else {
            // Pipelined: the next head has begun.
            deadline = clock::now() + limits.header_read_timeout;
        }
    }
}

/// Answers a head that cannot be served with the handler's response to
/// its [`Refusal`], then closes.
async fn refuse<S: AsyncWrite + Unpin, H: Handler>(
    io: &mut S,
    handler: &H,
    e: HeadError,
    limits: ConnectionLimits,
) -> io::Result<Ended> {
    tracing::debug!(error = ?e, "refusing an HTTP/1 request head");
    let refusal = match e {
        HeadError::Bad(what) => Refusal::BadRequest(what),
        HeadError::TooLarge => Refusal::HeaderFieldsTooLarge {
            limit: limits.max_header_bytes,
        },
    };
    write_response(
        io,
        Reply::<()>::from(handler.refuse(refusal)),
        false,
        false,
        false,
        limits.header_read_timeout,
    )
    .await?;
    let _ = io.shutdown().await;
    Ok(Ended::Closed)
}
