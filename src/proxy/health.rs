//! Target health: per-target state (requests in flight, consecutive
//! failures, ejection deadline, the connection permits), passive ejection
//! after `max_fails` consecutive failures for `fail_timeout`, and the
//! optional active checker (`health_path` every `health_interval`).
//!
//! Time is milliseconds since the upstream was built, passed in explicitly
//! (`now`), so the rules are tested without sleeping.
//!
//! A target's `mpg_upstream_target_up` series is shared by every build of
//! its upstream (a reload that changes the upstream builds a new one while
//! requests finish on the old): only the serving build writes it (see
//! [`Targets::publish`] and [`Targets::retire`]).
use http::header::HeaderValue;
use http::uri::{Authority, Scheme};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

use super::pool::Pool;
use super::transport::Transport;
use crate::admin::names;

/// One target of an upstream.
pub(crate) struct Target {
    pub(crate) scheme: Scheme,
    pub(crate) authority: Authority,
    /// The target as configured (metric label and log field).
    pub(crate) label: String,
    /// Requests in flight (response body included).
    pub(crate) outstanding: AtomicUsize,
    /// Consecutive failures.
    fails: AtomicU32,
    /// Ejected while `now < ejected_until`; 0 = never ejected.
    ejected_until: AtomicU64,
    /// `max_connections_per_target` permits.
    pub(crate) permits: Arc<Semaphore>,
    /// Its idle HTTP/1.1 connections.
    pub(crate) pool: Pool,
    /// The `Host` header requests to it carry.
    pub(crate) host: HeaderValue,
    ejections: metrics::Counter,
    /// `mpg_upstream_target_up`: 1 while `ejected_until` is 0, else 0.
    up: metrics::Gauge,
    /// Whether `up` shows this target's state: from [`Targets::publish`] to
    /// [`Targets::retire`]. Taken only when the state changes (ejected, or
    /// back), never on a request's usual path.
    shown: Mutex<bool>,
}

/// Every target of one upstream, with the ejection rule.
pub(crate) struct Targets {
    pub(crate) upstream: String,
    pub(crate) list: Vec<Target>,
    epoch: Instant,
    max_fails: u32,
    fail_timeout_ms: u64,
    /// Replaced or removed by a reload: its active checker stops.
    retired: AtomicBool,
}

impl Targets {
    pub(crate) fn new(
        upstream: &str,
        targets: Vec<(Scheme, Authority, String)>,
        max_connections: usize,
        max_fails: u32,
        fail_timeout: Duration,
        idle_timeout: Duration,
    ) -> Targets {
        let list = targets
            .into_iter()
            .map(|(scheme, authority, label)| {
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
                    permits: Arc::new(Semaphore::new(max_connections)),
                    pool: Pool::new(max_connections, idle_timeout),
                    ejections: metrics::counter!(names::UPSTREAM_EJECTIONS, &labels),
                    up,
                    shown: Mutex::new(false),
                    label,
                }
            })
            .collect();
        Targets {
            upstream: upstream.to_string(),
            list,
            epoch: Instant::now(),
            max_fails,
            fail_timeout_ms: fail_timeout.as_millis() as u64,
            retired: AtomicBool::new(false),
        }
    }

    /// From now on the target gauges show these targets' state (this
    /// upstream serves). Idempotent.
    pub(crate) fn publish(&self) {
        for t in &self.list {
            let mut shown = t.shown.lock().unwrap_or_else(PoisonError::into_inner);
            *shown = true;
            Self::show(t, &shown);
        }
    }

    /// This upstream no longer serves new requests (a reload replaced or
    /// removed it): requests still in flight on it count for nothing the
    /// gauges show, and its active checker stops. Called before the
    /// replacement is published, so the replacement's value is the last one
    /// written.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        for t in &self.list {
            *t.shown.lock().unwrap_or_else(PoisonError::into_inner) = false;
        }
    }

    /// Writes `t`'s gauge from its state as it is now, if shown. Each state
    /// change is followed by this, under the lock, so the last value written
    /// is the last state, whatever the order in which threads got here.
    fn show(t: &Target, shown: &bool) {
        if *shown {
            let up = t.ejected_until.load(Ordering::Relaxed) == 0;
            t.up.set(if up { 1.0 } else { 0.0 });
        }
    }

    /// The state of target `i` changed: its gauge follows, if shown.
    fn state_changed(&self, i: usize) {
        let t = &self.list[i];
        Self::show(t, &t.shown.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Milliseconds since the upstream was built (never 0).
    pub(crate) fn now(&self) -> u64 {
        self.at(Instant::now())
    }

    /// [`Targets::now`] for an instant the caller has read already.
    pub(crate) fn at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_millis() as u64 + 1
    }

    /// Whether target `i` takes requests at `now`.
    pub(crate) fn is_up(&self, i: usize, now: u64) -> bool {
        self.list[i].ejected_until.load(Ordering::Relaxed) <= now
    }

    /// Whole seconds until the first ejected target comes back (at least 1).
    pub(crate) fn retry_after(&self, now: u64) -> u64 {
        let first = self
            .list
            .iter()
            .map(|t| t.ejected_until.load(Ordering::Relaxed))
            .filter(|&until| until > now)
            .min()
            .unwrap_or(now);
        (first - now).div_ceil(1000).max(1)
    }

    /// Target `i` answered (a status below 500, or a passing check).
    pub(crate) fn succeeded(&self, i: usize) {
        let t = &self.list[i];
        if t.fails.load(Ordering::Relaxed) != 0 {
            t.fails.store(0, Ordering::Relaxed);
        }
        if t.ejected_until.load(Ordering::Relaxed) != 0 {
            t.ejected_until.store(0, Ordering::Relaxed);
            self.state_changed(i);
            tracing::info!(upstream = %self.upstream, target = %t.label, "target back in rotation");
        }
    }

    /// Target `i` failed (connect error, reset, timeout or 5xx) at `now`. After
    /// `max_fails` in a row it is ejected for `fail_timeout`; once back, its
    /// count stays at the threshold, so one more failure ejects it again.
    pub(crate) fn failed(&self, i: usize, now: u64) {
        let t = &self.list[i];
        let n = t.fails.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if self.max_fails > 0 && n >= self.max_fails && self.is_up(i, now) {
            self.eject(i, now, self.fail_timeout_ms, "consecutive failures");
        }
    }

    /// Takes target `i` out of rotation until `now + for_ms`.
    fn eject(&self, i: usize, now: u64, for_ms: u64, reason: &'static str) {
        let t = &self.list[i];
        t.ejected_until.store(now + for_ms, Ordering::Relaxed);
        t.ejections.increment(1);
        self.state_changed(i);
        tracing::warn!(upstream = %self.upstream, target = %t.label, reason, cool_down_ms = for_ms, "target ejected");
    }
}

