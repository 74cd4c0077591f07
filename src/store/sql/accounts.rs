//! Organizations and users in [`SqlStore`]: creating them, reading one,
//! listing them whole or a page at a time. Memberships are in `members.rs`,
//! sessions in `sessions.rs`; deleting an organization or a user, with
//! everything that hangs on it, in `removal.rs`.
use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::{check_id, SqlStore};
use crate::clock::unix_now;
use crate::store::{Organization, StoreError, User};
use sqlx::any::AnyRow;
use sqlx::Row;

/// The organization of a row of `id, name, created_at`.
fn organization_from_row(row: &AnyRow) -> Result<Organization, sqlx::Error> {
    Ok(Organization {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
    })
}

/// The user of a row of `id, email, created_at`.
fn user_from_row(row: &AnyRow) -> Result<User, sqlx::Error> {
    Ok(User {
        id: row.try_get("id")?,
        email: row.try_get("email")?,
        created_at: row.try_get("created_at")?,
    })
}

impl SqlStore {
    /// Creates an organization; Conflict if the id exists.
    pub async fn create_organization(
        &self,
        id: &str,
        name: Option<&str>,
    ) -> Result<Organization, StoreError> {
        self.create_organization_by(id, name, &Actor::cli()).await
    }

    /// [`Self::create_organization`], audited as `actor`'s.
    pub async fn create_organization_by(
        &self,
        id: &str,
        name: Option<&str>,
        actor: &Actor,
    ) -> Result<Organization, StoreError> {
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
        Ok(Organization {
            id: id.to_owned(),
            name: name.map(str::to_owned),
            created_at: now,
        })
    }

    /// Creates a user; Conflict if the id exists.
    pub async fn create_user(&self, id: &str, email: Option<&str>) -> Result<User, StoreError> {
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
        Ok(User {
            id: id.to_owned(),
            email: email.map(str::to_owned),
            created_at: now,
        })
    }

    /// Every organization, by id.
    pub async fn list_organizations(&self) -> Result<Vec<Organization>, StoreError> {
        let sql = "SELECT id, name, created_at FROM organizations ORDER BY id";
        self.list_accounts(sql, Bind::None, organization_from_row)
            .await
    }

    /// Every user, by id.
    pub async fn list_users(&self) -> Result<Vec<User>, StoreError> {
        let sql = "SELECT id, email, created_at FROM users ORDER BY id";
        self.list_accounts(sql, Bind::None, user_from_row).await
    }

    /// Up to `limit` organizations with an id after `after` (from the
    /// first with none), by id: one page of a list, read as one.
    pub async fn list_organizations_after(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Organization>, StoreError> {
        let sql =
            "SELECT id, name, created_at FROM organizations WHERE id > $1 ORDER BY id LIMIT $2";
        let bind = Bind::Page(after.unwrap_or(""), limit);
        self.list_accounts(sql, bind, organization_from_row).await
    }

    /// [`Self::list_organizations_after`] for users.
    pub async fn list_users_after(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<User>, StoreError> {
        let sql = "SELECT id, email, created_at FROM users WHERE id > $1 ORDER BY id LIMIT $2";
        let bind = Bind::Page(after.unwrap_or(""), limit);
        self.list_accounts(sql, bind, user_from_row).await
    }

    /// The organization `id`, if it exists.
    pub async fn get_organization(&self, id: &str) -> Result<Option<Organization>, StoreError> {
        let sql = "SELECT id, name, created_at FROM organizations WHERE id = $1";
        let found = self.list_accounts(sql, Bind::Id(id), organization_from_row);
        Ok(found.await?.pop())
    }

    /// The user `id`, if they exist.
    pub async fn get_user(&self, id: &str) -> Result<Option<User>, StoreError> {
        let sql = "SELECT id, email, created_at FROM users WHERE id = $1";
        Ok(self
            .list_accounts(sql, Bind::Id(id), user_from_row)
            .await?
            .pop())
    }

    /// The rows of `sql`, with `bind`'s values bound as `$1`, `$2`, each
    /// read with `from_row`.
    async fn list_accounts<T>(
        &self,
        sql: &'static str,
        bind: Bind<'_>,
        from_row: fn(&AnyRow) -> Result<T, sqlx::Error>,
    ) -> Result<Vec<T>, StoreError> {
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
                .map(from_row)
                .collect::<Result<Vec<_>, _>>()
                .db()
        })
        .await
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

#[cfg(test)]
mod tests {
    use crate::store::sql::SqlStore;
    use crate::store::testing::both_backends;
    use crate::store::StoreError;

    async fn orgs_users_and_members(store: &SqlStore) {
        let org = store.create_organization("acme", Some("Acme")).await.ok();
        let got = store.get_organization("acme").await.ok().flatten();
        assert_eq!(org.as_ref().map(|o| o.name.as_deref()), Some(Some("Acme")));
        assert_eq!(got, org);
        assert!(matches!(
            store.create_organization("acme", None).await,
            Err(StoreError::Conflict(m)) if m == "organization acme already exists"
        ));
        assert!(matches!(
            store.create_organization("bad id", None).await,
            Err(StoreError::Invalid(_))
        ));
        // Plain characters, but a credential's shape: refused, and not echoed.
        let pasted = format!("x{}", crate::secret::generate_session_token());
        assert!(matches!(
            store.create_user(&pasted, None).await,
            Err(StoreError::Invalid(m)) if !m.contains("mps_")
        ));
        let alice = store.create_user("alice", None).await.ok();
        assert_eq!(store.list_users().await.ok(), alice.map(|a| vec![a]));
        assert!(matches!(
            store.create_user("alice", None).await,
            Err(StoreError::Conflict(_))
        ));
        assert!(matches!(
            store.set_member("nope", "alice", "admin").await,
            Err(StoreError::NotFound(m)) if m == "organization nope"
        ));
        assert!(matches!(
            store.set_member("acme", "bob", "admin").await,
            Err(StoreError::NotFound(m)) if m == "user bob"
        ));
        assert_eq!(store.member_role("acme", "alice").await.ok(), Some(None));
        assert!(store.set_member("acme", "alice", "viewer").await.is_ok());
        assert!(store.set_member("acme", "alice", "admin").await.is_ok());
        assert_eq!(
            store.member_role("acme", "alice").await.ok().flatten(),
            Some("admin".to_owned())
        );
    }

    both_backends!(orgs_users_and_members);
}
