//! What one listener's connections are bounded by: the count, the time a
//! request head may take, idleness, head size and the drain's grace.
use std::time::Duration;

use crate::config::Limits;

/// Connection-level limits of one listener.
#[derive(Debug, Clone)]
pub struct ListenerLimits {
    /// `gateway` or `admin`, for metrics.
    pub name: &'static str,
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// TLS handshake and request headers must complete within this: the
    /// first request's from the accept, a later one's from its first byte.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Request header bytes the pipeline accepts (a head past twice this is
    /// refused before it is buffered).
    pub max_header_bytes: usize,
    /// In-flight requests get this long after shutdown starts.
    pub shutdown_grace: Duration,
}

impl ListenerLimits {
    /// The gateway listener's limits from `[server.limits]`.
    pub fn gateway(l: &Limits) -> Self {
        ListenerLimits {
            name: "gateway",
            max_connections: l.max_connections,
            header_read_timeout: l.header_read_timeout,
            idle_timeout: l.idle_timeout,
            max_header_bytes: l.max_header_bytes,
            shutdown_grace: l.shutdown_grace,
        }
    }
}

/// The most head bytes a connection buffers: well above `max_header_bytes`,
/// so that the pipeline answers a too-large head with its own 431.
pub(super) fn head_backstop(limits: &ListenerLimits) -> usize {
    (limits.max_header_bytes * 2).max(16 * 1024)
}
