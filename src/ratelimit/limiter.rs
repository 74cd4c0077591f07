//! The rate limiter the pipeline holds: a local backend, or Redis with a fallback.
//!
//! With Redis, a failed or slow call (every call runs under the configured timeout) trips a
//! small circuit breaker: for the next second decisions come from the fallback chosen by
//! `on_backend_error` without touching Redis, then one request probes Redis again, and the
//! first success switches back by itself. If Redis is down at start the limiter starts in
//! fallback and connects on a later probe. Failures are counted ([`RateLimiter::backend_errors`])
//! and logged as one [`Incident`]: the first with its cause, then their number once per summary
//! interval while they go on, and one line when Redis answers again.
//!
//! The authentication-failure guard is one more policy, registered after the configured
//! ones and keyed by client IP; while Redis is down it always falls back to in-process
//! counting (a per-instance brute-force guard beats none, and refusing everyone is stage 3's
//! call, not this guard's).
//!
//! Where the guard's peek comes right before a request's other decision (its policy's
//! token, or the failure it records), [`RateLimiter::guarded_check`] and
//! [`RateLimiter::guarded_auth_failure`] make both: on the local backend one after the
//! other, on Redis in one call, the second skipped there when the guard refuses.
//!
//! A request may also bring its own quota ([`RateLimiter::check_with`]): an organization's
//! override of a policy (its buckets live among the policy's), or a key's own limit, whose
//! buckets live under one more registered policy ([`RateLimiter::own_limit_policy`]), so a
//! key has one bucket whichever route it calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;

use crate::logging::Incident;

use super::clock::{Clock, SystemClock};
use super::gcra::{self, Gcra, Op};
use super::{
    Decision, LimiterError, LocalLimiter, OnBackendError, PolicyId, Quota, RedisLimiter,
    RedisTarget,
};

/// How long decisions skip a failed backend before one request probes it again.
const PROBE_INTERVAL_NANOS: u64 = 1_000_000_000;

/// The rate limiter of the pipeline's rate-limit stage, and the auth-failure
/// guard of its authentication stage.
#[derive(Debug)]
pub struct RateLimiter {
    /// Configured policies, then the auth-failure policy, then the keys' own.
    gcras: Vec<Gcra>,
    auth_policy: PolicyId,
    /// The backend for `local`; the fallback for `redis`.
    local: LocalLimiter,
    remote: Option<Remote>,
}

struct Remote {
    target: RedisTarget,
    prefix: Box<str>,
    quotas: Vec<Quota>,
    timeout: Duration,
    on_error: OnBackendError,
    limiter: ArcSwapOption<RedisLimiter>,
    /// 0 while healthy; else the clock time before which Redis is not tried.
    down_until: AtomicU64,
    errors: AtomicU64,
    /// Its failures in the log (times in ms on the limiter's clock).
    incident: Incident,
    /// Time per Redis call (made once here, not looked up per decision).
    latency: metrics::Histogram,
}

// === impl RateLimiter ===

impl RateLimiter {
    /// An in-process limiter for `policies` plus the per-IP `auth_failures` guard.
    pub fn local(policies: Vec<Quota>, auth_failures: Quota) -> Self {
        Self::local_with_clock(policies, auth_failures, Arc::new(SystemClock::new()))
    }

    /// [`RateLimiter::local`] reading time from `clock` (tests inject a [`super::ManualClock`]).
    pub fn local_with_clock(
        policies: Vec<Quota>,
        auth_failures: Quota,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let (all, auth_policy) = with_auth_policy(policies, auth_failures);
        Self {
            gcras: all.iter().map(Gcra::new).collect(),
            auth_policy,
            local: LocalLimiter::with_clock(all, clock),
            remote: None,
        }
    }

    /// A Redis-backed limiter shared by every instance. If Redis cannot be reached now, it
    /// starts in fallback (`on_error`) and connects later by itself. Every Redis call runs
    /// under `timeout`.
    pub async fn redis(
        target: RedisTarget,
        prefix: &str,
        policies: Vec<Quota>,
        auth_failures: Quota,
        on_error: OnBackendError,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        let clock = Arc::new(SystemClock::new());
        Self::redis_with_clock(
            target,
            prefix,
            policies,
            auth_failures,
            on_error,
            timeout,
            clock,
        )
        .await
    }

