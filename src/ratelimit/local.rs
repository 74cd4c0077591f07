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
        self.run(policy, key, Op::Check, None)
    }

    /// [`Self::check`] (or another `op`) against `gcra` instead of the
    /// policy's own parameters: a per-key or per-organization quota, whose
    /// buckets live among the policy's.
    pub(crate) fn run_with(&self, policy: PolicyId, key: &str, op: Op, gcra: &Gcra) -> Decision {
        self.run(policy, key, op, Some(gcra))
    }

    /// Whether `key` would be allowed now, without taking anything.
    pub fn peek(&self, policy: PolicyId, key: &str) -> Decision {
        self.run(policy, key, Op::Peek, None)
    }

    /// Records one unit of cost for `key` even if no whole token is left (draining the
    /// bucket to empty, never beyond): for events that already happened, such as
    /// authentication failures. The Decision says whether a whole token was there.
    pub fn consume(&self, policy: PolicyId, key: &str) -> Decision {
        self.run(policy, key, Op::Consume, None)
    }

    /// Gives back one token taken from `key` before (never past a full bucket).
    pub fn refund(&self, policy: PolicyId, key: &str) -> Decision {
        self.run(policy, key, Op::Refund, None)
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

    fn run(&self, policy: PolicyId, key: &str, op: Op, quota: Option<&Gcra>) -> Decision {
        let now = self.clock.now_nanos();
        let Some(state) = self.policies.get(policy.0) else {
            return gcra::unknown_policy_decision(now);
        };
        let gcra = quota.unwrap_or(&state.gcra);
        let index = (self.hasher.hash_one(key) as usize) & (SHARDS - 1);
        let mut shard = lock(&state.shards[index]);
        let outcome = match shard.tats.get_mut(key) {
            Some(tat) => {
                let outcome = gcra.apply(op, gcra.debt(*tat, now));
                if outcome.debt_after != outcome.debt_before {
                    *tat = now.saturating_add(outcome.debt_after);
                }
                outcome
            }
            None => {
                let outcome = gcra.apply(op, 0);
                if outcome.debt_after > 0 {
                    shard.insert(key, now.saturating_add(outcome.debt_after), now, state);
                }
                outcome
            }
        };
        drop(shard);
        gcra.decision(now, &outcome)
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
mod tests;
