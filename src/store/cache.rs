//! [`CachedKeyStore`]: the decorator the hot path reads through. A fresh hit
//! (younger than `ttl`, `negative_ttl` for "not found") never awaits the
//! store; a burst of lookups for one uncached secret makes one store query;
//! past `ttl` an entry is refreshed, and while the store is down a positive
//! entry is served up to `ttl + stale_if_error` old. Once a store failure is
//! seen the circuit breaker (`breaker.rs`) opens: stale entries are served
//! and other lookups refused without waiting, until a background probe finds
//! the store again. "Not found" answers live apart, under their own bound
//! (`negative.rs`), so unknown secrets never evict known ones.
//! [`CachedKeyStore::invalidate`] drops exactly the entries a [`Change`]
//! affects, and a load racing it does not re-insert what it removed.
mod breaker;
mod negative;
mod tier;

use super::{ApiKeyAuth, Change, KeyStore, SessionAuth, StoreError};
use crate::secret::SecretHash;
use futures_util::FutureExt;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tier::{lock, Tier};

/// Invalidations remembered for racing loads; older ones count as "changed".
const RECENT_CHANGES: usize = 1024;

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

/// What a cached value needs to know to be invalidated.
trait Cached: Send + Sync + 'static {
    /// True when `change` may make this value wrong.
    fn affected_by(&self, change: &Change) -> bool;
}

impl Cached for ApiKeyAuth {
    fn affected_by(&self, change: &Change) -> bool {
        match change {
            Change::ApiKey { id } => self.key.id == *id,
            Change::Member {
                organization_id,
                user_id,
            } => self.key.organization_id == *organization_id && self.key.user_id == *user_id,
            Change::Session { .. } => false,
            Change::All => true,
        }
    }
}

impl Cached for SessionAuth {
    fn affected_by(&self, change: &Change) -> bool {
        match change {
            Change::Session { id } => self.session.id == *id,
            Change::Member { user_id, .. } => self.session.user_id == *user_id,
            Change::ApiKey { .. } => false,
            Change::All => true,
        }
    }
}

/// Recent invalidations, numbered, so a load can ask "did anything that
/// touches my answer happen since I started?".
#[derive(Default)]
struct ChangeLog {
    epoch: AtomicU64,
    recent: Mutex<VecDeque<(u64, Change)>>,
}

impl ChangeLog {
    /// The number of the latest invalidation.
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Remembers `change` (called before the entries are dropped).
    fn record(&self, change: &Change) {
        let mut recent = lock(&self.recent);
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        recent.push_back((epoch, change.clone()));
        if recent.len() > RECENT_CHANGES {
            recent.pop_front();
        }
    }

    /// True if an invalidation after `start` matches `affects`, or if too
    /// many happened to tell.
    fn changed_since(&self, start: u64, affects: impl Fn(&Change) -> bool) -> bool {
        if self.epoch() == start {
            return false;
        }
        let recent = lock(&self.recent);
        match recent.front() {
            Some((oldest, _)) if *oldest > start + 1 => true,
            _ => recent
                .iter()
                .any(|(epoch, change)| *epoch > start && affects(change)),
        }
    }
}

/// The caching decorator around any [`KeyStore`] (cheap to clone).
#[derive(Clone)]
pub struct CachedKeyStore {
    api_keys: Arc<Tier<ApiKeyAuth>>,
    sessions: Arc<Tier<SessionAuth>>,
    log: Arc<ChangeLog>,
}

impl CachedKeyStore {
    /// Wraps `store`; `cfg.capacity` and `cfg.negative_capacity` bound each tier.
    pub fn new(store: Arc<dyn KeyStore>, cfg: CacheConfig) -> Self {
        let log = Arc::new(ChangeLog::default());
        let breaker = breaker::Breaker::new(Arc::clone(&store));
        let api_keys = Tier::new(
            Arc::clone(&store),
            |store, hash| async move { store.find_api_key(&hash).await }.boxed(),
            Arc::clone(&log),
            Arc::clone(&breaker),
            cfg,
        );
        let sessions = Tier::new(
            store,
            |store, hash| async move { store.find_session(&hash).await }.boxed(),
            Arc::clone(&log),
            breaker,
            cfg,
        );
        CachedKeyStore {
            api_keys,
            sessions,
            log,
        }
    }

    /// The API key with this secret hash (and its user's role), if any.
    pub async fn api_key(&self, hash: &SecretHash) -> Result<Option<Arc<ApiKeyAuth>>, StoreError> {
        self.api_keys.get(hash).await
    }

    /// The session with this token hash (and its user's memberships), if any.
    pub async fn session(&self, hash: &SecretHash) -> Result<Option<Arc<SessionAuth>>, StoreError> {
        self.sessions.get(hash).await
    }

    /// Drops exactly the entries `change` affects (`All`: everything).
    pub fn invalidate(&self, change: &Change) {
        // Record first: a load that finishes after this sees the change.
        self.log.record(change);
        self.api_keys.invalidate(change);
        self.sessions.invalidate(change);
    }

    /// Number of cached entries, positive and negative (both tiers).
    pub fn entry_count(&self) -> u64 {
        self.api_keys.entry_count() + self.sessions.entry_count()
    }

    /// Number of cached "not found" entries (both tiers).
    pub fn negative_count(&self) -> u64 {
        self.api_keys.negative_count() + self.sessions.negative_count()
    }
}

#[cfg(test)]
mod tests;