    /// [`RateLimiter::redis`] with an injected clock for the breaker and the fallback.
    pub async fn redis_with_clock(
        target: RedisTarget,
        prefix: &str,
        policies: Vec<Quota>,
        auth_failures: Quota,
        on_error: OnBackendError,
        timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, LimiterError> {
        let (all, auth_policy) = with_auth_policy(policies, auth_failures);
        let remote = Remote {
            target,
            prefix: prefix.into(),
            quotas: all.clone(),
            timeout,
            on_error,
            limiter: ArcSwapOption::empty(),
            down_until: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            incident: Incident::new(),
            latency: metrics::histogram!(
                crate::metrics::names::RATE_LIMIT_BACKEND_SECONDS,
                "backend" => "redis"
            ),
        };
        let now = clock.now_nanos();
        match remote.connect().await {
            Ok(limiter) => remote.limiter.store(Some(limiter)),
            Err(err) => remote.mark_down(now, &err),
        }
        Ok(Self {
            gcras: all.iter().map(Gcra::new).collect(),
            auth_policy,
            local: LocalLimiter::with_clock(all, clock),
            remote: Some(remote),
        })
    }

    /// Takes one token for `key` under `policy`; on a backend error applies
    /// `on_backend_error`. An unregistered `policy` is refused.
    pub async fn check(&self, policy: PolicyId, key: &str) -> Decision {
        if policy.0 >= self.auth_policy.0 {
            return gcra::unknown_policy_decision(self.now());
        }
        self.decide(policy, key, Op::Check, false, None).await
    }

    /// [`Self::check`] with `quota` instead of the policy's own: its capacity is the
    /// decision's limit. `policy` is a configured one or [`Self::own_limit_policy`].
    pub async fn check_with(&self, policy: PolicyId, key: &str, quota: &Quota) -> Decision {
        if policy == self.auth_policy || policy.0 >= self.gcras.len() {
            return gcra::unknown_policy_decision(self.now());
        }
        let gcra = Gcra::new(quota);
        self.decide(policy, key, Op::Check, false, Some(&gcra))
            .await
    }

    /// The policy under which keys with a limit of their own keep their buckets, keyed by
    /// key id, for [`Self::check_with`].
    pub fn own_limit_policy(&self) -> PolicyId {
        PolicyId(self.auth_policy.0 + 1)
    }

    /// `Some(refusal)` when `client_ip` (the client's rate-limit key: its
    /// address, or an IPv6 client's /64) has used up its
    /// authentication-failure bucket (checked before any store lookup);
    /// does not consume anything.
    pub async fn auth_failures_exceeded(&self, client_ip: &str) -> Option<Decision> {
        let decision = self
            .decide(self.auth_policy, client_ip, Op::Peek, true, None)
            .await;
        (!decision.allowed).then_some(decision)
    }

    /// Counts one authentication failure (a 401) against `client_ip`.
    pub async fn record_auth_failure(&self, client_ip: &str) {
        self.decide(self.auth_policy, client_ip, Op::Consume, true, None)
            .await;
    }

    /// [`Self::auth_failures_exceeded`] for `client_ip`, then, only if it is not,
    /// [`Self::check`] (with `quota`: [`Self::check_with`]) of `key` under `policy`.
    /// `Err` is the guard's refusal: then no token is taken. One call with Redis.
    pub async fn guarded_check(
        &self,
        client_ip: &str,
        policy: PolicyId,
        key: &str,
        quota: Option<&Quota>,
    ) -> Result<Decision, Decision> {
        let known = match quota {
            None => policy.0 < self.auth_policy.0,
            Some(_) => policy != self.auth_policy && policy.0 < self.gcras.len(),
        };
        if !known {
            return Ok(gcra::unknown_policy_decision(self.now()));
        }
        let gcra = quota.map(Gcra::new);
        self.after_guard(client_ip, policy, key, Op::Check, gcra.as_ref())
            .await
    }

    /// [`Self::auth_failures_exceeded`] for `client_ip`, then, only if it is not,
    /// [`Self::record_auth_failure`]: `Some(refusal)` when the guard refused (nothing is
    /// recorded then). One call with Redis.
    pub async fn guarded_auth_failure(&self, client_ip: &str) -> Option<Decision> {
        self.after_guard(client_ip, self.auth_policy, client_ip, Op::Consume, None)
            .await
            .err()
    }

    /// `"local"` or `"redis"` (the configured backend, for readiness and metrics).
    pub fn backend(&self) -> &'static str {
        match self.remote {
            None => "local",
            Some(_) => "redis",
        }
    }

