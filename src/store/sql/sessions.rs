//! The sessions part of [`SqlStore`]: creation, listing a user's sessions,
//! revocation (which logs a session change, so running gateways drop the
//! cached session) and the session lookup authentication reads through.
use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::limits::org_limits_of;
use super::list::{hash_list, in_list, text_list};
use super::SqlStore;
use crate::clock::unix_now;
use crate::secret::{generate_id, generate_session_token, hash_secret, SecretHash};
use crate::store::{Change, SessionAuth, SessionRecord, StoreError, UserAccess};
use sqlx::any::AnyRow;
use sqlx::AnyConnection;
use sqlx::AssertSqlSafe;
use sqlx::Row;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// Columns of a [`SessionRecord`] (never the token hash).
const SESSION_COLUMNS: &str = "id, user_id, created_at, expires_at";

/// Builds a record from a row selected with [`SESSION_COLUMNS`].
fn session_from_row(row: &AnyRow) -> Result<SessionRecord, sqlx::Error> {
    Ok(SessionRecord {
        id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
    })
}

/// Records `action` on `session` in each organization its user is a member of.
async fn audit_session(
    conn: &mut sqlx::AnyConnection,
    action: &str,
    session: &SessionRecord,
    actor: &Actor,
) -> Result<(), StoreError> {
    let orgs: Vec<String> =
        sqlx::query_scalar("SELECT organization_id FROM memberships WHERE user_id = $1")
            .bind(&session.user_id)
            .fetch_all(&mut *conn)
            .await
            .db()?;
    for org in orgs {
        record_event(conn, action, Subject::Other(&session.id), &org, actor).await?;
    }
    Ok(())
}

impl SqlStore {
    /// Creates a session for `user` valid for `ttl`; returns the token (shown
    /// once; only its hash is stored) and the record.
    pub async fn create_session(
        &self,
        user: &str,
        ttl: Duration,
    ) -> Result<(String, SessionRecord), StoreError> {
        self.create_session_by(user, ttl, &Actor::cli()).await
    }

