//! The one body type every response and forwarded request uses.
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

use crate::proxy::relayed::RelayedFields;

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
/// (HTTP/2) or ours (HTTP/1.1, see [`crate::h1`]).
pub struct RequestBody {
    kind: Kind,
}

enum Kind {
    Empty,
    /// Received whole with its head: given out at once.
    Full(Option<Bytes>),
    Hyper(hyper::body::Incoming),
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
            kind: Kind::Hyper(body),
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
            Kind::Hyper(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
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
            Kind::Hyper(b) => b.is_end_stream(),
            Kind::Streamed(s) => s.ended || s.hint.exact() == Some(0),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            Kind::Empty => http_body::SizeHint::with_exact(0),
            Kind::Full(data) => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Hyper(b) => b.size_hint(),
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