    /// False while the configured backend is failing and decisions come from the fallback.
    pub fn healthy(&self) -> bool {
        self.remote.as_ref().is_none_or(|remote| {
            remote.limiter.load().is_some() && remote.down_until.load(Ordering::Acquire) == 0
        })
    }

    /// Number of failed backend calls (connects, timeouts, errors) since start.
    pub fn backend_errors(&self) -> u64 {
        self.remote
            .as_ref()
            .map_or(0, |remote| remote.errors.load(Ordering::Relaxed))
    }

    fn now(&self) -> u64 {
        self.local.clock().now_nanos()
    }

    /// `op` on `key` under `policy`, with `quota`'s parameters if given, else the policy's.
    async fn decide(
        &self,
        policy: PolicyId,
        key: &str,
        op: Op,
        auth_guard: bool,
        quota: Option<&Gcra>,
    ) -> Decision {
        let Some(remote) = &self.remote else {
            return self.local_op(policy, key, op, quota);
        };
        // Boxed: the Redis path's state (its timer, its answer's channel) would otherwise
        // make every decision's future, local ones too, that large to move on each request.
        Box::pin(self.decide_remote(remote, policy, key, op, auth_guard, quota)).await
    }

    /// A decision by Redis, or by the fallback while Redis fails, with `quota`'s
    /// parameters (a request's own) if given, else the policy's.
    async fn decide_remote(
        &self,
        remote: &Remote,
        policy: PolicyId,
        key: &str,
        op: Op,
        auth_guard: bool,
        quota: Option<&Gcra>,
    ) -> Decision {
        let Some(gcra) = quota.or_else(|| self.gcras.get(policy.0)).copied() else {
            return gcra::unknown_policy_decision(self.now());
        };
        let now = self.now();
        if remote.may_try(now) {
            match remote.run(policy, key, gcra, op).await {
                Ok(decision) => {
                    remote.mark_up(now);
                    return decision;
                }
                Err(err) => remote.mark_down(now, &err),
            }
        }
        match (remote.on_error, auth_guard) {
            (OnBackendError::Local, _) | (_, true) => self.local_op(policy, key, op, quota),
            (OnBackendError::Deny, false) => gcra.deny_decision(now),
            (OnBackendError::Allow, false) => gcra.allow_decision(now),
        }
    }

    /// The guard's peek for `client_ip`, then `op` on `key` under `policy` (with `quota`'s
    /// parameters if given) only if the guard allows: `Err` is the guard's refusal.
    async fn after_guard(
        &self,
        client_ip: &str,
        policy: PolicyId,
        key: &str,
        op: Op,
        quota: Option<&Gcra>,
    ) -> Result<Decision, Decision> {
        let Some(remote) = &self.remote else {
            let guard = self.local.peek(self.auth_policy, client_ip);
            if !guard.allowed {
                return Err(guard);
            }
            return Ok(self.local_op(policy, key, op, quota));
        };
        // Boxed for the reason `decide` boxes.
        Box::pin(self.after_guard_remote(remote, client_ip, policy, key, op, quota)).await
    }

