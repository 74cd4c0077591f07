//! One cache tier (API keys or sessions): a bounded moka map from secret hash
//! to a timestamped [`Slot`], single-flight loading on a miss or refresh,
//! stale serving while the store is down, and the guard that keeps a load
//! racing an invalidation from caching what the invalidation removed.
use super::{CacheConfig, Cached, ChangeLog, StoreHealth};
use crate::auth::SecretHash;
use crate::store::{Change, KeyStore, StoreError};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use moka::future::Cache;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// Counter: key-cache lookups by `result` (`hit`, `stale`, `miss`).
pub(crate) const CACHE_LOOKUPS: &str = "mpg_key_cache_lookups_total";
/// A load retried this often when invalidations keep racing it; the last
/// result is then returned uncached.
const MAX_LOAD_ATTEMPTS: usize = 3;

/// Fetches one value from the store (a `KeyStore` method, boxed to `'static`).
pub(super) type Loader<T> =
    fn(Arc<dyn KeyStore>, SecretHash) -> BoxFuture<'static, Result<Option<T>, StoreError>>;

/// A shared in-flight load every concurrent caller awaits.
type Flight<T> = Shared<BoxFuture<'static, Result<Slot<T>, StoreError>>>;

/// A cached answer and when the store gave it (tokio clock, so tests can
/// advance time instead of sleeping).
pub(super) struct Slot<T> {
    /// When the query that produced this answer started.
    loaded_at: Instant,
    /// `None`: the store knows no such secret (negative entry).
    pub(super) value: Option<Arc<T>>,
}

impl<T> Clone for Slot<T> {
    fn clone(&self) -> Self {
        Slot {
            loaded_at: self.loaded_at,
            value: self.value.clone(),
        }
    }
}

impl<T> Slot<T> {
    /// Young enough to answer without asking the store.
    fn is_fresh(&self, now: Instant, cfg: &CacheConfig) -> bool {
        let ttl = if self.value.is_some() {
            cfg.ttl
        } else {
            cfg.negative_ttl
        };
        now.saturating_duration_since(self.loaded_at) < ttl
    }

    /// A positive entry still inside `ttl + stale_if_error`.
    fn can_serve_stale(&self, now: Instant, cfg: &CacheConfig) -> bool {
        self.value.is_some()
            && now.saturating_duration_since(self.loaded_at) < cfg.ttl + cfg.stale_if_error
    }
}

/// moka's own expiry is only the backstop that frees memory; freshness is
/// decided on the tokio clock in [`Slot`].
struct SlotExpiry {
    positive: Duration,
    negative: Duration,
}

impl SlotExpiry {
    fn lifetime<T>(&self, slot: &Slot<T>) -> Option<Duration> {
        Some(if slot.value.is_some() {
            self.positive
        } else {
            self.negative
        })
    }
}

impl<T: Send + Sync + 'static> moka::Expiry<SecretHash, Slot<T>> for SlotExpiry {
    fn expire_after_create(
        &self,
        _key: &SecretHash,
        slot: &Slot<T>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        self.lifetime(slot)
    }

    fn expire_after_update(
        &self,
        _key: &SecretHash,
        slot: &Slot<T>,
        _updated_at: std::time::Instant,
        _left: Option<Duration>,
    ) -> Option<Duration> {
        self.lifetime(slot)
    }
}

/// Locks `m`, recovering from poisoning (the guarded data stays consistent:
/// every critical section is a single map or queue operation).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One cache tier.
pub(super) struct Tier<T> {
    entries: Cache<SecretHash, Slot<T>, foldhash::fast::RandomState>,
    inflight: Mutex<HashMap<SecretHash, Flight<T>>>,
    store: Arc<dyn KeyStore>,
    loader: Loader<T>,
    log: Arc<ChangeLog>,
    health: Arc<StoreHealth>,
    cfg: CacheConfig,
    lookups: Lookups,
}

/// `mpg_cache_lookups_total` handles, made once (not looked up per request).
struct Lookups {
    hit: metrics::Counter,
    stale: metrics::Counter,
    miss: metrics::Counter,
}

impl<T: Cached> Tier<T> {
    /// A tier holding at most `cfg.capacity` entries.
    pub(super) fn new(
        store: Arc<dyn KeyStore>,
        loader: Loader<T>,
        log: Arc<ChangeLog>,
        health: Arc<StoreHealth>,
        cfg: CacheConfig,
    ) -> Arc<Self> {
        let entries = Cache::builder()
            .max_capacity(cfg.capacity)
            .support_invalidation_closures()
            .expire_after(SlotExpiry {
                positive: cfg.ttl + cfg.stale_if_error,
                negative: cfg.negative_ttl,
            })
            // The key is a digest already: a seeded foldhash spreads it as
            // well as moka's default SipHash, for a fraction of the cost.
            .build_with_hasher(foldhash::fast::RandomState::default());
        Arc::new(Tier {
            entries,
            inflight: Mutex::new(HashMap::new()),
            store,
            loader,
            log,
            health,
            cfg,
            lookups: Lookups {
                hit: metrics::counter!(CACHE_LOOKUPS, "result" => "hit"),
                stale: metrics::counter!(CACHE_LOOKUPS, "result" => "stale"),
                miss: metrics::counter!(CACHE_LOOKUPS, "result" => "miss"),
            },
        })
    }

