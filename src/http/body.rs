//! The one body type every response and forwarded request uses.
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

use crate::http::relayed::RelayedFields;
use std::sync::atomic::{AtomicBool, Ordering};

/// Error type carried by streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streamed or full body, boxed once so every path returns the same type;
/// a target's response also carries its relayed fields
/// (`proxy::relayed`) here, which the HTTP/1.1 writer writes as
/// they arrived.
pub struct Body {
    inner: BoxBody<Bytes, BoxError>,
    relayed: Option<RelayedFields>,
}

impl Body {
    /// `body`, boxed.
    pub fn new<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync + 'static,
    {
        Body {
            inner: BoxBody::new(body),
            relayed: None,
        }
    }

    /// This body, with a target's response fields to relay.
    pub(crate) fn relaying(mut self, relayed: Option<RelayedFields>) -> Self {
        self.relayed = relayed;
        self
    }

    /// The relayed fields, taken.
    pub(crate) fn take_relayed(&mut self) -> Option<RelayedFields> {
        self.relayed.take()
    }

    /// This body as a `HEAD` answer's: no bytes and no size of its own (the
    /// length to send is the response's `Content-Length` field), the
    /// relayed fields kept.
    pub(crate) fn into_bodyless(mut self) -> Self {
        Body {
            inner: BoxBody::new(Bodyless),
            relayed: self.relayed.take(),
        }
    }
}

/// The body of a `HEAD` answer: ended, its size unknown (an exact size of
/// 0 would be written as `Content-Length: 0`).
struct Bodyless;

impl http_body::Body for Bodyless {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        std::task::Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::default()
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body")
            .field("relayed", &self.relayed.as_ref().map(RelayedFields::len))
            .finish_non_exhaustive()
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A body holding `bytes` in full.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Body::new(Full::new(bytes.into()).map_err(|never| match never {}))
}

/// A body with nothing in it.
pub fn empty() -> Body {
    Body::new(Empty::<Bytes>::new().map_err(|never| match never {}))
}

/// After an answer sent before the request body ended (a refusal, or a
/// target that answered early), what is left of the body is read and thrown
/// away, so that the client's upload ends normally: HTTP/2 without a
/// `RST_STREAM` (older nghttp2-based clients, curl 7.88 among them, fail a
/// request whose stream is reset while they are still sending, even after
/// its whole response), HTTP/1.1 with the connection kept (or closed only
/// once the client has stopped sending). At most this many bytes are read;
/// past it the stream is reset, or the connection closed. Several times the
/// default `max_body_bytes`, tens of milliseconds of reading on a LAN: an
/// upload somewhat over the limit finishes cleanly, a huge one is cut.
pub(crate) const DRAIN_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// The longest the rest of a body is read for, from when the answer is
/// ready (nginx's `lingering_time`).
pub(crate) const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(30);
/// The longest the drain waits for the client's next bytes (nginx's
/// `lingering_timeout`): a client that stopped sending without ending its
/// body has its stream reset (or its connection closed) this soon.
pub(crate) const DRAIN_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// A body that fails with [`TooLarge`] once it has given more than its
/// limit. Unlike `http_body_util::Limited`, its size hint is the inner
/// body's own: `Limited` turns a hint at or past the limit into an exact
/// size equal to the limit, which the upstream client would then declare as
/// the `Content-Length` of a body its client never sent whole.
pub struct Limited<B> {
    inner: B,
    remaining: u64,
}

impl<B> Limited<B> {
    /// `inner`, limited to `limit` bytes.
    pub fn new(inner: B, limit: u64) -> Self {
        Limited {
            inner,
            remaining: limit,
        }
    }
}

/// A body went past its limit (`server.limits.max_body_bytes`).
#[derive(Debug, thiserror::Error)]
#[error("the body is larger than its limit")]
pub struct TooLarge;

