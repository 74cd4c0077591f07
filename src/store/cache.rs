//! [`CachedKeyStore`]: the decorator the hot path reads through. A fresh hit
//! (younger than `ttl`, `negative_ttl` for "not found") never awaits the
//! store; a burst of lookups for one uncached secret makes one store query;
//! past `ttl` an entry is refreshed, and while the store is down a positive
//! entry is served up to `ttl + stale_if_error` old. [`CachedKeyStore::invalidate`]
//! drops exactly the entries a [`Change`] affects, and a load racing it does
//! not re-insert what it removed.
mod tier;

use super::{ApiKeyAuth, Change, KeyStore, SessionAuth, StoreError};
use crate::auth::SecretHash;
use futures_util::FutureExt;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tier::{lock, Tier};
use tokio::time::Instant;

/// Invalidations remembered for racing loads; older ones count as "changed".
const RECENT_CHANGES: usize = 1024;
/// After a store failure, stale entries are served without a new attempt
/// for this long (bounds the latency of an outage to one timeout per second).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Cache sizing and lifetimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Positive entries are answered from cache this long.
    pub ttl: Duration,
    /// "Not found" entries are answered from cache this long.
    pub negative_ttl: Duration,
    /// Maximum entries per tier (API keys and sessions each).
    pub capacity: u64,
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

/// When the store last failed (shared by both tiers: it is one store).
#[derive(Default)]
struct StoreHealth {
    failed_at: Mutex<Option<Instant>>,
}

impl StoreHealth {
    fn failed(&self, now: Instant) {
        *lock(&self.failed_at) = Some(now);
    }

    fn succeeded(&self) {
        *lock(&self.failed_at) = None;
    }

