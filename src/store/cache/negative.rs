//! [`Negatives`]: one tier's "the store knows no such secret" answers, kept
//! apart from its positive entries so that a flood of unknown, well-formed
//! secrets (anyone can compute the checksum) only ever evicts other unknown
//! secrets. They have their own bound (`store.negative_cache_capacity`), are
//! answered from cache for `negative_cache_ttl`, and are swept out at most
//! [`SWEEP_EVERY`] after that, so a flood's entries do not outlive it.
use crate::secret::SecretHash;
use quick_cache::sync::Cache;
use quick_cache::UnitWeighter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Expired entries are swept this often (or every `negative_cache_ttl`,
/// if shorter, but not more often than every [`SWEEP_AT_MOST`]).
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// The shortest sweep period, whatever `negative_cache_ttl` is.
const SWEEP_AT_MOST: Duration = Duration::from_millis(100);

/// The not-found answers of one tier: secret hash → when the store said so.
pub(super) struct Negatives {
    map: Cache<SecretHash, Instant, UnitWeighter, foldhash::fast::RandomState>,
    ttl: Duration,
    /// Set once the sweeping task runs (started by the first insert).
    sweeping: AtomicBool,
}

impl Negatives {
    /// At most `capacity` entries, fresh for `ttl`.
    pub(super) fn new(capacity: u64, ttl: Duration) -> Arc<Self> {
        Arc::new(Negatives {
            map: Cache::with(
                usize::try_from(capacity).unwrap_or(usize::MAX),
                capacity,
                UnitWeighter,
                foldhash::fast::RandomState::default(),
                Default::default(),
            ),
            ttl,
            sweeping: AtomicBool::new(false),
        })
    }

    /// True when the store said "no such secret" less than `ttl` ago.
    pub(super) fn is_fresh(&self, hash: &SecretHash, now: Instant) -> bool {
        self.map
            .get(hash)
            .is_some_and(|at| now.saturating_duration_since(at) < self.ttl)
    }

    /// Remembers that the store did not know `hash` at `loaded_at`.
    pub(super) fn insert(self: &Arc<Self>, hash: SecretHash, loaded_at: Instant) {
        self.map.insert(hash, loaded_at);
        self.start_sweeping();
    }

    /// Forgets `hash` (the store knows it now).
    pub(super) fn remove(&self, hash: &SecretHash) {
        // A read first: the common case (no such entry) takes no write lock.
        if self.map.contains_key(hash) {
            self.map.remove(hash);
        }
    }

    /// Forgets everything.
    pub(super) fn clear(&self) {
        self.map.clear();
    }

    /// Entries held (expired ones until the next sweep).
    pub(super) fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Drops every entry expired at `now`.
    pub(super) fn sweep(&self, now: Instant) {
        self.map
            .retain(|_, at| now.saturating_duration_since(*at) < self.ttl);
    }

    /// Starts the task that sweeps every [`SWEEP_EVERY`] (once; it ends when
    /// the tier is dropped). Without a runtime nothing sweeps, and expired
    /// entries stay, unserved, until evicted or replaced.
    fn start_sweeping(self: &Arc<Self>) {
        if self.sweeping.load(Ordering::Relaxed) || self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::Release);
            return;
        };
        let negatives = Arc::downgrade(self);
        let every = self.ttl.clamp(SWEEP_AT_MOST, SWEEP_EVERY);
        runtime.spawn(async move {
            let mut ticker = tokio::time::interval_at(Instant::now() + every, every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(negatives) = negatives.upgrade() else {
                    return;
                };
                if negatives.len() > 0 {
                    negatives.sweep(Instant::now());
                }
            }
        });
    }
}
