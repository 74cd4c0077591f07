//! One cache tier (API keys or sessions): a bounded map (quick_cache's
//! S3-FIFO cache) from secret hash to a timestamped [`Slot`] for the secrets
//! the store knows, [`Negatives`] apart for those it does not, single-flight
//! loading on a miss or refresh, stale serving while the store is down (at
//! once while the [`Breaker`] is open), and the guard that keeps a load
//! racing an invalidation from caching what the invalidation removed.
//!
//! Misses are batched: the hashes that miss while the tier's store queries
//! run wait in a queue, and the next query asks for all of them at once (up
//! to [`MAX_BATCH`]), at most [`MAX_QUERIES`] queries in flight per tier. A
//! storm of new keys thus costs one round trip per batch, not per key, and a
//! hash already queued or in flight is never asked for twice.
use super::breaker::{Breaker, CircuitOpen};
use super::changes::{Cached, ChangeLog};
use super::negative::Negatives;
use crate::metrics::names::CACHE_LOOKUPS;
use crate::secret::SecretHash;
use crate::store::{Change, KeyStore, StoreError};
use futures_util::future::BoxFuture;
use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::UnitWeighter;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Cache sizing and lifetimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Positive entries are answered from cache this long.
    pub ttl: Duration,
    /// "Not found" entries are answered from cache this long.
    pub negative_ttl: Duration,
    /// Maximum positive entries per tier (API keys and sessions each).
    pub capacity: u64,
    /// Maximum "not found" entries per tier, apart from `capacity`.
    pub negative_capacity: u64,
    /// A positive entry past `ttl` is still served this much longer while
    /// the store is unavailable.
    pub stale_if_error: Duration,
}

/// A load retried this often when invalidations keep racing it; the last
/// result is then returned uncached.
const MAX_LOAD_ATTEMPTS: u8 = 3;
/// At most this many hashes in one store query; more wait for the next.
pub(super) const MAX_BATCH: usize = 256;
/// Store queries in flight per tier at most. More than one, so that a query
/// hung on a dead connection does not hold up the lookup that finds the
/// store down (and opens the breaker); few, so that a storm's misses gather
/// into batches instead of taking one connection each.
pub(super) const MAX_QUERIES: usize = 2;

/// Fetches the values of a batch of hashes from the store, each with its
/// hash, unknown ones left out (a `KeyStore` method, boxed to `'static`).
pub(super) type Loader<T> = fn(
    Arc<dyn KeyStore>,
    Vec<SecretHash>,
) -> BoxFuture<'static, Result<Vec<(SecretHash, T)>, StoreError>>;

/// What a lookup answers.
type Answer<T> = Result<Option<Arc<T>>, StoreError>;

/// A cached answer and when the store gave it (tokio clock, so tests can
/// advance time instead of sleeping).
pub(super) struct Slot<T> {
    /// When the query that produced this answer started.
    loaded_at: Instant,
    /// What the store said.
    value: Arc<T>,
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
        now.saturating_duration_since(self.loaded_at) < cfg.ttl
    }

    /// Still inside `ttl + stale_if_error`: served while the store is down.
    fn can_serve_stale(&self, now: Instant, cfg: &CacheConfig) -> bool {
        now.saturating_duration_since(self.loaded_at) < cfg.ttl + cfg.stale_if_error
    }
}

mod batch;

/// One cache tier.
pub(super) struct Tier<T> {
    entries: Entries<T>,
    negatives: Arc<Negatives>,
    inflight: Mutex<batch::InFlight<T>>,
    store: Arc<dyn KeyStore>,
    loader: Loader<T>,
    log: Arc<ChangeLog>,
    breaker: Arc<Breaker>,
    cfg: CacheConfig,
    lookups: Lookups,
}

