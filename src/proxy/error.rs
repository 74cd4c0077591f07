//! Why forwarding a request failed, as the pipeline maps it to a response
//! and the health rules count it against a target (or not).
use crate::h1::client::ClientError;
use crate::http_core::body::BoxError;

/// Why forwarding failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The target could not be reached, or the connect timed out (→ 502).
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] BoxError),
    /// No response headers within `request_timeout` (or `timeout`) (→ 504).
    #[error("the upstream did not answer in time")]
    Timeout,
    /// The connection failed mid-request (→ 502).
    #[error("the upstream connection failed: {0}")]
    Reset(#[source] BoxError),
    /// The client's request body went over `max_body_bytes` while streaming (→ 413).
    #[error("the request body is too large")]
    BodyTooLarge,
    /// Every target is ejected (→ 503 with `Retry-After`).
    #[error("every target of the upstream is down")]
    Unavailable {
        /// Whole seconds until the first target's cool-down ends (at least 1).
        retry_after: u64,
    },
    /// Every healthy target is at `max_connections_per_target` (→ 503).
    #[error("every target of the upstream is at its connection limit")]
    Saturated,
    /// The upstream configuration is unusable.
    #[error("invalid upstream: {0}")]
    Config(String),
}

impl UpstreamError {
    /// Whether the client caused it, through its request body: never held
    /// against the target's health.
    pub(crate) fn is_client_side(&self) -> bool {
        matches!(self, UpstreamError::BodyTooLarge) || self.client_body_error().is_some()
    }

    /// The client's request body failing (cut off, malformed, stalled) as
    /// the cause of a `Reset`.
    pub(crate) fn client_body_error(&self) -> Option<&ClientError> {
        match self {
            UpstreamError::Reset(e) => e
                .downcast_ref::<ClientError>()
                .filter(|e| matches!(e, ClientError::Body(_))),
            _ => None,
        }
    }
}
