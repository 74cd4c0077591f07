//! The change log half of [`SqlStore`]: every revoke, delete, role change and
//! session removal appends a row to `changes` in its own transaction; running
//! gateways read it to invalidate their caches (`invalidation.rs`), and prune
//! it so it stays bounded ([`CHANGE_RETENTION`]). Pruning advances a horizon
//! (`changes_horizon.pruned_through`, the highest seq ever pruned) in the
//! same transaction, so a reader whose cursor is below it knows it may have
//! missed something and clears its cache instead.
use super::error::Db;
use super::schema::{Dialect, NOTIFY_CHANNEL};
use super::SqlStore;
use crate::clock::unix_now;
use crate::store::{Change, StoreError};
use sqlx::AssertSqlSafe;
use sqlx::{AnyConnection, Executor, Row};
use std::time::Duration;

/// More than this many unseen changes: the reader gets [`Change::All`].
const CHANGES_BATCH: i64 = 1000;

/// Change records older than this are pruned. Readers need a record for
/// only one poll (250 ms; PostgreSQL re-reads the last 10 s for late
/// commits), and a reader that fell further behind clears its cache anyway.
/// A day is far past all of that and any sane clock skew between instances,
/// keeps the log readable for an operator asking "what changed today", and
/// bounds the table by one day of changes.
pub const CHANGE_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// Rows deleted per prune transaction (short transactions, short locks).
const PRUNE_BATCH: u32 = 1000;
/// Prune transactions per run at most; a larger backlog (e.g. the first
/// run on a store that never pruned) is worked off over later runs.
const PRUNE_MAX_BATCHES: u32 = 100;
/// Pause between two prune transactions, leaving the store to the requests.
const PRUNE_PACE: Duration = Duration::from_millis(10);
/// Advisory lock (PostgreSQL) held by the one instance pruning right now;
/// the others skip the run instead of queueing on the same rows.
const PRUNE_LOCK: i64 = 7302;

/// One read of the change log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(in crate::store) struct ChangeRead {
    /// Changes after the cursor (or recent), with their seq, oldest first.
    pub(in crate::store) changes: Vec<(i64, Change)>,
    /// The highest seq pruned so far (0: none), read *after* the changes: a
    /// change pruned before the read above is at or below it.
    pub(in crate::store) pruned_through: i64,
}

impl SqlStore {
    /// Appends `change` to the invalidation log inside the caller's transaction
    /// (PostgreSQL: also `NOTIFY`, delivered at commit).
    pub(in crate::store) async fn log_change(
        &self,
        conn: &mut AnyConnection,
        change: &Change,
    ) -> Result<(), StoreError> {
        let (kind, subject) = match change {
            Change::ApiKey { id } => ("api_key", id.clone()),
            Change::Member {
                organization_id,
                user_id,
            } => ("member", format!("{organization_id} {user_id}")),
            Change::Session { id } => ("session", id.clone()),
            Change::OrgLimits { organization_id } => ("org_limits", organization_id.clone()),
            Change::All => ("all", String::new()),
        };
        sqlx::query("INSERT INTO changes (kind, subject, at) VALUES ($1, $2, $3)")
            .bind(kind)
            .bind(subject)
            .bind(unix_now())
            .execute(&mut *conn)
            .await
            .db()?;
        if self.dialect == Dialect::Postgres {
            conn.execute(AssertSqlSafe(format!("NOTIFY {NOTIFY_CHANNEL}")))
                .await
                .db()?;
        }
        Ok(())
    }

    /// Changes logged after `seq`: (new max seq, changes). More than a batch
    /// behind, or behind the pruning horizon: `[Change::All]` and the new max.
    pub async fn changes_since(&self, seq: i64) -> Result<(i64, Vec<Change>), StoreError> {
        let read = self.changes_after(seq, i64::MAX).await?;
        let max = read.changes.iter().map(|(s, _)| *s).max().unwrap_or(seq);
        if read.pruned_through > seq {
            return Ok((max.max(read.pruned_through), vec![Change::All]));
        }
        Ok((max, read.changes.into_iter().map(|(_, c)| c).collect()))
    }

