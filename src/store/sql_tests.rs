//! Tests of [`super::SqlStore`]: each runs on SQLite and on the PostgreSQL at
//! `MPG_TEST_PG_URL`.
use super::*;
use crate::secret::hash_secret;
use crate::store::sql_changes::parse_change;
use crate::store::testing::TestDb;
use crate::store::{Change, KeyStatus, NewApiKey, CHANGE_RETENTION};
use serde_json::json;

/// Runs each suite function against a fresh SQLite file and a fresh
/// PostgreSQL database.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                let db = super::TestDb::sqlite();
                super::$name(&db.store().await).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                let db = super::TestDb::postgres().await;
                let store = db.store().await;
                super::$name(&store).await;
                store.pool.close().await;
            })*
        }
    };
}

both_backends!(
    migrate_is_idempotent,
    orgs_users_and_members,
    api_key_lifecycle,
    rotation_keeps_the_earlier_expiry_and_happens_once,
    concurrent_rotations_make_one_successor,
    list_paginates_in_stable_order,
    auth_lookup_sees_current_role,
    batch_lookup_answers_known_revoked_expired_and_non_members_and_skips_unknown,
    secret_is_never_stored,
    changes_feed_sees_every_invalidating_write,
    sessions_round_trip,
    usage_stamps_never_go_backwards,
    prune_deletes_only_records_past_retention,
    prune_works_off_a_backlog_in_batches,
    audit_events_past_retention_are_pruned,
    a_keys_own_limit_is_stored_shown_and_rotated,
    org_limits_travel_with_keys_and_sessions,
);

async fn seed(store: &SqlStore) {
    store.create_organization("acme", Some("Acme")).await.ok();
    store.create_user("alice", Some("a@example.com")).await.ok();
    store.set_member("acme", "alice", "admin").await.ok();
}

fn new_key(name: &str) -> NewApiKey {
    NewApiKey {
        organization_id: "acme".into(),
        user_id: "alice".into(),
        name: name.into(),
        scopes: vec!["clusters:read".into(), "clusters:write".into()],
        expires_at: None,
        rate_limit: None,
    }
}

async fn migrate_is_idempotent(store: &SqlStore) {
    store.migrate().await.unwrap_or_else(|e| panic!("{e:?}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e:?}"));
    let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e:?}"));
    let n: i64 = sqlx::query("SELECT COUNT(*) FROM schema_migrations WHERE version = $1")
        .bind(1_i64)
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or(-1);
    assert_eq!(n, 1);
    assert!(store.ping().await.is_ok());
}

async fn orgs_users_and_members(store: &SqlStore) {
    let org = store.create_organization("acme", Some("Acme")).await;
    assert_eq!(org.ok().map(|v| v["id"].clone()), Some(json!("acme")));
    assert!(matches!(
        store.create_organization("acme", None).await,
        Err(StoreError::Conflict(m)) if m == "organization acme"
    ));
    assert!(matches!(
        store.create_organization("bad id", None).await,
        Err(StoreError::Invalid(_))
    ));
    assert!(store.create_user("alice", None).await.is_ok());
    assert!(matches!(
        store.create_user("alice", None).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.set_member("nope", "alice", "admin").await,
        Err(StoreError::NotFound(m)) if m == "organization nope"
    ));
    assert!(matches!(
        store.set_member("acme", "bob", "admin").await,
        Err(StoreError::NotFound(m)) if m == "user bob"
    ));
    assert_eq!(store.member_role("acme", "alice").await.ok(), Some(None));
    assert!(store.set_member("acme", "alice", "viewer").await.is_ok());
    assert!(store.set_member("acme", "alice", "admin").await.is_ok());
    assert_eq!(
        store.member_role("acme", "alice").await.ok().flatten(),
        Some("admin".to_owned())
    );
}