    /// [`Self::after_guard`] in one Redis call; while Redis fails, the guard from the
    /// in-process limiter and the decision after it as [`Self::decide_remote`] falls back.
    async fn after_guard_remote(
        &self,
        remote: &Remote,
        client_ip: &str,
        policy: PolicyId,
        key: &str,
        op: Op,
        quota: Option<&Gcra>,
    ) -> Result<Decision, Decision> {
        let guard = (
            self.auth_policy,
            client_ip,
            self.gcras[self.auth_policy.0],
            Op::Peek,
        );
        let Some(gcra) = quota.or_else(|| self.gcras.get(policy.0)).copied() else {
            return Ok(gcra::unknown_policy_decision(self.now()));
        };
        let now = self.now();
        if remote.may_try(now) {
            match remote.run_then(guard, (policy, key, gcra, op)).await {
                Ok((guard, then)) => {
                    remote.mark_up(now);
                    return then.ok_or(guard);
                }
                Err(err) => remote.mark_down(now, &err),
            }
        }
        let guard = self.local.peek(self.auth_policy, client_ip);
        if !guard.allowed {
            return Err(guard);
        }
        Ok(match remote.on_error {
            _ if policy == self.auth_policy => self.local_op(policy, key, op, quota),
            OnBackendError::Local => self.local_op(policy, key, op, quota),
            OnBackendError::Deny => gcra.deny_decision(now),
            OnBackendError::Allow => gcra.allow_decision(now),
        })
    }

    fn local_op(&self, policy: PolicyId, key: &str, op: Op, quota: Option<&Gcra>) -> Decision {
        if let Some(gcra) = quota {
            return self.local.run_with(policy, key, op, gcra);
        }
        match op {
            Op::Check => self.local.check(policy, key),
            Op::Peek => self.local.peek(policy, key),
            Op::Consume => self.local.consume(policy, key),
        }
    }
}

/// Appends the auth-failure quota to the policies (its index is the returned id), then a
/// slot for the keys' own buckets, whose quota always comes with the request.
fn with_auth_policy(mut policies: Vec<Quota>, auth_failures: Quota) -> (Vec<Quota>, PolicyId) {
    let id = PolicyId(policies.len());
    policies.push(auth_failures);
    policies.push(auth_failures);
    (policies, id)
}

// === impl Remote ===

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The url may carry a Redis password: never print it.
        f.debug_struct("Remote")
            .field("prefix", &self.prefix)
            .field("on_error", &self.on_error)
            .field("timeout", &self.timeout)
            .field("down_until", &self.down_until)
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

impl Remote {
    async fn connect(&self) -> Result<Arc<RedisLimiter>, LimiterError> {
        let limiter = RedisLimiter::connect(
            &self.target,
            &self.prefix,
            self.quotas.clone(),
            self.timeout,
        )
        .await?;
        Ok(Arc::new(limiter))
    }

    /// The connected limiter, connecting first if there is none yet.
    async fn limiter(&self) -> Result<Arc<RedisLimiter>, LimiterError> {
        match self.limiter.load_full() {
            Some(limiter) => Ok(limiter),
            None => {
                // Boxed: a connect's state is kilobytes, which every decision's
                // (boxed) future would otherwise carry and move.
                let limiter = Box::pin(self.connect()).await?;
                self.limiter.store(Some(limiter.clone()));
                Ok(limiter)
            }
        }
    }

    async fn run(
        &self,
        policy: PolicyId,
        key: &str,
        gcra: Gcra,
        op: Op,
    ) -> Result<Decision, LimiterError> {
        let limiter = self.limiter().await?;
        let started = std::time::Instant::now();
        let decision = limiter.decide(policy, key, gcra, op).await;
        self.latency.record(started.elapsed().as_secs_f64());
        decision
    }

    /// `first`, then `then` only if `first` is allowed ([`RedisLimiter::decide_then`]).
    async fn run_then(
        &self,
        first: (PolicyId, &str, Gcra, Op),
        then: (PolicyId, &str, Gcra, Op),
    ) -> Result<(Decision, Option<Decision>), LimiterError> {
        let limiter = self.limiter().await?;
        let started = std::time::Instant::now();
        let decisions = limiter.decide_then(first, then).await;
        self.latency.record(started.elapsed().as_secs_f64());
        decisions
    }

