//! Why an exchange on a connection to a target failed.
use std::io;

use crate::http_core::body::{Body, BoxError};

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