    fn recently_failed(&self, now: Instant) -> bool {
        lock(&self.failed_at)
            .is_some_and(|at| now.saturating_duration_since(at) < RETRY_AFTER_FAILURE)
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
    /// Wraps `store`; `cfg.capacity` bounds each tier.
    pub fn new(store: Arc<dyn KeyStore>, cfg: CacheConfig) -> Self {
        let log = Arc::new(ChangeLog::default());
        let health = Arc::new(StoreHealth::default());
        let api_keys = Tier::new(
            Arc::clone(&store),
            |store, hash| async move { store.find_api_key(&hash).await }.boxed(),
            Arc::clone(&log),
            Arc::clone(&health),
            cfg,
        );
        let sessions = Tier::new(
            store,
            |store, hash| async move { store.find_session(&hash).await }.boxed(),
            Arc::clone(&log),
            health,
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

    /// Number of cached entries (both tiers).
    pub fn entry_count(&self) -> u64 {
        self.api_keys.entry_count() + self.sessions.entry_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::hash_secret;
    use crate::store::{ApiKeyRecord, SessionRecord};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    /// A store that counts queries, can fail, and answers from a snapshot
    /// taken when the query starts (so a slow query can race a change).
    #[derive(Default)]
    struct FakeStore {
        keys: Mutex<HashMap<SecretHash, ApiKeyAuth>>,
        sessions: Mutex<HashMap<SecretHash, SessionAuth>>,
        calls: AtomicUsize,
        failing: AtomicBool,
        delay_ms: AtomicU64,
    }

    impl FakeStore {
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }

        async fn answer<T: Clone>(
            &self,
            map: &Mutex<HashMap<SecretHash, T>>,
            hash: &SecretHash,
        ) -> Result<Option<T>, StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.failing.load(Ordering::SeqCst) {
                return Err(StoreError::Timeout);
            }
            let snapshot = lock(map).get(hash).cloned();
            let delay = self.delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            Ok(snapshot)
        }
    }

    #[async_trait::async_trait]
    impl KeyStore for FakeStore {
        async fn find_api_key(&self, hash: &SecretHash) -> Result<Option<ApiKeyAuth>, StoreError> {
            self.answer(&self.keys, hash).await
        }
        async fn find_session(&self, hash: &SecretHash) -> Result<Option<SessionAuth>, StoreError> {
            self.answer(&self.sessions, hash).await
        }
        async fn ping(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    fn key(id: &str, org: &str, user: &str, role: &str) -> ApiKeyAuth {
        ApiKeyAuth {
            key: ApiKeyRecord {
                id: id.into(),
                name: "n".into(),
                organization_id: org.into(),
                user_id: user.into(),
                scopes: vec!["clusters:read".into()],
                prefix: "AbCdEfGh".into(),
                created_at: 0,
                expires_at: None,
                revoked_at: None,
                last_used_at: None,
            },
            role: Some(role.into()),
        }
    }

    fn session(id: &str, user: &str) -> SessionAuth {
        SessionAuth {
            session: SessionRecord {
                id: id.into(),
                user_id: user.into(),
                created_at: 0,
                expires_at: i64::MAX,
            },
            memberships: vec![("acme".into(), "admin".into())],
        }
    }

    const CFG: CacheConfig = CacheConfig {
        ttl: Duration::from_secs(30),
        negative_ttl: Duration::from_secs(5),
        capacity: 1000,
        stale_if_error: Duration::from_secs(60),
    };

    fn setup() -> (Arc<FakeStore>, CachedKeyStore) {
        let store = Arc::new(FakeStore::default());
        lock(&store.keys).insert(hash_secret("k1"), key("key_1", "acme", "alice", "admin"));
        lock(&store.keys).insert(hash_secret("k2"), key("key_2", "acme", "bob", "admin"));
        lock(&store.sessions).insert(hash_secret("s1"), session("ses_1", "alice"));
        lock(&store.sessions).insert(hash_secret("s2"), session("ses_2", "bob"));
        let cache = CachedKeyStore::new(store.clone(), CFG);
        (store, cache)
    }

    async fn key_id(cache: &CachedKeyStore, secret: &str) -> Option<String> {
        let found = cache.api_key(&hash_secret(secret)).await;
        found.ok().flatten().map(|a| a.key.id.clone())
    }

    #[tokio::test(start_paused = true)]
    async fn burst_of_100_concurrent_lookups_makes_one_query() {
        let (store, cache) = setup();
        store.delay_ms.store(50, Ordering::SeqCst);
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { key_id(&cache, "k1").await })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.ok().flatten().as_deref(), Some("key_1"));
        }
        assert_eq!(store.calls(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn fresh_hits_skip_the_store_until_ttl() {
        let (store, cache) = setup();
        assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
        assert_eq!(store.calls(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
        assert_eq!(store.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_secrets_are_cached_for_negative_ttl() {
        let (store, cache) = setup();
        assert_eq!(key_id(&cache, "nope").await, None);
        assert_eq!(key_id(&cache, "nope").await, None);
        assert_eq!(store.calls(), 1);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(key_id(&cache, "nope").await, None);
        assert_eq!(store.calls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_entry_served_while_store_down_then_error() {
        let (store, cache) = setup();
        assert!(key_id(&cache, "k1").await.is_some());
        assert_eq!(key_id(&cache, "nope").await, None);
        store.failing.store(true, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(31)).await;
        // Past ttl, refresh fails: stale positive entry served.
        assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
        assert_eq!(store.calls(), 3);
        // Right after a failure, stale is served without another attempt.
        assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
        assert_eq!(store.calls(), 3);
        // A negative entry is never served stale.
        let err = cache.api_key(&hash_secret("nope")).await;
        assert!(matches!(err, Err(StoreError::Timeout)));
        // Past ttl + stale_if_error: the error.
        tokio::time::advance(Duration::from_secs(60)).await;
        let err = cache.api_key(&hash_secret("k1")).await;
        assert!(matches!(err, Err(StoreError::Timeout)));
        // Store back: fresh again.
        store.failing.store(false, Ordering::SeqCst);
        assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
    }

    #[tokio::test(start_paused = true)]
    async fn invalidate_by_key_id_drops_only_that_key() {
        let (store, cache) = setup();
        assert!(key_id(&cache, "k1").await.is_some());
        assert!(key_id(&cache, "k2").await.is_some());
        lock(&store.keys).remove(&hash_secret("k1"));
        cache.invalidate(&Change::ApiKey { id: "key_1".into() });
        assert_eq!(key_id(&cache, "k1").await, None);
        assert!(key_id(&cache, "k2").await.is_some());
        assert_eq!(store.calls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn invalidate_by_member_drops_that_users_keys_and_sessions() {
        let (store, cache) = setup();
        for s in ["k1", "k2"] {
            assert!(key_id(&cache, s).await.is_some());
        }
        for s in ["s1", "s2"] {
            assert!(cache
                .session(&hash_secret(s))
                .await
                .ok()
                .flatten()
                .is_some());
        }
        assert_eq!(store.calls(), 4);
        lock(&store.keys).insert(hash_secret("k1"), key("key_1", "acme", "alice", "viewer"));
        cache.invalidate(&Change::Member {
            organization_id: "acme".into(),
            user_id: "alice".into(),
        });
        let k1 = cache.api_key(&hash_secret("k1")).await.ok().flatten();
        assert_eq!(k1.and_then(|a| a.role.clone()).as_deref(), Some("viewer"));
        assert!(cache.session(&hash_secret("s1")).await.is_ok());
        assert_eq!(store.calls(), 6);
        // bob's entries stayed.
        assert!(key_id(&cache, "k2").await.is_some());
        assert!(cache.session(&hash_secret("s2")).await.is_ok());
        assert_eq!(store.calls(), 6);
        cache.invalidate(&Change::Session { id: "ses_2".into() });
        assert!(cache.session(&hash_secret("s2")).await.is_ok());
        assert_eq!(store.calls(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn invalidate_all_drops_everything() {
        let (store, cache) = setup();
        assert!(key_id(&cache, "k1").await.is_some());
        assert!(cache.session(&hash_secret("s1")).await.is_ok());
        assert_eq!(cache.entry_count(), 2);
        cache.invalidate(&Change::All);
        assert_eq!(cache.entry_count(), 0);
        assert!(key_id(&cache, "k1").await.is_some());
        assert_eq!(store.calls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn invalidation_during_a_load_is_not_undone_by_it() {
        let (store, cache) = setup();
        store.delay_ms.store(100, Ordering::SeqCst);
        let c = cache.clone();
        let lookup = tokio::spawn(async move {
            let found = c.api_key(&hash_secret("k1")).await;
            found.ok().flatten().and_then(|a| a.role.clone())
        });
        // Let the load take its snapshot, then change the role under it.
        tokio::time::sleep(Duration::from_millis(10)).await;
        lock(&store.keys).insert(hash_secret("k1"), key("key_1", "acme", "alice", "viewer"));
        cache.invalidate(&Change::Member {
            organization_id: "acme".into(),
            user_id: "alice".into(),
        });
        assert_eq!(lookup.await.ok().flatten().as_deref(), Some("viewer"));
        let again = cache.api_key(&hash_secret("k1")).await.ok().flatten();
        assert_eq!(
            again.and_then(|a| a.role.clone()).as_deref(),
            Some("viewer")
        );
        assert_eq!(store.calls(), 2);
    }

    #[tokio::test]
    async fn capacity_is_bounded() {
        let store = Arc::new(FakeStore::default());
        let cache = CachedKeyStore::new(
            store.clone(),
            CacheConfig {
                capacity: 10,
                ..CFG
            },
        );
        for i in 0..100 {
            let _ = cache.api_key(&hash_secret(&format!("x{i}"))).await;
        }
        assert!(cache.entry_count() <= 10, "{}", cache.entry_count());
    }

    #[test]
    fn change_log_overflow_counts_as_changed() {
        let log = ChangeLog::default();
        assert!(!log.changed_since(0, |_| true));
        for _ in 0..(RECENT_CHANGES + 5) {
            log.record(&Change::Session { id: "x".into() });
        }
        assert!(log.changed_since(0, |_| false));
        let now = log.epoch();
        log.record(&Change::Session { id: "x".into() });
        assert!(!log.changed_since(now, |_| false));
        assert!(log.changed_since(now, |_| true));
    }
}