/// Runs the active check until the upstream is dropped or retired (or the
/// task aborted).
pub(crate) async fn active_check(
    targets: Weak<Targets>,
    transport: Arc<Transport>,
    path: http::uri::PathAndQuery,
    interval: Duration,
    timeout: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(t) = targets.upgrade() else { return };
        if t.retired.load(Ordering::Relaxed) {
            return;
        }
        let checks = (0..t.list.len()).map(|i| {
            let (t, transport, path) = (&t, &transport, &path);
            async move {
                let req = http::Request::get(http::Uri::from(path.clone()))
                    .header(http::header::USER_AGENT, "mpg-gateway-health")
                    .body(crate::body::empty())
                    .ok()?;
                let (mut parts, body) = req.into_parts();
                let deadline = std::time::Instant::now() + timeout;
                let sent = transport.send(t, i, &mut parts, body, true, None, deadline);
                let (res, conn) = sent.await.ok()?;
                if let Some(conn) = conn {
                    t.list[i].pool.put(conn);
                }
                let ok = res.status().is_success() || res.status().is_redirection();
                Some(ok)
            }
        });
        let results = futures_util::future::join_all(checks).await;
        let now = t.now();
        for (i, ok) in results.into_iter().enumerate() {
            if ok == Some(true) {
                t.succeeded(i);
            } else {
                // Out until a check passes: renewed by each failing check.
                let cool = t.fail_timeout_ms.max(interval.as_millis() as u64);
                let was_up = t.is_up(i, now);
                t.list[i].ejected_until.store(now + cool, Ordering::Relaxed);
                if was_up {
                    t.list[i].ejections.increment(1);
                    t.state_changed(i);
                    tracing::warn!(upstream = %t.upstream, target = %t.list[i].label, reason = "health check", "target ejected");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(n: usize, max_fails: u32) -> Targets {
        let list = (0..n)
            .map(|i| {
                (
                    Scheme::HTTP,
                    Authority::try_from(format!("127.0.0.1:{}", 1000 + i)).unwrap(),
                    format!("http://127.0.0.1:{}", 1000 + i),
                )
            })
            .collect();
        Targets::new(
            "t",
            list,
            4,
            max_fails,
            Duration::from_secs(10),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn consecutive_failures_eject_for_the_cool_down_and_one_more_ejects_again() {
        let t = targets(2, 3);
        t.failed(0, 100);
        t.failed(0, 200);
        assert!(t.is_up(0, 300));
        t.failed(0, 300);
        assert!(!t.is_up(0, 301));
        assert!(t.is_up(1, 301));
        assert_eq!(t.retry_after(301), 10);
        assert_eq!(t.retry_after(9_400), 1);
        // Back after the cool-down; a single failure ejects it again.
        assert!(t.is_up(0, 10_300));
        t.failed(0, 10_400);
        assert!(!t.is_up(0, 10_401));
        // A success resets everything.
        t.succeeded(0);
        assert!(t.is_up(0, 10_402));
        t.failed(0, 10_500);
        assert!(t.is_up(0, 10_501));
    }

    #[test]
    fn a_success_between_failures_resets_the_count_and_zero_never_ejects() {
        let t = targets(1, 2);
        t.failed(0, 1);
        t.succeeded(0);
        t.failed(0, 2);
        assert!(t.is_up(0, 3));
        let never = targets(1, 0);
        for now in 1..100 {
            never.failed(0, now);
        }
        assert!(never.is_up(0, 100));
    }
}