/// The tier's map. A hit takes one shard's read lock and sets a bit: no
/// read log to replay and no epoch to pin, as a hit in moka has. Nothing
/// expires by time in the map itself: freshness is decided in [`Slot`], and an entry
/// too old to serve even stale stays, unserved, until the capacity bound
/// evicts it or a new answer replaces it.
type Entries<T> = Cache<
    SecretHash,
    Slot<T>,
    UnitWeighter,
    foldhash::fast::RandomState,
    DefaultLifecycle<SecretHash, Slot<T>>,
>;

/// `mpg_key_cache_lookups_total` handles, made once (not looked up per request).
struct Lookups {
    hit: metrics::Counter,
    stale: metrics::Counter,
    miss: metrics::Counter,
}

impl<T: Cached> Tier<T> {
    /// A tier holding at most `cfg.capacity` positive and
    /// `cfg.negative_capacity` negative entries.
    pub(super) fn new(
        store: Arc<dyn KeyStore>,
        loader: Loader<T>,
        log: Arc<ChangeLog>,
        breaker: Arc<Breaker>,
        cfg: CacheConfig,
    ) -> Arc<Self> {
        // The key is a digest already: a seeded foldhash spreads it as well
        // as SipHash would, for a fraction of the cost.
        let entries = Cache::with(
            usize::try_from(cfg.capacity).unwrap_or(usize::MAX),
            cfg.capacity,
            UnitWeighter,
            foldhash::fast::RandomState::default(),
            DefaultLifecycle::default(),
        );
        Arc::new(Tier {
            entries,
            negatives: Negatives::new(cfg.negative_capacity, cfg.negative_ttl),
            inflight: Mutex::default(),
            store,
            loader,
            log,
            breaker,
            cfg,
            lookups: Lookups {
                hit: metrics::counter!(CACHE_LOOKUPS, "result" => "hit"),
                stale: metrics::counter!(CACHE_LOOKUPS, "result" => "stale"),
                miss: metrics::counter!(CACHE_LOOKUPS, "result" => "miss"),
            },
        })
    }

    /// The answer for `hash`: fresh from cache, else loaded (single-flight),
    /// else (store down) a stale positive entry inside the stale window. While
    /// the breaker is open nothing waits on the store: stale or an error at once.
    pub(super) async fn get(
        self: &Arc<Self>,
        hash: &SecretHash,
    ) -> Result<Option<Arc<T>>, StoreError> {
        let now = Instant::from_std(crate::clock::now());
        let cached = self.entries.get(hash);
        match &cached {
            Some(slot) if slot.is_fresh(now, &self.cfg) => {
                self.lookups.hit.increment(1);
                return Ok(Some(slot.value.clone()));
            }
            Some(_) => {}
            None if self.negatives.is_fresh(hash, now) => {
                self.lookups.hit.increment(1);
                return Ok(None);
            }
            None => {}
        }
        if self.breaker.is_open() {
            return self.stale_or(cached, now, circuit_open());
        }
        self.lookups.miss.increment(1);
        let mut span = lookup_span();
        // A load started before the store went down waits out its timeout on
        // its own task; its callers are answered as soon as the breaker opens.
        let loaded = tokio::select! {
            biased;
            loaded = self.load(*hash) => loaded,
            () = self.breaker.opened() => Err(circuit_open()),
        };
        end_lookup_span(span.as_mut(), &loaded);
        match loaded {
            Err(e) if e.is_unavailable() => {
                self.stale_or(cached, Instant::from_std(crate::clock::now()), e)
            }
            other => other,
        }
    }

