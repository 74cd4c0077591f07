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

mod relay;

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

// === batching ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_decisions_on_one_key_admit_exactly_capacity_in_few_calls() {
    let prefix = random_prefix();
    // Two instances on one bucket, each with its own connection and batches.
    let a = connect(&prefix, vec![quota(100, 3600)]).await;
    let b = connect(&prefix, vec![quota(100, 3600)]).await;
    let mut tasks = Vec::new();
    for i in 0..400 {
        let redis = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            redis.check(P, "hot").await.unwrap().allowed
        }));
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += usize::from(task.await.unwrap());
    }
    assert_eq!(allowed, 100);
    let calls = a.calls() + b.calls();
    assert!(calls < 400, "{calls} script calls for 400 decisions");
    cleanup(&prefix).await;
}

#[tokio::test]
async fn one_batch_of_mixed_keys_policies_and_ops_decides_as_in_sequence() {
    let prefix = random_prefix();
    let quotas = vec![quota(3, 60), quota(5, 10), quota(2, 3600)];
    let redis = connect(&prefix, quotas.clone()).await;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    let local = LocalLimiter::with_clock(quotas.clone(), clock);
    let mut asked = Vec::new();
    for i in 0..60usize {
        let policy = PolicyId(i % 3);
        let key = ["a", "b", "c", "d"][i % 4];
        let op = [
            Op::Check,
            Op::Check,
            Op::Peek,
            Op::Refund,
            Op::Check,
            Op::Consume,
        ][i % 6];
        asked.push((policy, key, op));
    }
    // Polled together, the decisions are queued in this order before the task runs.
    let before = redis.calls();
    let decisions = futures_util::future::join_all(asked.iter().map(|&(policy, key, op)| {
        let redis = &redis;
        let gcra = Gcra::new(&quotas[policy.0]);
        async move { redis.decide(policy, key, gcra, op).await.unwrap() }
    }))
    .await;
    assert_eq!(
        redis.calls() - before,
        1,
        "one script call for the whole batch"
    );
    for ((policy, key, op), r) in asked.into_iter().zip(decisions) {
        let l = match op {
            Op::Check => local.check(policy, key),
            Op::Peek => local.peek(policy, key),
            Op::Consume => local.consume(policy, key),
            Op::Refund => local.refund(policy, key),
        };
        assert_eq!(
            (r.allowed, r.limit, r.remaining, r.retry_after_secs),
            (l.allowed, l.limit, l.remaining, l.retry_after_secs),
            "{policy:?} {key} {op:?}"
        );
    }
    // Peeks at fresh keys in a batch write nothing.
    let client = Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: Vec<_> = futures_util::future::join_all((0..5).map(|_| redis.peek(P, "fresh"))).await;
    let exists: bool = conn.exists(format!("{prefix}rl:0:fresh")).await.unwrap();
    assert!(!exists);
    cleanup(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flushes_amid_batches_neither_fail_nor_double_count() {
    let prefix = random_prefix();
    let a = connect(&prefix, vec![quota(150, 3600)]).await;
    let b = connect(&prefix, vec![quota(150, 3600)]).await;
    let flusher = tokio::spawn(async {
        let client = Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for _ in 0..40 {
            let _: () = ::redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let mut tasks = Vec::new();
    for i in 0..300 {
        let redis = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut allowed = 0;
            for _ in 0..2 {
                allowed += usize::from(redis.check(P, "hot").await.unwrap().allowed);
            }
            allowed
        }));
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += task.await.unwrap();
    }
    flusher.await.unwrap();
    assert_eq!(allowed, 150);
    cleanup(&prefix).await;
}

#[tokio::test]
async fn a_decision_given_up_before_its_batch_takes_nothing() {
    use futures_util::FutureExt;
    let prefix = random_prefix();
    let redis = connect(&prefix, vec![quota(5, 60)]).await;
    let mut abandoned = Box::pin(redis.check(P, "k"));
    assert!(
        (&mut abandoned).now_or_never().is_none(),
        "queued, not answered"
    );
    drop(abandoned);
    assert_eq!(redis.check(P, "k").await.unwrap().remaining, 4);
    cleanup(&prefix).await;
}

/// A request that becomes ready to run after another queued its decision (its bytes came
/// in the same turn of the event loop) has its decision in the same call: the batching
/// task lets the tasks ready to run queue theirs before it sends.
#[tokio::test]
async fn decisions_of_tasks_ready_in_the_same_turn_share_one_call() {
    let prefix = random_prefix();
    let redis = connect(&prefix, vec![quota(100, 60)]).await;
    assert!(redis.check(P, "warm").await.unwrap().allowed);
    let calls = redis.calls();
    let go = Arc::new(tokio::sync::Notify::new());
    let second = {
        let (redis, go) = (redis.clone(), go.clone());
        tokio::spawn(async move {
            go.notified().await;
            redis.check(P, "b").await
        })
    };
    // `second` now waits for `go`.
    tokio::task::yield_now().await;
    let first = redis.check(P, "a");
    tokio::pin!(first);
    // Queues `a` (waking the batching task), then readies `second` behind it.
    assert!(futures_util::poll!(&mut first).is_pending());
    go.notify_one();
    assert!(first.await.unwrap().allowed);
    assert!(second.await.unwrap().unwrap().allowed);
    assert_eq!(redis.calls() - calls, 1, "one call for both");
    cleanup(&prefix).await;
}

#[tokio::test]
async fn a_batch_of_many_distinct_quotas_gives_each_decision_its_own() {
    // A call names each distinct interval and burst once: more of them than the linear
    // search covers, repeated and interleaved, must still reach the right decisions.
    let prefix = random_prefix();
    let redis = connect(&prefix, vec![quota(1, 60)]).await;
    let capacities: Vec<u32> = (0..40).map(|i| 2 + i % 20).collect();
    let keys: Vec<String> = (0..capacities.len()).map(|i| format!("k{i}")).collect();
    let calls = redis.calls();
    let decisions =
        futures_util::future::join_all(capacities.iter().zip(&keys).map(|(&capacity, key)| {
            redis.decide(P, key, Gcra::new(&quota(capacity, 60)), Op::Check)
        }))
        .await;
    assert_eq!(redis.calls() - calls, 1, "one batch");
    for (capacity, decision) in capacities.into_iter().zip(decisions) {
        let decision = decision.unwrap();
        assert!(decision.allowed);
        assert_eq!(
            (decision.limit, decision.remaining),
            (capacity, capacity - 1)
        );
    }
    cleanup(&prefix).await;
}

#[tokio::test]
async fn one_bucket_under_two_quotas_in_a_batch_sees_each_quota_as_in_sequence() {
    // A per-request quota can differ from the last one used on the bucket: each decision
    // clamps the debt to its own burst, and a peek leaves the stored debt as it was.
    let prefix = random_prefix();
    let redis = connect(&prefix, vec![quota(1, 60)]).await;
    let small = Gcra::new(&quota(2, 2)); // T 1 s, burst 2 s
    let large = Gcra::new(&quota(10, 20)); // T 2 s, burst 20 s
    let asked = [
        (small, Op::Check),
        (small, Op::Check),
        (large, Op::Check),
        (small, Op::Peek),
        (large, Op::Check),
        (small, Op::Consume),
        (large, Op::Peek),
    ];
    let decisions = futures_util::future::join_all(
        asked
            .iter()
            .map(|&(gcra, op)| redis.decide(P, "k", gcra, op)),
    )
    .await;
    let mut debt = 0;
    for ((gcra, op), got) in asked.into_iter().zip(decisions) {
        let got = got.unwrap();
        let outcome = gcra.apply(op, debt);
        let want = gcra.decision(0, &outcome);
        assert_eq!(
            (got.allowed, got.limit, got.remaining, got.retry_after_secs),
            (
                want.allowed,
                want.limit,
                want.remaining,
                want.retry_after_secs
            ),
            "{op:?} under {gcra:?}"
        );
        // What the stored tat gives the next decision: unchanged by a refusal or a peek.
        if outcome.debt_after != outcome.debt_before {
            debt = outcome.debt_after;
        }
    }
    cleanup(&prefix).await;
}

// === a decision made only if the one before it is allowed ===

const GUARD: PolicyId = PolicyId(1);

/// A policy of 3 a minute and a guard of 2 an hour.
async fn guarded(prefix: &str) -> (RedisLimiter, Gcra, Gcra) {
    let quotas = vec![quota(3, 60), quota(2, 3600)];
    let (policy, guard) = (Gcra::new(&quotas[0]), Gcra::new(&quotas[1]));
    (connect(prefix, quotas).await, policy, guard)
}

/// The local limiter with the quotas of [`guarded`], to decide the same in sequence.
fn guarded_locally() -> LocalLimiter {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    LocalLimiter::with_clock(vec![quota(3, 60), quota(2, 3600)], clock)
}

#[tokio::test]
async fn a_second_decision_goes_in_the_same_call_and_takes_nothing_after_a_refusal() {
    let prefix = random_prefix();
    let (redis, policy, guard) = guarded(&prefix).await;
    let peek = (GUARD, "ip", guard, Op::Peek);
    let before = redis.calls();
    let (g, then) = redis
        .decide_then(peek, (P, "k", policy, Op::Check))
        .await
        .unwrap();
    assert!(g.allowed);
    assert_eq!(then.map(|d| d.remaining), Some(2));
    let (_, then) = redis
        .decide_then(peek, (GUARD, "ip", guard, Op::Consume))
        .await
        .unwrap();
    assert_eq!(then.map(|d| d.remaining), Some(1));
    assert_eq!(redis.calls() - before, 2, "one call per pair");
    redis.consume(GUARD, "ip").await.unwrap();
    // The guard refuses now: neither the policy's token nor another failure is taken.
    let client = Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = [format!("{prefix}rl:0:k"), format!("{prefix}rl:1:ip")];
    let was: Vec<String> = conn.mget(&keys).await.unwrap();
    for then in [
        (P, "k", policy, Op::Check),
        (GUARD, "ip", guard, Op::Consume),
    ] {
        let (g, then) = redis.decide_then(peek, then).await.unwrap();
        assert_eq!((g.allowed, g.limit, then), (false, 2, None));
    }
    let (_, then) = redis
        .decide_then(peek, (P, "fresh", policy, Op::Check))
        .await
        .unwrap();
    assert_eq!(then, None);
    let now: Vec<String> = conn.mget(&keys).await.unwrap();
    assert_eq!(now, was);
    let exists: bool = conn.exists(format!("{prefix}rl:0:fresh")).await.unwrap();
    assert!(!exists);
    assert_eq!(redis.check(P, "k").await.unwrap().remaining, 1);
    cleanup(&prefix).await;
}

/// A request of the batches of the tests below: the ip whose guard is peeked first, if
/// any; the policy's key, or, behind a guard, None for a failure recorded for the ip; the
/// op on the key.
type Asked = (Option<&'static str>, Option<&'static str>, Op);

/// Sends `asked` in one batch and checks each answer against the local limiter's, made in
/// sequence; returns how many of the requests' last decisions were allowed, refused and
/// skipped (a guard refused).
async fn in_one_call_as_in_sequence(
    redis: &RedisLimiter,
    local: &LocalLimiter,
    (policy, guard): (Gcra, Gcra),
    asked: &[Asked],
) -> (usize, usize, usize) {
    let before = redis.calls();
    let decisions = futures_util::future::join_all(asked.iter().map(|&(ip, key, op)| async move {
        let Some(ip) = ip else {
            let key = key.unwrap();
            return (None, Some(redis.decide(P, key, policy, op).await.unwrap()));
        };
        let then = match key {
            Some(key) => (P, key, policy, op),
            None => (GUARD, ip, guard, Op::Consume),
        };
        let peek = (GUARD, ip, guard, Op::Peek);
        let (g, then) = redis.decide_then(peek, then).await.unwrap();
        (Some(g), then)
    }))
    .await;
    assert_eq!(redis.calls() - before, 1, "one script call for the batch");
    let fields = |d: &Decision| (d.allowed, d.limit, d.remaining, d.retry_after_secs);
    let (mut allowed, mut refused, mut skipped) = (0, 0, 0);
    for (i, (&(ip, key, op), (g, then))) in asked.iter().zip(decisions).enumerate() {
        let want_guard = ip.map(|ip| local.peek(GUARD, ip));
        let want_then = match (&want_guard, key) {
            (Some(g), _) if !g.allowed => None,
            (_, Some(key)) => Some(match op {
                Op::Check => local.check(P, key),
                Op::Peek => local.peek(P, key),
                Op::Consume => local.consume(P, key),
                Op::Refund => local.refund(P, key),
            }),
            (Some(_), None) => Some(local.consume(GUARD, ip.unwrap())),
            (None, None) => unreachable!(),
        };
        match &want_then {
            Some(d) if d.allowed => allowed += 1,
            Some(_) => refused += 1,
            None => skipped += 1,
        }
        let at = format!("request {i} of {asked:?}");
        assert_eq!(
            g.as_ref().map(fields),
            want_guard.as_ref().map(fields),
            "{at}: the guard"
        );
        assert_eq!(
            then.as_ref().map(fields),
            want_then.as_ref().map(fields),
            "{at}"
        );
    }
    (allowed, refused, skipped)
}

#[tokio::test]
async fn a_batch_mixing_guarded_and_plain_decisions_decides_as_in_sequence() {
    let prefix = random_prefix();
    let (redis, policy, guard) = guarded(&prefix).await;
    let local = guarded_locally();
    let mut asked: Vec<Asked> = Vec::new();
    for i in 0..48usize {
        let ip = ["ip-a", "ip-b", "ip-c"][i % 3];
        match i % 4 {
            0 => asked.push((None, Some(["k1", "k2"][i % 2]), Op::Check)),
            1 => asked.push((Some(ip), None, Op::Check)),
            _ => asked.push((Some(ip), Some(["k1", "k2", "k3"][i % 3]), Op::Check)),
        }
    }
    let (_, _, skipped) = in_one_call_as_in_sequence(&redis, &local, (policy, guard), &asked).await;
    assert!(skipped > 0, "the guard refused some of them");
    cleanup(&prefix).await;
}

#[tokio::test]
async fn runs_of_alike_decisions_decide_as_in_sequence() {
    let prefix = random_prefix();
    let (redis, policy, guard) = guarded(&prefix).await;
    let local = guarded_locally();
    // Runs of one to six alike requests, some within what their bucket holds and some past
    // it.
    let kinds: [Asked; 6] = [
        (None, Some("k1"), Op::Check),
        (Some("ip-a"), Some("k2"), Op::Check),
        (None, Some("k3"), Op::Consume),
        (Some("ip-b"), None, Op::Consume),
        (None, Some("k2"), Op::Peek),
        (Some("ip-b"), Some("k1"), Op::Check),
    ];
    let mut asked = Vec::new();
    for (i, len) in [2, 1, 2, 3, 5, 2, 6, 1, 4, 5, 3, 6].into_iter().enumerate() {
        asked.extend(std::iter::repeat_n(kinds[i % kinds.len()], len));
    }
    // Twice: the second batch reads what the runs of the first wrote.
    let (allowed, refused, _) =
        in_one_call_as_in_sequence(&redis, &local, (policy, guard), &asked).await;
    assert!(
        allowed > 0 && refused > 0,
        "{allowed} allowed, {refused} refused"
    );
    let (_, _, skipped) = in_one_call_as_in_sequence(&redis, &local, (policy, guard), &asked).await;
    assert!(skipped > 0, "the guards refuse in the second round");
    cleanup(&prefix).await;
}

#[tokio::test]
async fn random_runs_decide_as_in_sequence() {
    use rand::{RngExt, SeedableRng};
    let keys = ["k1", "k2", "k3"];
    let ips = ["ip-a", "ip-b"];
    let ops = [Op::Check, Op::Peek, Op::Consume, Op::Refund];
    for seed in 0..20 {
        let prefix = random_prefix();
        let (redis, policy, guard) = guarded(&prefix).await;
        let local = guarded_locally();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Three batches of up to twelve runs of one to eight alike requests each.
        for _ in 0..3 {
            let mut asked: Vec<Asked> = Vec::new();
            for _ in 0..rng.random_range(1..=12) {
                let ip = rng
                    .random_bool(0.5)
                    .then(|| ips[rng.random_range(0..ips.len())]);
                let key = match ip {
                    Some(_) if rng.random_bool(0.25) => None,
                    _ => Some(keys[rng.random_range(0..keys.len())]),
                };
                let kind = (ip, key, ops[rng.random_range(0..ops.len())]);
                asked.extend(std::iter::repeat_n(kind, rng.random_range(1..=8)));
            }
            in_one_call_as_in_sequence(&redis, &local, (policy, guard), &asked).await;
        }
        cleanup(&prefix).await;
    }
}

#[tokio::test]
async fn a_run_of_consumes_past_the_burst_leaves_the_bucket_drained() {
    let prefix = random_prefix();
    // An interval of 20 s and a burst of 60 s.
    let redis = connect(&prefix, vec![quota(3, 60)]).await;
    redis.consume(P, "k").await.unwrap();
    // The debt is then no whole number of intervals: two more fit, not three.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = redis.calls();
    let run = futures_util::future::join_all((0..4).map(|_| redis.consume(P, "k"))).await;
    assert_eq!(redis.calls() - before, 1, "one call, one run");
    let allowed: Vec<bool> = run.iter().map(|d| d.as_ref().unwrap().allowed).collect();
    assert_eq!(allowed, [true, true, false, false]);
    // A refused consume drains the bucket: the next token is a whole interval away.
    let next = redis.check(P, "k").await.unwrap();
    assert_eq!((next.allowed, next.retry_after_secs), (false, Some(20)));
    cleanup(&prefix).await;
}

#[tokio::test]
async fn a_credit_spend_rides_in_its_decision_s_call_and_only_after_an_allowed_one() {
    use crate::ratelimit::CreditSpend;
    use crate::store::Credits;
    let prefix = random_prefix();
    let quotas = vec![quota(3, 3600)];
    let redis = connect(&prefix, quotas.clone()).await;
    let gcra = Gcra::new(&quotas[0]);
    let now = crate::clock::unix_now();
    let spend = CreditSpend {
        key_id: "key_c",
        created_at: now,
        credits: Credits::new(2, None, now, now),
        cost: 1,
    };
    let before = redis.calls();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (d, credited) = redis
            .decide_spending(P, "key_c", gcra, Op::Check, Some((&spend, now)))
            .await
            .unwrap();
        seen.push((d.allowed, credited));
    }
    assert_eq!(
        seen,
        [
            (true, Some(Credited::Spent(1))),
            (true, Some(Credited::Spent(0))),
            (true, Some(Credited::Short(0))),
        ]
    );
    assert_eq!(
        redis.calls() - before,
        3,
        "one call per decision and its spend"
    );
    // The bucket is empty now: the refused decision spends nothing, not even a try.
    let client = Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let count_key = format!("{prefix}cr:key_c");
    let was: String = conn.get(&count_key).await.unwrap();
    let more = CreditSpend {
        credits: Credits {
            generation: 1,
            ..Credits::new(10, None, now, now)
        },
        ..spend
    };
    let (d, credited) = redis
        .decide_spending(P, "key_c", gcra, Op::Check, Some((&more, now)))
        .await
        .unwrap();
    assert_eq!((d.allowed, credited), (false, None));
    let after: String = conn.get(&count_key).await.unwrap();
    assert_eq!(after, was);
    cleanup(&prefix).await;
}
