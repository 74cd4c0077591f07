//! Admin tokens in [`SqlStore`]: the bearer tokens of the admin API
//! (`/admin/v1`). Only a token's SHA-256 is stored; the token is shown once,
//! when it is made. A token is looked up on every admin request, never
//! cached, so a revocation holds on every instance at once.
use sqlx::any::AnyRow;
use sqlx::AssertSqlSafe;
use sqlx::Row;

use super::error::Db;
use super::SqlStore;
use crate::clock::unix_now;
use crate::secret::{generate_admin_token, generate_id, hash_secret, SecretHash};
use crate::store::{AdminToken, StoreError};

/// Longest admin token name accepted.
const MAX_NAME_CHARS: usize = 100;

/// Columns of an [`AdminToken`] (never the token hash).
const TOKEN_COLUMNS: &str = "id, name, created_at, revoked_at";

/// The token of `row`, if there is one.
fn one(row: Option<AnyRow>) -> Result<Option<AdminToken>, StoreError> {
    row.as_ref().map(token_from_row).transpose().db()
}

fn token_from_row(row: &AnyRow) -> Result<AdminToken, sqlx::Error> {
    Ok(AdminToken {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

impl SqlStore {
    /// Makes an admin token named `name`: the token (shown once; only its
    /// hash is stored) and its record.
    pub async fn create_admin_token(&self, name: &str) -> Result<(String, AdminToken), StoreError> {
        if name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS {
            return Err(StoreError::Invalid(
                "name (1-100 characters, not only spaces)".into(),
            ));
        }
        let token = generate_admin_token();
        let record = AdminToken {
            id: generate_id("adm_"),
            name: name.to_owned(),
            created_at: unix_now(),
            revoked_at: None,
        };
        let mut conn = self.conn().await?;
        self.timed(async {
            sqlx::query(
                "INSERT INTO admin_tokens (id, name, token_hash, created_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(&record.id)
            .bind(&record.name)
            .bind(hash_secret(&token).to_hex())
            .bind(record.created_at)
            .execute(&mut *conn)
            .await
            .db()
        })
        .await?;
        Ok((token, record))
    }

    /// Every admin token, oldest first (revoked ones too).
    pub async fn list_admin_tokens(&self) -> Result<Vec<AdminToken>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            sqlx::query(AssertSqlSafe(format!(
                "SELECT {TOKEN_COLUMNS} FROM admin_tokens ORDER BY created_at, id"
            )))
            .fetch_all(&mut *conn)
            .await
            .db()?
            .iter()
            .map(token_from_row)
            .collect::<Result<Vec<_>, _>>()
            .db()
        })
        .await
    }

    /// Revokes the token `id` (again: no change); `None` if there is none.
    pub async fn revoke_admin_token(&self, id: &str) -> Result<Option<AdminToken>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            sqlx::query(
                "UPDATE admin_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
            )
            .bind(unix_now())
            .bind(id)
            .execute(&mut *conn)
            .await
            .db()?;
            let query = format!("SELECT {TOKEN_COLUMNS} FROM admin_tokens WHERE id = $1");
            let row = sqlx::query(AssertSqlSafe(query))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await;
            one(row.db()?)
        })
        .await
    }

    /// The live (unrevoked) admin token whose SHA-256 is `hash`, if any.
    pub async fn admin_token_by_hash(
        &self,
        hash: &SecretHash,
    ) -> Result<Option<AdminToken>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let query = format!(
                "SELECT {TOKEN_COLUMNS} FROM admin_tokens WHERE token_hash = $1 AND revoked_at IS NULL"
            );
            let row = sqlx::query(AssertSqlSafe(query)).bind(hash.to_hex()).fetch_optional(&mut *conn).await;
            one(row.db()?)
        })
        .await
    }
}