    /// The answer for `hash`: fresh from cache, else `load`'s (cached unless
    /// an invalidation raced it), else (store down) a stale positive entry;
    /// a cached entry counts only if it `fits`. For values the tier's loader
    /// cannot find by hash alone (a verified JWT's user): no batching and no
    /// single flight, since each caller verified its token first.
    pub(super) async fn get_with(
        self: &Arc<Self>,
        hash: &SecretHash,
        fits: impl Fn(&T) -> bool,
        load: impl std::future::Future<Output = Result<Option<T>, StoreError>>,
    ) -> Result<Option<Arc<T>>, StoreError> {
        let now = Instant::from_std(crate::clock::now());
        let cached = self.entries.get(hash).filter(|slot| fits(&slot.value));
        if let Some(slot) = cached.as_ref().filter(|s| s.is_fresh(now, &self.cfg)) {
            self.lookups.hit.increment(1);
            return Ok(Some(slot.value.clone()));
        }
        if self.breaker.is_open() {
            return self.stale_or(cached, now, circuit_open());
        }
        self.lookups.miss.increment(1);
        let start_epoch = self.log.epoch();
        let breaker_epoch = self.breaker.epoch();
        let started = Instant::now();
        let mut span = lookup_span();
        let loaded = load.await;
        end_lookup_span(span.as_mut(), &loaded);
        match loaded {
            Ok(found) => {
                self.breaker.succeeded();
                let found = found.map(Arc::new);
                if let Some(value) = &found {
                    self.cache(*hash, value, started, start_epoch);
                }
                Ok(found)
            }
            Err(e) if e.is_unavailable() => {
                self.breaker.failed(&e, breaker_epoch);
                self.stale_or(cached, Instant::from_std(crate::clock::now()), e)
            }
            Err(e) => Err(e),
        }
    }

    /// The answer for `hash` if the cache holds a fresh one (counted as a hit), else `None`
    /// (nothing counted, nothing loaded): the caller learns without waiting whether a
    /// lookup would reach the store.
    pub(super) fn fresh(&self, hash: &SecretHash) -> Option<Option<Arc<T>>> {
        let now = Instant::from_std(crate::clock::now());
        let answer = match self.entries.get(hash) {
            Some(slot) if slot.is_fresh(now, &self.cfg) => Some(slot.value),
            Some(_) => return None,
            None if self.negatives.is_fresh(hash, now) => None,
            None => return None,
        };
        self.lookups.hit.increment(1);
        Some(answer)
    }

    /// `cached` if it may still be served stale at `now`, else `err`.
    fn stale_or(
        &self,
        cached: Option<Slot<T>>,
        now: Instant,
        err: StoreError,
    ) -> Result<Option<Arc<T>>, StoreError> {
        match cached {
            Some(slot) if slot.can_serve_stale(now, &self.cfg) => {
                self.lookups.stale.increment(1);
                Ok(Some(slot.value))
            }
            _ => Err(err),
        }
    }

    /// Drops every entry `change` affects.
    pub(super) fn invalidate(&self, change: &Change) {
        if matches!(change, Change::All) {
            self.entries.clear();
            self.negatives.clear();
            return;
        }
        // A walk over every entry, one shard's write lock at a time (a
        // change is rare: a key revoked or edited, a membership changed).
        self.entries
            .retain(|_, slot: &Slot<T>| !slot.value.affected_by(change));
    }

    /// Number of cached entries, positive and negative.
    pub(super) fn entry_count(&self) -> u64 {
        self.entries.len() as u64 + self.negatives.len()
    }

    /// Number of negative entries.
    pub(super) fn negative_count(&self) -> u64 {
        self.negatives.len()
    }
}

/// The error of a lookup refused because the breaker is open (made once:
/// an outage may refuse many lookups a second).
fn circuit_open() -> StoreError {
    static OPEN: std::sync::LazyLock<Arc<CircuitOpen>> =
        std::sync::LazyLock::new(|| Arc::new(CircuitOpen));
    StoreError::Unreachable(OPEN.clone())
}

/// The trace span of a store lookup on a cache miss, when the request is
/// sampled.
fn lookup_span() -> Option<crate::trace::ChildSpan> {
    crate::trace::child("store.lookup", opentelemetry::trace::SpanKind::Client)
}

/// Says on the lookup's span what the store answered.
fn end_lookup_span<T>(
    span: Option<&mut crate::trace::ChildSpan>,
    loaded: &Result<Option<T>, StoreError>,
) {
    let Some(span) = span else {
        return;
    };
    match loaded {
        Ok(found) => span.set("mpg.store.found", found.is_some()),
        Err(e) => span.fail(e),
    }
}
