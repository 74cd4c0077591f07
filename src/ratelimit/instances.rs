//! How many gateway instances share the Redis limiter: each writes its id
//! with Redis's time into one sorted set every second and reads how many
//! wrote within the last few seconds. While Redis fails, an instance spends
//! credits from its share of a key's last count, that count divided by this
//! number (`CreditBook::spend_share`), so that the instances together spend
//! no more than the count. Redis down, the last number read stays.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::Script;

use super::redis_target::{RedisConn, RedisTarget};

/// How often each instance says it is there, and reads the count.
const EVERY: Duration = Duration::from_secs(1);

/// An instance not heard from for this long no longer counts (ms).
const FORGET_AFTER_MS: u64 = 5_000;

/// KEYS[1]: the set of instances, scored by when each last wrote (Redis ms).
/// ARGV: this instance's id, [`FORGET_AFTER_MS`]. Returns how many wrote
/// within that time, this one included.
const SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local forget = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - forget)
redis.call('PEXPIRE', KEYS[1], forget)
return redis.call('ZCARD', KEYS[1])
"#;

/// The instances counted last: 1 until Redis has answered.
#[derive(Debug)]
pub(super) struct Instances(AtomicU64);

impl Instances {
    /// The number read last (at least 1: this instance).
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed).max(1)
    }

    /// Counts the instances on `target` under `prefix` every [`EVERY`], each
    /// call within `timeout`, until the returned count is dropped.
    pub(super) fn spawn(target: RedisTarget, prefix: &str, timeout: Duration) -> Arc<Instances> {
        Self::spawn_as(process_id(), target, prefix, timeout)
    }

    /// [`Self::spawn`] counting this instance as `id`.
    fn spawn_as(id: &str, target: RedisTarget, prefix: &str, timeout: Duration) -> Arc<Instances> {
        let instances = Arc::new(Instances(AtomicU64::new(1)));
        let weak = Arc::downgrade(&instances);
        let key = format!("{prefix}instances");
        tokio::spawn(count(weak, target, key, id.to_owned(), timeout));
        instances
    }
}

/// This process's id in the set: one per process, so that a reload's new
/// limiter is not counted as another instance.
fn process_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| crate::secret::generate_id("gw_"))
}

async fn count(
    weak: Weak<Instances>,
    target: RedisTarget,
    key: String,
    id: String,
    timeout: Duration,
) {
    let script = Script::new(SCRIPT);
    let mut conn: Option<RedisConn> = None;
    let mut ticker = tokio::time::interval(EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(instances) = weak.upgrade() else {
            break;
        };
        let counted = tokio::time::timeout(timeout, async {
            let c = match conn.as_mut() {
                Some(c) => c,
                None => conn.insert(target.connect(timeout).await?),
            };
            let mut call = script.key(&key);
            call.arg(&id).arg(FORGET_AFTER_MS);
            call.invoke_async::<u64>(c).await
        })
        .await;
        match counted {
            Ok(Ok(n)) => instances.0.store(n, Ordering::Relaxed),
            // Redis down or slow: keep the last number; connect afresh.
            Ok(Err(_)) | Err(_) => conn = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis_url() -> String {
        std::env::var("MPG_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
    }

    #[tokio::test]
    async fn instances_on_one_prefix_count_one_another_and_the_gone_are_forgotten() {
        let url = redis_url();
        let prefix = format!("mpg-test-{}:", crate::secret::generate_id(""));
        let target = RedisTarget::new(&url, None).unwrap();
        let timeout = Duration::from_secs(1);
        let a = Instances::spawn_as("a", target.clone(), &prefix, timeout);
        let b = Instances::spawn_as("b", target.clone(), &prefix, timeout);
        let c = Instances::spawn_as("c", target.clone(), &prefix, timeout);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while a.get() != 3 || b.get() != 3 {
            assert!(tokio::time::Instant::now() < deadline, "{a:?} {b:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(c);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(9);
        while a.get() != 2 {
            assert!(tokio::time::Instant::now() < deadline, "{a:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