async fn api_key_lifecycle(store: &SqlStore) {
    let mut missing = new_key("x");
    missing.organization_id = "ghost".into();
    assert!(matches!(
        store.create_api_key(missing).await,
        Err(StoreError::NotFound(m)) if m == "organization ghost"
    ));
    seed(store).await;
    let Ok((secret, rec)) = store.create_api_key(new_key("ci")).await else {
        panic!("create failed")
    };
    assert_eq!(rec.prefix, &secret[4..12]);
    assert_eq!(
        store.get_api_key(&rec.id).await.ok().flatten(),
        Some(rec.clone())
    );
    let first = store.revoke_api_key(&rec.id, 1000).await.ok().flatten();
    assert_eq!(first.as_ref().and_then(|r| r.revoked_at), Some(1000));
    let again = store.revoke_api_key(&rec.id, 2000).await.ok().flatten();
    assert_eq!(again.as_ref().and_then(|r| r.revoked_at), Some(1000));
    assert_eq!(again.map(|r| r.status(3000)), Some(KeyStatus::Revoked));
    assert_eq!(store.revoke_api_key("key_none", 1).await.ok(), Some(None));
    assert_eq!(store.delete_api_key(&rec.id).await.ok(), Some(true));
    assert_eq!(store.delete_api_key(&rec.id).await.ok(), Some(false));
    assert_eq!(store.get_api_key(&rec.id).await.ok(), Some(None));
}

async fn rotation_keeps_the_earlier_expiry_and_happens_once(store: &SqlStore) {
    seed(store).await;
    let now = unix_now();
    let mut short = new_key("short");
    short.expires_at = Some(now + 10);
    let Ok((_, rec)) = store.create_api_key(short).await else {
        panic!("create failed")
    };
    // The grace would outlast the key: its own expiry stays.
    let Ok(Some(r)) = store.rotate_api_key(&rec.id, 3600, now).await else {
        panic!("rotate failed")
    };
    assert_eq!(
        (r.old.expires_at, r.new.expires_at),
        (Some(now + 10), Some(now + 10))
    );
    assert_eq!(r.new.name, "short");
    assert_eq!(r.new.scopes, rec.scopes);
    let stored = store.get_api_key(&rec.id).await.ok().flatten();
    assert_eq!(stored, Some(r.old.clone()));
    assert!(matches!(
        store.rotate_api_key(&rec.id, 0, now).await,
        Err(StoreError::Conflict(m)) if m.contains(&r.new.id)
    ));
    // A shorter grace wins over a later expiry.
    let Ok(Some(r2)) = store.rotate_api_key(&r.new.id, 5, now).await else {
        panic!("rotate failed")
    };
    assert_eq!(r2.old.expires_at, Some(now + 5));
    assert_eq!(r2.new.expires_at, Some(now + 10));
    assert_eq!(
        store
            .rotate_api_key("key_none", 0, now)
            .await
            .ok()
            .map(|r| r.is_none()),
        Some(true)
    );
}

async fn concurrent_rotations_make_one_successor(store: &SqlStore) {
    seed(store).await;
    let Ok((_, rec)) = store.create_api_key(new_key("ci")).await else {
        panic!("create failed")
    };
    let now = unix_now();
    let (a, b) = tokio::join!(
        store.rotate_api_key(&rec.id, 60, now),
        store.rotate_api_key(&rec.id, 60, now)
    );
    let won: Vec<_> = [a, b]
        .into_iter()
        .filter_map(|r| r.ok().flatten())
        .collect();
    assert_eq!(won.len(), 1, "both or neither rotation won");
    let (page, _) = store
        .list_api_keys("acme", 100, None)
        .await
        .unwrap_or_default();
    assert_eq!(
        page.len(),
        2,
        "the losing rotation left a key behind: {page:?}"
    );
    let stored = store.get_api_key(&rec.id).await.ok().flatten();
    assert_eq!(
        stored.and_then(|r| r.replaced_by),
        Some(won[0].new.id.clone())
    );
}

async fn list_paginates_in_stable_order(store: &SqlStore) {
    seed(store).await;
    let mut created = Vec::new();
    for i in 0..5 {
        if let Ok((_, rec)) = store.create_api_key(new_key(&format!("k{i}"))).await {
            created.push(rec);
        }
    }
    created.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let Ok((page, next)) = store.list_api_keys("acme", 2, cursor.as_deref()).await else {
            panic!("list failed")
        };
        assert!(page.len() <= 2);
        seen.extend(page);
        pages += 1;
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, created);
    assert!(matches!(
        store.list_api_keys("acme", 2, Some("garbage")).await,
        Err(StoreError::Invalid(m)) if m == "cursor"
    ));
    let other = store.list_api_keys("other", 10, None).await;
    assert_eq!(other.ok().map(|(p, n)| (p.len(), n)), Some((0, None)));
}

