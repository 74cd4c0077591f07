//! The invalidation tasks' tests: the poller against an in-memory change log
//! that can fail, and the whole path against a real store.
use super::*;
use crate::secret::hash_secret;
use crate::store::testing::TestDb;
use crate::store::{CacheConfig, KeyStatus, KeyStore, NewApiKey};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

/// A change log in memory that can be switched to fail.
#[derive(Default)]
struct FakeLog {
    rows: Mutex<Vec<(i64, Change, i64)>>,
    failing: AtomicBool,
    lookback: Option<i64>,
    pruned_through: AtomicI64,
}

impl FakeLog {
    /// Deletes the rows up to `seq` and raises the horizon, as pruning does.
    fn prune_through(&self, seq: i64) {
        if let Ok(mut rows) = self.rows.lock() {
            rows.retain(|r| r.0 > seq);
        }
        self.pruned_through.fetch_max(seq, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl ChangeSource for FakeLog {
    async fn latest(&self) -> Result<i64, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout);
        }
        let rows = self.rows.lock().map_err(|_| StoreError::Timeout)?;
        let max = rows.iter().map(|r| r.0).max().unwrap_or(0);
        Ok(max.max(self.pruned_through.load(Ordering::SeqCst)))
    }
    async fn after(&self, seq: i64, recent_at: i64) -> Result<ChangeRead, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout);
        }
        let rows = self.rows.lock().map_err(|_| StoreError::Timeout)?;
        let mut out: Vec<_> = rows
            .iter()
            .filter(|(s, _, at)| *s > seq || *at >= recent_at)
            .map(|(s, c, _)| (*s, c.clone()))
            .collect();
        out.sort_by_key(|(s, _)| *s);
        Ok(ChangeRead {
            changes: out,
            pruned_through: self.pruned_through.load(Ordering::SeqCst),
        })
    }
    fn lookback(&self) -> Option<i64> {
        self.lookback
    }
}

/// A cache over a real SQLite store with one key cached.
async fn cached_key(db: &TestDb) -> (SqlStore, CachedKeyStore, String, String) {
    let store = db.store().await;
    assert!(store.create_organization("acme", None).await.is_ok());
    assert!(store.create_user("alice", None).await.is_ok());
    assert!(store.set_member("acme", "alice", "admin").await.is_ok());
    let new = NewApiKey {
        organization_id: "acme".into(),
        user_id: "alice".into(),
        name: "ci".into(),
        scopes: vec!["clusters:read".into()],
        expires_at: None,
        rate_limit: None,
        controls: Default::default(),
    };
    let Ok((secret, rec)) = store.create_api_key(new).await else {
        panic!("create failed")
    };
    let cfg = CacheConfig {
        ttl: Duration::from_secs(3600),
        negative_ttl: Duration::from_secs(3600),
        capacity: 100,
        negative_capacity: 100,
        stale_if_error: Duration::from_secs(0),
    };
    let cache = CachedKeyStore::new(Arc::new(store.clone()) as Arc<dyn KeyStore>, cfg);
    (store, cache, secret, rec.id)
}

async fn status(cache: &CachedKeyStore, secret: &str) -> Option<KeyStatus> {
    let found = cache.api_key(&hash_secret(secret)).await.ok().flatten();
    found.map(|a| a.status(unix_now()))
}

