//! The limiter against a Redis held back on the wire: a relay between them holds Redis's
//! answers and acknowledges late, for the batching task's deadlines and for the calls it
//! keeps on their way at once.
use super::*;
/// A relay to Redis whose answers can be held back (`true`: Redis seems to hang). It
/// acknowledges what the limiter sends late, as a busy server's kernel does (delayed ACKs,
/// no quick ones), and notes when each script call reaches it.
struct Relay {
    url: String,
    frozen: tokio::sync::watch::Sender<bool>,
    /// When each EVALSHA or EVAL reached the relay, in order.
    calls: Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
}

async fn freezable_relay() -> Relay {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let real = redis_url();
    let real = real
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_string();
    let (frozen_tx, frozen_rx) = tokio::sync::watch::channel(false);
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = calls.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(&real).await else {
                return;
            };
            let (mut in_read, mut in_write) = inbound.into_split();
            let (mut out_read, mut out_write) = outbound.into_split();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    // Quick ACKs off again after every read (the kernel turns them back
                    // on by itself): what comes next is acknowledged late.
                    let _ = rustix::net::sockopt::set_tcp_quickack(in_read.as_ref(), false);
                    let Ok(n) = in_read.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    let now = std::time::Instant::now();
                    let scripts = buf[..n]
                        .windows(4)
                        .filter(|w| w.eq_ignore_ascii_case(b"EVAL"))
                        .count();
                    seen.lock()
                        .unwrap()
                        .extend(std::iter::repeat_n(now, scripts));
                    if out_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
            let mut frozen = frozen_rx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let Ok(n) = out_read.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 || frozen.wait_for(|f| !*f).await.is_err() {
                        return;
                    }
                    if in_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Relay {
        url: format!("redis://{addr}"),
        frozen: frozen_tx,
        calls,
    }
}

/// A limiter with a prefix of its own, through a relay that holds Redis's replies while
/// frozen: one decision has gone through (the script is loaded), then the relay froze.
async fn frozen_limiter(timeout: Duration) -> (RedisLimiter, Relay, String) {
    let relay = freezable_relay().await;
    let prefix = random_prefix();
    let target = RedisTarget::new(&relay.url, None).unwrap();
    let redis = RedisLimiter::connect(&target, &prefix, vec![quota(1000, 60)], timeout)
        .await
        .unwrap();
    assert!(redis.check(P, "k").await.unwrap().allowed);
    relay.frozen.send_replace(true);
    (redis, relay, prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_of_a_hung_batch_and_those_queued_behind_it_answer_within_the_timeout() {
    let timeout = Duration::from_millis(200);
    let (redis, relay, prefix) = frozen_limiter(timeout).await;
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let redis = redis.clone();
        tasks.push(tokio::spawn(async move {
            // Half are queued while the first batch hangs.
            tokio::time::sleep(Duration::from_millis(if i < 20 { 0 } else { 100 })).await;
            let started = std::time::Instant::now();
            let result = redis.check(P, "k").await;
            (result, started.elapsed())
        }));
    }
    for task in tasks {
        let (result, took) = task.await.unwrap();
        assert!(result.is_err(), "{result:?}");
        assert!(took < timeout + Duration::from_millis(150), "{took:?}");
    }
    relay.frozen.send_replace(false);
    cleanup(&prefix).await;
}

/// Callers keep no timer: the batching task answers each within the timeout counted from
/// when it was queued, however long the call before it hung, and grants a decision queued
/// after an idle spell the whole timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_queued_behind_a_hung_call_is_answered_within_its_own_timeout() {
    let timeout = Duration::from_millis(300);
    let (redis, relay, prefix) = frozen_limiter(timeout).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let hung = {
        let redis = redis.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            (redis.check(P, "k").await, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued = std::time::Instant::now();
    let behind = redis.check(P, "k").await;
    let waited = queued.elapsed();
    assert!(behind.is_err(), "{behind:?}");
    // It goes out beside the hung call (not behind it) and fails on its own deadline.
    assert!(
        waited < timeout + Duration::from_millis(100),
        "queued 200 ms into the hung call: {waited:?}"
    );
    let (hung, took) = hung.await.unwrap();
    // Timed out by the batching task's deadline (the connection keeps no timer of its own).
    assert!(hung.is_err(), "{hung:?}");
    assert!(took >= timeout - Duration::from_millis(10), "{took:?}");
    assert!(took < timeout + Duration::from_millis(100), "{took:?}");
    relay.frozen.send_replace(false);
    cleanup(&prefix).await;
}

/// The next batch goes out while the call before it is still on its way, up to
/// `MAX_CALLS` of them: the gateway does not idle for a round trip between batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_batch_goes_out_while_a_call_is_on_its_way() {
    let (redis, relay, prefix) = frozen_limiter(Duration::from_secs(2)).await;
    let calls = redis.calls();
    let mut waiting = Vec::new();
    for _ in 0..=super::batch::MAX_CALLS {
        let redis = redis.clone();
        waiting.push(tokio::spawn(async move { redis.check(P, "k").await }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One call per decision, each sent while those before it hang; the last one waits.
    assert_eq!(redis.calls() - calls, super::batch::MAX_CALLS as u64);
    relay.frozen.send_replace(false);
    for task in waiting {
        let _ = task.await.unwrap();
    }
    cleanup(&prefix).await;
}

/// When the `n`th script call (from 0) reached `relay`.
async fn nth_call(relay: &Relay, n: usize) -> std::time::Instant {
    for _ in 0..2000 {
        if let Some(&at) = relay.calls.lock().unwrap().get(n) {
            return at;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("script call {n} never reached Redis");
}

/// A script call leaves as soon as it is made, not once the call before it has been
/// acknowledged (Nagle's algorithm is off on the limiter's connection): against a server
/// that acknowledges late, the calls on their way at once would otherwise go one at a time.
#[tokio::test]
async fn a_call_leaves_while_the_one_before_is_unacknowledged() {
    let (redis, relay, prefix) = frozen_limiter(Duration::from_secs(2)).await;
    let redis = Arc::new(redis);
    let check = |redis: &Arc<RedisLimiter>| {
        let redis = redis.clone();
        tokio::spawn(async move { redis.check(P, "k").await })
    };
    // A delayed ACK waits 40 ms at least; a try or two more if this machine was slow.
    let mut gaps = Vec::new();
    for _ in 0..3 {
        relay.frozen.send_replace(true);
        let seen = relay.calls.lock().unwrap().len();
        let first = check(&redis);
        let first_at = nth_call(&relay, seen).await;
        let second = check(&redis);
        let second_at = nth_call(&relay, seen + 1).await;
        relay.frozen.send_replace(false);
        assert!(first.await.unwrap().unwrap().allowed);
        assert!(second.await.unwrap().unwrap().allowed);
        gaps.push(second_at - first_at);
        if second_at - first_at < Duration::from_millis(20) {
            break;
        }
    }
    assert!(
        gaps.iter().any(|gap| *gap < Duration::from_millis(20)),
        "the second call reached Redis only after the first was acknowledged: {gaps:?}"
    );
    cleanup(&prefix).await;
}
