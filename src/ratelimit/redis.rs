//! The shared limiter: GCRA in Redis, one Lua script per decision, so that
//! several instances count into one bucket.
//!
//! The script reads the time with `redis.call('TIME')`, so the gateways' clocks never
//! matter, and updates the key atomically. Lua numbers are doubles, exact only below 2^53,
//! and Unix nanoseconds are past that; so the stored `tat` is the decimal string of its
//! Unix nanoseconds, split into seconds and nanoseconds when read, and the script only ever
//! computes the key's *debt* (`tat - now`, at most the burst tolerance, below 2^53 by
//! construction). It returns Redis's `now` and the debt before the op, and the Decision is
//! computed in Rust by `gcra.rs`, the same code the local limiter runs.
//!
//! Keys are `{prefix}rl:{policy index}:{key}` and carry a millisecond TTL ending when the
//! bucket is full again, so idle keys vanish by themselves. Every call runs under the
//! configured timeout on a reconnecting, multiplexed connection (`redis_target.rs`); `Script`
//! sends EVALSHA and reloads the script after NOSCRIPT (a Redis restart or `SCRIPT FLUSH`).
//!
//! A script call names its one key, so a Redis Cluster runs it on the node owning that key's
//! slot; buckets spread over the slots. SCRIPT LOAD goes to every node, and a primary
//! that lacks the script (a failover, a new node) answers NOSCRIPT and gets it again.

use std::time::Duration;

use ::redis::Script;

use super::gcra::{Gcra, Op};
use super::redis_target::{RedisConn, RedisTarget};
use super::{Decision, LimiterError, PolicyId, Quota};

/// ARGV: 1 = emission interval T (ns), 2 = burst c*T (ns), 3 = op (0 check, 1 peek,
/// 2 consume). Returns { now seconds, now microseconds, debt before the op (ns) }.
const SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_ns = tonumber(t[2]) * 1000
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local op = ARGV[3]
local debt = 0
local stored = redis.call('GET', KEYS[1])
if stored then
  local tat_s = tonumber(string.sub(stored, 1, -10))
  local tat_ns = tonumber(string.sub(stored, -9))
  if tat_s and tat_ns then
    debt = (tat_s - now_s) * 1000000000 + (tat_ns - now_ns)
  end
  if debt < 0 then debt = 0 elseif debt > burst then debt = burst end
end
local needed = debt + interval
local after = debt
if op == '0' then
  if needed <= burst then after = needed end
elseif op == '2' then
  if needed <= burst then after = needed else after = burst end
end
if after ~= debt and after > 0 then
  local total = now_ns + after
  local carry = math.floor(total / 1000000000)
  local rem = total - carry * 1000000000
  if rem < 0 then carry = carry - 1; rem = rem + 1000000000
  elseif rem >= 1000000000 then carry = carry + 1; rem = rem - 1000000000 end
  local tat = string.format('%d%09d', now_s + carry, rem)
  redis.call('SET', KEYS[1], tat, 'PX', math.ceil(after / 1000000))
end
return { t[1], t[2], debt }
"#;

/// GCRA limiter whose state lives in Redis, shared by every gateway instance.
#[derive(Clone)]
pub struct RedisLimiter {
    conn: RedisConn,
    script: Script,
    prefix: Box<str>,
    policies: Vec<Gcra>,
    timeout: Duration,
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
        let script = Script::new(SCRIPT);
        let conn = tokio::time::timeout(timeout, async {
            let mut conn = target.connect(timeout).await?;
            script.prepare_invoke().load_async(&mut conn).await?;
            Ok::<_, ::redis::RedisError>(conn)
        })
        .await
        .map_err(|_| LimiterError::Timeout)??;
        Ok(Self {
            conn,
            script,
            prefix: prefix.into(),
            policies: policies.iter().map(Gcra::new).collect(),
            timeout,
        })
    }

    /// Takes one token for `key` under `policy` if there is one; a refusal costs nothing.
    pub async fn check(&self, policy: PolicyId, key: &str) -> Result<Decision, LimiterError> {
        self.run(policy, key, Op::Check).await
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

    /// [`Self::check`] against `gcra` instead of the policy's parameters (a
    /// per-key or per-organization quota; its buckets live among the policy's).
    pub(crate) async fn check_with(
        &self,
        policy: PolicyId,
        key: &str,
        gcra: &Gcra,
    ) -> Result<Decision, LimiterError> {
        self.run_with(policy, key, Op::Check, gcra).await
    }

    /// The Redis key holding `key`'s bucket under `policy`.
    fn redis_key(&self, policy: PolicyId, key: &str) -> String {
        format!("{}rl:{}:{}", self.prefix, policy.0, key)
    }

    async fn run(&self, policy: PolicyId, key: &str, op: Op) -> Result<Decision, LimiterError> {
        let gcra = self
            .policies
            .get(policy.0)
            .ok_or(LimiterError::UnknownPolicy(policy.0))?;
        self.run_with(policy, key, op, gcra).await
    }

    async fn run_with(
        &self,
        policy: PolicyId,
        key: &str,
        op: Op,
        gcra: &Gcra,
    ) -> Result<Decision, LimiterError> {
        if policy.0 >= self.policies.len() {
            return Err(LimiterError::UnknownPolicy(policy.0));
        }
        let mut conn = self.conn.clone();
        let mut invocation = self.script.key(self.redis_key(policy, key));
        invocation
            .arg(gcra.interval())
            .arg(gcra.burst())
            .arg(op.code());
        let (secs, micros, debt): (u64, u64, u64) =
            tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn))
                .await
                .map_err(|_| LimiterError::Timeout)??;
        let now = secs
            .saturating_mul(1_000_000_000)
            .saturating_add(micros.saturating_mul(1_000));
        Ok(gcra.decision(now, &gcra.apply(op, debt)))
    }

    /// The burst tolerance of `policy` in ns (tests check key TTLs against it).
    #[cfg(test)]
    fn burst(&self, policy: PolicyId) -> Option<u64> {
        self.policies.get(policy.0).map(Gcra::burst)
    }
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

#[cfg(test)]
pub(crate) mod tests;