/// Waits (on real I/O, bounded) until the cache shows `want`.
async fn eventually(cache: &CachedKeyStore, secret: &str, want: KeyStatus) -> bool {
    for _ in 0..250 {
        if status(cache, secret).await == Some(want) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn follower_survives_errors_and_misses_nothing() {
    let db = TestDb::sqlite();
    let (_store, cache, secret, id) = cached_key(&db).await;
    let log = FakeLog::default();
    let mut follower = Follower::default();
    log.failing.store(true, Ordering::SeqCst);
    assert!(follower.poll(&log, &cache).await.is_err());
    log.failing.store(false, Ordering::SeqCst);
    assert!(follower.poll(&log, &cache).await.is_ok());
    assert_eq!(follower.high, Some(0));
    // Cache the key, then the change arrives while the store is down.
    assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
    log.rows
        .lock()
        .map(|mut r| r.push((1, Change::ApiKey { id }, 0)))
        .ok();
    log.failing.store(true, Ordering::SeqCst);
    assert!(follower.poll(&log, &cache).await.is_err());
    assert_eq!(follower.high, Some(0));
    log.failing.store(false, Ordering::SeqCst);
    assert!(follower.poll(&log, &cache).await.is_ok());
    assert_eq!(follower.high, Some(1));
    assert_eq!(cache.entry_count(), 0, "the key's entry was dropped");
}

/// A gateway reads where the log stands before it serves: what its first
/// requests cache survives the follower's first polls, though a recent
/// change is re-read by each (PostgreSQL's lookback), and changes after the
/// start still reach the cache. Without a start the first poll clears.
#[tokio::test]
async fn a_follower_given_its_start_keeps_what_was_cached_before_its_first_poll() {
    let db = TestDb::sqlite();
    let (_store, cache, secret, id) = cached_key(&db).await;
    let log = FakeLog {
        lookback: Some(10),
        ..FakeLog::default()
    };
    let recent = Change::ApiKey { id: id.clone() };
    log.rows
        .lock()
        .map(|mut r| r.push((1, recent, unix_now())))
        .ok();
    let start = read_start(&log).await;
    assert!(start.is_ok());
    // Cached after the start was read, as by the gateway's first requests.
    assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
    let mut follower = Follower::starting_at(start.ok());
    for _ in 0..2 {
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(
            cache.entry_count(),
            1,
            "the entry cached after the start was dropped"
        );
    }
    log.rows
        .lock()
        .map(|mut r| r.push((2, Change::ApiKey { id }, unix_now())))
        .ok();
    assert!(follower.poll(&log, &cache).await.is_ok());
    assert_eq!(follower.high, Some(2));
    assert_eq!(
        cache.entry_count(),
        0,
        "the change after the start was missed"
    );

    assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
    let mut unknown = Follower::starting_at(None);
    assert!(unknown.poll(&log, &cache).await.is_ok());
    assert_eq!(unknown.high, Some(2));
    assert_eq!(
        cache.entry_count(),
        0,
        "cached before the position was known"
    );
}

#[tokio::test]
async fn out_of_order_commits_are_applied_once() {
    let db = TestDb::sqlite();
    let (_store, cache, _secret, _id) = cached_key(&db).await;
    let now = unix_now();
    let log = FakeLog {
        lookback: Some(10),
        ..FakeLog::default()
    };
    let mut follower = Follower::default();
    assert!(follower.poll(&log, &cache).await.is_ok());
    log.rows
        .lock()
        .map(|mut r| r.push((2, Change::Session { id: "s2".into() }, now)))
        .ok();
    assert!(follower.poll(&log, &cache).await.is_ok());
    assert_eq!(follower.high, Some(2));
    // Seq 1 commits late: still applied, because it is recent.
    log.rows
        .lock()
        .map(|mut r| r.push((1, Change::Session { id: "s1".into() }, now)))
        .ok();
    assert!(follower.poll(&log, &cache).await.is_ok());
    assert!(follower.seen.contains_key(&1) && follower.seen.contains_key(&2));
    assert_eq!(follower.high, Some(2));
}

#[tokio::test]
async fn a_long_gap_clears_the_cache_on_postgres_only() {
    let db = TestDb::sqlite();
    let (_store, cache, secret, _id) = cached_key(&db).await;
    for (lookback, cleared) in [(Some(10), true), (None, false)] {
        let log = FakeLog {
            lookback,
            ..FakeLog::default()
        };
        let mut follower = Follower::default();
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
        // A short gap keeps the cache.
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(cache.entry_count(), 1);
        // The store was unreachable for longer than GAP_CLEAR.
        follower.last_ok = std::time::Instant::now().checked_sub(GAP_CLEAR * 2);
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(cache.entry_count() == 0, cleared, "lookback {lookback:?}");
    }
}

#[tokio::test]
async fn a_cursor_behind_the_pruned_horizon_clears_the_cache_once() {
    let db = TestDb::sqlite();
    let (_store, cache, secret, id) = cached_key(&db).await;
    for lookback in [None, Some(10)] {
        let log = FakeLog {
            lookback,
            ..FakeLog::default()
        };
        let push = |seq: i64, change: Change| {
            log.rows.lock().map(|mut r| r.push((seq, change, 0))).ok();
        };
        let mut follower = Follower::default();
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
        // Applied, then pruned: the follower saw it, its cache stays.
        push(1, Change::Session { id: "s1".into() });
        assert!(follower.poll(&log, &cache).await.is_ok());
        log.prune_through(1);
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(cache.entry_count(), 1, "lookback {lookback:?}");
        // While the follower is away the key's change is logged and
        // pruned unread; only a later, unrelated change is left.
        push(2, Change::ApiKey { id: id.clone() });
        push(3, Change::Session { id: "s3".into() });
        log.prune_through(2);
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(cache.entry_count(), 0, "lookback {lookback:?}");
        assert_eq!(follower.high, Some(3));
        // Past the horizon now: no second clear.
        assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
        assert!(follower.poll(&log, &cache).await.is_ok());
        assert_eq!(cache.entry_count(), 1, "lookback {lookback:?}");
        // A fresh follower starts at the horizon even with the log empty.
        log.prune_through(3);
        let mut fresh = Follower::default();
        assert!(fresh.poll(&log, &cache).await.is_ok());
        assert_eq!(fresh.high, Some(3));
    }
}

/// A revocation pruned before this follower read it is never served
/// from its cache: the follower finds its cursor below the horizon.
async fn pruned_revocation_is_never_served_from_cache(db: &TestDb) {
    let (store, cache, secret, id) = cached_key(db).await;
    let mut follower = Follower::default();
    assert!(follower.poll(&store, &cache).await.is_ok());
    assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
    assert!(store.revoke_api_key(&id, unix_now()).await.is_ok());
    let pruned = store.prune_changes(unix_now() + 1).await;
    assert!(pruned.as_ref().is_ok_and(|n| *n >= 1), "{pruned:?}");
    assert_eq!(
        status(&cache, &secret).await,
        Some(KeyStatus::Active),
        "still cached"
    );
    assert!(follower.poll(&store, &cache).await.is_ok());
    assert_eq!(cache.entry_count(), 0);
    assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Revoked));
    store.pool.close().await;
}

