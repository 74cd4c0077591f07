//! API keys in the SQL store: their lifecycle, rotation, listing, the auth
//! lookups (one and batched), and the limits that travel with them.
use super::*;
use crate::secret::{hash_secret, SecretHash};
use crate::store::sql::connect::PING_IF_IDLE_FOR;
use crate::store::testing::{both_backends, new_key, on_postgres, seed, TestDb};
use crate::store::{KeyStatus, KeyStore, LimitSpec};
use std::time::Duration;

both_backends!(
    api_key_lifecycle,
    rotation_keeps_the_earlier_expiry_and_happens_once,
    concurrent_rotations_make_one_successor,
    list_paginates_in_stable_order,
    auth_lookup_sees_current_role,
    batch_lookup_answers_known_revoked_expired_and_non_members_and_skips_unknown,
    secret_is_never_stored,
    a_keys_own_limit_is_stored_shown_and_rotated,
    org_limits_travel_with_keys_and_sessions,
    batch_session_lookup_answers_each_as_its_own_lookup,
);

// What exists on PostgreSQL only is checked there only: no SQLite run that
// would pass by returning.
on_postgres!(
    postgres_only: postgres_plans_each_statement_once,
    postgres_compares_secret_hashes_bytewise,
);

pub(super) async fn api_key_lifecycle(store: &SqlStore) {
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

pub(super) async fn rotation_keeps_the_earlier_expiry_and_happens_once(store: &SqlStore) {
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

pub(super) async fn concurrent_rotations_make_one_successor(store: &SqlStore) {
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

pub(super) async fn list_paginates_in_stable_order(store: &SqlStore) {
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

pub(super) async fn auth_lookup_sees_current_role(store: &SqlStore) {
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

pub(super) async fn batch_lookup_answers_known_revoked_expired_and_non_members_and_skips_unknown(
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

pub(super) async fn secret_is_never_stored(store: &SqlStore) {
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

pub(super) async fn a_keys_own_limit_is_stored_shown_and_rotated(store: &SqlStore) {
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
        got.and_then(|r| r.rate_limit)
            .map(|l| (l.requests.get(), l.per)),
        Some((7, Duration::from_secs(90)))
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
    // A key without one has none.
    let Ok((_, plain)) = store.create_api_key(new_key("plain")).await else {
        panic!("create failed")
    };
    assert_eq!(plain.rate_limit, None);
}

pub(super) async fn org_limits_travel_with_keys_and_sessions(store: &SqlStore) {
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
    let set = store.set_org_limit("acme", "default", twenty).await.ok();
    let set = set.map(|l| (l.organization_id, l.policy, l.limit));
    assert_eq!(set, Some(("acme".into(), "default".into(), twenty)));
    assert!(store.set_org_limit("globex", "burst", ten).await.is_ok());
    let limits = key_limits().await;
    assert_eq!(limits.len(), 1, "only the key's organization: {limits:?}");
    assert_eq!(
        crate::store::org_limit(&limits, "acme", "default"),
        Some(&twenty)
    );
    // The batched lookup brings the same overrides, two of them on one key.
    assert!(store.set_org_limit("acme", "burst", ten).await.is_ok());
    let hash = hash_secret(&secret);
    let batch = store.find_api_keys(&[hash]).await;
    let batch: Vec<_> = batch.ok().into_iter().flatten().map(|(_, a)| a).collect();
    let one = store.find_api_key(&hash).await.ok().flatten();
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

pub(super) async fn batch_session_lookup_answers_each_as_its_own_lookup(store: &SqlStore) {
    seed(store).await;
    store.create_organization("globex", None).await.ok();
    store.set_member("globex", "alice", "viewer").await.ok();
    // An id the list parameter must quote (PostgreSQL would read a bare NULL as null).
    store.create_user("NULL", None).await.ok();
    store.set_member("globex", "NULL", "member").await.ok();
    store.create_user("carol@example.com", None).await.ok();
    let ten = LimitSpec::parse(10, "1m").unwrap_or_else(|e| panic!("{e:?}"));
    assert!(store.set_org_limit("globex", "burst", ten).await.is_ok());
    assert!(store.set_org_limit("acme", "default", ten).await.is_ok());
    let mut tokens = Vec::new();
    for user in ["alice", "alice", "NULL", "carol@example.com"] {
        let Ok((token, _)) = store.create_session(user, Duration::from_secs(600)).await else {
            panic!("session failed")
        };
        tokens.push(token);
    }
    let mut hashes: Vec<SecretHash> = (0..100)
        .map(|i| hash_secret(&format!("mps_unknown_{i}")))
        .collect();
    for token in &tokens {
        hashes.insert(hashes.len() / 2, hash_secret(token));
    }
    let Ok(found) = store.find_sessions(&hashes).await else {
        panic!("batch lookup failed")
    };
    assert_eq!(found.len(), 4);
    for token in &tokens {
        let hash = hash_secret(token);
        let one = store.find_session(&hash).await.ok().flatten();
        let batched = found
            .iter()
            .find(|(h, _)| *h == hash)
            .map(|(_, s)| s.clone());
        assert!(one.is_some());
        assert_eq!(batched, one);
    }
    let alice = found.iter().find(|(h, _)| *h == hash_secret(&tokens[0]));
    assert_eq!(alice.map(|(_, s)| s.org_limits.len()), Some(2));
    assert_eq!(
        store
            .find_sessions(&[hash_secret("mps_nope")])
            .await
            .ok()
            .map(|f| f.len()),
        Some(0)
    );
    assert_eq!(
        store.find_sessions(&[]).await.ok().map(|f| f.len()),
        Some(0)
    );
}

pub(super) async fn postgres_plans_each_statement_once(store: &SqlStore) {
    assert_eq!(store.backend(), "postgres");
    // Every pooled connection, not just the first.
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(store.conn().await.unwrap_or_else(|e| panic!("{e:?}")));
    }
    for conn in &mut conns {
        let mode: String = sqlx::query("SHOW plan_cache_mode")
            .fetch_one(&mut **conn)
            .await
            .and_then(|r| r.try_get(0))
            .unwrap_or_default();
        assert_eq!(mode, "force_generic_plan");
    }
}

/// A batch of sessions costs the store one timed lookup, not one per session.
#[test]
fn a_session_batch_is_one_store_lookup() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let count = || {
        let page = handle.render();
        let line = page
            .lines()
            .find(|l| l.starts_with("mpg_store_query_duration_seconds_count"));
        line.and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let db = TestDb::sqlite();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let store = db.store().await;
            seed(&store).await;
            let mut hashes = Vec::new();
            for _ in 0..5 {
                let Ok((token, _)) = store.create_session("alice", Duration::from_secs(60)).await
                else {
                    panic!("session failed")
                };
                hashes.push(hash_secret(&token));
            }
            let before = count();
            let found = store.find_sessions(&hashes).await.ok().map(|f| f.len());
            assert_eq!(found, Some(5));
            assert_eq!(count() - before, 1);
        });
    });
}

/// A pooled connection back from a query moments ago is used without a ping
/// (a storm's batches pay one round trip each); one idle a while is pinged
/// first, and replaced if its server end is gone.
#[tokio::test]
async fn postgres_pings_a_pooled_connection_only_after_it_sat_idle() {
    use sqlx::{Connection as _, Executor as _};
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let url = db.url();
    let kill_all = || async {
        let mut admin = sqlx::PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let _ = admin.close().await;
    };
    assert!(store.ping().await.is_ok());
    kill_all().await;
    let fresh = store.ping().await;
    assert!(
        fresh.is_err(),
        "used unpinged, the dead connection fails: {fresh:?}"
    );
    tokio::time::sleep(PING_IF_IDLE_FOR + Duration::from_millis(200)).await;
    kill_all().await;
    let idle = store.ping().await;
    assert!(
        idle.is_ok(),
        "pinged, the dead connection is replaced: {idle:?}"
    );
    store.pool.close().await;
}

/// The secret hashes compare byte by byte on PostgreSQL (migration 6), so an index
/// search of a batched lookup costs no locale-aware comparison.
pub(super) async fn postgres_compares_secret_hashes_bytewise(store: &SqlStore) {
    assert_eq!(store.backend(), "postgres");
    let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e:?}"));
    for (table, column) in [("api_keys", "key_hash"), ("sessions", "token_hash")] {
        let collation: Option<String> = sqlx::query(
            "SELECT collation_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2",
        )
        .bind(table)
        .bind(column)
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get(0))
        .unwrap_or_else(|e| panic!("{table}.{column}: {e:?}"));
        assert_eq!(collation.as_deref(), Some("C"), "{table}.{column}");
    }
}

#[test]
fn cursor_round_trips_and_rejects_garbage() {
    let record = ApiKeyRecord {
        id: "key_x.y".into(),
        name: String::new(),
        organization_id: String::new(),
        user_id: String::new(),
        scopes: vec![],
        prefix: String::new(),
        created_at: -5,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
        replaced_by: None,
        rate_limit: None,
        controls: Default::default(),
    };
    let c = encode_cursor(&record);
    assert_eq!(decode_cursor(&c).ok(), Some((-5, "key_x.y".to_owned())));
    for bad in ["", "zz", "abc", "6162", "é0", "352e+f"] {
        assert!(
            matches!(decode_cursor(bad), Err(StoreError::Invalid(_))),
            "{bad}"
        );
    }
}
