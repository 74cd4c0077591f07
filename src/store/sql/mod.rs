//! [`SqlStore`]: the one SQL store, served from SQLite or PostgreSQL through
//! sqlx's `Any` driver so the same statements run on both (`$1` placeholders
//! work on both). This file owns the store's handle and what every query
//! shares: a pooled connection or a write transaction, and the query
//! deadline. Each other file owns one concern, as the list below says.
//!
//! A statement put together with `format!` holds only the store's own text
//! (column lists, a table name from an enum, `$n` placeholders, a dialect's
//! fragment), never a value: values always go as binds. Such a statement is
//! passed as `AssertSqlSafe(…)`, which sqlx requires for any SQL that is not a
//! literal, so that each one can be found and checked.

// Reaching the server and keeping the schema.
mod connect;
mod connect_check;
mod error;
mod migrate;
pub(super) mod schema;
// Accounts: organizations and users, memberships, deleting either.
mod accounts;
mod members;
mod removal;
// API keys: their lifecycle, updates, rotation, the auth lookups.
mod key_lookup;
mod key_update;
mod keys;
mod rotate;
// Sessions, organizations' limits, admin tokens.
mod admin_tokens;
mod limits;
mod sessions;
// What happened: the change log and the audit trail.
mod audit;
pub(super) mod changes;
// A list of values bound as one parameter.
mod list;

pub use audit::{spawn_audit_pruning, Actor};
pub use changes::CHANGE_RETENTION;
pub use key_update::{CreditsUpdate, KeyUpdate};
pub use keys::NewApiKey;
pub use migrate::StoreWaiting;
pub use removal::Removed;
pub use rotate::Rotation;

use crate::secret::SecretHash;
use crate::store::{ApiKeyAuth, KeyStore, SessionAuth, StoreError, UserAccess};
use connect_check::ConnectCheck;
use error::Db;
use schema::Dialect;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool, Executor, Transaction};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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
    /// once when it refuses connections (see `connect_check.rs`).
    pub(super) async fn conn(&self) -> Result<PoolConnection<Any>, StoreError> {
        self.gate()?;
        self.acquiring(self.pool.acquire()).await
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
    pub(super) async fn begin_always(&self) -> Result<Transaction<'static, Any>, StoreError> {
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
mod tests {
    use super::split_page;

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
}
