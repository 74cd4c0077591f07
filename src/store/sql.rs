//! [`SqlStore`]: the one SQL store, served from SQLite or PostgreSQL through
//! sqlx's `Any` driver so the same statements run on both (`$1` placeholders
//! work on both). This file owns connecting, migrating and the query
//! deadline; the change log lives in `sql_changes.rs`, organizations, users
//! and memberships in `sql_accounts.rs`, sessions in `sql_sessions.rs`,
//! deleting an organization or a user in `sql_removal.rs`, API keys in
//! `sql_keys.rs`, and what a sqlx error means for the caller in `sql_error.rs`.
//!
//! A statement put together with `format!` holds only the store's own text
//! (column lists, a table name from an enum, `$n` placeholders, a dialect's
//! fragment), never a value: values always go as binds. Such a statement is
//! passed as `AssertSqlSafe(…)`, which sqlx requires for any SQL that is not a
//! literal, so that each one can be found and checked.
use super::schema::{Dialect, LEDGER, MIGRATIONS};
use super::sql_connect::ConnectCheck;
use super::sql_error::Db;
use super::{ApiKeyAuth, KeyStore, SessionAuth, StoreConfig, StoreError, UserAccess};
use crate::clock::unix_now;
use crate::secret::SecretHash;
use sqlx::any::AnyPoolOptions;
use sqlx::pool::PoolConnection;
use sqlx::AssertSqlSafe;
use sqlx::{Any, AnyPool, Connection, Executor, Row, Transaction};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Busy timeout set on every SQLite connection (writers wait, not fail).
const SQLITE_BUSY_TIMEOUT_MS: u64 = 5000;

/// A pooled connection idle at least this long is pinged before it is handed out.
pub(super) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The SQL key store (cheap to clone: a pool handle).
#[derive(Clone)]
pub struct SqlStore {
    pub(super) pool: AnyPool,
    pub(super) dialect: Dialect,
    pub(super) timeout: Duration,
    /// Kept for `LISTEN` (PostgreSQL); may hold a password, so never logged.
    pub(super) url: Arc<str>,
    /// Fails an acquire at once when the server refuses connections.
    connect_check: Arc<ConnectCheck>,
    /// Closed while the schema is not known to be in place (a start with the
    /// store down): every query fails as unreachable until a migration ran.
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &self.backend())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The first retry of a migration that found the store down at start; each
/// next one waits twice as long, up to [`MIGRATION_RETRY_MAX`] (less jitter).
const MIGRATION_RETRY_FIRST: Duration = Duration::from_millis(500);
const MIGRATION_RETRY_MAX: Duration = Duration::from_secs(30);

/// Why a query failed while the store waits for its first migration.
#[derive(Debug, thiserror::Error)]
#[error("the store has not answered since the start")]
pub struct StoreWaiting;

/// Splits `sqlite://PATH?opts` into the file path (None for in-memory).
fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// A page fetched with `LIMIT limit + 1`: its first `limit` rows, and the cursor of the
/// last of them when there were more.
pub(super) fn split_page<T>(
    mut rows: Vec<T>,
    limit: u32,
    cursor: impl FnOnce(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if rows.len() <= limit {
        return (rows, None);
    }
    rows.truncate(limit);
    let next = rows.last().map(cursor);
    (rows, next)
}

/// Ids become headers, log fields and change-log subjects: keep them short
/// and plain, and never shaped like a credential (an `mpg_`/`mps_`/`mpga_`
/// secret pasted into one would be forwarded and logged with it).
pub(super) fn check_id(what: &str, id: &str) -> Result<(), StoreError> {
    let plain = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'@'));
    if !plain {
        return Err(StoreError::Invalid(format!(
            "{what} id (1-128 characters of A-Z a-z 0-9 _ - . : @)"
        )));
    }
    if crate::secret::looks_like_secret(id.bytes()) {
        return Err(StoreError::Invalid(format!(
            "{what} id (it holds what looks like a credential)"
        )));
    }
    Ok(())
}

