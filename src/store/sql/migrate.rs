//! Migrating [`SqlStore`]: the schema's versions applied in one transaction
//! (serialized between instances on PostgreSQL), and a start with the store
//! down, which keeps every query failing as unreachable while a task retries
//! the migration with backoff.
use super::error::Db;
use super::schema::{Dialect, LEDGER, MIGRATIONS};
use super::SqlStore;
use crate::clock::unix_now;
use crate::store::StoreError;
use sqlx::{Executor, Row};
use std::sync::Arc;
use std::time::Duration;

/// The first retry of a migration that found the store down at start; each
/// next one waits twice as long, up to [`MIGRATION_RETRY_MAX`] (less jitter).
const MIGRATION_RETRY_FIRST: Duration = Duration::from_millis(500);
const MIGRATION_RETRY_MAX: Duration = Duration::from_secs(30);

/// Why a query failed while the store waits for its first migration.
#[derive(Debug, thiserror::Error)]
#[error("the store has not answered since the start")]
pub struct StoreWaiting;

impl SqlStore {
    /// Creates or upgrades the schema; idempotent, safe to run at every start.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.begin_always().await?;
        self.timed(async {
            if self.dialect == Dialect::Postgres {
                // Serialize concurrent migrators; the void result stays in the subquery.
                sqlx::query("SELECT 1 FROM (SELECT pg_advisory_xact_lock(7301)) AS l")
                    .execute(&mut *tx)
                    .await
                    .db()?;
            }
            tx.execute(LEDGER).await.db()?;
            let applied: Vec<i64> = sqlx::query("SELECT version FROM schema_migrations")
                .fetch_all(&mut *tx)
                .await
                .db()?
                .iter()
                .map(|r| r.try_get::<i64, _>(0))
                .collect::<Result<_, _>>()
                .db()?;
            for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
                for stmt in m.statements(self.dialect) {
                    tx.execute(*stmt).await.db()?;
                }
                sqlx::query("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)")
                    .bind(m.version)
                    .bind(unix_now())
                    .execute(&mut *tx)
                    .await
                    .db()?;
                tracing::info!(
                    version = m.version,
                    backend = self.backend(),
                    "migrated store"
                );
            }
            Ok(())
        })
        .await?;
        self.commit(tx).await
    }

    /// Migrates the store, and if it is down ([`StoreError::store_is_down`]), keeps every query
    /// failing as unreachable (so lookups answer 503 and readiness says no)
    /// while a task retries the migration with backoff and jitter; the
    /// store opens once one succeeds. Any other failure is returned.
    pub async fn migrate_or_wait(&self) -> Result<(), StoreError> {
        match self.migrate().await {
            Err(e) if e.store_is_down() => {
                self.open.store(false, std::sync::atomic::Ordering::Release);
                tracing::error!(
                    backend = self.backend(),
                    error = %crate::logging::Chain(&e),
                    "the store cannot be reached at start; serving 503 until it answers"
                );
                tokio::spawn(self.clone().retry_migration());
                Ok(())
            }
            other => other,
        }
    }

    /// Whether queries may run (false only while waiting for the store at start).
    pub fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }

    async fn retry_migration(self) {
        let mut wait = MIGRATION_RETRY_FIRST;
        let mut failures: u64 = 0;
        loop {
            // Full jitter: instances that started together do not retry together.
            let jittered = wait.mul_f64(0.5 + rand::random::<f64>() / 2.0);
            tokio::time::sleep(jittered).await;
            match self.migrate().await {
                Ok(()) => {
                    self.open.store(true, std::sync::atomic::Ordering::Release);
                    tracing::info!(
                        backend = self.backend(),
                        failed_attempts = failures,
                        "the store answers; serving"
                    );
                    return;
                }
                Err(e) => {
                    failures += 1;
                    tracing::debug!(error = %crate::logging::Chain(&e), "the store still cannot be reached");
                    wait = (wait * 2).min(MIGRATION_RETRY_MAX);
                }
            }
        }
    }

    /// `Err` while the store waits for its first migration.
    pub(super) fn gate(&self) -> Result<(), StoreError> {
        if self.is_open() {
            return Ok(());
        }
        static WAITING: std::sync::LazyLock<Arc<StoreWaiting>> =
            std::sync::LazyLock::new(|| Arc::new(StoreWaiting));
        Err(StoreError::Unreachable(WAITING.clone()))
    }
}

#[cfg(test)]
mod tests {
    use crate::store::sql::SqlStore;
    use crate::store::KeyStore;
    use sqlx::Row;

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

    crate::store::testing::both_backends!(migrate_is_idempotent);
}