async fn auth_lookup_sees_current_role(store: &SqlStore) {
    seed(store).await;
    let Ok((secret, rec)) = store.create_api_key(new_key("ci")).await else {
        panic!("create failed")
    };
    let hash = hash_secret(&secret);
    let found = store.find_api_key(&hash).await.ok().flatten();
    assert_eq!(found.as_ref().map(|a| &a.key), Some(&rec));
    assert_eq!(found.and_then(|a| a.role), Some("admin".to_owned()));
    assert!(store.set_member("acme", "alice", "viewer").await.is_ok());
    let found = store.find_api_key(&hash).await.ok().flatten();
    assert_eq!(found.and_then(|a| a.role), Some("viewer".to_owned()));
    let unknown = store.find_api_key(&hash_secret("mpg_nope")).await;
    assert_eq!(unknown.ok(), Some(None));
}

async fn batch_lookup_answers_known_revoked_expired_and_non_members_and_skips_unknown(
    store: &SqlStore,
) {
    seed(store).await;
    store.create_user("bob", None).await.ok();
    let now = unix_now();
    let create = |name: &'static str, user: &'static str, expires_at: Option<i64>| {
        let mut new = new_key(name);
        new.user_id = user.into();
        new.expires_at = expires_at;
        store.create_api_key(new)
    };
    let Ok((active, active_rec)) = create("active", "alice", None).await else {
        panic!("create failed")
    };
    let Ok((revoked, revoked_rec)) = create("revoked", "alice", None).await else {
        panic!("create failed")
    };
    let Ok((expired, _)) = create("expired", "alice", Some(now - 10)).await else {
        panic!("create failed")
    };
    let Ok((outsider, _)) = create("outsider", "bob", None).await else {
        panic!("create failed")
    };
    assert!(store.revoke_api_key(&revoked_rec.id, now).await.is_ok());
    // A batch as large as the cache sends, mostly unknown hashes.
    let mut hashes: Vec<SecretHash> = (0..250)
        .map(|i| hash_secret(&format!("mpg_unknown_{i}")))
        .collect();
    for secret in [&active, &revoked, &expired, &outsider] {
        hashes.insert(hashes.len() / 2, hash_secret(secret));
    }
    let Ok(found) = store.find_api_keys(&hashes).await else {
        panic!("batch lookup failed")
    };
    assert_eq!(found.len(), 4);
    let of = |secret: &str| {
        let hash = hash_secret(secret);
        let hit = found.iter().find(|(h, _)| *h == hash);
        hit.map(|(_, auth)| auth.clone())
    };
    let a = of(&active).unwrap_or_else(|| panic!("active key missing"));
    assert_eq!(a.key, active_rec);
    assert_eq!(a.role.as_deref(), Some("admin"));
    let status = |secret: &str| of(secret).map(|a| a.key.status(now));
    assert_eq!(status(&revoked), Some(KeyStatus::Revoked));
    assert_eq!(status(&expired), Some(KeyStatus::Expired));
    assert_eq!(of(&outsider).map(|a| a.role), Some(None));
    // Each answer is the one its own lookup gives.
    for secret in [&active, &revoked, &expired, &outsider] {
        let one = store
            .find_api_key(&hash_secret(secret))
            .await
            .ok()
            .flatten();
        assert_eq!(one, of(secret));
    }
    let none = store.find_api_keys(&[hash_secret("mpg_nope")]).await;
    assert_eq!(none.ok().map(|f| f.len()), Some(0));
    assert_eq!(
        store.find_api_keys(&[]).await.ok().map(|f| f.len()),
        Some(0)
    );
}

