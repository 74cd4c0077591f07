//! [`CachedKeyStore`]: the decorator the hot path reads through. A fresh hit
//! (younger than `ttl`, `negative_ttl` for "not found") never awaits the
//! store; a burst of lookups for one uncached secret makes one store query;
//! the misses waiting at the same moment are asked for in one store query;
//! past `ttl` an entry is refreshed, and while the store is down a positive
//! entry is served up to `ttl + stale_if_error` old. Once a store failure is
//! seen the circuit breaker (`breaker.rs`) opens: stale entries are served
//! and other lookups refused without waiting, until a background probe finds
//! the store again. "Not found" answers live apart, under their own bound
//! (`negative.rs`), so unknown secrets never evict known ones.
//! [`CachedKeyStore::invalidate`] drops exactly the entries a [`Change`]
//! affects, and a load racing it does not re-insert what it removed.
mod breaker;
mod changes;
mod negative;
mod tier;

use super::{CachedApiKey, Change, KeyStore, SessionAuth, SessionRecord, StoreError};
use crate::secret::SecretHash;
use changes::ChangeLog;
use futures_util::FutureExt;
use std::sync::Arc;
use tier::Tier;

pub use tier::CacheConfig;

/// The caching decorator around any [`KeyStore`] (cheap to clone).
#[derive(Clone)]
pub struct CachedKeyStore {
    api_keys: Arc<Tier<CachedApiKey>>,
    sessions: Arc<Tier<SessionAuth>>,
    log: Arc<ChangeLog>,
    store: Arc<dyn KeyStore>,
}

impl CachedKeyStore {
    /// Wraps `store`; `cfg.capacity` and `cfg.negative_capacity` bound each tier.
    pub fn new(store: Arc<dyn KeyStore>, cfg: CacheConfig) -> Self {
        let log = Arc::new(ChangeLog::default());
        let breaker = breaker::Breaker::new(Arc::clone(&store));
        let api_keys = Tier::new(
            Arc::clone(&store),
            |store, hashes| {
                async move {
                    let found = store.find_api_keys(&hashes).await?;
                    Ok(found
                        .iter()
                        .map(|(hash, auth)| (*hash, CachedApiKey::from(auth)))
                        .collect())
                }
                .boxed()
            },
            Arc::clone(&log),
            Arc::clone(&breaker),
            cfg,
        );
        let sessions = Tier::new(
            Arc::clone(&store),
            |store, hashes| async move { store.find_sessions(&hashes).await }.boxed(),
            Arc::clone(&log),
            breaker,
            cfg,
        );
        CachedKeyStore {
            api_keys,
            sessions,
            log,
            store,
        }
    }

    /// The API key with this secret hash (and its user's role), if any.
    pub async fn api_key(
        &self,
        hash: &SecretHash,
    ) -> Result<Option<Arc<CachedApiKey>>, StoreError> {
        self.api_keys.get(hash).await
    }

    /// The session with this token hash (and its user's memberships), if any.
    pub async fn session(&self, hash: &SecretHash) -> Result<Option<Arc<SessionAuth>>, StoreError> {
        self.sessions.get(hash).await
    }

    /// The API key with this secret hash if the cache answers for it fresh (`Some(None)`:
    /// fresh "not found"); `None` when [`Self::api_key`] would ask the store.
    pub fn fresh_api_key(&self, hash: &SecretHash) -> Option<Option<Arc<CachedApiKey>>> {
        self.api_keys.fresh(hash)
    }

    /// [`Self::fresh_api_key`] for sessions.
    pub fn fresh_session(&self, hash: &SecretHash) -> Option<Option<Arc<SessionAuth>>> {
        self.sessions.fresh(hash)
    }

    /// The session the verified JWT `token` stands for, cached under `hash`
    /// (its [`cache_key`](crate::auth::jwt::cache_key)) until `cache_ttl`
    /// (the record's `expires_at` bounds it too), holding the token, which a
    /// cached entry must match: `session`'s user with its memberships, or
    /// `None` if the store has no such user. A membership change drops it as
    /// it does a session's.
    pub async fn token_session(
        &self,
        hash: &SecretHash,
        token: &str,
        session: SessionRecord,
    ) -> Result<Option<Arc<SessionAuth>>, StoreError> {
        let store = Arc::clone(&self.store);
        let owned: Box<str> = token.into();
        let load = async move {
            let access = store.find_user_access(&session.user_id).await?;
            Ok(access.map(|a| SessionAuth {
                session,
                memberships: a.memberships,
                org_limits: a.org_limits,
                token: Some(owned),
            }))
        };
        let fits = |found: &SessionAuth| found.token.as_deref() == Some(token);
        self.sessions.get_with(hash, fits, load).await
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
