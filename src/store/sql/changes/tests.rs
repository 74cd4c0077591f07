//! What the SQL store records over time: the change feed, usage stamps, and
//! the pruning of changes, usage and audit events past retention.
use super::*;
use crate::store::sql::SqlStore;
use crate::store::testing::{both_backends, new_key, seed, TestDb};
use crate::store::CHANGE_RETENTION;
use sqlx::Row;
use std::time::Duration;

both_backends!(
    changes_feed_sees_every_invalidating_write,
    usage_stamps_never_go_backwards,
    prune_deletes_only_records_past_retention,
    prune_works_off_a_backlog_in_batches,
    audit_events_past_retention_are_pruned,
);

#[test]
fn change_kinds_parse_and_an_unknown_one_drops_everything() {
    assert_eq!(
        parse_change("member", "acme alice".into()),
        Change::Member {
            organization_id: "acme".into(),
            user_id: "alice".into()
        }
    );
    assert_eq!(parse_change("weird", String::new()), Change::All);
}

pub(super) async fn changes_feed_sees_every_invalidating_write(store: &SqlStore) {
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

pub(super) async fn usage_stamps_never_go_backwards(store: &SqlStore) {
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
pub(super) async fn change_rows(store: &SqlStore) -> i64 {
    sqlx::query("SELECT COUNT(*) FROM changes")
        .fetch_one(&store.pool)
        .await
        .and_then(|r| r.try_get::<i64, _>(0))
        .unwrap_or(-1)
}

/// Moves the records up to `seq` to `at` (unix seconds).
pub(super) async fn backdate_changes(store: &SqlStore, seq: i64, at: i64) {
    let done = sqlx::query("UPDATE changes SET at = $1 WHERE seq <= $2")
        .bind(at)
        .bind(seq)
        .execute(&store.pool)
        .await;
    assert!(done.is_ok(), "{done:?}");
}

/// Appends `n` records logged at unix time 0 (far past any retention).
pub(super) async fn ancient_changes(store: &SqlStore, n: i64) {
    let done = sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
         INSERT INTO changes (kind, subject, at) SELECT 'session', 'ses_old', 0 FROM n",
    )
    .bind(n)
    .execute(&store.pool)
    .await;
    assert!(done.is_ok(), "{done:?}");
}

pub(super) async fn prune_deletes_only_records_past_retention(store: &SqlStore) {
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

pub(super) async fn prune_works_off_a_backlog_in_batches(store: &SqlStore) {
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

/// Pruning the audit trail deletes the events older than the cut-off only.
pub(super) async fn audit_events_past_retention_are_pruned(store: &SqlStore) {
    seed(store).await;
    let Ok((_, rec)) = store.create_api_key(new_key("audited")).await else {
        panic!("create failed")
    };
    let now = crate::clock::unix_now();
    let old = now - 100 * 24 * 3600;
    sqlx::query(
        "INSERT INTO audit_events (id, action, key_id, organization_id, actor, at) \
         VALUES ('evt_old', 'api_key.revoked', 'key_old', 'acme', 'cli', $1)",
    )
    .bind(old)
    .execute(&store.pool)
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
    let listed = store.list_audit_events("acme", 10, None).await;
    let Ok((events, None)) = listed else {
        panic!("list failed: {listed:?}")
    };
    // The seed's organization and membership, the key, and the old event.
    assert_eq!(events.len(), 4);
    let pruned = store.prune_audit_events(now - 90 * 24 * 3600).await;
    assert_eq!(pruned.ok(), Some(1));
    let listed = store.list_audit_events("acme", 10, None).await;
    let Ok((events, None)) = listed else {
        panic!("list failed: {listed:?}")
    };
    let actions: Vec<&str> = events.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        ["api_key.created", "member.added", "organization.created"]
    );
    assert_eq!(events[1].subject.as_deref(), Some("alice"));
    assert_eq!(
        (events[1].key_id.as_deref(), events[2].subject.as_deref()),
        (None, None)
    );
    assert_eq!(events[0].action, "api_key.created");
    assert_eq!(events[0].key_id, Some(rec.id));
    assert_eq!(events[0].actor, "cli");
    assert!(store
        .list_audit_events("acme", 10, Some("x"))
        .await
        .is_err());
}
