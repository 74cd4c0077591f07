//! The shared limiter: GCRA in Redis, computed by a Lua script, so that several instances
//! count into one bucket.
//!
//! The script reads the time with `redis.call('TIME')`, so the gateways' clocks never
//! matter, and updates its keys atomically. Lua numbers are doubles, exact only below 2^53,
//! and Unix nanoseconds are past that; so the stored `tat` is the decimal string of its
//! Unix nanoseconds, split into seconds and nanoseconds when read, and the script only ever
//! computes a key's *debt* (`tat - now`, at most the burst tolerance, below 2^53 by
//! construction). It returns Redis's `now` and the debt before the op, and the Decision is
//! computed in Rust by `gcra.rs`, the same code the local limiter runs.
//!
//! The decisions waiting at the same moment share one script call (`redis/batch.rs`),
//! applied in the order they were asked, alike ones in a row as one run
//! (`redis/script.rs`); each caller still waits at most the configured timeout for its own
//! answer (the batching task keeps one deadline per call for that).
//! A decision made only if another is allowed (the request's guard, then its policy) goes
//! in the same call as that one ([`RedisLimiter::decide_then`]). Calls go over one
//! reconnecting, multiplexed connection (`redis_target.rs`) as EVALSHA; after NOSCRIPT (a
//! Redis restart or `SCRIPT FLUSH`) the call goes again as EVAL with the script's text,
//! which caches it again.
//!
//! Keys are `{prefix}rl:{policy index}:{key}` and carry a millisecond TTL ending when the
//! bucket is full again, so idle keys vanish by themselves. On a Redis Cluster a call holds
//! the keys of one slot, so it runs on the node owning that slot; buckets spread over the
//! slots. SCRIPT LOAD goes to every node at connect, and a primary that lacks the script
//! (a failover, a new node) answers NOSCRIPT and gets it with the EVAL.

mod batch;
mod script;

use std::time::Duration;

use ::redis::Script;
use tokio::sync::oneshot;

use self::batch::Batcher;
use self::script::{Answer, CreditStep, Pending, Step};
use super::credits::Credited;
use super::gcra::{Gcra, Op};
use super::nodes::slot as key_slot;
use super::redis_target::{RedisConn, RedisTarget};
use super::{Decision, LimiterError, PolicyId, Quota};

/// GCRA limiter whose state lives in Redis, shared by every gateway instance.
#[derive(Clone)]
pub struct RedisLimiter {
    batcher: Batcher,
    prefix: Box<str>,
    /// `{prefix}rl:{policy index}:` per policy, so that a key is two copies, not a format.
    key_prefixes: Vec<Box<str>>,
    /// `{prefix}cr:`, the start of every credit count's key.
    credit_prefix: Box<str>,
    policies: Vec<Gcra>,
    timeout: Duration,
    /// A Redis Cluster: one call holds the keys of one slot only.
    cluster: bool,
    /// For `CLUSTER SLOTS` and credit spends (decisions go through the batcher's clone).
    conn: RedisConn,
    /// The credit spend's script ([`super::credits::SCRIPT`]).
    credit_script: Script,
}

/// A failed decision, with the slot of the key it failed on (on a cluster):
/// the node that did not answer is the one serving that slot.
#[derive(Debug, Clone)]
pub(crate) struct Failed {
    pub(crate) slot: Option<u16>,
    pub(crate) error: LimiterError,
}

impl RedisLimiter {
    /// Connects to `target` (and loads the script) within `timeout`; keys are named
    /// `{prefix}rl:{policy index}:{key}`. Later calls reconnect by themselves.
    pub async fn connect(
        target: &RedisTarget,
        prefix: &str,
        policies: Vec<Quota>,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        let script = Script::new(script::SCRIPT);
        let conn = tokio::time::timeout(timeout, async {
            let mut conn = target.connect(timeout).await?;
            script.prepare_invoke().load_async(&mut conn).await?;
            Ok::<_, ::redis::RedisError>(conn)
        })
        .await
        .map_err(|_| LimiterError::Timeout)??;
        let cluster = conn.is_cluster();
        Ok(Self {
            batcher: Batcher::spawn(conn.clone(), script.get_hash().to_owned(), cluster, timeout),
            conn,
            prefix: prefix.into(),
            key_prefixes: (0..policies.len())
                .map(|i| format!("{prefix}rl:{i}:").into())
                .collect(),
            credit_prefix: format!("{prefix}cr:").into(),
            policies: policies.iter().map(Gcra::new).collect(),
            timeout,
            cluster,
            credit_script: Script::new(super::credits::SCRIPT),
        })
    }