    /// Changes with `seq > after` or logged at or after `recent_at` (unix
    /// seconds; PostgreSQL can commit sequence numbers out of order, so the
    /// poller re-reads a recent window), with their seq, oldest first; then
    /// the pruning horizon.
    pub(in crate::store) async fn changes_after(
        &self,
        after: i64,
        recent_at: i64,
    ) -> Result<ChangeRead, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let rows = sqlx::query(
                "SELECT seq, kind, subject FROM changes WHERE seq > $1 OR at >= $2 \
                 ORDER BY seq LIMIT $3",
            )
            .bind(after)
            .bind(recent_at)
            .bind(CHANGES_BATCH + 1)
            .fetch_all(&mut *conn)
            .await
            .db()?;
            let changes = if rows.len() > usize::try_from(CHANGES_BATCH).unwrap_or(usize::MAX) {
                vec![(max_seq(&mut conn).await?.unwrap_or(after), Change::All)]
            } else {
                rows.iter()
                    .map(|r| {
                        let seq: i64 = r.try_get(0)?;
                        let kind: String = r.try_get(1)?;
                        let subject: String = r.try_get(2)?;
                        Ok((seq, parse_change(&kind, subject)))
                    })
                    .collect::<Result<Vec<_>, sqlx::Error>>()
                    .db()?
            };
            // Must come after the rows: a prune committing in between then
            // shows up here, never as a silent hole in what was read.
            let pruned_through = pruned_through(&mut conn).await?;
            Ok(ChangeRead {
                changes,
                pruned_through,
            })
        })
        .await
    }

    /// The highest seq logged so far (0 when none): the newest row, or the
    /// pruning horizon once pruning has emptied the table.
    pub async fn latest_change_seq(&self) -> Result<i64, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let max = max_seq(&mut conn).await?.unwrap_or(0);
            Ok(max.max(pruned_through(&mut conn).await?))
        })
        .await
    }

    /// Deletes change records logged before `before` (unix seconds), oldest
    /// first, [`PRUNE_BATCH`] per transaction and at most
    /// [`PRUNE_MAX_BATCHES`] transactions; returns how many it deleted.
    /// Several gateways may call this at once: on PostgreSQL one prunes and
    /// the others return at once.
    pub async fn prune_changes(&self, before: i64) -> Result<u64, StoreError> {
        // The usual answer is "nothing yet": one index probe, no write lock.
        let mut conn = self.conn().await?;
        let due = self
            .timed(async {
                sqlx::query("SELECT seq FROM changes WHERE at < $1 LIMIT 1")
                    .bind(before)
                    .fetch_optional(&mut *conn)
                    .await
                    .db()
            })
            .await?;
        drop(conn);
        if due.is_none() {
            return Ok(0);
        }
        let mut total = 0;
        for i in 0..PRUNE_MAX_BATCHES {
            if i > 0 {
                tokio::time::sleep(PRUNE_PACE).await;
            }
            match self.prune_changes_batch(before).await? {
                Some(n) => {
                    total += n;
                    if n < u64::from(PRUNE_BATCH) {
                        break;
                    }
                }
                None => break,
            }
        }
        Ok(total)
    }

    /// One prune transaction: deletes up to [`PRUNE_BATCH`] records older
    /// than `before` (through the `changes_at` index) and raises the horizon
    /// to the highest seq deleted. None: another instance is pruning.
    async fn prune_changes_batch(&self, before: i64) -> Result<Option<u64>, StoreError> {
        let mut tx = self.begin().await?;
        let deleted = self
            .timed(async {
                if self.dialect == Dialect::Postgres {
                    let mine: bool = sqlx::query("SELECT pg_try_advisory_xact_lock($1)")
                        .bind(PRUNE_LOCK)
                        .fetch_one(&mut *tx)
                        .await
                        .db()?
                        .try_get(0)
                        .db()?;
                    if !mine {
                        return Ok(None);
                    }
                }
                let seqs: Vec<i64> = sqlx::query(
                    "DELETE FROM changes WHERE seq IN \
                     (SELECT seq FROM changes WHERE at < $1 ORDER BY at LIMIT $2) RETURNING seq",
                )
                .bind(before)
                .bind(i64::from(PRUNE_BATCH))
                .fetch_all(&mut *tx)
                .await
                .db()?
                .iter()
                .map(|r| r.try_get::<i64, _>(0))
                .collect::<Result<_, _>>()
                .db()?;
                if let Some(&high) = seqs.iter().max() {
                    // An upsert, so a lost horizon row cannot hide a prune.
                    sqlx::query(
                        "INSERT INTO changes_horizon (id, pruned_through) VALUES (1, $1) \
                         ON CONFLICT (id) DO UPDATE SET pruned_through = excluded.pruned_through \
                         WHERE changes_horizon.pruned_through < excluded.pruned_through",
                    )
                    .bind(high)
                    .execute(&mut *tx)
                    .await
                    .db()?;
                }
                Ok(Some(seqs.len() as u64))
            })
            .await?;
        match deleted {
            Some(n) if n > 0 => self.commit(tx).await?,
            // Nothing written: end the transaction (releasing the lock).
            _ => self.timed(async { tx.rollback().await.db() }).await?,
        }
        Ok(deleted)
    }
}

/// The newest seq in the change log; `None` when it is empty.
async fn max_seq(conn: &mut AnyConnection) -> Result<Option<i64>, StoreError> {
    sqlx::query("SELECT MAX(seq) FROM changes")
        .fetch_one(&mut *conn)
        .await
        .db()?
        .try_get(0)
        .db()
}

/// The pruning horizon: the highest seq ever pruned (0: none yet).
async fn pruned_through(conn: &mut AnyConnection) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT pruned_through FROM changes_horizon WHERE id = 1")
        .fetch_optional(&mut *conn)
        .await
        .db()?;
    row.map_or(Ok(0), |r| r.try_get::<i64, _>(0).db())
}

/// A change-log row back into a [`Change`]; anything unknown means "drop all".
pub(in crate::store) fn parse_change(kind: &str, subject: String) -> Change {
    match kind {
        "api_key" => Change::ApiKey { id: subject },
        "session" => Change::Session { id: subject },
        "org_limits" => Change::OrgLimits {
            organization_id: subject,
        },
        "member" => match subject.split_once(' ') {
            Some((org, user)) => Change::Member {
                organization_id: org.to_owned(),
                user_id: user.to_owned(),
            },
            None => Change::All,
        },
        _ => Change::All,
    }
}

#[cfg(test)]
mod tests;
