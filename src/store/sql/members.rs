//! Memberships in [`SqlStore`]: a user's role in an organization (set,
//! read, listed, removed), each change logged so running gateways drop the
//! cached keys and sessions that carry the role; and the checks that an
//! organization or a user exists, which other writes share.
use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::SqlStore;
use crate::store::{Change, Membership, StoreError};
use sqlx::{AnyConnection, Row};

impl SqlStore {
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
    pub async fn set_member(
        &self,
        org: &str,
        user: &str,
        role: &str,
    ) -> Result<Membership, StoreError> {
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
    ) -> Result<Membership, StoreError> {
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
        Ok(Membership {
            organization_id: org.to_owned(),
            user_id: user.to_owned(),
            role: role.to_owned(),
        })
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

    /// `org`'s memberships, by user id. NotFound if the organization does
    /// not exist.
    pub async fn list_members(&self, org: &str) -> Result<Vec<Membership>, StoreError> {
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
            .map(|r| {
                Ok(Membership {
                    organization_id: org.to_owned(),
                    user_id: r.try_get(0)?,
                    role: r.try_get(1)?,
                })
            })
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
