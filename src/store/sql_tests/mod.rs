//! Tests of [`super::SqlStore`]: each runs on SQLite and on the PostgreSQL at
//! `MPG_TEST_PG_URL`.
use super::*;
use crate::secret::hash_secret;
use crate::store::sql_changes::parse_change;
use crate::store::testing::TestDb;
use crate::store::{Change, KeyStatus, NewApiKey, CHANGE_RETENTION};
use serde_json::json;

mod changes;
mod connect;
mod keys;

use changes::*;
use keys::*;

/// Runs each suite function, in module `$module`, against a fresh
/// PostgreSQL database.
macro_rules! on_postgres {
    ($module:ident: $($name:ident),* $(,)?) => {
        mod $module {
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
        on_postgres!(postgres: $($name),*);
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
    batch_session_lookup_answers_each_as_its_own_lookup,
);

// What exists on PostgreSQL only is checked there only: no SQLite run that
// would pass by returning.
on_postgres!(
    postgres_only: postgres_plans_each_statement_once,
    postgres_compares_secret_hashes_bytewise,
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
        Err(StoreError::Conflict(m)) if m == "organization acme already exists"
    ));
    assert!(matches!(
        store.create_organization("bad id", None).await,
        Err(StoreError::Invalid(_))
    ));
    // Plain characters, but a credential's shape: refused, and not echoed.
    let pasted = format!("x{}", crate::secret::generate_session_token());
    assert!(matches!(
        store.create_user(&pasted, None).await,
        Err(StoreError::Invalid(m)) if !m.contains("mps_")
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

#[test]
fn a_page_past_its_limit_is_cut_and_names_its_last_row() {
    let cursor = |n: &u32| n.to_string();
    assert_eq!(
        split_page(vec![1, 2, 3], 2, cursor),
        (vec![1, 2], Some("2".into()))
    );
    assert_eq!(split_page(vec![1, 2], 2, cursor), (vec![1, 2], None));
    assert_eq!(split_page(Vec::<u32>::new(), 0, cursor), (vec![], None));
    assert_eq!(split_page(vec![7], 0, cursor), (vec![], None));
}
