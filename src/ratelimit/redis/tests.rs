use super::*;
use crate::ratelimit::{LocalLimiter, ManualClock, RedisTarget};
use ::redis::{AsyncCommands, Client};
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
    let target = RedisTarget::new(&redis_url(), None).unwrap();
    RedisLimiter::connect(&target, prefix, quotas, Duration::from_secs(2))
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
        &RedisTarget::new("redis://127.0.0.1:1", None).unwrap(),
        "x:",
        vec![quota(1, 1)],
        Duration::from_millis(300),
    )
    .await;
    assert!(result.is_err());
    assert!(started.elapsed() < Duration::from_secs(2));
}
