//! The audit trail in [`SqlStore`]: one event per change of a key (create,
//! rotate, revoke, delete) or of what an organization holds (the
//! organization itself, a membership, a limit, a member's session), written
//! in the transaction of the change itself; listed newest first; pruned past
//! a retention period. An event names what changed, never a secret or hash.
use sqlx::any::AnyRow;
use sqlx::Row;
use std::time::Duration;

use super::error::Db;
use super::{split_page, SqlStore};
use crate::clock::unix_now;
use crate::store::{AuditEvent, StoreError};

/// Who made a change: a user through the HTTP API, an admin token through
/// the admin API (with the request's id and client address), or the command
/// line (all three absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actor {
    /// The calling user, or the admin token's id (`adm_…`); `None` for the
    /// command line.
    pub user_id: Option<String>,
    /// The request's `X-Request-Id`.
    pub request_id: Option<String>,
    /// The client's IP address.
    pub client: Option<String>,
}

impl Actor {
    /// The command line.
    pub fn cli() -> Self {
        Actor::default()
    }

    /// What the event's `actor` shows: the user id, or `cli`.
    fn name(&self) -> &str {
        self.user_id.as_deref().unwrap_or("cli")
    }
}

/// What an event is about: a key, or something else of an organization.
#[derive(Debug, Clone, Copy)]
pub(super) enum Subject<'a> {
    /// The key with this id.
    Key(&'a str),
    /// A key (`old`) and the key it was rotated into (`new`, the subject).
    Rotated {
        /// The rotated key.
        old: &'a str,
        /// Its successor.
        new: &'a str,
    },
    /// A key and the names of the fields an update set, one comma apart.
    KeyFields {
        /// The key.
        key: &'a str,
        /// `name,enabled,…`
        fields: &'a str,
    },
    /// A user, policy or session, by its id or name.
    Other(&'a str),
    /// The organization itself.
    Organization,
}

/// Writes one event inside the caller's transaction.
pub(super) async fn record_event(
    conn: &mut sqlx::AnyConnection,
    action: &str,
    subject: Subject<'_>,
    organization_id: &str,
    actor: &Actor,
) -> Result<(), StoreError> {
    let (key_id, other) = match subject {
        Subject::Key(id) => (Some(id), None),
        Subject::Rotated { old, new } => (Some(old), Some(new)),
        Subject::KeyFields { key, fields } => (Some(key), Some(fields)),
        Subject::Other(what) => (None, Some(what)),
        Subject::Organization => (None, None),
    };
    sqlx::query(
        "INSERT INTO audit_events (id, action, key_id, subject, organization_id, actor, \
         request_id, client, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(crate::secret::generate_id("evt_"))
    .bind(action)
    .bind(key_id)
    .bind(other)
    .bind(organization_id)
    .bind(actor.name())
    .bind(actor.request_id.as_deref())
    .bind(actor.client.as_deref())
    .bind(unix_now())
    .execute(&mut *conn)
    .await
    .db()?;
    Ok(())
}

fn event_from_row(row: &AnyRow) -> Result<AuditEvent, sqlx::Error> {
    Ok(AuditEvent {
        id: row.try_get("id")?,
        action: row.try_get("action")?,
        key_id: row.try_get("key_id")?,
        subject: row.try_get("subject")?,
        organization_id: row.try_get("organization_id")?,
        actor: row.try_get("actor")?,
        request_id: row.try_get("request_id")?,
        client: row.try_get("client")?,
        at: row.try_get("at")?,
    })
}

impl SqlStore {
    /// One page of `org`'s events, newest first, and the cursor of the next
    /// page if there is one. The cursor is the last event's id, as opaque as
    /// the id; one that names no event of `org` (any more) is Invalid.
    pub async fn list_audit_events(
        &self,
        org: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<(Vec<AuditEvent>, Option<String>), StoreError> {
        if limit == 0 {
            return Err(StoreError::Invalid("limit".into()));
        }
        let mut conn = self.conn().await?;
        let before = match cursor {
            Some(c) => {
                let seq: Option<i64> = self
                    .timed(async {
                        sqlx::query_scalar(
                            "SELECT seq FROM audit_events WHERE id = $1 AND organization_id = $2",
                        )
                        .bind(c)
                        .bind(org)
                        .fetch_optional(&mut *conn)
                        .await
                        .db()
                    })
                    .await?;
                seq.ok_or_else(|| StoreError::Invalid("cursor".into()))?
            }
            None => i64::MAX,
        };
        let page = self
            .timed(async {
                sqlx::query(
                    "SELECT id, action, key_id, subject, organization_id, actor, request_id, client, at \
                     FROM audit_events WHERE organization_id = $1 AND seq < $2 \
                     ORDER BY seq DESC LIMIT $3",
                )
                .bind(org)
                .bind(before)
                .bind(i64::from(limit) + 1)
                .fetch_all(&mut *conn)
                .await
                .db()?
                .iter()
                .map(event_from_row)
                .collect::<Result<Vec<_>, _>>()
                .db()
            })
            .await?;
        Ok(split_page(page, limit, |e| e.id.clone()))
    }

    /// Deletes events recorded before `before` (unix seconds); returns how many.
    pub async fn prune_audit_events(&self, before: i64) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let done = sqlx::query("DELETE FROM audit_events WHERE at < $1")
                .bind(before)
                .execute(&mut *conn)
                .await
                .db()?;
            Ok(done.rows_affected())
        })
        .await
    }
}