    /// Spends `spend`'s cost from its key's count in Redis, in one script
    /// call: `[spent, remaining, generation, period, now]`.
    pub(crate) async fn spend_credits(
        &self,
        spend: &super::CreditSpend<'_>,
        now: i64,
    ) -> Result<[i64; 5], Failed> {
        self.credit_call(spend, now, spend.cost as i64).await
    }

    /// Gives back `spend`'s cost to its key's count (the script with a negative cost).
    pub(crate) async fn refund_credits(
        &self,
        spend: &super::CreditSpend<'_>,
        now: i64,
    ) -> Result<[i64; 5], Failed> {
        self.credit_call(spend, now, -(spend.cost as i64)).await
    }

    /// One call of the credit script for `spend` with `cost`.
    async fn credit_call(
        &self,
        spend: &super::CreditSpend<'_>,
        now: i64,
        cost: i64,
    ) -> Result<[i64; 5], Failed> {
        let key = self.credit_key(spend.key_id);
        let slot = self.cluster.then(|| key_slot(key.as_bytes()));
        let failed = |error| Failed { slot, error };
        let c = &spend.credits;
        let period = c.period_at(spend.created_at, now);
        let mut invocation = self.credit_script.key(key);
        invocation
            .arg(c.generation)
            .arg(spend.created_at)
            .arg(c.refill.map_or(0, |r| r.interval.as_secs()))
            .arg(c.refill.map_or(0, |r| r.amount))
            .arg(period)
            .arg(c.remaining_at(spend.created_at, now))
            .arg(cost)
            .arg(super::credits::ttl_ms(c));
        let mut conn = self.conn.clone();
        let reply = tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn))
            .await
            .map_err(|_| failed(LimiterError::Timeout))?;
        let reply: Vec<i64> = reply.map_err(|e| failed(e.into()))?;
        reply.try_into().map_err(|_| failed(unexpected_reply()))
    }

    /// The Redis key of an API key's credit count.
    pub(crate) fn credit_key(&self, key_id: &str) -> String {
        joined(&self.credit_prefix, key_id)
    }

    /// Takes one token for `key` under `policy` if there is one; a refusal costs nothing.
    pub async fn check(&self, policy: PolicyId, key: &str) -> Result<Decision, LimiterError> {
        self.run(policy, key, Op::Check).await
    }

    /// The cluster slot of `key`'s bucket under `policy` (0 on a single server).
    pub(crate) fn slot(&self, policy: PolicyId, key: &str) -> u16 {
        if !self.cluster {
            return 0;
        }
        key_slot(self.redis_key(policy, key).as_bytes())
    }

    /// Whether this is a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Which primary serves each slot, from `CLUSTER SLOTS`, within the timeout.
    pub(crate) async fn slot_map(&self) -> Result<super::nodes::SlotMap, LimiterError> {
        let mut conn = self.conn.clone();
        let reply = tokio::time::timeout(
            self.timeout,
            ::redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<::redis::Value>(&mut conn),
        )
        .await
        .map_err(|_| LimiterError::Timeout)??;
        super::nodes::SlotMap::parse(&reply).ok_or_else(unexpected_reply)
    }

    /// Whether `key` would be allowed now, without taking anything.
    pub async fn peek(&self, policy: PolicyId, key: &str) -> Result<Decision, LimiterError> {
        self.run(policy, key, Op::Peek).await
    }

    /// Records one unit of cost even if no whole token is left (drains to empty, never
    /// beyond); see [`super::LocalLimiter::consume`].
    pub async fn consume(&self, policy: PolicyId, key: &str) -> Result<Decision, LimiterError> {
        self.run(policy, key, Op::Consume).await
    }

    /// The Redis key holding `key`'s bucket under `policy`.
    fn redis_key(&self, policy: PolicyId, key: &str) -> String {
        let Some(start) = self.key_prefixes.get(policy.0) else {
            return format!("{}rl:{}:{}", self.prefix, policy.0, key);
        };
        joined(start, key)
    }

    async fn run(&self, policy: PolicyId, key: &str, op: Op) -> Result<Decision, LimiterError> {
        let gcra = self
            .policies
            .get(policy.0)
            .ok_or(LimiterError::UnknownPolicy(policy.0))?;
        self.decide(policy, key, *gcra, op)
            .await
            .map_err(|f| f.error)
    }

    /// Applies `op` to `key`'s bucket under `policy` with the parameters `gcra` (the
    /// policy's own, or a quota given for this request), in the next batch.
    pub(crate) async fn decide(
        &self,
        policy: PolicyId,
        key: &str,
        gcra: Gcra,
        op: Op,
    ) -> Result<Decision, Failed> {
        let (decision, _) = self.decide_spending(policy, key, gcra, op, None).await?;
        Ok(decision)
    }

    /// [`Self::decide`], then, only if allowed, `credit`'s spend in the same script call
    /// (on a cluster, in a second call when its key is in another slot).
    pub(crate) async fn decide_spending(
        &self,
        policy: PolicyId,
        key: &str,
        gcra: Gcra,
        op: Op,
        credit: Option<(&super::CreditSpend<'_>, i64)>,
    ) -> Result<(Decision, Option<Credited>), Failed> {
        let key = self.redis_key(policy, key);
        let (step, apart) = self.credit_step(&key, credit);
        let answer = self.send(key, gcra, op, None, step).await?;
        let decision = gcra.decision(answer.now, &gcra.apply(op, answer.debt));
        let credited = self
            .credited(decision.allowed, answer.credit, apart)
            .await?;
        Ok((decision, credited))
    }

    /// The credit step of `credit` for a call on `key`, or, on a cluster where its count
    /// lives in another slot, `None` and the spend to make in a call of its own.
    fn credit_step<'c>(
        &self,
        key: &str,
        credit: Option<(&'c super::CreditSpend<'c>, i64)>,
    ) -> (
        Option<CreditStep>,
        Option<(&'c super::CreditSpend<'c>, i64)>,
    ) {
        let Some((spend, now)) = credit else {
            return (None, None);
        };
        let count = self.credit_key(spend.key_id);
        if self.cluster && key_slot(count.as_bytes()) != key_slot(key.as_bytes()) {
            return (None, credit);
        }
        let c = &spend.credits;
        let args = [
            c.generation as f64,
            spend.created_at as f64,
            c.refill.map_or(0, |r| r.interval.as_secs()) as f64,
            c.refill.map_or(0, |r| r.amount) as f64,
            c.period_at(spend.created_at, now) as f64,
            c.remaining_at(spend.created_at, now) as f64,
            spend.cost as f64,
            super::credits::ttl_ms(c) as f64,
        ];
        (Some(CreditStep { key: count, args }), None)
    }

    /// The credit outcome of a call: what its step answered, or, for a spend whose count
    /// lives in another slot, that spend made now if the decision was allowed.
    async fn credited(
        &self,
        allowed: bool,
        answered: Option<Credited>,
        apart: Option<(&super::CreditSpend<'_>, i64)>,
    ) -> Result<Option<Credited>, Failed> {
        match apart {
            Some((spend, now)) if allowed => {
                let [ok, remaining, ..] = self.spend_credits(spend, now).await?;
                let left = remaining.max(0) as u64;
                Ok(Some(if ok == 1 {
                    Credited::Spent(left)
                } else {
                    Credited::Short(left)
                }))
            }
            _ => Ok(answered),
        }
    }

    /// [`Self::decide`] for `first`, then for `then` only if `first` is allowed, in one
    /// script call: `(first's decision, then's if made)`. On a cluster, keys of two slots
    /// take two calls, the second only if needed.
    #[cfg(test)]
    pub(crate) async fn decide_then(
        &self,
        first: (PolicyId, &str, Gcra, Op),
        then: (PolicyId, &str, Gcra, Op),
    ) -> Result<(Decision, Option<Decision>), Failed> {
        let (decision, then, _) = self.decide_then_spending(first, then, None).await?;
        Ok((decision, then))
    }

    /// [`Self::decide_then`], then, only if both are allowed, `credit`'s spend in the
    /// same call (on a cluster, as [`Self::decide_spending`] makes it).
    pub(crate) async fn decide_then_spending(
        &self,
        first: (PolicyId, &str, Gcra, Op),
        then: (PolicyId, &str, Gcra, Op),
        credit: Option<(&super::CreditSpend<'_>, i64)>,
    ) -> Result<(Decision, Option<Decision>, Option<Credited>), Failed> {
        let (policy, key, gcra, op) = first;
        let (then_policy, then_key, then_gcra, then_op) = then;
        let first_key = self.redis_key(policy, key);
        let then_key = self.redis_key(then_policy, then_key);
        if self.cluster && key_slot(first_key.as_bytes()) != key_slot(then_key.as_bytes()) {
            let answer = self.send(first_key, gcra, op, None, None).await?;
            let decision = gcra.decision(answer.now, &gcra.apply(op, answer.debt));
            if !decision.allowed {
                return Ok((decision, None, None));
            }
            let (step, apart) = self.credit_step(&then_key, credit);
            let answer = self.send(then_key, then_gcra, then_op, None, step).await?;
            let then = then_gcra.decision(answer.now, &then_gcra.apply(then_op, answer.debt));
            let credited = self.credited(then.allowed, answer.credit, apart).await?;
            return Ok((decision, Some(then), credited));
        }
        let (credit_step, apart) = self.credit_step(&first_key, credit);
        let step = Step {
            key: then_key,
            gcra: then_gcra,
            op: then_op,
        };
        let answer = self
            .send(first_key, gcra, op, Some(step), credit_step)
            .await?;
        let decision = gcra.decision(answer.now, &gcra.apply(op, answer.debt));
        let then = match (decision.allowed, answer.then) {
            (true, Some(debt)) => {
                Some(then_gcra.decision(answer.now, &then_gcra.apply(then_op, debt)))
            }
            (false, None) => None,
            // The script makes the second decision exactly when the first is allowed.
            _ => {
                return Err(Failed {
                    slot: None,
                    error: unexpected_reply(),
                })
            }
        };
        let allowed = then.is_some_and(|t| t.allowed);
        let credited = self.credited(allowed, answer.credit, apart).await?;
        Ok((decision, then, credited))
    }

    /// Queues one decision (and its second, if any) and waits for its answer.
    async fn send(
        &self,
        key: String,
        gcra: Gcra,
        op: Op,
        then: Option<Step>,
        credit: Option<CreditStep>,
    ) -> Result<Answer, Failed> {
        let slot = self.cluster.then(|| key_slot(key.as_bytes()));
        let failed = |error| Failed { slot, error };
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            key,
            gcra,
            op,
            then,
            credit,
            reply,
        };
        if !self.batcher.send(pending) {
            return Err(failed(LimiterError::Stopped));
        }
        // The batching task answers within the timeout (or fails the call) by itself.
        match answer.await {
            Ok(answer) => answer.map_err(failed),
            Err(_) => Err(failed(LimiterError::Stopped)),
        }
    }

    /// Script calls made so far (one per batch on a single server).
    #[cfg(test)]
    fn calls(&self) -> u64 {
        self.batcher.calls()
    }

    /// The burst tolerance of `policy` in ns (tests check key TTLs against it).
    #[cfg(test)]
    fn burst(&self, policy: PolicyId) -> Option<u64> {
        self.policies.get(policy.0).map(Gcra::burst)
    }
}

/// A script reply that contradicts itself.
fn unexpected_reply() -> LimiterError {
    LimiterError::Unavailable(std::sync::Arc::new(::redis::RedisError::from((
        ::redis::ErrorKind::UnexpectedReturnType,
        "unexpected rate-limit script reply",
    ))))
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &self.prefix)
            .field("policies", &self.policies.len())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// `start` then `key`, in one allocation of the right size: a Redis key is made on every
/// request, and two copies cost a fraction of a `format!`.
fn joined(start: &str, key: &str) -> String {
    let mut out = String::with_capacity(start.len() + key.len());
    out.push_str(start);
    out.push_str(key);
    out
}

#[cfg(test)]
pub(crate) mod tests;
