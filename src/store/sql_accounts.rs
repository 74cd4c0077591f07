//! The accounts half of [`SqlStore`]: organizations, users, memberships and
//! sessions (creation, role changes, session removal and the session lookup).
use super::sql::{check_id, SqlStore};
use super::sql_error::Db;
use super::{Change, SessionAuth, SessionRecord, StoreError};
use crate::clock::unix_now;
use crate::secret::{generate_id, generate_session_token, hash_secret, SecretHash};
use serde_json::{json, Value};
use sqlx::{AnyConnection, Row};
use std::time::Duration;

impl SqlStore {
    /// Creates an organization; Conflict if the id exists.
    pub async fn create_organization(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<Value, StoreError> {
        check_id("organization", id)?;
        let now = unix_now();
        let mut conn = self.conn().await?;
        let done = self
            .timed(async {
                sqlx::query(
                    "INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(id)
                .bind(name)
                .bind(now)
                .execute(&mut *conn)
                .await
                .db()
            })
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!("organization {id}")));
        }
        Ok(json!({"id": id, "name": name, "created_at": super::rfc3339(Some(now))}))
    }

    /// Creates a user; Conflict if the id exists.
    pub async fn create_user(&self, id: &str, email: Option<&str>) -> Result<Value, StoreError> {
        check_id("user", id)?;
        let now = unix_now();
        let mut conn = self.conn().await?;
        let done = self
            .timed(async {
                sqlx::query(
                    "INSERT INTO users (id, email, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(id)
                .bind(email)
                .bind(now)
                .execute(&mut *conn)
                .await
                .db()
            })
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!("user {id}")));
        }
        Ok(json!({"id": id, "email": email, "created_at": super::rfc3339(Some(now))}))
    }

    /// NotFound unless both the organization and the user exist.
    pub(super) async fn require_org_and_user(
        &self,
        conn: &mut AnyConnection,
        org: &str,
        user: &str,
    ) -> Result<(), StoreError> {
        let org_found = sqlx::query("SELECT id FROM organizations WHERE id = $1")
            .bind(org)
            .fetch_optional(&mut *conn)
            .await
            .db()?;
        if org_found.is_none() {
            return Err(StoreError::NotFound(format!("organization {org}")));
        }
        self.require_user(conn, user).await
    }

    /// NotFound unless the user exists.
    async fn require_user(&self, conn: &mut AnyConnection, user: &str) -> Result<(), StoreError> {
        let found = sqlx::query("SELECT id FROM users WHERE id = $1")
            .bind(user)
            .fetch_optional(&mut *conn)
            .await
            .db()?;
        match found {
            Some(_) => Ok(()),
            None => Err(StoreError::NotFound(format!("user {user}"))),
        }
    }

    /// Sets (inserts or replaces) `user`'s role in `org`; logs a member change.
    pub async fn set_member(&self, org: &str, user: &str, role: &str) -> Result<Value, StoreError> {
        if role.is_empty() || role.len() > 64 || role.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(StoreError::Invalid("role".into()));
        }
        let mut tx = self.begin().await?;
        self.timed(async {
            self.require_org_and_user(&mut tx, org, user).await?;
            sqlx::query(
                "INSERT INTO memberships (organization_id, user_id, role) VALUES ($1, $2, $3) \
                 ON CONFLICT (organization_id, user_id) DO UPDATE SET role = excluded.role",
            )
            .bind(org)
            .bind(user)
            .bind(role)
            .execute(&mut *tx)
            .await
            .db()?;
            let change = Change::Member {
                organization_id: org.to_owned(),
                user_id: user.to_owned(),
            };
            self.log_change(&mut tx, &change).await
        })
        .await?;
        self.commit(tx).await?;
        Ok(json!({"organization_id": org, "user_id": user, "role": role}))
    }

    /// `user`'s role in `org`, if a member.
    pub async fn member_role(&self, org: &str, user: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let row = sqlx::query(
                "SELECT role FROM memberships WHERE organization_id = $1 AND user_id = $2",
            )
            .bind(org)
            .bind(user)
            .fetch_optional(&mut *conn)
            .await
            .db()?;
            row.map(|r| r.try_get::<String, _>(0)).transpose().db()
        })
        .await
    }

    /// Creates a session for `user` valid for `ttl`; returns the token (shown
    /// once; only its hash is stored) and the record.
    pub async fn create_session(
        &self,
        user: &str,
        ttl: Duration,
    ) -> Result<(String, SessionRecord), StoreError> {
        let ttl = i64::try_from(ttl.as_secs()).map_err(|_| StoreError::Invalid("ttl".into()))?;
        let token = generate_session_token();
        let now = unix_now();
        let record = SessionRecord {
            id: generate_id("ses_"),
            user_id: user.to_owned(),
            created_at: now,
            expires_at: now.saturating_add(ttl),
        };
        let mut tx = self.begin().await?;
        self.timed(async {
            self.require_user(&mut tx, user).await?;
            sqlx::query(
                "INSERT INTO sessions (id, token_hash, user_id, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&record.id)
            .bind(hash_secret(&token).to_hex())
            .bind(user)
            .bind(record.created_at)
            .bind(record.expires_at)
            .execute(&mut *tx)
            .await
            .db()
        })
        .await?;
        self.commit(tx).await?;
        Ok((token, record))
    }

    /// Removes a session; logs a session change. False if there was none.
    pub async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let deleted = self
            .timed(async {
                let done = sqlx::query("DELETE FROM sessions WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .db()?;
                if done.rows_affected() > 0 {
                    let change = Change::Session { id: id.to_owned() };
                    self.log_change(&mut tx, &change).await?;
                }
                Ok(done.rows_affected() > 0)
            })
            .await?;
        self.commit(tx).await?;
        Ok(deleted)
    }
    /// The session lookup: the session with this token hash and every
    /// (organization, role) of its user.
    pub(super) async fn find_session_by_hash(
        &self,
        hash: &SecretHash,
    ) -> Result<Option<SessionAuth>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let row = sqlx::query(
                "SELECT id, user_id, created_at, expires_at FROM sessions WHERE token_hash = $1",
            )
            .bind(hash.to_hex())
            .fetch_optional(&mut *conn)
            .await
            .db()?;
            let Some(row) = row else { return Ok(None) };
            let session = SessionRecord {
                id: row.try_get("id").db()?,
                user_id: row.try_get("user_id").db()?,
                created_at: row.try_get("created_at").db()?,
                expires_at: row.try_get("expires_at").db()?,
            };
            let memberships = sqlx::query(
                "SELECT organization_id, role FROM memberships WHERE user_id = $1 \
                 ORDER BY organization_id",
            )
            .bind(&session.user_id)
            .fetch_all(&mut *conn)
            .await
            .db()?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .db()?;
            Ok(Some(SessionAuth {
                session,
                memberships,
            }))
        })
        .await
    }
}