/// How often the audit trail is pruned.
const AUDIT_PRUNE_EVERY: Duration = Duration::from_secs(60 * 60);

/// Deletes events older than `retention` every hour, starting at once.
/// Errors are logged and retried on the next run.
pub fn spawn_audit_pruning(store: SqlStore, retention: Duration) -> tokio::task::JoinHandle<()> {
    let retention = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(AUDIT_PRUNE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match store
                .prune_audit_events(unix_now().saturating_sub(retention))
                .await
            {
                Ok(0) => {}
                Ok(events) => tracing::debug!(events, "audit trail pruned"),
                Err(e) => {
                    tracing::warn!(error = %e, "pruning the audit trail failed; retrying later")
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::store::testing::TestDb;
    use std::time::Duration;

    /// The task prunes at once on start: an event past retention is gone
    /// without waiting for the first hour.
    #[tokio::test]
    async fn the_pruning_task_deletes_old_events_at_start() {
        let db = TestDb::sqlite();
        let store = db.store().await;
        let old = crate::clock::unix_now() - 3600;
        for (key, at) in [("key_old", old), ("key_new", old + 3590)] {
            let insert = sqlx::query(
                "INSERT INTO audit_events (id, action, key_id, organization_id, actor, at) \
                 VALUES ($1, 'api_key.deleted', $1, 'acme', 'cli', $2)",
            )
            .bind(key)
            .bind(at)
            .execute(&store.pool)
            .await;
            assert!(insert.is_ok(), "{insert:?}");
        }
        let task = super::spawn_audit_pruning(store.clone(), Duration::from_secs(60));
        let mut left = Vec::new();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Ok((events, _)) = store.list_audit_events("acme", 10, None).await {
                left = events.into_iter().map(|e| e.key_id).collect();
                if left.len() == 1 {
                    break;
                }
            }
        }
        task.abort();
        assert_eq!(left, [Some("key_new".to_string())]);
    }
}

#[cfg(test)]
mod upgrade_tests {
    use crate::store::testing::TestDb;

    /// Migration 9 on a trail written before it: every event keeps its id,
    /// order and fields, with no subject, and new events get one.
    async fn version_9_keeps_the_trail(db: TestDb, v8_table: &'static str) {
        let store = db.store().await;
        for stmt in [
            "DROP TABLE audit_events",
            v8_table,
            "DELETE FROM schema_migrations WHERE version = 9",
        ] {
            let done = sqlx::query(stmt).execute(&store.pool).await;
            assert!(done.is_ok(), "{stmt}: {done:?}");
        }
        for (id, key, at) in [("evt_a", "key_1", 10), ("evt_b", "key_2", 20)] {
            let insert = sqlx::query(
                "INSERT INTO audit_events (id, action, key_id, organization_id, actor, at) \
                 VALUES ($1, 'api_key.created', $2, 'acme', 'cli', $3)",
            )
            .bind(id)
            .bind(key)
            .bind(at)
            .execute(&store.pool)
            .await;
            assert!(insert.is_ok(), "{insert:?}");
        }
        assert!(store.migrate().await.is_ok());
        store.create_organization("acme", None).await.ok();
        let (events, _) = store
            .list_audit_events("acme", 10, None)
            .await
            .unwrap_or_default();
        let seen: Vec<(&str, Option<&str>, Option<&str>)> = events
            .iter()
            .map(|e| (e.action.as_str(), e.key_id.as_deref(), e.subject.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("organization.created", None, None),
                ("api_key.created", Some("key_2"), None),
                ("api_key.created", Some("key_1"), None),
            ]
        );
        assert_eq!(
            (events[1].id.as_str(), events[2].id.as_str()),
            ("evt_b", "evt_a")
        );
    }

    #[tokio::test]
    async fn version_9_keeps_the_trail_on_sqlite() {
        version_9_keeps_the_trail(
            TestDb::sqlite(),
            "CREATE TABLE audit_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, \
             action TEXT NOT NULL, key_id TEXT NOT NULL, organization_id TEXT NOT NULL, \
             actor TEXT NOT NULL, request_id TEXT, client TEXT, at BIGINT NOT NULL, id TEXT)",
        )
        .await
    }

    #[tokio::test]
    async fn version_9_keeps_the_trail_on_postgres() {
        version_9_keeps_the_trail(
            TestDb::postgres().await,
            "CREATE TABLE audit_events (seq BIGSERIAL PRIMARY KEY, \
             action TEXT NOT NULL, key_id TEXT NOT NULL, organization_id TEXT NOT NULL, \
             actor TEXT NOT NULL, request_id TEXT, client TEXT, at BIGINT NOT NULL, id TEXT)",
        )
        .await
    }
}
