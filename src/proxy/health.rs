//! Target health: the state of each target of an upstream (consecutive
//! failures, ejection deadline; kept in its [`Target`]), passive ejection
//! after `max_fails` consecutive failures, and the optional active checker
//! (`health_path` every `health_interval`).
//!
//! An ejected target is probed half-open, as Linkerd's failure accrual
//! does: once its back-off has passed, one request goes to it; if that
//! succeeds the target is back at once, else the next probe waits twice as
//! long. The back-off starts at [`FIRST_PROBE_MS`] and grows to
//! `fail_timeout`. (nginx instead keeps a target out for the whole
//! `fail_timeout` and Envoy for its ejection time, so a target that came
//! back at once still waited.) A target the active checker found failing
//! stays out until a check passes: each failing check renews its ejection.
//!
//! An upstream's refusals (502, 503, 504 the gateway answered for it) are
//! one [`Incident`] in the log: the first with its cause, then a count per
//! summary interval, and one line when a target answers again.
//!
//! Time is milliseconds since the upstream was built, passed in explicitly
//! (`now`), so the rules are tested without sleeping.
//!
//! A target's `mpg_upstream_target_up` series is shared by every build of
//! its upstream (a reload that changes the upstream builds a new one while
//! requests finish on the old): only the serving build writes it (see
//! [`Targets::publish`] and [`Targets::retire`]).
use http::uri::{Authority, Scheme};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::error::UpstreamError;
use super::target::Target;
use super::transport::Transport;
use crate::logging::{Chain, Incident};

/// The first back-off of an ejected target, in ms: its first probe comes
/// this long after the ejection (or `fail_timeout`, if shorter).
pub(crate) const FIRST_PROBE_MS: u64 = 250;

/// Every target of one upstream, with the ejection rule.
pub(crate) struct Targets {
    pub(crate) upstream: String,
    pub(crate) list: Vec<Target>,
    epoch: Instant,
    max_fails: u32,
    fail_timeout_ms: u64,
    /// Replaced or removed by a reload: its active checker stops.
    retired: AtomicBool,
    /// The upstream's refusals, in the log.
    incident: Incident,
}

