//! Deleting an organization or a user with everything that hangs on it: one
//! transaction removes the API keys, sessions and memberships that name it,
//! then the row itself, and logs a change for each thing removed, so running
//! gateways drop exactly those cache entries (past [`MAX_ITEMIZED`] changes,
//! one "drop everything" instead). The row is locked first (PostgreSQL), so
//! a key or session created meanwhile waits and then fails instead of being
//! removed by the foreign-key cascade without a change logged for it.
use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::schema::Dialect;
use super::SqlStore;
use crate::store::{Change, StoreError};
use sqlx::AssertSqlSafe;
use sqlx::{AnyConnection, Row};

/// More changes than this in one deletion are logged as one [`Change::All`]:
/// a transaction of thousands of inserts could outlast the query deadline,
/// and followers treat a long backlog as "drop everything" anyway.
const MAX_ITEMIZED: usize = 256;

/// What a deletion removed besides the organization or user itself.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    /// Ids of the API keys deleted.
    pub api_keys: Vec<String>,
    /// Ids of the sessions ended (deleting a user only).
    pub sessions: Vec<String>,
    /// Memberships removed, as (organization, user).
    pub memberships: Vec<(String, String)>,
}

impl Removed {
    /// The changes to log for this removal.
    fn changes(&self) -> Vec<Change> {
        let count = self.api_keys.len() + self.sessions.len() + self.memberships.len();
        if count > MAX_ITEMIZED {
            return vec![Change::All];
        }
        let keys = self
            .api_keys
            .iter()
            .map(|id| Change::ApiKey { id: id.clone() });
        let sessions = self
            .sessions
            .iter()
            .map(|id| Change::Session { id: id.clone() });
        let members = self.memberships.iter().map(|(org, user)| Change::Member {
            organization_id: org.clone(),
            user_id: user.clone(),
        });
        keys.chain(sessions).chain(members).collect()
    }
}

/// Runs `sql` (a `DELETE … RETURNING` of one text column) with `id` bound
/// to `$1`; returns that column of every row deleted.
async fn delete_returning(
    conn: &mut AnyConnection,
    sql: &'static str,
    id: &str,
) -> Result<Vec<String>, StoreError> {
    sqlx::query(sql)
        .bind(id)
        .fetch_all(&mut *conn)
        .await
        .db()?
        .iter()
        .map(|r| r.try_get::<String, _>(0))
        .collect::<Result<_, _>>()
        .db()
}

/// What is being deleted.
#[derive(Debug, Clone, Copy)]
enum Owner {
    Organization,
    User,
}

impl Owner {
    fn table(self) -> &'static str {
        match self {
            Owner::Organization => "organizations",
            Owner::User => "users",
        }
    }

    /// Deletes what refers to `id` and says what that was.
    async fn remove_dependents(
        self,
        conn: &mut AnyConnection,
        id: &str,
    ) -> Result<Removed, StoreError> {
        Ok(match self {
            Owner::Organization => {
                let api_keys = delete_returning(
                    conn,
                    "DELETE FROM api_keys WHERE organization_id = $1 RETURNING id",
                    id,
                )
                .await?;
                let users = delete_returning(
                    conn,
                    "DELETE FROM memberships WHERE organization_id = $1 RETURNING user_id",
                    id,
                )
                .await?;
                Removed {
                    api_keys,
                    sessions: Vec::new(),
                    memberships: users.into_iter().map(|u| (id.to_owned(), u)).collect(),
                }
            }
            Owner::User => {
                let sessions = delete_returning(
                    conn,
                    "DELETE FROM sessions WHERE user_id = $1 RETURNING id",
                    id,
                )
                .await?;
                let api_keys = delete_returning(
                    conn,
                    "DELETE FROM api_keys WHERE user_id = $1 RETURNING id",
                    id,
                )
                .await?;
                let orgs = delete_returning(
                    conn,
                    "DELETE FROM memberships WHERE user_id = $1 RETURNING organization_id",
                    id,
                )
                .await?;
                Removed {
                    api_keys,
                    sessions,
                    memberships: orgs.into_iter().map(|o| (o, id.to_owned())).collect(),
                }
            }
        })
    }
}

impl SqlStore {
    /// Deletes organization `id`: its API keys (whoever created them) and
    /// its memberships go with it; its users, and their sessions, stay.
    /// None if there is no such organization.
    pub async fn delete_organization(&self, id: &str) -> Result<Option<Removed>, StoreError> {
        self.delete_organization_by(id, &Actor::cli()).await
    }

    /// [`Self::delete_organization`], audited as `actor`'s.
    pub async fn delete_organization_by(
        &self,
        id: &str,
        actor: &Actor,
    ) -> Result<Option<Removed>, StoreError> {
        self.remove(Owner::Organization, id, actor).await
    }

    /// Deletes user `id`: their sessions end, the API keys they own (in
    /// every organization) are deleted, and their memberships removed.
    /// None if there is no such user.
    pub async fn delete_user(&self, id: &str) -> Result<Option<Removed>, StoreError> {
        self.delete_user_by(id, &Actor::cli()).await
    }

    /// [`Self::delete_user`], audited as `actor`'s: `member.removed` in each
    /// organization the user was a member of.
    pub async fn delete_user_by(
        &self,
        id: &str,
        actor: &Actor,
    ) -> Result<Option<Removed>, StoreError> {
        self.remove(Owner::User, id, actor).await
    }

    /// In one transaction: locks the row (None if absent), deletes what
    /// refers to it, logs those changes, and deletes the row.
    async fn remove(
        &self,
        owner: Owner,
        id: &str,
        actor: &Actor,
    ) -> Result<Option<Removed>, StoreError> {
        let lock = match self.dialect {
            Dialect::Postgres => " FOR UPDATE",
            // `BEGIN IMMEDIATE` already holds the database's write lock.
            Dialect::Sqlite => "",
        };
        let table = owner.table();
        let mut tx = self.begin().await?;
        let removed = self
            .timed(async {
                let found = sqlx::query(AssertSqlSafe(format!(
                    "SELECT id FROM {table} WHERE id = $1{lock}"
                )))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .db()?;
                if found.is_none() {
                    return Ok(None);
                }
                let removed = owner.remove_dependents(&mut tx, id).await?;
                for change in removed.changes() {
                    self.log_change(&mut tx, &change).await?;
                }
                match owner {
                    Owner::Organization => {
                        let event = "organization.deleted";
                        record_event(&mut tx, event, Subject::Organization, id, actor).await?;
                    }
                    Owner::User => {
                        for (org, user) in &removed.memberships {
                            let event = "member.removed";
                            record_event(&mut tx, event, Subject::Other(user), org, actor).await?;
                        }
                    }
                }
                sqlx::query(AssertSqlSafe(format!("DELETE FROM {table} WHERE id = $1")))
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .db()?;
                Ok(Some(removed))
            })
            .await?;
        self.commit(tx).await?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
