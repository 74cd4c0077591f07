//! The cache decorator's tests, against a fake store, on tokio's paused clock.
use super::*;
use crate::secret::hash_secret;
use crate::store::{ApiKeyAuth, ApiKeyRecord, SessionRecord, UserAccess};
use breaker::{OPEN_AFTER_FAILURES, PROBE_EVERY};
use changes::{lock, RECENT_CHANGES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// A store that counts queries, can fail, and answers from a snapshot
/// taken when the query starts (so a slow query can race a change).
#[derive(Default)]
struct FakeStore {
    keys: Mutex<HashMap<SecretHash, ApiKeyAuth>>,
    sessions: Mutex<HashMap<SecretHash, SessionAuth>>,
    calls: AtomicUsize,
    /// What lookups fail with, if anything.
    failure: Mutex<Option<StoreError>>,
    delay_ms: AtomicU64,
    /// Pings fail while set.
    ping_fails: AtomicBool,
    pings: AtomicUsize,
    /// The hashes of each API key query, in order.
    batches: Mutex<Vec<Vec<SecretHash>>>,
    /// Users by id, for the lookups of verified JWTs.
    users: Mutex<HashMap<String, UserAccess>>,
}

impl FakeStore {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Lookups fail with `e` from now on (None: they answer again).
    fn fail_with(&self, e: Option<StoreError>) {
        *lock(&self.failure) = e;
    }

    /// The store refuses connections: lookups and pings fail at once.
    fn down(&self) {
        self.fail_with(Some(refused()));
        self.ping_fails.store(true, Ordering::SeqCst);
    }

    /// The store answers again.
    fn up(&self) {
        self.fail_with(None);
        self.ping_fails.store(false, Ordering::SeqCst);
    }

    async fn answer<T: Clone>(
        &self,
        map: &Mutex<HashMap<SecretHash, T>>,
        hash: &SecretHash,
    ) -> Result<Option<T>, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let failure = lock(&self.failure).clone();
        if let Some(e) = failure {
            return Err(e);
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
    /// One query for the whole batch (one failure check, one delay), each
    /// hash counted as a lookup.
    async fn find_api_keys(
        &self,
        hashes: &[SecretHash],
    ) -> Result<Vec<(SecretHash, ApiKeyAuth)>, StoreError> {
        self.calls.fetch_add(hashes.len(), Ordering::SeqCst);
        lock(&self.batches).push(hashes.to_vec());
        let failure = lock(&self.failure).clone();
        if let Some(e) = failure {
            return Err(e);
        }
        let snapshot: Vec<_> = {
            let keys = lock(&self.keys);
            hashes
                .iter()
                .filter_map(|h| Some((*h, keys.get(h)?.clone())))
                .collect()
        };
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok(snapshot)
    }
    async fn find_user_access(&self, user_id: &str) -> Result<Option<UserAccess>, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let failure = lock(&self.failure).clone();
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(lock(&self.users).get(user_id).cloned())
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.pings.fetch_add(1, Ordering::SeqCst);
        if self.ping_fails.load(Ordering::SeqCst) {
            return Err(refused());
        }
        Ok(())
    }
}

/// What a PostgreSQL that refuses connections fails with.
fn refused() -> StoreError {
    StoreError::Unreachable(Arc::new(std::io::Error::from(
        std::io::ErrorKind::ConnectionRefused,
    )))
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
            replaced_by: None,
            rate_limit: None,
            controls: Default::default(),
        },
        role: Some(role.into()),
        org_limits: vec![],
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
        org_limits: vec![],
        token: None,
    }
}

