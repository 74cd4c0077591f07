//! The one body type every response and forwarded request uses. Beside it:
//! the request body handlers receive ([`RequestBody`]), a body bounded to
//! a size ([`Limited`]), and the bounds on reading past an unread request
//! body after its answer ([`DRAIN_MAX_BYTES`] and the others).
mod drain;
mod limited;
mod request;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

use crate::http_core::relayed::RelayedFields;
pub(crate) use drain::{read_before_answer, Unread, DRAIN_IDLE, DRAIN_MAX_BYTES, DRAIN_TIME};
pub use limited::{Limited, TooLarge};
pub use request::RequestBody;

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
