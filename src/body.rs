//! The one body type every response and forwarded request uses.
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

/// Error type carried by streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streamed or full body, boxed once so every path returns the same type.
pub type Body = BoxBody<Bytes, BoxError>;

/// A body holding `bytes` in full.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body with nothing in it.
pub fn empty() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}