const CFG: CacheConfig = CacheConfig {
    ttl: Duration::from_secs(30),
    negative_ttl: Duration::from_secs(5),
    capacity: 1000,
    negative_capacity: 1000,
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
    found.ok().flatten().map(|a| a.id().to_owned())
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

/// Every hash the store was asked for, with how often.
fn asked(store: &FakeStore) -> HashMap<SecretHash, usize> {
    let mut asked = HashMap::new();
    for hash in lock(&store.batches).iter().flatten() {
        *asked.entry(*hash).or_insert(0) += 1;
    }
    asked
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_new_keys_is_batched_and_asks_for_each_key_once() {
    let store = Arc::new(FakeStore::default());
    const N: usize = 1000;
    for i in (0..N).step_by(2) {
        let k = key(&format!("key_{i}"), "acme", "alice", "admin");
        lock(&store.keys).insert(hash_secret(&format!("s{i}")), k);
    }
    store.delay_ms.store(5, Ordering::SeqCst);
    let cache = CachedKeyStore::new(store.clone(), CFG);
    // Every key looked up twice at once: the second joins the first.
    let tasks: Vec<_> = (0..2 * N)
        .map(|n| {
            let cache = cache.clone();
            let i = n % N;
            tokio::spawn(async move { (i, key_id(&cache, &format!("s{i}")).await) })
        })
        .collect();
    for task in tasks {
        let (i, found) = task.await.unwrap_or_default();
        let want = (i % 2 == 0).then(|| format!("key_{i}"));
        assert_eq!(found, want, "s{i}");
    }
    let batches = lock(&store.batches).len();
    assert!(batches <= N / 100, "{batches} queries for {N} keys");
    assert!(lock(&store.batches)
        .iter()
        .all(|b| b.len() <= tier::MAX_BATCH));
    let asked = asked(&store);
    assert_eq!(asked.len(), N);
    assert!(asked.values().all(|n| *n == 1), "a key was asked for twice");
    assert_eq!(cache.negative_count(), N as u64 / 2);
    // All cached: no more queries.
    assert_eq!(key_id(&cache, "s0").await.as_deref(), Some("key_0"));
    assert_eq!(key_id(&cache, "s1").await, None);
    assert_eq!(lock(&store.batches).len(), batches);
}

#[tokio::test(start_paused = true)]
async fn a_key_in_flight_is_not_asked_for_again_by_the_next_batch() {
    let (store, cache) = setup();
    store.delay_ms.store(100, Ordering::SeqCst);
    let spawn = |secret: &'static str| {
        let cache = cache.clone();
        tokio::spawn(async move { key_id(&cache, secret).await })
    };
    let first = spawn("k1");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // k1's query is running: these wait, k2 and the unknown one for the next batch.
    let later = [spawn("k1"), spawn("k2"), spawn("nope"), spawn("k1")];
    assert_eq!(first.await.ok().flatten().as_deref(), Some("key_1"));
    let mut answers = Vec::new();
    for task in later {
        answers.push(task.await.ok().flatten());
    }
    let want = [Some("key_1"), Some("key_2"), None, Some("key_1")].map(|a| a.map(String::from));
    assert_eq!(answers, want);
    let batches = lock(&store.batches).clone();
    assert_eq!(
        batches,
        [
            vec![hash_secret("k1")],
            vec![hash_secret("k2"), hash_secret("nope")]
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_fails_each_waiter_once_and_the_next_lookup_asks_again() {
    let (store, cache) = setup();
    store.fail_with(Some(StoreError::Timeout));
    store.delay_ms.store(10, Ordering::SeqCst);
    let tasks: Vec<_> = ["k1", "k2", "k1"]
        .into_iter()
        .map(|s| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.api_key(&hash_secret(s)).await.map(|f| f.is_some()) })
        })
        .collect();
    for task in tasks {
        assert!(matches!(task.await, Ok(Err(StoreError::Timeout))));
    }
    assert_eq!(lock(&store.batches).len(), 1);
    store.fail_with(None);
    assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
    assert_eq!(lock(&store.batches).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_racing_a_batch_sends_only_the_keys_it_touches_back() {
    let (store, cache) = setup();
    store.delay_ms.store(100, Ordering::SeqCst);
    let spawn = |secret: &'static str| {
        let cache = cache.clone();
        tokio::spawn(async move {
            let found = cache.api_key(&hash_secret(secret)).await;
            found
                .ok()
                .flatten()
                .and_then(|a| a.role().map(str::to_owned))
        })
    };
    let (k1, k2) = (spawn("k1"), spawn("k2"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    lock(&store.keys).insert(hash_secret("k1"), key("key_1", "acme", "alice", "viewer"));
    cache.invalidate(&Change::Member {
        organization_id: "acme".into(),
        user_id: "alice".into(),
    });
    assert_eq!(k1.await.ok().flatten().as_deref(), Some("viewer"));
    assert_eq!(k2.await.ok().flatten().as_deref(), Some("admin"));
    let batches = lock(&store.batches).clone();
    assert_eq!(
        batches,
        [
            vec![hash_secret("k1"), hash_secret("k2")],
            vec![hash_secret("k1")]
        ]
    );
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
async fn the_fresh_probe_answers_only_from_a_fresh_entry_and_never_asks_the_store() {
    let (store, cache) = setup();
    let (k1, nope, s1) = (hash_secret("k1"), hash_secret("nope"), hash_secret("s1"));
    assert!(cache.fresh_api_key(&k1).is_none());
    assert!(cache.fresh_api_key(&nope).is_none());
    assert!(cache.fresh_session(&s1).is_none());
    assert_eq!(store.calls(), 0);
    key_id(&cache, "k1").await;
    key_id(&cache, "nope").await;
    cache.session(&s1).await.unwrap();
    let found = cache
        .fresh_api_key(&k1)
        .map(|k| k.map(|k| k.id().to_owned()));
    assert_eq!(found, Some(Some("key_1".to_owned())));
    assert!(matches!(cache.fresh_api_key(&nope), Some(None)));
    assert!(matches!(cache.fresh_session(&s1), Some(Some(_))));
    // Past the negative ttl, then past the ttl: a lookup would ask the store again.
    tokio::time::advance(CFG.negative_ttl).await;
    assert!(cache.fresh_api_key(&nope).is_none());
    assert!(cache.fresh_api_key(&k1).is_some());
    tokio::time::advance(CFG.ttl).await;
    assert!(cache.fresh_api_key(&k1).is_none());
    assert_eq!(store.calls(), 3);
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
    store.down();
    tokio::time::advance(Duration::from_secs(31)).await;
    // Past ttl, refresh fails: stale positive entry served.
    assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
    assert_eq!(store.calls(), 3);
    // The breaker is open: stale is served without another attempt.
    assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
    assert_eq!(store.calls(), 3);
    // A negative entry is never served stale.
    let err = cache.api_key(&hash_secret("nope")).await;
    assert!(matches!(err, Err(StoreError::Unreachable(_))), "{err:?}");
    // Past ttl + stale_if_error: the error.
    tokio::time::advance(Duration::from_secs(60)).await;
    let err = cache.api_key(&hash_secret("k1")).await;
    assert!(matches!(err, Err(StoreError::Unreachable(_))), "{err:?}");
    assert_eq!(store.calls(), 3);
    // Store back: the next probe closes the breaker, and lookups are fresh again.
    store.up();
    tokio::time::sleep(PROBE_EVERY * 2).await;
    assert_eq!(key_id(&cache, "k1").await.as_deref(), Some("key_1"));
    assert_eq!(store.calls(), 4);
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
    assert_eq!(
        k1.and_then(|a| a.role().map(str::to_owned)).as_deref(),
        Some("viewer")
    );
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
        found
            .ok()
            .flatten()
            .and_then(|a| a.role().map(str::to_owned))
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
        again.and_then(|a| a.role().map(str::to_owned)).as_deref(),
        Some("viewer")
    );
    assert_eq!(store.calls(), 2);
}

#[tokio::test]
async fn capacity_is_bounded() {
    let store = Arc::new(FakeStore::default());
    for i in 0..100 {
        let id = format!("key_{i}");
        lock(&store.keys).insert(hash_secret(&id), key(&id, "acme", "alice", "admin"));
    }
    let cache = CachedKeyStore::new(
        store.clone(),
        CacheConfig {
            capacity: 10,
            ..CFG
        },
    );
    for i in 0..100 {
        let _ = cache.api_key(&hash_secret(&format!("key_{i}"))).await;
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

mod outages;
mod tokens;