#[tokio::test]
async fn sqlite_pruned_revocation_is_never_served_from_cache() {
    pruned_revocation_is_never_served_from_cache(&TestDb::sqlite()).await;
}

#[tokio::test]
async fn postgres_pruned_revocation_is_never_served_from_cache() {
    pruned_revocation_is_never_served_from_cache(&TestDb::postgres().await).await;
}

async fn change_rows(store: &SqlStore) -> i64 {
    sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM changes")
        .fetch_one(&store.pool)
        .await
        .unwrap_or(-1)
}

#[tokio::test]
async fn the_task_prunes_past_retention_and_a_live_follower_keeps_its_cache() {
    let db = TestDb::sqlite();
    let (store, cache, secret, id) = cached_key(&db).await;
    // The role set by `cached_key` is past retention; a session's removal is not.
    let Ok(old) = store.latest_change_seq().await else {
        panic!("latest failed")
    };
    let retention = i64::try_from(CHANGE_RETENTION.as_secs()).unwrap_or(i64::MAX);
    assert!(sqlx::query("UPDATE changes SET at = $1 WHERE seq <= $2")
        .bind(unix_now() - retention - 60)
        .bind(old)
        .execute(&store.pool)
        .await
        .is_ok());
    let Ok((_, ses)) = store.create_session("alice", Duration::from_secs(60)).await else {
        panic!("session failed")
    };
    assert_eq!(store.delete_session(&ses.id).await.ok(), Some(true));
    let task = spawn_invalidation(
        store.clone(),
        cache.clone(),
        Duration::from_millis(20),
        None,
    );
    let mut pruned = false;
    for _ in 0..250 {
        if change_rows(&store).await == 1 {
            pruned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pruned, "the old record was not pruned");
    assert_eq!(
        store.changes_since(old).await.ok().map(|c| c.1.len()),
        Some(1)
    );
    // The follower had read everything pruned: several polls later its
    // cache still holds the key.
    assert!(eventually(&cache, &secret, KeyStatus::Active).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(cache.entry_count(), 1);
    assert!(store.revoke_api_key(&id, unix_now()).await.is_ok());
    assert!(eventually(&cache, &secret, KeyStatus::Revoked).await);
    task.abort();
}

#[tokio::test]
async fn sqlite_revocation_reaches_the_cache_by_polling() {
    let db = TestDb::sqlite();
    let (store, cache, secret, id) = cached_key(&db).await;
    let task = spawn_invalidation(
        store.clone(),
        cache.clone(),
        Duration::from_millis(20),
        None,
    );
    assert!(eventually(&cache, &secret, KeyStatus::Active).await);
    assert!(store.revoke_api_key(&id, unix_now()).await.is_ok());
    assert!(eventually(&cache, &secret, KeyStatus::Revoked).await);
    task.abort();
}

#[tokio::test]
async fn postgres_revocation_arrives_by_notify() {
    let db = TestDb::postgres().await;
    let (store, cache, secret, id) = cached_key(&db).await;
    let Ok((secret_b, rec_b)) = store
        .create_api_key(NewApiKey {
            organization_id: "acme".into(),
            user_id: "alice".into(),
            name: "b".into(),
            scopes: vec![],
            expires_at: None,
            rate_limit: None,
            controls: Default::default(),
        })
        .await
    else {
        panic!("create failed")
    };
    assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
    // The poll timer fires once at start, then never again in this test.
    let task = spawn_invalidation(
        store.clone(),
        cache.clone(),
        Duration::from_secs(3600),
        None,
    );
    assert!(store.revoke_api_key(&id, unix_now()).await.is_ok());
    assert!(eventually(&cache, &secret, KeyStatus::Revoked).await);
    // The follower is initialized now: the next change can only come by NOTIFY.
    assert_eq!(status(&cache, &secret_b).await, Some(KeyStatus::Active));
    assert!(store.revoke_api_key(&rec_b.id, unix_now()).await.is_ok());
    assert!(eventually(&cache, &secret_b, KeyStatus::Revoked).await);
    task.abort();
    store.pool.close().await;
}

/// The pid of the backend holding this database's `LISTEN`, if any.
async fn listener_pid(admin: &mut sqlx::PgConnection, db: &str) -> Option<i32> {
    sqlx::query_scalar::<_, i32>(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(db)
    .fetch_optional(admin)
    .await
    .ok()
    .flatten()
}

#[tokio::test]
async fn postgres_listener_resubscribes_after_its_connection_is_killed() {
    use sqlx::Connection;
    let db = TestDb::postgres().await;
    let TestDb::Postgres { name } = &db else {
        panic!("not postgres")
    };
    let (store, cache, secret, id) = cached_key(&db).await;
    let task = spawn_invalidation(
        store.clone(),
        cache.clone(),
        Duration::from_secs(3600),
        None,
    );
    let Ok(mut admin) = sqlx::PgConnection::connect(&db.url()).await else {
        panic!("admin connect")
    };
    let mut first = None;
    for _ in 0..250 {
        first = listener_pid(&mut admin, name).await;
        if first.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Some(first) = first else {
        panic!("no LISTEN connection")
    };
    assert!(sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first)
        .execute(&mut admin)
        .await
        .is_ok());
    // Wait for the new subscription, then let its catch-up poll pass.
    let mut again = false;
    for _ in 0..250 {
        if listener_pid(&mut admin, name)
            .await
            .is_some_and(|p| p != first)
        {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again, "the listener did not come back");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(&cache, &secret).await, Some(KeyStatus::Active));
    // The poll timer is an hour away: only a NOTIFY can carry this.
    assert!(store.revoke_api_key(&id, unix_now()).await.is_ok());
    assert!(eventually(&cache, &secret, KeyStatus::Revoked).await);
    task.abort();
    let _ = admin.close().await;
    store.pool.close().await;
}

/// A rotation logs a change: a follower drops the cached old record, so
/// another gateway sees the shortened expiry (here: none, so at once).
async fn rotation_reaches_a_follower_cache(db: &TestDb) {
    let (store, cache, secret, id) = cached_key(db).await;
    let task = spawn_invalidation(
        store.clone(),
        cache.clone(),
        Duration::from_millis(20),
        None,
    );
    assert!(eventually(&cache, &secret, KeyStatus::Active).await);
    let rotated = store.rotate_api_key(&id, 0, unix_now()).await;
    let Ok(Some(rotation)) = rotated else {
        panic!("rotate failed: {rotated:?}")
    };
    assert_eq!(
        rotation.old.replaced_by.as_deref(),
        Some(rotation.new.id.as_str())
    );
    assert!(eventually(&cache, &secret, KeyStatus::Expired).await);
    assert!(eventually(&cache, &rotation.secret, KeyStatus::Active).await);
    task.abort();
}

#[tokio::test]
async fn sqlite_rotation_reaches_the_cache() {
    rotation_reaches_a_follower_cache(&TestDb::sqlite()).await;
}

#[tokio::test]
async fn postgres_rotation_reaches_the_cache() {
    rotation_reaches_a_follower_cache(&TestDb::postgres().await).await;
}
