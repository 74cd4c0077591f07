//! The accounts part of [`SqlStore`]: organizations, users and memberships
//! (creation, listing, role changes and membership removal). Sessions are in
//! `sql_sessions.rs`; deleting an organization or a user, with everything
//! that hangs on it, in `sql_removal.rs`.
use super::sql::{check_id, SqlStore};
use super::sql_audit::{record_event, Actor, Subject};
use super::sql_error::Db;
use super::{Change, StoreError};
use crate::clock::unix_now;
use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

/// An organization or user row as the admin commands print it: `id`, the
/// optional `column` (name or email) and `created_at`.
fn account_json(row: &AnyRow, column: &str) -> Result<Value, sqlx::Error> {
    let id: String = row.try_get("id")?;
    let extra: Option<String> = row.try_get(column)?;
    let created_at: i64 = row.try_get("created_at")?;
    Ok(json!({"id": id, column: extra, "created_at": super::rfc3339(Some(created_at))}))
}

impl SqlStore {
    /// Creates an organization; Conflict if the id exists.
    pub async fn create_organization(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<Value, StoreError> {
        self.create_organization_by(id, name, &Actor::cli()).await
    }

    /// [`Self::create_organization`], audited as `actor`'s.
    pub async fn create_organization_by(
        &self,
        id: &str,
        name: Option<&str>,
        actor: &Actor,
    ) -> Result<Value, StoreError> {
        check_id("organization", id)?;
        let now = unix_now();
        let mut tx = self.begin().await?;
        let done = self
            .timed(async {
                let done = sqlx::query(
                    "INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(id)
                .bind(name)
                .bind(now)
                .execute(&mut *tx)
                .await
                .db()?;
                if done.rows_affected() > 0 {
                    let event = "organization.created";
                    record_event(&mut tx, event, Subject::Organization, id, actor).await?;
                }
                Ok(done)
            })
            .await?;
        self.commit(tx).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "organization {id} already exists"
            )));
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
            return Err(StoreError::Conflict(format!("user {id} already exists")));
        }
        Ok(json!({"id": id, "email": email, "created_at": super::rfc3339(Some(now))}))
    }

    /// Every organization, by id.
    pub async fn list_organizations(&self) -> Result<Vec<Value>, StoreError> {
        self.list_accounts(
            "SELECT id, name, created_at FROM organizations ORDER BY id",
            "name",
        )
        .await
    }

    /// Every user, by id.
    pub async fn list_users(&self) -> Result<Vec<Value>, StoreError> {
        self.list_accounts(
            "SELECT id, email, created_at FROM users ORDER BY id",
            "email",
        )
        .await
    }

    /// Up to `limit` organizations with an id after `after` (from the
    /// first with none), by id: one page of a list, read as one.
    pub async fn list_organizations_after(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Value>, StoreError> {
        let sql =
            "SELECT id, name, created_at FROM organizations WHERE id > $1 ORDER BY id LIMIT $2";
        let bind = Bind::Page(after.unwrap_or(""), limit);
        self.list_accounts_where(sql, "name", bind).await
    }

    /// [`Self::list_organizations_after`] for users.
    pub async fn list_users_after(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Value>, StoreError> {
        let sql = "SELECT id, email, created_at FROM users WHERE id > $1 ORDER BY id LIMIT $2";
        let bind = Bind::Page(after.unwrap_or(""), limit);
        self.list_accounts_where(sql, "email", bind).await
    }

    /// The organization `id`, if it exists.
    pub async fn get_organization(&self, id: &str) -> Result<Option<Value>, StoreError> {
        let sql = "SELECT id, name, created_at FROM organizations WHERE id = $1";
        Ok(self
            .list_accounts_where(sql, "name", Bind::Id(id))
            .await?
            .pop())
    }

    /// The user `id`, if they exist.
    pub async fn get_user(&self, id: &str) -> Result<Option<Value>, StoreError> {
        let sql = "SELECT id, email, created_at FROM users WHERE id = $1";
        Ok(self
            .list_accounts_where(sql, "email", Bind::Id(id))
            .await?
            .pop())
    }

    async fn list_accounts(
        &self,
        sql: &'static str,
        column: &str,
    ) -> Result<Vec<Value>, StoreError> {
        self.list_accounts_where(sql, column, Bind::None).await
    }

    /// The rows of `sql`, with `bind`'s values bound as `$1`, `$2`.
    async fn list_accounts_where(
        &self,
        sql: &'static str,
        column: &str,
        bind: Bind<'_>,
    ) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let query = match bind {
                Bind::None => sqlx::query(sql),
                Bind::Id(id) => sqlx::query(sql).bind(id),
                Bind::Page(after, limit) => sqlx::query(sql).bind(after).bind(i64::from(limit)),
            };
            query
                .fetch_all(&mut *conn)
                .await
                .db()?
                .iter()
                .map(|r| account_json(r, column))
                .collect::<Result<Vec<_>, _>>()
                .db()
        })
        .await
    }

    /// NotFound unless the organization exists.
    pub(super) async fn require_org(
        &self,
        conn: &mut AnyConnection,
        org: &str,
    ) -> Result<(), StoreError> {
        let found = sqlx::query("SELECT id FROM organizations WHERE id = $1")
            .bind(org)
            .fetch_optional(&mut *conn)
            .await
            .db()?;
        match found {
            Some(_) => Ok(()),
            None => Err(StoreError::NotFound(format!("organization {org}"))),
        }
    }

    /// NotFound unless both the organization and the user exist.
    pub(super) async fn require_org_and_user(
        &self,
        conn: &mut AnyConnection,
        org: &str,
        user: &str,
    ) -> Result<(), StoreError> {
        self.require_org(conn, org).await?;
        self.require_user(conn, user).await
    }

    /// NotFound unless the user exists.
    pub(super) async fn require_user(
        &self,
        conn: &mut AnyConnection,
        user: &str,
    ) -> Result<(), StoreError> {
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
        self.set_member_by(org, user, role, &Actor::cli()).await
    }

    /// [`Self::set_member`], audited as `actor`'s (`member.added`, also for a
    /// new role).
    pub async fn set_member_by(
        &self,
        org: &str,
        user: &str,
        role: &str,
        actor: &Actor,
    ) -> Result<Value, StoreError> {
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
            self.log_change(&mut tx, &change).await?;
            record_event(&mut tx, "member.added", Subject::Other(user), org, actor).await
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

    /// `org`'s members as (user id, role), by user id. NotFound if the
    /// organization does not exist.
    pub async fn list_members(&self, org: &str) -> Result<Vec<(String, String)>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            self.require_org(&mut conn, org).await?;
            sqlx::query(
                "SELECT user_id, role FROM memberships WHERE organization_id = $1 ORDER BY user_id",
            )
            .bind(org)
            .fetch_all(&mut *conn)
            .await
            .db()?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .db()
        })
        .await
    }

    /// Removes `user` from `org` and logs a member change, so running
    /// gateways drop the cached keys and sessions that carry the role.
    /// Returns the role the user had; None if they were not a member.
    /// NotFound if the organization or the user does not exist.
    pub async fn remove_member(&self, org: &str, user: &str) -> Result<Option<String>, StoreError> {
        self.remove_member_by(org, user, &Actor::cli()).await
    }

    /// [`Self::remove_member`], audited as `actor`'s.
    pub async fn remove_member_by(
        &self,
        org: &str,
        user: &str,
        actor: &Actor,
    ) -> Result<Option<String>, StoreError> {
        let mut tx = self.begin().await?;
        let role = self
            .timed(async {
                self.require_org_and_user(&mut tx, org, user).await?;
                let row = sqlx::query(
                    "DELETE FROM memberships WHERE organization_id = $1 AND user_id = $2 \
                     RETURNING role",
                )
                .bind(org)
                .bind(user)
                .fetch_optional(&mut *tx)
                .await
                .db()?;
                let role: Option<String> = row.map(|r| r.try_get(0)).transpose().db()?;
                if role.is_some() {
                    let change = Change::Member {
                        organization_id: org.to_owned(),
                        user_id: user.to_owned(),
                    };
                    self.log_change(&mut tx, &change).await?;
                    let event = "member.removed";
                    record_event(&mut tx, event, Subject::Other(user), org, actor).await?;
                }
                Ok(role)
            })
            .await?;
        self.commit(tx).await?;
        Ok(role)
    }
}

/// The values a listing query binds.
enum Bind<'a> {
    None,
    /// `$1`: an id.
    Id(&'a str),
    /// `$1`: the id to list after, `$2`: how many rows at most.
    Page(&'a str, u32),
}