    /// [`Self::create_session`], audited as `actor`'s: `session.created` in
    /// each organization the user is a member of (a session acts in each).
    pub async fn create_session_by(
        &self,
        user: &str,
        ttl: Duration,
        actor: &Actor,
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
            .db()?;
            audit_session(&mut tx, "session.created", &record, actor).await
        })
        .await?;
        self.commit(tx).await?;
        Ok((token, record))
    }

    /// `user`'s sessions, expired ones included, oldest first. NotFound if
    /// the user does not exist.
    pub async fn list_sessions(&self, user: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            self.require_user(&mut conn, user).await?;
            sqlx::query(AssertSqlSafe(format!(
                "SELECT {SESSION_COLUMNS} FROM sessions WHERE user_id = $1 \
                 ORDER BY created_at, id"
            )))
            .bind(user)
            .fetch_all(&mut *conn)
            .await
            .db()?
            .iter()
            .map(session_from_row)
            .collect::<Result<Vec<_>, _>>()
            .db()
        })
        .await
    }

    /// Removes a session and logs a session change, so running gateways
    /// drop it from their caches. None if there was no such session.
    pub async fn revoke_session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.revoke_session_by(id, &Actor::cli()).await
    }

    /// [`Self::revoke_session`], audited as `actor`'s (`session.revoked`, as
    /// for its creation).
    pub async fn revoke_session_by(
        &self,
        id: &str,
        actor: &Actor,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let mut tx = self.begin().await?;
        let record = self
            .timed(async {
                let row = sqlx::query(AssertSqlSafe(format!(
                    "DELETE FROM sessions WHERE id = $1 RETURNING {SESSION_COLUMNS}"
                )))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .db()?;
                let record = row.as_ref().map(session_from_row).transpose().db()?;
                if let Some(record) = &record {
                    let change = Change::Session { id: id.to_owned() };
                    self.log_change(&mut tx, &change).await?;
                    audit_session(&mut tx, "session.revoked", record, actor).await?;
                }
                Ok(record)
            })
            .await?;
        self.commit(tx).await?;
        Ok(record)
    }

    /// Removes a session (see [`SqlStore::revoke_session`]). False if there was none.
    pub async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.revoke_session(id).await?.is_some())
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
            let session = session_from_row(&row).db()?;
            let access = access_of(&mut conn, &session.user_id).await.db()?;
            Ok(Some(SessionAuth {
                session,
                memberships: access.memberships,
                org_limits: access.org_limits,
                token: None,
            }))
        })
        .await
    }

    /// The memberships of the user `user_id` and their organizations'
    /// overrides, or `None` if there is no such user.
    pub(super) async fn find_user_access_by_id(
        &self,
        user_id: &str,
    ) -> Result<Option<UserAccess>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let user = sqlx::query("SELECT id FROM users WHERE id = $1")
                .bind(user_id)
                .fetch_optional(&mut *conn)
                .await
                .db()?;
            if user.is_none() {
                return Ok(None);
            }
            Ok(Some(access_of(&mut conn, user_id).await.db()?))
        })
        .await
    }

    /// The batched session lookup: the sessions whose token hash is in
    /// `hashes`, each as [`SqlStore::find_session_by_hash`] gives it, in three
    /// queries whatever the batch size (the sessions, their users'
    /// memberships, those organizations' overrides). Unknown hashes are left out.
    pub(super) async fn find_sessions_by_hashes(
        &self,
        hashes: &[SecretHash],
    ) -> Result<Vec<(SecretHash, SessionAuth)>, StoreError> {
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        let matching = in_list(self.dialect);
        let list = hash_list(self.dialect, hashes);
        let mut conn = self.conn().await?;
        self.timed(async {
            let rows = sqlx::query(AssertSqlSafe(format!(
                "SELECT {SESSION_COLUMNS}, token_hash FROM sessions WHERE token_hash {matching}"
            )))
            .bind(list)
            .fetch_all(&mut *conn)
            .await
            .db()?;
            let mut sessions = Vec::with_capacity(rows.len());
            for row in &rows {
                let hex: String = row.try_get("token_hash").db()?;
                if let Some(hash) = SecretHash::from_hex(&hex) {
                    sessions.push((hash, session_from_row(row).db()?));
                }
            }
            if sessions.is_empty() {
                return Ok(Vec::new());
            }
            let users: BTreeSet<&str> = sessions.iter().map(|(_, s)| s.user_id.as_str()).collect();
            let rows = sqlx::query(AssertSqlSafe(format!(
                "SELECT user_id, organization_id, role FROM memberships WHERE user_id {matching} \
                 ORDER BY user_id, organization_id"
            )))
            .bind(text_list(self.dialect, users.into_iter()))
            .fetch_all(&mut *conn)
            .await
            .db()?;
            let mut memberships: HashMap<String, Vec<(String, String)>> = HashMap::new();
            for row in &rows {
                let user: String = row.try_get(0).db()?;
                let membership = (row.try_get(1).db()?, row.try_get(2).db()?);
                memberships.entry(user).or_default().push(membership);
            }
            let orgs: BTreeSet<&str> = memberships
                .values()
                .flatten()
                .map(|(org, _)| org.as_str())
                .collect();
            let orgs: Vec<String> = orgs.into_iter().map(str::to_owned).collect();
            let limits = org_limits_of(&mut conn, &orgs).await.db()?;
            Ok(sessions
                .into_iter()
                .map(|(hash, session)| {
                    let memberships = memberships
                        .get(&session.user_id)
                        .cloned()
                        .unwrap_or_default();
                    // In the order a lookup of one session gives: by organization, then policy.
                    let org_limits = limits
                        .iter()
                        .filter(|l| memberships.iter().any(|(org, _)| *org == l.organization_id))
                        .cloned()
                        .collect();
                    let auth = SessionAuth {
                        session,
                        memberships,
                        org_limits,
                        token: None,
                    };
                    (hash, auth)
                })
                .collect())
        })
        .await
    }
}

/// Every (organization, role) of `user` and those organizations' overrides.
async fn access_of(conn: &mut AnyConnection, user: &str) -> Result<UserAccess, sqlx::Error> {
    let memberships = sqlx::query(
        "SELECT organization_id, role FROM memberships WHERE user_id = $1 ORDER BY organization_id",
    )
    .bind(user)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
    .collect::<Result<Vec<(String, String)>, sqlx::Error>>()?;
    let orgs: Vec<String> = memberships.iter().map(|(org, _)| org.clone()).collect();
    let org_limits = org_limits_of(conn, &orgs).await?;
    Ok(UserAccess {
        memberships,
        org_limits,
    })
}

#[cfg(test)]
mod tests {
    use crate::secret::hash_secret;
    use crate::store::sql::SqlStore;
    use crate::store::testing::{both_backends, seed};
    use crate::store::{KeyStore, StoreError};
    use std::time::Duration;

    async fn sessions_round_trip(store: &SqlStore) {
        assert!(matches!(
            store.create_session("ghost", Duration::from_secs(60)).await,
            Err(StoreError::NotFound(m)) if m == "user ghost"
        ));
        seed(store).await;
        let Ok((token, rec)) = store
            .create_session("alice", Duration::from_secs(3600))
            .await
        else {
            panic!("session failed")
        };
        assert!(crate::secret::check_session_token_format(&token).is_ok());
        assert_eq!(rec.expires_at - rec.created_at, 3600);
        let found = store
            .find_session(&hash_secret(&token))
            .await
            .ok()
            .flatten();
        assert_eq!(found.as_ref().map(|s| &s.session), Some(&rec));
        assert_eq!(
            found.as_ref().and_then(|s| s.role_in("acme")),
            Some("admin")
        );
        assert_eq!(store.delete_session(&rec.id).await.ok(), Some(true));
        assert_eq!(
            store.find_session(&hash_secret(&token)).await.ok(),
            Some(None)
        );
    }

    both_backends!(sessions_round_trip);
}