async fn secret_is_never_stored(store: &SqlStore) {
    seed(store).await;
    let Ok((secret, rec)) = store.create_api_key(new_key("ci")).await else {
        panic!("create failed")
    };
    let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e:?}"));
    let rows = sqlx::query("SELECT * FROM api_keys")
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_default();
    assert_eq!(rows.len(), 1);
    let body = &secret[4..];
    for i in 0..rows[0].len() {
        if let Ok(Some(text)) = rows[0].try_get::<Option<String>, _>(i) {
            assert!(!text.contains(body), "column {i} holds the secret");
        }
    }
    let stored: String = rows[0].try_get("key_hash").unwrap_or_default();
    assert_eq!(stored, hash_secret(&secret).to_hex());
    assert_eq!(rec.prefix.len(), 8);
}

async fn changes_feed_sees_every_invalidating_write(store: &SqlStore) {
    seed(store).await;
    let start = store.latest_change_seq().await.unwrap_or(-1);
    let Ok((_, a)) = store.create_api_key(new_key("a")).await else {
        panic!("create failed")
    };
    let Ok((_, b)) = store.create_api_key(new_key("b")).await else {
        panic!("create failed")
    };
    let Ok((_, ses)) = store.create_session("alice", Duration::from_secs(60)).await else {
        panic!("session failed")
    };
    assert!(store.revoke_api_key(&a.id, 5).await.is_ok());
    assert!(store.revoke_api_key(&a.id, 6).await.is_ok()); // no second entry
    assert!(store.delete_api_key(&b.id).await.is_ok());
    assert!(store.set_member("acme", "alice", "viewer").await.is_ok());
    assert_eq!(store.delete_session(&ses.id).await.ok(), Some(true));
    let Ok((max, changes)) = store.changes_since(start).await else {
        panic!("changes failed")
    };
    assert_eq!(
        changes,
        vec![
            Change::ApiKey { id: a.id.clone() },
            Change::ApiKey { id: b.id.clone() },
            Change::Member {
                organization_id: "acme".into(),
                user_id: "alice".into()
            },
            Change::Session { id: ses.id.clone() },
        ]
    );
    assert_eq!(store.latest_change_seq().await.ok(), Some(max));
    assert_eq!(store.changes_since(max).await.ok(), Some((max, vec![])));
}

async fn sessions_round_trip(store: &SqlStore) {
    assert!(matches!(
        store.create_session("ghost", Duration::from_secs(60)).await,
        Err(StoreError::NotFound(m)) if m == "user ghost"
    ));
    seed(store).await;
    let Ok((token, rec)) = store
        .create_session("alice", Duration::from_secs(3600))
        .await
    else {
        panic!("session failed")
    };
    assert!(crate::secret::check_session_token_format(&token).is_ok());
    assert_eq!(rec.expires_at - rec.created_at, 3600);
    let found = store
        .find_session(&hash_secret(&token))
        .await
        .ok()
        .flatten();
    assert_eq!(found.as_ref().map(|s| &s.session), Some(&rec));
    assert_eq!(
        found.as_ref().and_then(|s| s.role_in("acme")),
        Some("admin")
    );
    assert_eq!(store.delete_session(&rec.id).await.ok(), Some(true));
    assert_eq!(
        store.find_session(&hash_secret(&token)).await.ok(),
        Some(None)
    );
}

async fn usage_stamps_never_go_backwards(store: &SqlStore) {
    seed(store).await;
    let Ok((_, rec)) = store.create_api_key(new_key("ci")).await else {
        panic!("create failed")
    };
    let used = vec![(rec.id.clone(), 500), ("key_unknown".to_owned(), 1)];
    assert!(store.record_key_usage(&used).await.is_ok());
    assert!(store
        .record_key_usage(&[(rec.id.clone(), 400)])
        .await
        .is_ok());
    let got = store.get_api_key(&rec.id).await.ok().flatten();
    assert_eq!(got.and_then(|r| r.last_used_at), Some(500));
    // Keys used in the same second share one statement; each gets its own stamp.
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        let Ok((_, rec)) = store.create_api_key(new_key(name)).await else {
            panic!("create failed")
        };
        ids.push(rec.id);
    }
    let used = vec![
        (ids[0].clone(), 700),
        ("key_unknown".to_owned(), 700),
        (ids[1].clone(), 700),
        (ids[2].clone(), 650),
        (rec.id.clone(), 700),
    ];
    assert!(store.record_key_usage(&used).await.is_ok());
    for (id, want) in [
        (&ids[0], 700),
        (&ids[1], 700),
        (&ids[2], 650),
        (&rec.id, 700),
    ] {
        let got = store.get_api_key(id).await.ok().flatten();
        assert_eq!(got.and_then(|r| r.last_used_at), Some(want), "{id}");
    }
}