/// Whether a target takes a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Availability {
    /// In rotation.
    Up,
    /// Ejected, its back-off not over.
    Out,
    /// Ejected, its back-off over: the request that claims the probe
    /// ([`Targets::claim_probe`]) goes to it.
    HalfOpen,
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
                Target::new(
                    upstream,
                    scheme,
                    authority,
                    label,
                    max_connections,
                    idle_timeout,
                )
            })
            .collect();
        Targets {
            upstream: upstream.to_string(),
            list,
            epoch: Instant::now(),
            max_fails,
            fail_timeout_ms: fail_timeout.as_millis() as u64,
            retired: AtomicBool::new(false),
            incident: Incident::new(),
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

    /// Whether target `i` takes requests at `now` (in rotation, or
    /// half-open: a probe may go to it).
    pub(crate) fn is_up(&self, i: usize, now: u64) -> bool {
        self.availability(i, now) != Availability::Out
    }

    /// Target `i`'s state at `now`: one atomic load.
    pub(crate) fn availability(&self, i: usize, now: u64) -> Availability {
        match self.list[i].ejected_until.load(Ordering::Relaxed) {
            0 => Availability::Up,
            until if now < until => Availability::Out,
            _ => Availability::HalfOpen,
        }
    }

    /// Claims the probe of half-open target `i` at `now`: true for the one
    /// request that gets it. Until that request's outcome, or its back-off
    /// (twice the last), no other request goes to the target.
    pub(crate) fn claim_probe(&self, i: usize, now: u64) -> bool {
        let t = &self.list[i];
        let until = t.ejected_until.load(Ordering::Relaxed);
        if until == 0 || now < until {
            return false;
        }
        let probes = t.probes.load(Ordering::Relaxed);
        let next = now + self.back_off(probes + 1);
        if t.ejected_until
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        t.probes.store(probes + 1, Ordering::Relaxed);
        tracing::debug!(upstream = %self.upstream, target = %t.label, probe = probes + 1, "probing an ejected target");
        true
    }

    /// The back-off after `probes` failed probes: [`FIRST_PROBE_MS`],
    /// doubled for each, at most `fail_timeout`.
    fn back_off(&self, probes: u32) -> u64 {
        FIRST_PROBE_MS
            .saturating_mul(1 << probes.min(20))
            .min(self.fail_timeout_ms)
            .max(1)
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

    /// Target `i` answered (a status below 500, or a passing check). A
    /// healthy target's answer costs two atomic loads; one that had failed
    /// is back in rotation, and ends the upstream's incident if one is
    /// under way.
    pub(crate) fn succeeded(&self, i: usize) {
        let t = &self.list[i];
        // Acquire: a refusal counted in the incident follows its target's
        // failure (see `refused`), so a target seen failing shows it too.
        let failed = t.fails.load(Ordering::Acquire) != 0;
        let ejected = t.ejected_until.load(Ordering::Relaxed) != 0;
        if !(failed || ejected) {
            return;
        }
        if failed {
            t.fails.store(0, Ordering::Relaxed);
        }
        if ejected {
            t.ejected_until.store(0, Ordering::Relaxed);
            t.probes.store(0, Ordering::Relaxed);
            self.state_changed(i);
            tracing::info!(upstream = %self.upstream, target = %t.label, "target back in rotation");
        }
        if let Some(r) = self.incident.recovered(self.now()) {
            r.log(
                tracing::Level::WARN,
                &format_args!("upstream {}", self.upstream),
                "requests refused",
            );
        }
    }

    /// Target `i` failed (connect error, reset, timeout or 5xx) at `now`.
    /// After `max_fails` in a row it is ejected; it is back when a probe
    /// or a check succeeds.
    pub(crate) fn failed(&self, i: usize, now: u64) {
        let t = &self.list[i];
        let n = t.fails.fetch_add(1, Ordering::Release).saturating_add(1);
        if self.max_fails > 0 && n >= self.max_fails {
            self.eject(i, now, "consecutive failures");
        }
    }

    /// Takes target `i` out of rotation for the first back-off, unless it
    /// is out already (a failed probe: its claim set the next back-off).
    fn eject(&self, i: usize, now: u64, reason: &'static str) {
        let t = &self.list[i];
        let for_ms = self.back_off(0);
        if t.ejected_until
            .compare_exchange(0, now + for_ms, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        t.probes.store(0, Ordering::Relaxed);
        t.ejections.increment(1);
        self.state_changed(i);
        tracing::warn!(upstream = %self.upstream, target = %t.label, reason, first_probe_ms = for_ms, "target ejected");
    }

    /// The gateway answered a request for this upstream with an error
    /// (`err`; from target `target`, when one was tried): counted in the
    /// upstream's incident, logged when a line is due. The target's
    /// `last_error` is noted with the line, so a failure between lines stays
    /// a few atomic operations (no lock, no allocation).
    pub(crate) fn refused(&self, target: Option<usize>, err: &UpstreamError) {
        let Some(line) = self.incident.failed(self.now()) else {
            return;
        };
        let subject = format_args!("upstream {}", self.upstream);
        let cause = Chain(err);
        match target.map(|i| &self.list[i]) {
            Some(t) => {
                *t.last_error.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(cause.to_string());
                line.log(
                    tracing::Level::WARN,
                    &subject,
                    "requests refused",
                    &format_args!("{}: {cause}", t.label),
                )
            }
            None => line.log(tracing::Level::WARN, &subject, "requests refused", &cause),
        }
    }
}

/// One target as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetView {
    /// The target as configured.
    pub url: String,
    /// `in_rotation`, `ejected` (its back-off not over) or `probing` (a
    /// request may try it).
    pub state: &'static str,
    /// Requests in flight to it.
    pub in_flight: usize,
    /// Failures in a row.
    pub failures: u32,
    /// The last error logged for it (an upstream's incident writes a line at
    /// its first failure, then at most once per `[log] summary_interval`).
    pub last_error: Option<String>,
}

impl Targets {
    /// Every target's state now.
    pub(crate) fn view(&self) -> Vec<TargetView> {
        let now = self.now();
        (self.list.iter().enumerate())
            .map(|(i, t)| TargetView {
                url: t.label.clone(),
                state: match self.availability(i, now) {
                    Availability::Up => "in_rotation",
                    Availability::Out => "ejected",
                    Availability::HalfOpen => "probing",
                },
                in_flight: t.outstanding.load(Ordering::Relaxed),
                failures: t.fails.load(Ordering::Relaxed),
                last_error: (t.last_error.lock().unwrap_or_else(PoisonError::into_inner)).clone(),
            })
            .collect()
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
                    .body(crate::http_core::body::empty())
                    .ok()?;
                let (mut parts, body) = req.into_parts();
                let deadline = std::time::Instant::now() + timeout;
                let sent = transport.send(&t.list[i], &mut parts, body, true, None, deadline);
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
                let was_up = t.list[i].ejected_until.swap(now + cool, Ordering::AcqRel) == 0;
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
    fn consecutive_failures_eject_and_one_probe_per_doubling_back_off_follows() {
        let t = targets(2, 3);
        t.failed(0, 100);
        t.failed(0, 200);
        assert!(t.is_up(0, 300));
        t.failed(0, 300);
        assert_eq!(t.availability(0, 301), Availability::Out);
        assert!(t.is_up(1, 301));
        assert_eq!(t.retry_after(301), 1);
        // The first back-off: no probe before it ends, one request after.
        assert!(!t.claim_probe(0, 549));
        assert_eq!(t.availability(0, 550), Availability::HalfOpen);
        assert!(t.claim_probe(0, 550));
        assert!(!t.claim_probe(0, 550), "one probe at a time");
        // It failed: out again, for twice as long; no second ejection.
        t.failed(0, 560);
        assert_eq!(t.availability(0, 1_049), Availability::Out);
        assert!(t.claim_probe(0, 1_050));
        assert_eq!(t.availability(0, 2_049), Availability::Out);
        // Doubling up to fail_timeout (10 s).
        let mut at = 2_050;
        let mut gaps = Vec::new();
        for _ in 0..6 {
            while !t.claim_probe(0, at) {
                at += 1;
            }
            gaps.push(at);
        }
        let gaps: Vec<u64> = gaps.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps, [2_000, 4_000, 8_000, 10_000, 10_000]);
        // A probe that succeeds puts it back at once, with a clean count.
        t.succeeded(0);
        assert_eq!(t.availability(0, at), Availability::Up);
        t.failed(0, at);
        t.failed(0, at);
        assert!(t.is_up(0, at));
        t.failed(0, at);
        assert_eq!(t.availability(0, at + 1), Availability::Out);
        assert!(t.claim_probe(0, at + 250), "the back-off starts over");
    }

    #[test]
    fn a_short_fail_timeout_bounds_the_first_back_off_too() {
        let list = vec![(
            Scheme::HTTP,
            Authority::from_static("127.0.0.1:1000"),
            "http://127.0.0.1:1000".to_string(),
        )];
        let t = Targets::new(
            "t",
            list,
            4,
            1,
            Duration::from_millis(100),
            Duration::from_secs(60),
        );
        t.failed(0, 1);
        assert!(!t.claim_probe(0, 100));
        assert!(t.claim_probe(0, 101));
        assert!(!t.claim_probe(0, 200));
        assert!(t.claim_probe(0, 201));
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