    /// Healthy: always. Failed: not before the probe time, then one caller at a time.
    fn may_try(&self, now: u64) -> bool {
        let until = self.down_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        now >= until
            && self
                .down_until
                .compare_exchange(until, probe_time(now), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// A decision came from Redis: a load (no write) while it was healthy.
    fn mark_up(&self, now: u64) {
        if self.down_until.load(Ordering::Acquire) == 0 {
            return;
        }
        if self.down_until.swap(0, Ordering::AcqRel) != 0 {
            if let Some(r) = self.incident.recovered(now / 1_000_000) {
                r.log(tracing::Level::WARN, &self.subject(), "calls failed");
            }
        }
    }

    fn mark_down(&self, now: u64, err: &LimiterError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(crate::metrics::names::RATE_LIMIT_BACKEND_ERRORS, "backend" => "redis")
            .increment(1);
        self.down_until.store(probe_time(now), Ordering::Release);
        if let Some(line) = self.incident.failed(now / 1_000_000) {
            let cause = crate::logging::Chain(err);
            line.log(
                tracing::Level::WARN,
                &self.subject(),
                "calls failed",
                &cause,
            );
        }
    }

    /// What the log calls it: the backend and the fallback in use meanwhile.
    fn subject(&self) -> String {
        let fallback = match self.on_error {
            OnBackendError::Local => "in-process limits",
            OnBackendError::Deny => "refusing",
            OnBackendError::Allow => "allowing",
        };
        format!("rate-limit backend redis (meanwhile {fallback})")
    }
}

fn probe_time(now: u64) -> u64 {
    now.saturating_add(PROBE_INTERVAL_NANOS).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::redis::tests::{cleanup, random_prefix, redis_url};
    use crate::ratelimit::ManualClock;
    use std::num::NonZeroU32;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    const START: u64 = 1_700_000_000_000_000_000;
    const P: PolicyId = PolicyId(0);
    const IP: &str = "192.0.2.7";

    fn quota(capacity: u32, secs: u64) -> Quota {
        Quota::new(
            NonZeroU32::new(capacity).unwrap(),
            Duration::from_secs(secs),
        )
    }

    fn clock() -> Arc<ManualClock> {
        Arc::new(ManualClock::new(START))
    }

    fn target(url: &str) -> RedisTarget {
        RedisTarget::new(url, None).unwrap()
    }

    #[tokio::test]
    async fn local_backend_counts_down_and_guards_auth_failures() {
        let l = RateLimiter::local_with_clock(vec![quota(2, 60)], quota(3, 60), clock());
        assert_eq!(l.backend(), "local");
        assert!(l.healthy());
        assert_eq!(l.check(P, "k").await.remaining, 1);
        assert_eq!(l.check(P, "k").await.remaining, 0);
        assert!(!l.check(P, "k").await.allowed);
        // The auth guard is its own bucket, keyed by IP; asking does not consume.
        for _ in 0..5 {
            assert_eq!(l.auth_failures_exceeded(IP).await, None);
        }
        for _ in 0..3 {
            l.record_auth_failure(IP).await;
        }
        let refused = l.auth_failures_exceeded(IP).await.unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.limit, 3);
        assert_eq!(refused.retry_after_secs, Some(20));
        let other = "::1";
        assert_eq!(l.auth_failures_exceeded(other).await, None);
        // The guard's index is not a policy the pipeline may use.
        assert!(!l.check(PolicyId(1), "k").await.allowed);
        assert_eq!(l.backend_errors(), 0);
    }

    #[tokio::test]
    async fn guarded_ops_on_the_local_backend_take_nothing_after_a_guard_refusal() {
        let clock = clock();
        let l = RateLimiter::local_with_clock(vec![quota(3, 60)], quota(2, 60), clock.clone());
        let d = l.guarded_check(IP, P, "k", None).await.unwrap();
        assert_eq!((d.limit, d.remaining), (3, 2));
        let d = l.guarded_check(IP, P, "acme", Some(&quota(9, 60))).await;
        assert_eq!(d.map(|d| (d.limit, d.remaining)), Ok((9, 8)));
        let own = l.own_limit_policy();
        let d = l.guarded_check(IP, own, "key_1", Some(&quota(1, 60))).await;
        assert_eq!(d.map(|d| (d.allowed, d.limit)), Ok((true, 1)));
        // Two failures recorded (one token back every 30 s), then the guard refuses.
        assert_eq!(l.guarded_auth_failure(IP).await, None);
        assert_eq!(l.guarded_auth_failure(IP).await, None);
        clock.advance(Duration::from_secs(10));
        for _ in 0..2 {
            // Recording nothing: a recorded failure would put the wait back to 30 s.
            let refused = l.guarded_auth_failure(IP).await.unwrap();
            assert_eq!(
                (refused.allowed, refused.retry_after_secs),
                (false, Some(20))
            );
            let refused = l.guarded_check(IP, P, "k", None).await.unwrap_err();
            assert_eq!((refused.limit, refused.retry_after_secs), (2, Some(20)));
        }
        assert_eq!(l.check(P, "k").await.remaining, 1, "no token taken");
        assert!(l.guarded_check("::1", P, "k", None).await.is_ok());
        // As check and check_with: no guard index, no unknown policy.
        for (policy, q) in [(PolicyId(1), None), (PolicyId(1), Some(quota(9, 60)))] {
            let d = l
                .guarded_check("::1", policy, "k", q.as_ref())
                .await
                .unwrap();
            assert_eq!((d.allowed, d.limit), (false, 0));
        }
        assert!(
            !l.guarded_check("::1", own, "k", None)
                .await
                .unwrap()
                .allowed
        );
    }

    #[tokio::test]
    async fn a_quota_of_its_own_replaces_the_policys() {
        let l = RateLimiter::local_with_clock(vec![quota(100, 60)], quota(3, 60), clock());
        // An organization's override: the policy's buckets, the override's capacity.
        let d = l.check_with(P, "acme", &quota(2, 60)).await;
        assert_eq!((d.limit, d.remaining), (2, 1));
        assert_eq!(l.check_with(P, "acme", &quota(2, 60)).await.remaining, 0);
        let refused = l.check_with(P, "acme", &quota(2, 60)).await;
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_secs, Some(30));
        assert_eq!(l.check(P, "other").await.limit, 100);
        // A key's own bucket: one more policy, refused to plain checks.
        let own = l.own_limit_policy();
        assert_ne!(own, P);
        assert_eq!(l.check_with(own, "key_1", &quota(1, 60)).await.limit, 1);
        assert!(!l.check_with(own, "key_1", &quota(1, 60)).await.allowed);
        assert!(l.check_with(own, "key_2", &quota(1, 60)).await.allowed);
        assert!(!l.check(own, "key_3").await.allowed);
        // Neither the auth guard nor an unknown index takes a quota.
        assert!(!l.check_with(PolicyId(1), IP, &quota(9, 60)).await.allowed);
        assert_eq!(l.check_with(PolicyId(9), "k", &quota(9, 60)).await.limit, 0);
    }

