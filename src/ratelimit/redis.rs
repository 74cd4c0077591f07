//! The shared limiter: GCRA in Redis, one Lua script per decision (DESIGN.md §8).
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
//! configured timeout on a reconnecting, multiplexed `ConnectionManager`; `Script` sends
//! EVALSHA and reloads the script after NOSCRIPT (a Redis restart or `SCRIPT FLUSH`).

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Script};

use super::gcra::{Gcra, Op};
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
    conn: ConnectionManager,
    script: Script,
    prefix: Box<str>,
    policies: Vec<Gcra>,
    timeout: Duration,
}

impl RedisLimiter {
    /// Connects to `url` (and loads the script) within `timeout`; keys are named
    /// `{prefix}rl:{policy index}:{key}`. Later calls reconnect by themselves.
    pub async fn connect(
        url: &str,
        prefix: &str,
        policies: Vec<Quota>,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        let client = Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(2)
            .set_max_delay(1_000);
        let script = Script::new(SCRIPT);
        let conn = tokio::time::timeout(timeout, async {
            let mut conn = ConnectionManager::new_with_config(client, config).await?;
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

    /// The Redis key holding `key`'s bucket under `policy`.
    fn redis_key(&self, policy: PolicyId, key: &str) -> String {
        format!("{}rl:{}:{}", self.prefix, policy.0, key)
    }

    async fn run(&self, policy: PolicyId, key: &str, op: Op) -> Result<Decision, LimiterError> {
        let gcra = self
            .policies
            .get(policy.0)
            .ok_or(LimiterError::UnknownPolicy(policy.0))?;
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
pub(crate) mod tests {
    use super::*;
    use crate::ratelimit::{LocalLimiter, ManualClock};
    use ::redis::AsyncCommands;
    use std::num::NonZeroU32;
    use std::sync::Arc;

    pub(crate) fn redis_url() -> String {
        std::env::var("MPG_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
    }

    pub(crate) fn random_prefix() -> String {
        format!("mpgtest:{:016x}:", rand::random::<u64>())
    }

    /// Deletes every key under `prefix`.
    pub(crate) async fn cleanup(prefix: &str) {
        let client = Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = conn.keys(format!("{prefix}*")).await.unwrap();
        if !keys.is_empty() {
            let _: () = conn.del(keys).await.unwrap();
        }
    }

    fn quota(capacity: u32, secs: u64) -> Quota {
        Quota::new(
            NonZeroU32::new(capacity).unwrap(),
            Duration::from_secs(secs),
        )
    }

    async fn connect(prefix: &str, quotas: Vec<Quota>) -> RedisLimiter {
        RedisLimiter::connect(&redis_url(), prefix, quotas, Duration::from_secs(2))
            .await
            .unwrap()
    }

    const P: PolicyId = PolicyId(0);

    #[tokio::test]
    async fn burst_matches_the_local_limiter() {
        let prefix = random_prefix();
        let quotas = vec![quota(5, 60)];
        let redis = connect(&prefix, quotas.clone()).await;
        let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
        let local = LocalLimiter::with_clock(quotas, clock);
        for _ in 0..8 {
            let r = redis.check(P, "client").await.unwrap();
            let l = local.check(P, "client");
            assert_eq!(
                (
                    r.allowed,
                    r.limit,
                    r.remaining,
                    r.retry_after_secs,
                    r.window_secs
                ),
                (
                    l.allowed,
                    l.limit,
                    l.remaining,
                    l.retry_after_secs,
                    l.window_secs
                )
            );
        }
        let peek = redis.peek(P, "client").await.unwrap();
        assert!(!peek.allowed);
        assert_eq!(peek.retry_after_secs, Some(12));
        cleanup(&prefix).await;
    }

    #[tokio::test]
    async fn stored_tat_matches_the_reported_reset_and_carries_a_ttl() {
        let prefix = random_prefix();
        let redis = connect(&prefix, vec![quota(10, 10)]).await;
        let d = redis.check(P, "k").await.unwrap();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(d.reset_unix >= wall && d.reset_unix <= wall + 3, "{d:?}");
        let client = Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let key = format!("{prefix}rl:0:k");
        let tat: u64 = conn.get(&key).await.unwrap();
        assert_eq!(d.reset_unix, tat.div_ceil(1_000_000_000));
        let pttl: i64 = conn.pttl(&key).await.unwrap();
        let burst_ms = redis.burst(P).unwrap() / 1_000_000;
        assert!(pttl > 0 && pttl as u64 <= burst_ms, "pttl {pttl}");
        // A peek on a fresh key writes nothing.
        redis.peek(P, "fresh").await.unwrap();
        let exists: bool = conn.exists(format!("{prefix}rl:0:fresh")).await.unwrap();
        assert!(!exists);
        cleanup(&prefix).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_tasks_admit_exactly_capacity() {
        let prefix = random_prefix();
        let redis = connect(&prefix, vec![quota(10, 60)]).await;
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let redis = redis.clone();
            tasks.push(tokio::spawn(async move {
                let mut allowed = 0;
                for _ in 0..5 {
                    if redis.check(P, "hot").await.unwrap().allowed {
                        allowed += 1;
                    }
                }
                allowed
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap();
        }
        assert_eq!(total, 10);
        cleanup(&prefix).await;
    }

    #[tokio::test]
    async fn script_flush_is_survived() {
        let prefix = random_prefix();
        let redis = connect(&prefix, vec![quota(3, 60)]).await;
        assert_eq!(redis.check(P, "k").await.unwrap().remaining, 2);
        let client = Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = ::redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(redis.check(P, "k").await.unwrap().remaining, 1);
        cleanup(&prefix).await;
    }

    #[tokio::test]
    async fn consume_and_unknown_policy() {
        let prefix = random_prefix();
        let redis = connect(&prefix, vec![quota(2, 60)]).await;
        assert!(redis.consume(P, "ip").await.unwrap().allowed);
        assert!(redis.consume(P, "ip").await.unwrap().allowed);
        assert!(!redis.consume(P, "ip").await.unwrap().allowed);
        assert!(!redis.peek(P, "ip").await.unwrap().allowed);
        assert!(matches!(
            redis.check(PolicyId(3), "ip").await,
            Err(LimiterError::UnknownPolicy(3))
        ));
        cleanup(&prefix).await;
    }

    #[tokio::test]
    async fn unreachable_redis_fails_within_the_timeout() {
        let started = std::time::Instant::now();
        let result = RedisLimiter::connect(
            "redis://127.0.0.1:1",
            "x:",
            vec![quota(1, 1)],
            Duration::from_millis(300),
        )
        .await;
        assert!(result.is_err());
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