impl<B> http_body::Body for Limited<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let frame = match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            std::task::Poll::Pending => return std::task::Poll::Pending,
            std::task::Poll::Ready(frame) => frame,
        };
        std::task::Poll::Ready(match frame {
            Some(Ok(frame)) => match frame.data_ref().map(|d| d.len() as u64) {
                Some(n) if n > this.remaining => {
                    this.remaining = 0;
                    Some(Err(Box::new(TooLarge)))
                }
                Some(n) => {
                    this.remaining -= n;
                    Some(Ok(frame))
                }
                None => Some(Ok(frame)),
            },
            Some(Err(e)) => Some(Err(e.into())),
            None => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request's body as handlers receive it, from either server: hyper's
/// (HTTP/2) or ours (HTTP/1.1, see [`crate::h1`]). An HTTP/2 body dropped
/// before its end is drained ([`DRAIN_MAX_BYTES`]); an HTTP/1.1 one is
/// drained by its connection.
pub struct RequestBody {
    kind: Kind,
}

enum Kind {
    Empty,
    /// Received whole with its head: given out at once.
    Full(Option<Bytes>),
    Hyper {
        body: hyper::body::Incoming,
        /// Seen to have ended, so that dropping it need not ask h2 again
        /// (each ask takes the connection's lock).
        ended: AtomicBool,
    },
    Streamed(Streamed),
}

/// An HTTP/1.1 body that the connection reads from the socket and decodes
/// as the handler asks for it.
struct Streamed {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, BoxError>>,
    /// Told once, on the first poll: the connection starts reading (and
    /// sends `100 Continue` if the client waits for one).
    want: Option<std::sync::Arc<tokio::sync::Notify>>,
    hint: http_body::SizeHint,
    ended: bool,
}

impl RequestBody {
    /// No body.
    pub fn empty() -> Self {
        RequestBody { kind: Kind::Empty }
    }

    /// A body already received whole.
    pub(crate) fn full(data: Bytes) -> Self {
        RequestBody {
            kind: Kind::Full(Some(data)),
        }
    }

    /// A body fed through `rx` once `want` has been notified; `length` when
    /// the request declared one.
    pub(crate) fn streamed(
        rx: tokio::sync::mpsc::Receiver<Result<Bytes, BoxError>>,
        want: std::sync::Arc<tokio::sync::Notify>,
        length: Option<u64>,
    ) -> Self {
        let hint = match length {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        };
        RequestBody {
            kind: Kind::Streamed(Streamed {
                rx,
                want: Some(want),
                hint,
                ended: false,
            }),
        }
    }
}

impl From<hyper::body::Incoming> for RequestBody {
    fn from(body: hyper::body::Incoming) -> Self {
        RequestBody {
            kind: Kind::Hyper {
                body,
                ended: AtomicBool::new(false),
            },
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // Only a body the handler left unread costs more than this test.
        let unread = match &mut self.kind {
            Kind::Hyper { body, ended } => {
                !*ended.get_mut() && !http_body::Body::is_end_stream(body)
            }
            _ => false,
        };
        if unread {
            if let Kind::Hyper { body, .. } = std::mem::replace(&mut self.kind, Kind::Empty) {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(drain_h2(body));
                }
            }
        }
    }
}

/// Reads what is left of an HTTP/2 request body and throws it away (reading
/// gives the client its flow-control window back), within the drain bounds.
/// The stream stays open meanwhile: h2 resets it (`NO_ERROR`, RFC 9113
/// §8.1) only when the last handle on it goes, which is here, after the
/// client's `END_STREAM` or once a bound is passed.
async fn drain_h2(mut body: hyper::body::Incoming) {
    use tokio::time::{timeout_at, Instant};
    let deadline = Instant::now() + DRAIN_TIME;
    let mut left = DRAIN_MAX_BYTES;
    loop {
        let by = deadline.min(Instant::now() + DRAIN_IDLE);
        match timeout_at(by, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                if n > left {
                    tracing::debug!("request body left unread past the drain limit: stream reset");
                    return;
                }
                left -= n;
            }
            // The body ended, or the client reset the stream.
            Ok(None | Some(Err(_))) => return,
            Err(_) => {
                tracing::debug!("request body not ended within the drain time: stream reset");
                return;
            }
        }
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        match &mut self.get_mut().kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(http_body::Frame::data(d)))),
            Kind::Hyper { body, ended } => {
                let frame = std::pin::Pin::new(body).poll_frame(cx);
                if let Poll::Ready(None) = frame {
                    ended.store(true, Ordering::Relaxed);
                }
                frame.map_err(|e| Box::new(e) as BoxError)
            }
            Kind::Streamed(s) => {
                if s.ended {
                    return Poll::Ready(None);
                }
                if let Some(want) = s.want.take() {
                    want.notify_one();
                }
                match s.rx.poll_recv(cx) {
                    Poll::Ready(Some(Ok(data))) => {
                        let n = data.len() as u64;
                        if let Some(exact) = s.hint.exact() {
                            s.hint.set_exact(exact.saturating_sub(n));
                        }
                        Poll::Ready(Some(Ok(http_body::Frame::data(data))))
                    }
                    Poll::Ready(Some(Err(e))) => {
                        s.ended = true;
                        Poll::Ready(Some(Err(e)))
                    }
                    Poll::Ready(None) => {
                        s.ended = true;
                        Poll::Ready(None)
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Full(data) => data.is_none(),
            Kind::Hyper { body, ended } => {
                let end = body.is_end_stream();
                if end {
                    ended.store(true, Ordering::Relaxed);
                }
                end
            }
            Kind::Streamed(s) => s.ended || s.hint.exact() == Some(0),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            Kind::Empty => http_body::SizeHint::with_exact(0),
            Kind::Full(data) => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Hyper { body, .. } => body.size_hint(),
            Kind::Streamed(s) => s.hint,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    #[tokio::test]
    async fn a_limited_body_keeps_its_size_and_fails_past_the_limit() {
        // `http_body_util::Limited` would say exactly 4 here: a length the
        // upstream client would declare for a body it never gets whole.
        let body = Limited::new(full("0123456789"), 4);
        assert_eq!(body.size_hint().exact(), Some(10));
        let err = http_body_util::BodyExt::collect(body).await.unwrap_err();
        assert!(err.is::<TooLarge>(), "{err}");
        let body = Limited::new(full("0123"), 4);
        assert_eq!(body.size_hint().exact(), Some(4));
        let got = http_body_util::BodyExt::collect(body).await.unwrap();
        assert_eq!(got.to_bytes(), "0123");
    }
}