    /// A Redis-backed limiter under `prefix` with one policy of `capacity` a minute (and an
    /// auth guard of 2): two of them share their buckets.
    async fn shared(prefix: &str, capacity: u32) -> RateLimiter {
        RateLimiter::redis(
            target(&redis_url()),
            prefix,
            vec![quota(capacity, 60)],
            quota(2, 60),
            OnBackendError::Deny,
            Duration::from_secs(2),
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn redis_counts_a_quota_of_its_own_across_instances() {
        let prefix = random_prefix();
        let (a, b) = (shared(&prefix, 100).await, shared(&prefix, 100).await);
        let own = a.own_limit_policy();
        let q = quota(2, 60);
        let d = a.check_with(own, "key_1", &q).await;
        assert_eq!((d.allowed, d.limit, d.remaining), (true, 2, 1));
        assert_eq!(b.check_with(own, "key_1", &q).await.remaining, 0);
        assert!(!a.check_with(own, "key_1", &q).await.allowed);
        assert_eq!(b.check_with(P, "acme", &quota(3, 60)).await.limit, 3);
        assert_eq!(a.check(P, "globex").await.remaining, 99);
        assert_eq!(a.backend_errors() + b.backend_errors(), 0);
        cleanup(&prefix).await;
    }

    #[tokio::test]
    async fn a_quota_of_its_own_shapes_the_fallback_too() {
        let deny = unreachable(OnBackendError::Deny, clock()).await;
        let d = deny.check_with(P, "acme", &quota(7, 60)).await;
        assert_eq!((d.allowed, d.limit), (false, 7));
        let local = unreachable(OnBackendError::Local, clock()).await;
        let own = local.own_limit_policy();
        assert_eq!(local.check_with(own, "key_1", &quota(1, 60)).await.limit, 1);
        assert!(!local.check_with(own, "key_1", &quota(1, 60)).await.allowed);
    }

    #[tokio::test]
    async fn debug_output_hides_the_redis_password() {
        let l = RateLimiter::redis_with_clock(
            target("redis://:s3cret-pw@127.0.0.1:1"),
            "x:",
            vec![quota(1, 1)],
            quota(1, 1),
            OnBackendError::Deny,
            Duration::from_millis(100),
            clock(),
        )
        .await
        .unwrap();
        let debug = format!("{l:?}");
        assert!(debug.contains("Remote"), "{debug}");
        assert!(!debug.contains("s3cret-pw"), "{debug}");
    }

    #[tokio::test]
    async fn redis_backend_decides_and_shares_state() {
        let prefix = random_prefix();
        let (a, b) = (shared(&prefix, 3).await, shared(&prefix, 3).await);
        assert_eq!(a.backend(), "redis");
        assert!(a.healthy());
        // Two instances share one bucket.
        assert_eq!(a.check(P, "k").await.remaining, 2);
        assert_eq!(b.check(P, "k").await.remaining, 1);
        assert_eq!(a.check(P, "k").await.remaining, 0);
        assert!(!b.check(P, "k").await.allowed);
        a.record_auth_failure(IP).await;
        b.record_auth_failure(IP).await;
        assert!(a.auth_failures_exceeded(IP).await.is_some());
        assert_eq!(a.backend_errors() + b.backend_errors(), 0);
        cleanup(&prefix).await;
    }

    #[tokio::test]
    async fn redis_guarded_ops_share_the_guard_and_take_nothing_after_its_refusal() {
        let prefix = random_prefix();
        let (a, b) = (shared(&prefix, 3).await, shared(&prefix, 3).await);
        let d = a.guarded_check(IP, P, "k", None).await.unwrap();
        assert_eq!((d.limit, d.remaining), (3, 2));
        let d = b.guarded_check(IP, P, "acme", Some(&quota(9, 60))).await;
        assert_eq!(d.map(|d| (d.limit, d.remaining)), Ok((9, 8)));
        assert_eq!(a.guarded_auth_failure(IP).await, None);
        assert_eq!(b.guarded_auth_failure(IP).await, None);
        for l in [&a, &b] {
            let refused = l.guarded_check(IP, P, "k", None).await.unwrap_err();
            assert_eq!((refused.allowed, refused.limit), (false, 2));
            assert!(l.guarded_auth_failure(IP).await.is_some());
        }
        assert_eq!(b.check(P, "k").await.remaining, 1, "no token taken");
        assert_eq!(
            a.guarded_check("::1", P, "k", None)
                .await
                .unwrap()
                .remaining,
            0
        );
        assert_eq!(a.backend_errors() + b.backend_errors(), 0);
        cleanup(&prefix).await;
    }

    #[tokio::test]
    async fn guarded_ops_with_redis_unreachable_guard_locally_and_fall_back_per_policy() {
        let deny = unreachable(OnBackendError::Deny, clock()).await;
        let d = deny.guarded_check(IP, P, "k", None).await.unwrap();
        assert_eq!(
            (d.allowed, d.limit, d.retry_after_secs),
            (false, 2, Some(1))
        );
        let allow = unreachable(OnBackendError::Allow, clock()).await;
        let local = unreachable(OnBackendError::Local, clock()).await;
        assert!(allow.guarded_check(IP, P, "k", None).await.unwrap().allowed);
        assert_eq!(
            local
                .guarded_check(IP, P, "k", None)
                .await
                .unwrap()
                .remaining,
            1
        );
        // The guard (one failure an hour) counts in process whatever the policy's fallback.
        for l in [&deny, &allow, &local] {
            assert_eq!(l.guarded_auth_failure(IP).await, None);
            assert!(l.guarded_auth_failure(IP).await.is_some());
            let refused = l.guarded_check(IP, P, "k", None).await.unwrap_err();
            assert_eq!(refused.limit, 1);
            assert_eq!(l.backend_errors(), 1, "no call within the probe interval");
        }
        assert_eq!(local.check(P, "k").await.remaining, 0, "no token taken");
    }

    async fn unreachable(on_error: OnBackendError, clock: Arc<ManualClock>) -> RateLimiter {
        RateLimiter::redis_with_clock(
            target("redis://127.0.0.1:1"),
            "x:",
            vec![quota(2, 60)],
            quota(1, 60),
            on_error,
            Duration::from_millis(200),
            clock,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn unreachable_redis_falls_back_per_policy() {
        let started = std::time::Instant::now();
        let deny = unreachable(OnBackendError::Deny, clock()).await;
        assert!(!deny.healthy());
        assert_eq!(deny.backend(), "redis");
        let d = deny.check(P, "k").await;
        assert!(!d.allowed);
        assert_eq!((d.limit, d.remaining, d.retry_after_secs), (2, 0, Some(1)));

        let allow = unreachable(OnBackendError::Allow, clock()).await;
        for _ in 0..5 {
            let d = allow.check(P, "k").await;
            assert!(d.allowed);
            assert_eq!(d.remaining, 2);
        }

        let local = unreachable(OnBackendError::Local, clock()).await;
        assert_eq!(local.check(P, "k").await.remaining, 1);
        assert_eq!(local.check(P, "k").await.remaining, 0);
        assert!(!local.check(P, "k").await.allowed);
        // The auth guard counts locally whatever the policy.
        deny.record_auth_failure(IP).await;
        assert!(deny.auth_failures_exceeded(IP).await.is_some());
        allow.record_auth_failure(IP).await;
        assert!(allow.auth_failures_exceeded(IP).await.is_some());

        // Only the start-up connect failed: within a probe interval nothing is retried.
        assert_eq!(deny.backend_errors(), 1);
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn probes_again_after_the_interval() {
        let clock = clock();
        let l = unreachable(OnBackendError::Deny, clock.clone()).await;
        assert_eq!(l.backend_errors(), 1);
        l.check(P, "k").await;
        assert_eq!(l.backend_errors(), 1);
        clock.advance(Duration::from_secs(1));
        l.check(P, "k").await;
        assert_eq!(l.backend_errors(), 2);
        l.check(P, "k").await;
        assert_eq!(l.backend_errors(), 2);
    }

    /// A TCP relay to Redis that can be switched off (dropping every relayed connection).
    async fn switchable_relay(target: String) -> (String, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up_tx, up_rx) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut up = up_rx.clone();
                if !*up.borrow_and_update() {
                    continue; // dropped: connection closed at once
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        (format!("redis://{addr}"), up_tx)
    }

    #[tokio::test]
    async fn starts_in_fallback_and_recovers_when_redis_answers() {
        let real = redis_url();
        let real = real.trim_start_matches("redis://").trim_end_matches('/');
        let (url, up) = switchable_relay(real.to_string()).await;
        let prefix = random_prefix();
        let clock = clock();
        let l = RateLimiter::redis_with_clock(
            target(&url),
            &prefix,
            vec![quota(5, 60)],
            quota(1, 60),
            OnBackendError::Deny,
            Duration::from_millis(300),
            clock.clone(),
        )
        .await
        .unwrap();
        assert!(!l.healthy());
        assert!(!l.check(P, "k").await.allowed);

        up.send_replace(true);
        clock.advance(Duration::from_secs(1));
        assert_eq!(l.check(P, "k").await.remaining, 4);
        assert!(l.healthy());
        assert_eq!(l.check(P, "k").await.remaining, 3);

        // Redis goes away mid-flight: fallback, then back to the same shared bucket.
        up.send_replace(false);
        tokio::task::yield_now().await;
        assert!(!l.check(P, "k").await.allowed);
        assert!(!l.healthy());
        up.send_replace(true);
        clock.advance(Duration::from_secs(1));
        let mut recovered = None;
        for _ in 0..10 {
            let d = l.check(P, "k").await;
            if l.healthy() {
                recovered = Some(d);
                break;
            }
            clock.advance(Duration::from_secs(1));
        }
        assert_eq!(recovered.map(|d| d.remaining), Some(2));
        cleanup(&prefix).await;
    }
}