/// How many change records the store holds.
async fn change_rows(store: &SqlStore) -> i64 {
    sqlx::query("SELECT COUNT(*) FROM changes")
        .fetch_one(&store.pool)
        .await
        .and_then(|r| r.try_get::<i64, _>(0))
        .unwrap_or(-1)
}

/// Moves the records up to `seq` to `at` (unix seconds).
async fn backdate_changes(store: &SqlStore, seq: i64, at: i64) {
    let done = sqlx::query("UPDATE changes SET at = $1 WHERE seq <= $2")
        .bind(at)
        .bind(seq)
        .execute(&store.pool)
        .await;
    assert!(done.is_ok(), "{done:?}");
}

/// Appends `n` records logged at unix time 0 (far past any retention).
async fn ancient_changes(store: &SqlStore, n: i64) {
    let done = sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
         INSERT INTO changes (kind, subject, at) SELECT 'session', 'ses_old', 0 FROM n",
    )
    .bind(n)
    .execute(&store.pool)
    .await;
    assert!(done.is_ok(), "{done:?}");
}

async fn prune_deletes_only_records_past_retention(store: &SqlStore) {
    seed(store).await;
    let start = store.latest_change_seq().await.unwrap_or(-1);
    let mut ids = Vec::new();
    for name in ["a", "b", "c", "d"] {
        let Ok((_, rec)) = store.create_api_key(new_key(name)).await else {
            panic!("create failed")
        };
        assert!(store.revoke_api_key(&rec.id, 5).await.is_ok());
        ids.push(rec.id);
    }
    let Ok(latest) = store.latest_change_seq().await else {
        panic!("latest failed")
    };
    let Ok((_, all)) = store.changes_since(start).await else {
        panic!("changes failed")
    };
    assert_eq!(all.len(), 4);
    // The two oldest revocations (and the role set by `seed`) are past retention.
    let retention = CHANGE_RETENTION.as_secs() as i64;
    let old_seq = latest - 2;
    backdate_changes(store, old_seq, unix_now() - retention - 60).await;
    // A record just inside the retention is kept.
    assert!(sqlx::query("UPDATE changes SET at = $1 WHERE seq = $2")
        .bind(unix_now() - retention + 60)
        .bind(latest - 1)
        .execute(&store.pool)
        .await
        .is_ok());
    let before = change_rows(store).await;
    let pruned = store.prune_changes(unix_now() - retention).await;
    assert_eq!(pruned.ok(), Some(before as u64 - 2));
    assert_eq!(change_rows(store).await, 2);
    // The horizon is the newest pruned seq; the log's position never goes back.
    let Ok(read) = store.changes_after(old_seq, i64::MAX).await else {
        panic!("read failed")
    };
    assert_eq!(read.pruned_through, old_seq);
    assert_eq!(
        read.changes
            .iter()
            .map(|(_, c)| c.clone())
            .collect::<Vec<_>>(),
        vec![
            Change::ApiKey { id: ids[2].clone() },
            Change::ApiKey { id: ids[3].clone() }
        ]
    );
    assert_eq!(store.latest_change_seq().await.ok(), Some(latest));
    // A reader at or past the horizon sees exactly the kept changes; one
    // below it is told to drop everything.
    let Ok((max, kept)) = store.changes_since(old_seq).await else {
        panic!("changes failed")
    };
    assert_eq!((max, kept.len()), (latest, 2));
    assert_eq!(
        store.changes_since(start).await.ok(),
        Some((latest, vec![Change::All]))
    );
    // Nothing more to prune: a no-op.
    assert_eq!(
        store.prune_changes(unix_now() - retention).await.ok(),
        Some(0)
    );
    // Pruning everything leaves the position where it was.
    assert_eq!(store.prune_changes(unix_now() + 1).await.ok(), Some(2));
    assert_eq!(change_rows(store).await, 0);
    assert_eq!(store.latest_change_seq().await.ok(), Some(latest));
    assert_eq!(
        store.changes_since(latest).await.ok(),
        Some((latest, vec![]))
    );
    // New records continue the sequence.
    assert!(store.delete_api_key(&ids[0]).await.is_ok());
    let Ok((next, changes)) = store.changes_since(latest).await else {
        panic!("changes failed")
    };
    assert!(next > latest);
    assert_eq!(changes, vec![Change::ApiKey { id: ids[0].clone() }]);
}

