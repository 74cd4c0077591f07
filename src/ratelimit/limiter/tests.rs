//! The limiter: both backends, quotas of a request's own, the guarded decisions, and
//! the fallback while Redis fails.
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