    /// The answer for `hash`: fresh from cache, else loaded (single-flight),
    /// else — store down — a stale positive entry inside the stale window.
    pub(super) async fn get(
        self: &Arc<Self>,
        hash: &SecretHash,
    ) -> Result<Option<Arc<T>>, StoreError> {
        let now = Instant::now();
        let cached = self.entries.get(hash).await;
        if let Some(slot) = &cached {
            if slot.is_fresh(now, &self.cfg) {
                self.lookups.hit.increment(1);
                return Ok(slot.value.clone());
            }
            // The store just failed: serve stale now rather than make every
            // request wait out another timeout.
            if slot.can_serve_stale(now, &self.cfg) && self.health.recently_failed(now) {
                self.lookups.stale.increment(1);
                return Ok(slot.value.clone());
            }
        }
        self.lookups.miss.increment(1);
        match self.load(*hash).await {
            Ok(slot) => Ok(slot.value),
            Err(e) if e.is_unavailable() => match cached {
                Some(slot) if slot.can_serve_stale(Instant::now(), &self.cfg) => {
                    tracing::warn!(error = %e, "key store down; serving stale cache entry");
                    Ok(slot.value)
                }
                _ => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Joins the in-flight load of `hash` or starts one. The load runs as its
    /// own task, so it completes (and leaves the in-flight map) even if every
    /// caller gives up.
    async fn load(self: &Arc<Self>, hash: SecretHash) -> Result<Slot<T>, StoreError> {
        let flight = {
            let mut inflight = lock(&self.inflight);
            match inflight.get(&hash) {
                Some(flight) => flight.clone(),
                None => {
                    let tier = Arc::clone(self);
                    let task = tokio::spawn(async move {
                        let result = tier.fetch(hash).await;
                        lock(&tier.inflight).remove(&hash);
                        result
                    });
                    let flight = async move {
                        task.await
                            .unwrap_or_else(|e| Err(StoreError::Unavailable(Arc::new(e))))
                    }
                    .boxed()
                    .shared();
                    inflight.insert(hash, flight.clone());
                    flight
                }
            }
        };
        flight.await
    }

    /// Queries the store and caches the answer, unless an invalidation that
    /// touches it arrived meanwhile (then asks again).
    async fn fetch(&self, hash: SecretHash) -> Result<Slot<T>, StoreError> {
        let mut last = None;
        for _ in 0..MAX_LOAD_ATTEMPTS {
            let start_epoch = self.log.epoch();
            let started = Instant::now();
            let value = match (self.loader)(Arc::clone(&self.store), hash).await {
                Ok(value) => value.map(Arc::new),
                Err(e) => {
                    if e.is_unavailable() {
                        self.health.failed(Instant::now());
                    }
                    return Err(e);
                }
            };
            self.health.succeeded();
            let slot = Slot {
                loaded_at: started,
                value,
            };
            let raced = |slot: &Slot<T>| {
                slot.value
                    .as_ref()
                    .is_some_and(|v| self.log.changed_since(start_epoch, |c| v.affected_by(c)))
            };
            if raced(&slot) {
                last = Some(slot);
                continue;
            }
            self.entries.insert(hash, slot.clone()).await;
            // An invalidation between the check and the insert would miss
            // the new entry: look once more now that it is visible.
            if raced(&slot) {
                self.entries.invalidate(&hash).await;
                last = Some(slot);
                continue;
            }
            return Ok(slot);
        }
        last.ok_or(StoreError::Timeout)
    }

    /// Drops every entry `change` affects.
    pub(super) fn invalidate(&self, change: &Change) {
        if matches!(change, Change::All) {
            self.entries.invalidate_all();
            return;
        }
        let change = change.clone();
        let registered = self
            .entries
            .invalidate_entries_if(move |_, slot: &Slot<T>| {
                slot.value.as_ref().is_some_and(|v| v.affected_by(&change))
            });
        if registered.is_err() {
            // Cannot happen (closures are enabled), but never keep stale data.
            self.entries.invalidate_all();
        }
    }

    /// Approximate number of cached entries.
    pub(super) fn entry_count(&self) -> u64 {
        self.entries.entry_count()
    }

    /// Applies moka's pending housekeeping (tests: exact counts).
    #[cfg(test)]
    pub(super) async fn sync(&self) {
        self.entries.run_pending_tasks().await;
    }
}
