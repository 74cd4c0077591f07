//! Opening [`SqlStore`]: the url's dialect, the SQLite file and its
//! directory, and the pool's settings (its size, when a pooled connection is
//! pinged, what each new connection sets). Telling a refused connect from a
//! busy pool is `connect_check.rs`'s job.
use super::error::Db;
use super::schema::Dialect;
use super::SqlStore;
use crate::store::{StoreConfig, StoreError};
use sqlx::any::AnyPoolOptions;
use sqlx::{AssertSqlSafe, Connection, Executor};
use std::sync::Arc;
use std::time::Duration;

/// Busy timeout set on every SQLite connection (writers wait, not fail).
const SQLITE_BUSY_TIMEOUT_MS: u64 = 5000;

/// A pooled connection idle at least this long is pinged before it is handed out.
pub(super) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// Splits `sqlite://PATH?opts` into the file path (None for in-memory).
fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// The dialect of `url` and the url to open: a SQLite url gets `mode=rwc`
/// (unless it names a mode) and its file's directory is created.
fn dialect_and_url(url: &str) -> Result<(Dialect, String), StoreError> {
    if url.starts_with("sqlite:") {
        if let Some(path) = sqlite_path(url) {
            if let Some(parent) = std::path::Path::new(path).parent() {
                if !parent.as_os_str().is_empty() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| StoreError::Unavailable(Arc::new(e)))?;
                }
            }
        }
        let url = if url.contains("mode=") {
            url.to_owned()
        } else if url.contains('?') {
            format!("{url}&mode=rwc")
        } else {
            format!("{url}?mode=rwc")
        };
        Ok((Dialect::Sqlite, url))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok((Dialect::Postgres, url.to_owned()))
    } else {
        Err(StoreError::Invalid(
            "store url (want sqlite://PATH or postgres://…)".into(),
        ))
    }
}

/// The pool's settings for `dialect`.
fn pool_options(dialect: Dialect, in_memory: bool, acquire_timeout: Duration) -> AnyPoolOptions {
    AnyPoolOptions::new()
        // An in-memory SQLite database exists once per connection.
        .max_connections(match (dialect, in_memory) {
            (Dialect::Sqlite, true) => 1,
            (Dialect::Sqlite, false) => 4,
            (Dialect::Postgres, _) => 16,
        })
        .acquire_timeout(acquire_timeout)
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
}

impl SqlStore {
    /// Opens a connection pool for `cfg.url` (`sqlite://…` or `postgres://…`).
    /// SQLite: the file and its parent directory are created if missing, WAL
    /// mode and a busy timeout are set on every connection. Does NOT migrate.
    pub async fn connect(cfg: &StoreConfig) -> Result<SqlStore, StoreError> {
        sqlx::any::install_default_drivers();
        let (dialect, url) = dialect_and_url(&cfg.url)?;
        let in_memory = dialect == Dialect::Sqlite && sqlite_path(&url).is_none();
        let pool = pool_options(dialect, in_memory, cfg.query_timeout)
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
}

#[cfg(test)]
mod tests;
