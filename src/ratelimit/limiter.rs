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
//!
//! A key with usage credits spends them with its token, in the same Redis call
//! (`limiter/spend.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;

use crate::logging::Incident;

use super::clock::{Clock, SystemClock};
use super::credits::{self, CreditBook, CreditSpend, Spent};
use super::gcra::{self, Gcra, Op};
use super::instances::Instances;
use super::nodes::NodeHealth;
use super::redis::Failed;
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
    /// Keys' credit counts: the local backend's own; with Redis, the last
    /// each key's spend answered (and the fallback's).
    credits: Arc<CreditBook>,
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
    /// On a cluster: the primaries failing now. Their slots' decisions fall
    /// back; every other slot's still go to Redis.
    nodes: Arc<NodeHealth>,
    /// The instances sharing this Redis, for the credits' fallback share.
    instances: Arc<Instances>,
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
            credits: Arc::default(),
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
            target: target.clone(),
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
            nodes: NodeHealth::new(),
            instances: Instances::spawn(target.clone(), prefix, timeout),
        };
        // Exported from the start, at 0: a rate over it works before the first
        // failure, and "no failures" reads as 0, not as a missing series.
        metrics::counter!(crate::metrics::names::RATE_LIMIT_BACKEND_ERRORS, "backend" => "redis")
            .increment(0);
        let now = clock.now_nanos();
        match remote.connect().await {
            Ok(limiter) => remote.limiter.store(Some(limiter)),
            Err(err) => remote.mark_down(now, &unattributed(err)),
        }
        Ok(Self {
            gcras: all.iter().map(Gcra::new).collect(),
            auth_policy,
            local: LocalLimiter::with_clock(all, clock),
            remote: Some(remote),
            credits: Arc::default(),
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
        let (decision, _) = self
            .guarded_spend(client_ip, policy, key, quota, None)
            .await?;
        Ok(decision)
    }

    /// [`Self::guarded_check`], then, only if its token is taken, `credit`'s spend at
    /// `credit.1` (unix seconds): in the same Redis call, or in process on the local
    /// backend. The spend's outcome is `None` when it was not made.
    pub async fn guarded_spend(
        &self,
        client_ip: &str,
        policy: PolicyId,
        key: &str,
        quota: Option<&Quota>,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> Result<(Decision, Option<Spent>), Decision> {
        let known = match quota {
            None => policy.0 < self.auth_policy.0,
            Some(_) => policy != self.auth_policy && policy.0 < self.gcras.len(),
        };
        if !known {
            return Ok((gcra::unknown_policy_decision(self.now()), None));
        }
        let gcra = quota.map(Gcra::new);
        self.after_guard(client_ip, policy, key, gcra.as_ref(), credit)
            .await
    }

    /// Takes one authentication-failure token of `client_ip` if one is left:
    /// `Some(refusal)` when none is (nothing is taken then). One step under the
    /// bucket's lock or in one Redis script, so concurrent failures cannot all pass
    /// one peek. Taken before a lookup whose outcome is not known yet, it is given
    /// back with [`Self::refund_auth_failure`] when the credential is good.
    pub async fn guarded_auth_failure(&self, client_ip: &str) -> Option<Decision> {
        let decision = self
            .decide(self.auth_policy, client_ip, Op::Check, true, None)
            .await;
        (!decision.allowed).then_some(decision)
    }

    /// Gives back one authentication-failure token of `client_ip` that
    /// [`Self::guarded_auth_failure`] took (the bucket never fills past full).
    pub async fn refund_auth_failure(&self, client_ip: &str) {
        self.decide(self.auth_policy, client_ip, Op::Refund, true, None)
            .await;
    }

    /// `"local"` or `"redis"` (the configured backend, for readiness and metrics).
    pub fn backend(&self) -> &'static str {
        match self.remote {
            None => "local",
            Some(_) => "redis",
        }
    }

    /// False while the configured backend is failing and decisions come from the
    /// fallback (on a cluster: those of some nodes' slots, see [`Self::nodes_down`]).
    pub fn healthy(&self) -> bool {
        self.remote.as_ref().is_none_or(|remote| {
            remote.limiter.load().is_some()
                && remote.down_until.load(Ordering::Acquire) == 0
                && !remote.nodes.any_down()
        })
    }

    /// On a Redis Cluster, the primaries (`host:port`) whose slots' decisions
    /// fall back now; empty elsewhere.
    pub fn nodes_down(&self) -> Vec<String> {
        self.remote
            .as_ref()
            .map(|remote| remote.nodes.down())
            .unwrap_or_default()
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
        if remote.may_try(now, &[(policy, key)]) {
            match remote.run(policy, key, gcra, op).await {
                Ok(decision) => {
                    remote.mark_up(now, &[(policy, key)]);
                    return decision;
                }
                Err(failed) => remote.mark_down(now, &failed),
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
        quota: Option<&Gcra>,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> Result<(Decision, Option<Spent>), Decision> {
        let Some(remote) = &self.remote else {
            let guard = self.local.peek(self.auth_policy, client_ip);
            if !guard.allowed {
                return Err(guard);
            }
            let decision = self.local_op(policy, key, Op::Check, quota);
            return Ok((decision, self.local_spend(decision.allowed, credit)));
        };
        // Boxed for the reason `decide` boxes.
        Box::pin(self.after_guard_remote(remote, client_ip, policy, key, quota, credit)).await
    }

    /// [`Self::after_guard`] in one Redis call; while Redis fails, the guard from the
    /// in-process limiter and the decision after it as [`Self::decide_remote`] falls back.
    async fn after_guard_remote(
        &self,
        remote: &Remote,
        client_ip: &str,
        policy: PolicyId,
        key: &str,
        quota: Option<&Gcra>,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> Result<(Decision, Option<Spent>), Decision> {
        let op = Op::Check;
        let guard = (
            self.auth_policy,
            client_ip,
            self.gcras[self.auth_policy.0],
            Op::Peek,
        );
        let Some(gcra) = quota.or_else(|| self.gcras.get(policy.0)).copied() else {
            return Ok((gcra::unknown_policy_decision(self.now()), None));
        };
        let now = self.now();
        let keys = [(self.auth_policy, client_ip), (policy, key)];
        if remote.may_try(now, &keys) {
            match remote
                .run_then(guard, (policy, key, gcra, op), credit)
                .await
            {
                Ok((guard, then, credited)) => {
                    remote.mark_up(now, &keys);
                    let then = then.ok_or(guard)?;
                    return Ok((then, self.redis_spent(credited, credit)));
                }
                Err(failed) => remote.mark_down(now, &failed),
            }
        }
        let guard = self.local.peek(self.auth_policy, client_ip);
        if !guard.allowed {
            return Err(guard);
        }
        let decision = match remote.on_error {
            _ if policy == self.auth_policy => self.local_op(policy, key, op, quota),
            OnBackendError::Local => self.local_op(policy, key, op, quota),
            OnBackendError::Deny => gcra.deny_decision(now),
            OnBackendError::Allow => gcra.allow_decision(now),
        };
        Ok((
            decision,
            self.fallback_spend(remote, decision.allowed, credit),
        ))
    }

    fn local_op(&self, policy: PolicyId, key: &str, op: Op, quota: Option<&Gcra>) -> Decision {
        if let Some(gcra) = quota {
            return self.local.run_with(policy, key, op, gcra);
        }
        match op {
            Op::Check => self.local.check(policy, key),
            Op::Peek => self.local.peek(policy, key),
            Op::Consume => self.local.consume(policy, key),
            Op::Refund => self.local.refund(policy, key),
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
        if limiter.is_cluster() {
            match limiter.slot_map().await {
                Ok(map) => self.nodes.set_map(map),
                // Then the cluster's slots share one breaker until a later read.
                Err(e) => tracing::debug!(error = %e, "CLUSTER SLOTS not read at connect"),
            }
        }
        Ok(Arc::new(limiter))
    }

    /// Reads the cluster's slot map again in the background, at most once a second.
    fn refresh_slots(&self, now: u64) {
        let Some(limiter) = self.limiter.load_full().filter(|l| l.is_cluster()) else {
            return;
        };
        if !self.nodes.refresh_due(now) {
            return;
        }
        let nodes = Arc::clone(&self.nodes);
        tokio::spawn(async move {
            match limiter.slot_map().await {
                Ok(map) => nodes.set_map(map),
                Err(e) => {
                    tracing::warn!(error = %crate::logging::Chain(&e), "CLUSTER SLOTS not read")
                }
            }
        });
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
    ) -> Result<Decision, Failed> {
        self.call(op.name(), |l| async move {
            l.decide(policy, key, gcra, op).await
        })
        .await
    }

    /// `first`, then `then` only if `first` is allowed ([`RedisLimiter::decide_then`]).
    async fn run_then(
        &self,
        first: (PolicyId, &str, Gcra, Op),
        then: (PolicyId, &str, Gcra, Op),
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> Result<(Decision, Option<Decision>, Option<credits::Credited>), Failed> {
        self.call("guard_then_check", |l| async move {
            l.decide_then_spending(first, then, credit).await
        })
        .await
    }

    /// One call to Redis by `call` on the connected limiter (connecting first if need
    /// be): timed, and traced as `op` when the request is sampled.
    async fn call<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T, Failed>
    where
        F: FnOnce(Arc<RedisLimiter>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Failed>>,
    {
        let limiter = self.limiter().await.map_err(unattributed)?;
        // The request path's clock, read once per poll: the wait spans two polls, and a
        // reading per poll is exact to within one (microseconds).
        let started = crate::clock::now();
        let mut span = redis_span(op);
        let answer = call(limiter).await;
        self.record_latency(started);
        if let (Some(span), Err(e)) = (span.as_mut(), &answer) {
            span.fail(&e.error);
        }
        answer
    }

    /// Records a call to Redis begun at `started` (a [`crate::clock::now`] reading).
    fn record_latency(&self, started: std::time::Instant) {
        let took = crate::clock::now().saturating_duration_since(started);
        self.latency.record(took.as_secs_f64());
    }

    /// Whether decisions for `keys` may go to Redis now. Healthy: always.
    /// Failed: not before the probe time, then one caller at a time; on a
    /// cluster, per node: a key whose primary is failing falls back (counted
    /// by node), every other key goes to Redis.
    fn may_try(&self, now: u64, keys: &[(PolicyId, &str)]) -> bool {
        let until = self.down_until.load(Ordering::Acquire);
        let whole = until == 0
            || (now >= until
                && self
                    .down_until
                    .compare_exchange(until, probe_time(now), Ordering::AcqRel, Ordering::Acquire)
                    .is_ok());
        if !whole || !self.nodes.any_down() {
            return whole;
        }
        let Some(limiter) = self.limiter.load_full() else {
            return true;
        };
        keys.iter().all(|(policy, key)| {
            let slot = limiter.slot(*policy, key);
            let ok = self.nodes.may_try(slot, now, probe_time(now));
            if !ok {
                metrics::counter!(
                    crate::metrics::names::RATE_LIMIT_NODE_FALLBACKS,
                    "node" => self.nodes.node_of(slot)
                )
                .increment(1);
            }
            ok
        })
    }

    /// Decisions for `keys` came from Redis: a load (no write) while it was healthy.
    fn mark_up(&self, now: u64, keys: &[(PolicyId, &str)]) {
        if self.down_until.load(Ordering::Acquire) != 0
            && self.down_until.swap(0, Ordering::AcqRel) != 0
        {
            if let Some(r) = self.incident.recovered(now / 1_000_000) {
                r.log(tracing::Level::WARN, &self.subject(), "calls failed");
            }
        }
        if !self.nodes.any_down() {
            return;
        }
        let Some(limiter) = self.limiter.load_full() else {
            return;
        };
        for (policy, key) in keys {
            if let Some(node) = self.nodes.answered(limiter.slot(*policy, key)) {
                tracing::warn!(node, "rate-limit backend redis: the node answers again; its slots' decisions are Redis's again");
            }
        }
    }

    fn mark_down(&self, now: u64, failed: &Failed) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(crate::metrics::names::RATE_LIMIT_BACKEND_ERRORS, "backend" => "redis")
            .increment(1);
        let cause = crate::logging::Chain(&failed.error);
        if let Some(slot) = failed.slot {
            // A cluster node: only its slots fall back.
            let node = self.nodes.failed(slot, probe_time(now));
            self.refresh_slots(now);
            if let Some(line) = self.incident.failed(now / 1_000_000) {
                let subject = format!("{} for the slots of node {node}", self.subject());
                line.log(tracing::Level::WARN, &subject, "calls failed", &cause);
            }
            return;
        }
        self.down_until.store(probe_time(now), Ordering::Release);
        if let Some(line) = self.incident.failed(now / 1_000_000) {
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

/// A failure no slot is known for (no connection yet): the whole backend's.
fn unattributed(error: LimiterError) -> Failed {
    Failed { slot: None, error }
}

fn probe_time(now: u64) -> u64 {
    now.saturating_add(PROBE_INTERVAL_NANOS).max(1)
}

mod spend;
#[cfg(test)]
mod tests;

/// The trace span of a call to Redis, when the request is sampled.
/// `op` says which: `check`, `peek`, `consume`, `refund` (the auth-failure
/// guard's), `guard_then_check`, `credits` or `credits_refund` (a key's credit spend
/// made alone, or given back).
fn redis_span(op: &'static str) -> Option<crate::trace::ChildSpan> {
    let mut span = crate::trace::child("ratelimit.redis", opentelemetry::trace::SpanKind::Client)?;
    span.set("db.system.name", "redis");
    span.set("mpg.ratelimit.op", op);
    Some(span)
}