impl SqlStore {
    /// Opens a connection pool for `cfg.url` (`sqlite://…` or `postgres://…`).
    /// SQLite: the file and its parent directory are created if missing, WAL
    /// mode and a busy timeout are set on every connection. Does NOT migrate.
    pub async fn connect(cfg: &StoreConfig) -> Result<SqlStore, StoreError> {
        sqlx::any::install_default_drivers();
        let (dialect, url) = if cfg.url.starts_with("sqlite:") {
            if let Some(path) = sqlite_path(&cfg.url) {
                if let Some(parent) = std::path::Path::new(path).parent() {
                    if !parent.as_os_str().is_empty() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| StoreError::Unavailable(Arc::new(e)))?;
                    }
                }
            }
            let url = if cfg.url.contains("mode=") {
                cfg.url.clone()
            } else if cfg.url.contains('?') {
                format!("{}&mode=rwc", cfg.url)
            } else {
                format!("{}?mode=rwc", cfg.url)
            };
            (Dialect::Sqlite, url)
        } else if cfg.url.starts_with("postgres://") || cfg.url.starts_with("postgresql://") {
            (Dialect::Postgres, cfg.url.clone())
        } else {
            return Err(StoreError::Invalid(
                "store url (want sqlite://PATH or postgres://…)".into(),
            ));
        };
        let in_memory = dialect == Dialect::Sqlite && sqlite_path(&url).is_none();
        let pool = AnyPoolOptions::new()
            // An in-memory SQLite database exists once per connection.
            .max_connections(match (dialect, in_memory) {
                (Dialect::Sqlite, true) => 1,
                (Dialect::Sqlite, false) => 4,
                (Dialect::Postgres, _) => 16,
            })
            .acquire_timeout(cfg.query_timeout)
            // A connection idle for a while is pinged before use (one that died
            // is replaced); one back from a query moments ago is not, so a storm
            // of lookups pays one round trip per batch, not two.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute(AssertSqlSafe(format!(
                            "PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}"
                        )))
                        .await?;
                        conn.execute("PRAGMA foreign_keys = ON").await?;
                    } else {
                        // Plan each prepared statement once: left to choose, PostgreSQL
                        // plans the auth lookup anew for every batch of a few hashes,
                        // which costs it more than the lookup itself.
                        conn.execute("SET plan_cache_mode = force_generic_plan")
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy(&url)
            .db()?;
        Ok(SqlStore {
            pool,
            dialect,
            timeout: cfg.query_timeout,
            url: url.into(),
            connect_check: Arc::default(),
            open: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        })
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

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self.dialect {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    /// The url this store was opened with (may hold a password: never log it).
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// Runs `fut` under the query deadline.
    pub(super) async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let result = tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        metrics::histogram!(crate::metrics::names::STORE_SECONDS)
            .record(started.elapsed().as_secs_f64());
        result
    }

    /// A pooled connection; a dead server shows up here as Unreachable, at
    /// once when it refuses connections (see `sql_connect.rs`).
    pub(super) async fn conn(&self) -> Result<PoolConnection<Any>, StoreError> {
        self.gate()?;
        self.acquiring(self.pool.acquire()).await
    }

    /// `Err` while the store waits for its first migration.
    fn gate(&self) -> Result<(), StoreError> {
        if self.is_open() {
            return Ok(());
        }
        static WAITING: std::sync::LazyLock<Arc<StoreWaiting>> =
            std::sync::LazyLock::new(|| Arc::new(StoreWaiting));
        Err(StoreError::Unreachable(WAITING.clone()))
    }

    /// Awaits `acquire` (anything that starts with a pool acquire); on
    /// PostgreSQL a refused connect fails it at once instead of at the
    /// acquire deadline. SQLite opens files: nothing to refuse.
    async fn acquiring<T>(
        &self,
        acquire: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match self.dialect {
            Dialect::Sqlite => acquire.await.db(),
            Dialect::Postgres => {
                let opts = self.pool.connect_options();
                self.connect_check
                    .acquire(&opts, self.timeout, acquire)
                    .await
            }
        }
    }

    /// A write transaction (SQLite: `BEGIN IMMEDIATE`, so a read-then-write
    /// never fails on a lock upgrade).
    pub(super) async fn begin(&self) -> Result<Transaction<'static, Any>, StoreError> {
        self.gate()?;
        self.begin_always().await
    }

    /// [`Self::begin`] whether or not the store is open (for the migration).
    async fn begin_always(&self) -> Result<Transaction<'static, Any>, StoreError> {
        let begin = match self.dialect {
            Dialect::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE"),
            Dialect::Postgres => self.pool.begin_with("BEGIN"),
        };
        let begin = async {
            tokio::time::timeout(self.timeout.saturating_mul(2), begin)
                .await
                .unwrap_or(Err(sqlx::Error::PoolTimedOut))
        };
        self.acquiring(begin).await
    }

    /// Commits `tx` under the deadline.
    pub(super) async fn commit(&self, tx: Transaction<'static, Any>) -> Result<(), StoreError> {
        self.timed(async { tx.commit().await.db() }).await
    }

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
}

#[async_trait::async_trait]
impl KeyStore for SqlStore {
    async fn find_api_key(&self, hash: &SecretHash) -> Result<Option<ApiKeyAuth>, StoreError> {
        self.find_api_key_by_hash(hash).await
    }

    async fn find_session(&self, hash: &SecretHash) -> Result<Option<SessionAuth>, StoreError> {
        self.find_session_by_hash(hash).await
    }

    async fn find_api_keys(
        &self,
        hashes: &[SecretHash],
    ) -> Result<Vec<(SecretHash, ApiKeyAuth)>, StoreError> {
        self.find_api_keys_by_hashes(hashes).await
    }

    async fn find_sessions(
        &self,
        hashes: &[SecretHash],
    ) -> Result<Vec<(SecretHash, SessionAuth)>, StoreError> {
        self.find_sessions_by_hashes(hashes).await
    }

    async fn find_user_access(&self, user_id: &str) -> Result<Option<UserAccess>, StoreError> {
        self.find_user_access_by_id(user_id).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async { conn.execute("SELECT 1").await.db().map(|_| ()) })
            .await
    }
}

#[cfg(test)]
#[path = "sql_tests/mod.rs"]
mod tests;