async fn prune_works_off_a_backlog_in_batches(store: &SqlStore) {
    ancient_changes(store, 2500).await;
    seed(store).await; // one recent record
    let Ok(latest) = store.latest_change_seq().await else {
        panic!("latest failed")
    };
    let retention = CHANGE_RETENTION.as_secs() as i64;
    assert_eq!(
        store.prune_changes(unix_now() - retention).await.ok(),
        Some(2500)
    );
    assert_eq!(change_rows(store).await, 1);
    let Ok(read) = store.changes_after(latest - 1, i64::MAX).await else {
        panic!("read failed")
    };
    assert_eq!(read.pruned_through, latest - 1);
    assert_eq!(read.changes.len(), 1);
}

/// Several gateways on one PostgreSQL prune at once: every old record is
/// deleted once, nothing fails, and the horizon is the newest one pruned.
#[tokio::test]
async fn concurrent_prunes_on_postgres_neither_fail_nor_deadlock() {
    let db = TestDb::postgres().await;
    let (a, b) = (db.store().await, db.store().await);
    ancient_changes(&a, 3500).await;
    seed(&a).await;
    let Ok(latest) = a.latest_change_seq().await else {
        panic!("latest failed")
    };
    let before = unix_now() - CHANGE_RETENTION.as_secs() as i64;
    let (x, y) = tokio::join!(a.prune_changes(before), b.prune_changes(before));
    let (Ok(x), Ok(y)) = (x, y) else {
        panic!("a prune failed")
    };
    // One instance may have stepped aside for a batch: finish what is left.
    let rest = a.prune_changes(before).await.unwrap_or(u64::MAX);
    assert_eq!(x + y + rest, 3500, "{x} + {y} + {rest}");
    assert_eq!(change_rows(&a).await, 1);
    let Ok(read) = b.changes_after(latest, i64::MAX).await else {
        panic!("read failed")
    };
    assert_eq!(read.pruned_through, latest - 1);
    a.pool.close().await;
    b.pool.close().await;
}

