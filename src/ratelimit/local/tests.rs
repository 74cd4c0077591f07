use super::*;
use crate::ratelimit::ManualClock;
use proptest::prelude::*;
use std::fmt::Write;
use std::num::NonZeroU32;
use std::time::Duration;

const START: u64 = 1_700_000_000_000_000_000;
const P: PolicyId = PolicyId(0);

fn quota(capacity: u32, period: Duration) -> Quota {
    Quota::new(NonZeroU32::new(capacity).unwrap(), period)
}

fn limiter(capacity: u32, period: Duration) -> (LocalLimiter, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START));
    let limiter = LocalLimiter::with_clock(vec![quota(capacity, period)], clock.clone());
    (limiter, clock)
}

#[test]
fn burst_then_refusal_then_refill() {
    let (l, clock) = limiter(3, Duration::from_secs(3)); // T = 1 s
    let remaining: Vec<u32> = (0..3).map(|_| l.check(P, "k").remaining).collect();
    assert_eq!(remaining, [2, 1, 0]);
    let refused = l.check(P, "k");
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after_secs, Some(1));
    assert_eq!(refused.reset_unix, START / 1_000_000_000 + 3);
    // Refusals cost nothing: one interval later exactly one token is back.
    for _ in 0..10 {
        assert!(!l.check(P, "k").allowed);
    }
    clock.advance(Duration::from_millis(999));
    assert!(!l.check(P, "k").allowed);
    clock.advance(Duration::from_millis(1));
    let d = l.check(P, "k");
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert!(!l.check(P, "k").allowed);
}

#[test]
fn keys_and_policies_are_independent() {
    let clock = Arc::new(ManualClock::new(START));
    let l = LocalLimiter::with_clock(
        vec![
            quota(1, Duration::from_secs(60)),
            quota(2, Duration::from_secs(60)),
        ],
        clock,
    );
    assert!(l.check(PolicyId(0), "a").allowed);
    assert!(!l.check(PolicyId(0), "a").allowed);
    assert!(l.check(PolicyId(0), "b").allowed);
    assert!(l.check(PolicyId(1), "a").allowed);
    assert_eq!(l.check(PolicyId(1), "a").remaining, 0);
}

#[test]
fn unknown_policy_fails_closed() {
    let (l, _) = limiter(3, Duration::from_secs(3));
    let d = l.check(PolicyId(7), "k");
    assert!(!d.allowed);
    assert_eq!(d.retry_after_secs, Some(1));
    assert_eq!(l.tracked_keys(PolicyId(7)), 0);
}

#[test]
fn peek_does_not_consume_and_consume_drains() {
    let (l, _) = limiter(2, Duration::from_secs(2));
    for _ in 0..5 {
        let d = l.peek(P, "ip");
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
    }
    assert_eq!(l.tracked_keys(P), 0, "peek on a fresh key stores nothing");
    assert_eq!(l.consume(P, "ip").remaining, 1);
    assert_eq!(l.consume(P, "ip").remaining, 0);
    assert!(!l.consume(P, "ip").allowed);
    let d = l.peek(P, "ip");
    assert!(!d.allowed);
    assert_eq!(d.retry_after_secs, Some(1));
}

#[test]
fn a_million_keys_over_a_long_time_leave_the_map_small() {
    // 10 per second: each key's entry lives 100 ms; one new key every millisecond.
    let (l, clock) = limiter(10, Duration::from_secs(1));
    let mut key = String::with_capacity(16);
    for i in 0..1_000_000u32 {
        key.clear();
        write!(key, "client-{i}").unwrap();
        assert!(l.check(P, &key).allowed);
        clock.advance(Duration::from_millis(1));
    }
    let tracked = l.tracked_keys(P);
    assert!(
        tracked < SHARDS * (MIN_SWEEP_INTERVAL + 100),
        "{tracked} keys kept"
    );
}

#[test]
fn hard_cap_evicts_the_most_idle_first() {
    let (l, clock) = limiter(1, Duration::from_secs(3600));
    let l = l.with_max_keys(SHARDS * 8);
    // Every entry stays live for an hour, so sweeping frees nothing: the cap must bite.
    for i in 0..10_000u32 {
        l.check(P, &i.to_string());
        clock.advance(Duration::from_micros(1));
    }
    assert!(l.tracked_keys(P) <= SHARDS * 8);
    // The newest key is still tracked (and so still limited).
    assert!(!l.check(P, "9999").allowed);
}

#[test]
fn concurrent_callers_never_exceed_capacity() {
    let (l, _) = limiter(17, Duration::from_secs(60));
    let allowed = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50 {
                    if l.check(P, "shared").allowed {
                        allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(allowed.into_inner(), 17);
}

/// A limiter of one policy (`capacity` per `period_ms`) on a manual clock at
/// `START`, with the clock and the policy's emission interval.
fn limiter_at_start(capacity: u32, period_ms: u64) -> (LocalLimiter, Arc<ManualClock>, u64) {
    let clock = Arc::new(ManualClock::new(START));
    let q = quota(capacity, Duration::from_millis(period_ms));
    let interval = Gcra::new(&q).interval();
    (
        LocalLimiter::with_clock(vec![q], clock.clone()),
        clock,
        interval,
    )
}

/// The first window [start, end] of sorted admission times holding more than
/// capacity + floor((end - start) / interval) admissions, if any.
fn window_over_bound(times: &[u64], capacity: u32, interval: u64) -> Option<String> {
    for (i, start) in times.iter().enumerate() {
        for (j, end) in times.iter().enumerate().skip(i) {
            let count = (j - i + 1) as u64;
            let bound = u64::from(capacity) + (end - start) / interval;
            if count > bound {
                return Some(format!("{count} > {bound} in [{start}, {end}]"));
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// In any window [t, t + w] a key gets at most capacity + floor(w / T) admissions.
    #[test]
    fn window_bound_holds(
        capacity in 1u32..8,
        period_ms in 1u64..2_000,
        arrivals in proptest::collection::vec((0u64..5_000_000_000, 0usize..3), 1..150),
    ) {
        let mut arrivals = arrivals;
        arrivals.sort_unstable();
        let (l, clock, interval) = limiter_at_start(capacity, period_ms);
        let keys = ["a", "b", "c"];
        let mut admitted: [Vec<u64>; 3] = Default::default();
        for (offset, k) in arrivals {
            clock.set(START + offset);
            if l.check(P, keys[k]).allowed {
                admitted[k].push(offset);
            }
        }
        for times in &admitted {
            let broken = window_over_bound(times, capacity, interval);
            prop_assert!(broken.is_none(), "{}", broken.unwrap_or_default());
        }
    }

    /// The same bound when several threads call at once: at each random instant
    /// 1–4 threads race for the one shared key.
    #[test]
    fn window_bound_holds_for_concurrent_callers(
        capacity in 1u32..6,
        period_ms in 1u64..1_000,
        arrivals in proptest::collection::vec((0u64..3_000_000_000, 1usize..5), 1..40),
    ) {
        let mut arrivals = arrivals;
        arrivals.sort_unstable();
        let (l, clock, interval) = limiter_at_start(capacity, period_ms);
        let mut admitted = Vec::new();
        for (offset, callers) in arrivals {
            clock.set(START + offset);
            let won = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..callers {
                    s.spawn(|| {
                        if l.check(P, "shared").allowed {
                            won.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    });
                }
            });
            for _ in 0..won.into_inner() {
                admitted.push(offset);
            }
        }
        let broken = window_over_bound(&admitted, capacity, interval);
        prop_assert!(broken.is_none(), "{}", broken.unwrap_or_default());
    }
}
