//! The in-process limiter: one GCRA `tat` per key in sharded maps, synchronous, no await.
//!
//! Memory stays bounded however many distinct keys arrive: an entry whose `tat <= now` is a
//! full bucket, exactly what a missing entry means, so it can be dropped at any time. Each
//! shard sweeps such entries every so many inserts (amortised O(1) per insert), and a hard
//! cap per shard evicts the most idle entries (lowest `tat`, closest to full) when a flood of
//! live keys would exceed it. Eviction can only ever hand a key a fresher bucket, never a
//! stricter one.

use foldhash::fast::RandomState;
use foldhash::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::clock::{Clock, SystemClock};
use super::gcra::{self, Gcra, Op};
use super::{Decision, PolicyId, Quota};

/// Shards per policy (a power of two).
const SHARDS: usize = 64;
/// A shard sweeps after at least this many inserts, or as many as it held after its last
/// sweep if that is more (which keeps sweeping amortised O(1) per insert).
const MIN_SWEEP_INTERVAL: usize = 64;
/// Default bound on tracked keys per policy.
const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// In-process GCRA limiter for a fixed list of policies.
pub struct LocalLimiter {
    policies: Vec<PolicyState>,
    clock: Arc<dyn Clock>,
    hasher: RandomState,
}

struct PolicyState {
    gcra: Gcra,
    shards: Box<[Mutex<Shard>]>,
    max_per_shard: usize,
}

#[derive(Default)]
struct Shard {
    /// Key -> theoretical arrival time (Unix ns).
    tats: HashMap<Box<str>, u64>,
    inserts_since_sweep: usize,
    sweep_interval: usize,
}

// === impl LocalLimiter ===

impl LocalLimiter {
    /// A limiter for `policies` (indexed by [`PolicyId`]) on the real clock.
    pub fn new(policies: Vec<Quota>) -> Self {
        Self::with_clock(policies, Arc::new(SystemClock::new()))
    }

    /// A limiter for `policies` reading time from `clock` (tests inject a [`super::ManualClock`]).
    pub fn with_clock(policies: Vec<Quota>, clock: Arc<dyn Clock>) -> Self {
        Self {
            policies: policies
                .iter()
                .map(|quota| PolicyState::new(Gcra::new(quota), DEFAULT_MAX_KEYS))
                .collect(),
            clock,
            hasher: RandomState::default(),
        }
    }

    /// Bounds the keys tracked per policy to about `max_keys` (at least one per shard).
    /// Past it, the most idle keys are forgotten first (they get a full bucket back).
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        for policy in &mut self.policies {
            policy.max_per_shard = (max_keys / SHARDS).max(1);
        }
        self
    }

    /// Takes one token for `key` under `policy` if there is one; a refusal costs nothing.
    /// Never allocates when the key is already tracked.
    pub fn check(&self, policy: PolicyId, key: &str) -> Decision {
        self.run(policy, key, Op::Check)
    }

    /// Whether `key` would be allowed now, without taking anything.
    pub fn peek(&self, policy: PolicyId, key: &str) -> Decision {
        self.run(policy, key, Op::Peek)
    }

    /// Records one unit of cost for `key` even if no whole token is left (draining the
    /// bucket to empty, never beyond): for events that already happened, such as
    /// authentication failures. The Decision says whether a whole token was there.
    pub fn consume(&self, policy: PolicyId, key: &str) -> Decision {
        self.run(policy, key, Op::Consume)
    }

    /// Number of keys currently tracked under `policy` (for metrics and tests).
    pub fn tracked_keys(&self, policy: PolicyId) -> usize {
        self.policies.get(policy.0).map_or(0, |p| {
            p.shards.iter().map(|shard| lock(shard).tats.len()).sum()
        })
    }

    /// The clock this limiter reads.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    fn run(&self, policy: PolicyId, key: &str, op: Op) -> Decision {
        let now = self.clock.now_nanos();
        let Some(state) = self.policies.get(policy.0) else {
            return gcra::unknown_policy_decision(now);
        };
        let index = (self.hasher.hash_one(key) as usize) & (SHARDS - 1);
        let mut shard = lock(&state.shards[index]);
        let outcome = match shard.tats.get_mut(key) {
            Some(tat) => {
                let outcome = state.gcra.apply(op, state.gcra.debt(*tat, now));
                if outcome.debt_after != outcome.debt_before {
                    *tat = now.saturating_add(outcome.debt_after);
                }
                outcome
            }
            None => {
                let outcome = state.gcra.apply(op, 0);
                if outcome.debt_after > 0 {
                    shard.insert(key, now.saturating_add(outcome.debt_after), now, state);
                }
                outcome
            }
        };
        drop(shard);
        state.gcra.decision(now, &outcome)
    }
}

impl std::fmt::Debug for LocalLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys may be client identifiers: never print them.
        f.debug_struct("LocalLimiter")
            .field("policies", &self.policies.len())
            .finish_non_exhaustive()
    }
}

// === impl PolicyState ===

impl PolicyState {
    fn new(gcra: Gcra, max_keys: usize) -> Self {
        Self {
            gcra,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            max_per_shard: (max_keys / SHARDS).max(1),
        }
    }
}

// === impl Shard ===

impl Shard {
    fn insert(&mut self, key: &str, tat: u64, now: u64, policy: &PolicyState) {
        self.tats.insert(Box::from(key), tat);
        self.inserts_since_sweep += 1;
        if self.inserts_since_sweep >= self.sweep_interval.max(MIN_SWEEP_INTERVAL) {
            self.sweep(now);
        }
        if self.tats.len() > policy.max_per_shard {
            self.sweep(now);
            if self.tats.len() > policy.max_per_shard {
                self.evict_most_idle(policy.max_per_shard / 2);
            }
        }
    }

    /// Drops every full bucket (`tat <= now`): indistinguishable from an absent key.
    fn sweep(&mut self, now: u64) {
        self.tats.retain(|_, tat| *tat > now);
        self.inserts_since_sweep = 0;
        self.sweep_interval = self.tats.len();
    }

    /// Keeps only the `keep` entries furthest from full; the rest get a full bucket back.
    fn evict_most_idle(&mut self, keep: usize) {
        if keep == 0 {
            self.tats.clear();
            return;
        }
        let mut tats: Vec<u64> = self.tats.values().copied().collect();
        let cut = tats.len().saturating_sub(keep);
        let (_, threshold, above) = tats.select_nth_unstable(cut);
        let threshold = *threshold;
        // Ties at the threshold: keep only as many as fit, so the cap holds even then.
        let greater = above.iter().filter(|tat| **tat > threshold).count();
        let mut ties_kept = keep.saturating_sub(greater);
        self.tats.retain(|_, tat| {
            if *tat > threshold {
                true
            } else if *tat == threshold && ties_kept > 0 {
                ties_kept -= 1;
                true
            } else {
                false
            }
        });
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic elsewhere cannot leave a map of plain integers inconsistent.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
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
}