#[tokio::test]
async fn a_refused_connect_is_unreachable_at_once_not_at_the_query_timeout() {
    // sqlx's pool retries a refused connect until its acquire deadline; the
    // store fails it at once.
    let cfg = StoreConfig {
        url: "postgres://postgres@127.0.0.1:1/none".into(),
        query_timeout: Duration::from_secs(2),
    };
    let store = SqlStore::connect(&cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(store.backend(), "postgres");
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let err = store.ping().await.err();
        assert!(matches!(err, Some(StoreError::Unreachable(_))), "{err:?}");
        let lookup = store.find_api_key(&hash_secret("x")).await;
        assert!(
            matches!(lookup, Err(StoreError::Unreachable(_))),
            "{lookup:?}"
        );
        let took = started.elapsed();
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
}

#[tokio::test]
async fn a_server_that_accepts_and_never_answers_is_unreachable_within_half_the_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let cfg = StoreConfig {
        url: format!("postgres://postgres@{addr}/none"),
        query_timeout: Duration::from_secs(1),
    };
    let store = SqlStore::connect(&cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let started = std::time::Instant::now();
    let err = store.ping().await.err();
    let took = started.elapsed();
    assert!(matches!(err, Some(StoreError::Unreachable(_))), "{err:?}");
    assert!(took < Duration::from_millis(900), "{took:?}");
    hold.abort();
}

#[tokio::test]
async fn sqlite_connections_use_wal_and_busy_timeout() {
    let db = TestDb::sqlite();
    let store = db.store().await;
    let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e:?}"));
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or_default();
    assert_eq!(mode, "wal");
    let busy: i64 = sqlx::query("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or_default();
    assert_eq!(busy, 5000);
    assert_eq!(store.backend(), "sqlite");
}

#[tokio::test]
async fn slow_query_is_a_timeout() {
    let cfg = StoreConfig {
        url: std::env::var("MPG_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        query_timeout: Duration::from_millis(200),
    };
    let store = SqlStore::connect(&cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e:?}"));
    let slow = store
        .timed(async {
            sqlx::query("SELECT 1 FROM pg_sleep(2)")
                .execute(&mut *conn)
                .await
                .db()
        })
        .await;
    assert!(matches!(slow, Err(StoreError::Timeout)), "{slow:?}");
}

#[tokio::test]
async fn bad_url_is_invalid() {
    let cfg = StoreConfig {
        url: "mysql://x".into(),
        query_timeout: Duration::from_secs(1),
    };
    assert!(matches!(
        SqlStore::connect(&cfg).await,
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn sqlite_path_and_change_parsing() {
    assert_eq!(
        sqlite_path("sqlite://data/g.db?mode=rwc"),
        Some("data/g.db")
    );
    assert_eq!(sqlite_path("sqlite::memory:"), None);
    assert_eq!(
        parse_change("member", "acme alice".into()),
        Change::Member {
            organization_id: "acme".into(),
            user_id: "alice".into()
        }
    );
    assert_eq!(parse_change("weird", String::new()), Change::All);
}

/// Pruning the audit trail deletes the events older than the cut-off only.
async fn audit_events_past_retention_are_pruned(store: &SqlStore) {
    seed(store).await;
    let Ok((_, rec)) = store.create_api_key(new_key("audited")).await else {
        panic!("create failed")
    };
    let now = crate::clock::unix_now();
    let old = now - 100 * 24 * 3600;
    sqlx::query(
        "INSERT INTO audit_events (action, key_id, organization_id, actor, at) \
         VALUES ('api_key.revoked', 'key_old', 'acme', 'cli', $1)",
    )
    .bind(old)
    .execute(&store.pool)
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    let listed = store.list_audit_events("acme", 10, None).await;
    let Ok((events, None)) = listed else {
        panic!("list failed: {listed:?}")
    };
    assert_eq!(events.len(), 2);
    let pruned = store.prune_audit_events(now - 90 * 24 * 3600).await;
    assert_eq!(pruned.ok(), Some(1));
    let listed = store.list_audit_events("acme", 10, None).await;
    let Ok((events, None)) = listed else {
        panic!("list failed: {listed:?}")
    };
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].action, "api_key.created");
    assert_eq!(events[0].key_id, rec.id);
    assert_eq!(events[0].actor, "cli");
    assert!(store
        .list_audit_events("acme", 10, Some("x"))
        .await
        .is_err());
}

async fn a_keys_own_limit_is_stored_shown_and_rotated(store: &SqlStore) {
    seed(store).await;
    let limit = crate::store::LimitSpec::parse(7, "90s").ok();
    let mut new = new_key("limited");
    new.rate_limit = limit;
    let Ok((secret, rec)) = store.create_api_key(new).await else {
        panic!("create failed")
    };
    assert_eq!(rec.rate_limit, limit);
    let got = store.get_api_key(&rec.id).await.ok().flatten();
    assert_eq!(got.as_ref().and_then(|r| r.rate_limit), limit);
    assert_eq!(
        got.map(|r| r.to_json(0)["rate_limit"].clone()),
        Some(json!({"requests": 7, "per": "90s"}))
    );
    let found = store
        .find_api_key(&hash_secret(&secret))
        .await
        .ok()
        .flatten();
    assert_eq!(found.and_then(|a| a.key.rate_limit), limit);
    let (page, _) = store
        .list_api_keys("acme", 10, None)
        .await
        .unwrap_or_default();
    assert_eq!(page.first().and_then(|r| r.rate_limit), limit);
    let rotation = store.rotate_api_key(&rec.id, 0, unix_now()).await;
    let Ok(Some(rotation)) = rotation else {
        panic!("rotate failed")
    };
    assert_eq!(rotation.new.rate_limit, limit);
    let rotated = store.get_api_key(&rotation.new.id).await.ok().flatten();
    assert_eq!(rotated.and_then(|r| r.rate_limit), limit);
    // A key without one shows null.
    let Ok((_, plain)) = store.create_api_key(new_key("plain")).await else {
        panic!("create failed")
    };
    assert_eq!(plain.to_json(0)["rate_limit"], serde_json::Value::Null);
}

async fn org_limits_travel_with_keys_and_sessions(store: &SqlStore) {
    use crate::store::LimitSpec;
    seed(store).await;
    store.create_organization("globex", None).await.ok();
    store.set_member("globex", "alice", "viewer").await.ok();
    let ten = LimitSpec::parse(10, "1m").unwrap_or_else(|e| panic!("{e:?}"));
    assert!(matches!(
        store.set_org_limit("ghost", "default", ten).await,
        Err(StoreError::NotFound(m)) if m == "organization ghost"
    ));
    let Ok((secret, _)) = store.create_api_key(new_key("k")).await else {
        panic!("create failed")
    };
    let Ok((token, _)) = store
        .create_session("alice", Duration::from_secs(600))
        .await
    else {
        panic!("session failed")
    };
    let key_limits = || async {
        let found = store.find_api_key(&hash_secret(&secret)).await;
        found
            .ok()
            .flatten()
            .map(|a| a.org_limits)
            .unwrap_or_default()
    };
    assert!(key_limits().await.is_empty());
    assert!(store.set_org_limit("acme", "default", ten).await.is_ok());
    let twenty = LimitSpec::parse(20, "1s").unwrap_or_else(|e| panic!("{e:?}"));
    let set = store.set_org_limit("acme", "default", twenty).await;
    assert_eq!(
        set.ok().map(|l| l.to_json()),
        Some(json!({
            "organization_id": "acme", "policy": "default", "requests": 20, "per": "1s"
        }))
    );
    assert!(store.set_org_limit("globex", "burst", ten).await.is_ok());
    let limits = key_limits().await;
    assert_eq!(limits.len(), 1, "only the key's organization: {limits:?}");
    assert_eq!(
        crate::store::org_limit(&limits, "acme", "default"),
        Some(&twenty)
    );
    // The batched lookup brings the same overrides, two of them on one key.
    assert!(store.set_org_limit("acme", "burst", ten).await.is_ok());
    let batch = store.find_api_keys(&[hash_secret(&secret)]).await;
    let batch: Vec<_> = batch.ok().into_iter().flatten().map(|(_, a)| a).collect();
    let one = store
        .find_api_key(&hash_secret(&secret))
        .await
        .ok()
        .flatten();
    assert_eq!(batch.first().map(|a| a.org_limits.len()), Some(2));
    assert_eq!(batch.first(), one.as_ref());
    assert!(store.unset_org_limit("acme", "burst").await.is_ok());
    let session = store
        .find_session(&hash_secret(&token))
        .await
        .ok()
        .flatten();
    let session_limits = session.map(|s| s.org_limits).unwrap_or_default();
    assert_eq!(session_limits.len(), 2, "every member organization's");
    assert_eq!(
        crate::store::org_limit(&session_limits, "globex", "burst"),
        Some(&ten)
    );
    assert_eq!(
        store.list_org_limits("acme").await.map(|l| l.len()).ok(),
        Some(1)
    );
    let removed = store.unset_org_limit("acme", "default").await;
    assert_eq!(removed.ok().flatten().map(|l| l.limit), Some(twenty));
    assert_eq!(
        store.unset_org_limit("acme", "default").await.ok(),
        Some(None)
    );
    assert!(key_limits().await.is_empty());
    // Deleting the organization takes its overrides with it.
    assert!(store.delete_organization("globex").await.is_ok());
    assert_eq!(
        store.list_org_limits("globex").await.map(|l| l.len()).ok(),
        Some(0)
    );
}
