//! One target of an upstream (a host named in its `targets`): where it is,
//! the `Host` its requests carry, its idle connections and connection
//! permits, and the counters the health rules (`health`) keep for it.
use http::header::HeaderValue;
use http::uri::{Authority, Parts, PathAndQuery, Scheme};
use http::Uri;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

use super::error::UpstreamError;
use super::pool::Pool;
use crate::metrics::names;

/// One target of an upstream.
pub(crate) struct Target {
    pub(crate) scheme: Scheme,
    pub(crate) authority: Authority,
    /// The target as configured (metric label and log field).
    pub(crate) label: String,
    /// Requests in flight (response body included).
    pub(crate) outstanding: AtomicUsize,
    /// Consecutive failures.
    pub(super) fails: AtomicU32,
    /// 0: in rotation. Else ejected: out while `now < ejected_until`, then
    /// half-open (one request may claim a probe) until a success.
    pub(super) ejected_until: AtomicU64,
    /// Probes claimed since the ejection: the next back-off doubles with each.
    pub(super) probes: AtomicU32,
    /// `max_connections_per_target` permits.
    pub(crate) permits: Arc<Semaphore>,
    /// Its idle HTTP/1.1 connections.
    pub(crate) pool: Pool,
    /// The `Host` header requests to it carry.
    pub(crate) host: HeaderValue,
    pub(super) ejections: metrics::Counter,
    /// `mpg_upstream_target_up`: 1 while `ejected_until` is 0, else 0.
    pub(super) up: metrics::Gauge,
    /// Whether `up` shows this target's state: from `Targets::publish` to
    /// `Targets::retire`. Taken only when the state changes (ejected, or
    /// back), never on a request's usual path.
    pub(super) shown: Mutex<bool>,
    /// The last error logged for this target, for the console; written
    /// only with an incident's log line.
    pub(super) last_error: Mutex<Option<String>>,
}

impl Target {
    /// Target `label` (at `scheme://authority`) of `upstream`, in rotation,
    /// with `max_connections` permits and a pool closing idle connections
    /// after `idle_timeout`.
    pub(super) fn new(
        upstream: &str,
        scheme: Scheme,
        authority: Authority,
        label: String,
        max_connections: usize,
        idle_timeout: Duration,
    ) -> Target {
        let labels = [
            ("upstream", upstream.to_string()),
            ("target", label.clone()),
        ];
        let up = metrics::gauge!(names::UPSTREAM_TARGET_UP, &labels);
        let host = HeaderValue::from_str(authority.as_str())
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Target {
            host,
            scheme,
            authority,
            outstanding: AtomicUsize::new(0),
            fails: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            probes: AtomicU32::new(0),
            permits: Arc::new(Semaphore::new(max_connections)),
            pool: Pool::new(max_connections, idle_timeout),
            ejections: metrics::counter!(names::UPSTREAM_EJECTIONS, &labels),
            up,
            shown: Mutex::new(false),
            last_error: Mutex::new(None),
            label,
        }
    }

    /// The absolute URI of `path` on this target.
    pub(super) fn uri(&self, path: Option<PathAndQuery>) -> Result<Uri, UpstreamError> {
        let mut uri = Parts::default();
        uri.scheme = Some(self.scheme.clone());
        uri.authority = Some(self.authority.clone());
        uri.path_and_query = path;
        Uri::from_parts(uri).map_err(|e| UpstreamError::Config(e.to_string()))
    }
}
