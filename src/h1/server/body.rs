//! A request body while its handler runs: fed to the handler as it reads it
//! (with the `100 Continue` a client may wait for), and what is left of it
//! once the handler has answered, read past within the drain bounds.
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify};

use super::response::send;
use crate::h1::codec::read_more;
use crate::h1::codec::Decoder;
use crate::http_core::body::{BoxError, DRAIN_IDLE, DRAIN_MAX_BYTES, DRAIN_TIME};
use crate::http_core::service::{Reply, Stamp};

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
            Rest::Unread { decoder, .. } => decoder
                .length_left()
                .is_none_or(|left| left <= DRAIN_MAX_BYTES),
        }
    }
}

/// Runs the handler while feeding it the request body as it asks; returns
/// its response and what is left of the body. `idle_timeout` bounds each
/// wait for the client: to take the `100 Continue`, and to send more of a
/// body the handler is waiting for (nginx's `client_body_timeout`; nothing
/// else ends a stalled upload to the built-in key service).
pub(super) async fn drive<S, T>(
    io: &mut S,
    rbuf: &mut BytesMut,
    mut handler: Pin<Box<impl Future<Output = Reply<T>>>>,
    mut feed: Feed,
    idle_timeout: Duration,
) -> io::Result<(Reply<T>, Rest)>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: Stamp,
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
                        Err(_) => feed.decoder.abandon(),
                    }
                }
                let rest = if feed.decoder.is_done() {
                    Rest::Read
                } else if feed.decoder.is_broken() {
                    Rest::Broken
                } else {
                    Rest::Unread {
                        decoder: feed.decoder,
                        expecting: feed.expect_continue && !wanted,
                    }
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
                        feed.decoder.abandon();
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
