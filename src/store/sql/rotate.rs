//! Key rotation in [`SqlStore`]: a new key with the old one's name, owner,
//! scopes, expiry, rate limit and controls, and the old key marked `replaced_by` it and set to
//! expire at the end of the grace period, all in one transaction.
use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::keys::{insert_key, key_by_id};
use super::SqlStore;
use crate::secret::{generate_api_key, generate_key_id};
use crate::store::{ApiKeyRecord, Change, Credits, KeyControls, KeyStatus, StoreError};

/// What a rotation made: the new key's secret (shown once), the new key's
/// record, and the old key's record as it now stands.
#[derive(Debug, Clone)]
pub struct Rotation {
    /// The new key's secret.
    pub secret: String,
    /// The new key.
    pub new: ApiKeyRecord,
    /// The old key, with `replaced_by` and its shortened `expires_at`.
    pub old: ApiKeyRecord,
}

/// Conflict unless `old` is active at `now` and not rotated yet.
fn rotatable(old: &ApiKeyRecord, now: i64) -> Result<(), StoreError> {
    if let Some(next) = &old.replaced_by {
        return Err(StoreError::Conflict(format!(
            "the key was already rotated into {next}; rotate that key instead"
        )));
    }
    match old.status(now) {
        KeyStatus::Active => Ok(()),
        KeyStatus::Revoked => Err(StoreError::Conflict(
            "the key is revoked; only an active key can be rotated".into(),
        )),
        KeyStatus::Expired => Err(StoreError::Conflict(
            "the key has expired; only an active key can be rotated".into(),
        )),
    }
}

/// A new key made at `now` like `old` (name, owner, scopes, expiry, rate
/// limit), and its secret.
fn successor(old: &ApiKeyRecord, now: i64) -> (String, ApiKeyRecord) {
    let (secret, prefix) = generate_api_key();
    let new = ApiKeyRecord {
        id: generate_key_id(),
        name: old.name.clone(),
        organization_id: old.organization_id.clone(),
        user_id: old.user_id.clone(),
        scopes: old.scopes.clone(),
        prefix,
        created_at: now,
        expires_at: old.expires_at,
        revoked_at: None,
        last_used_at: None,
        replaced_by: None,
        rate_limit: old.rate_limit,
        controls: successor_controls(old, now),
    };
    (secret, new)
}

/// The successor's controls: the old key's, its credits as they stand now
/// (as last written back), refilled from the successor's creation.
fn successor_controls(old: &ApiKeyRecord, now: i64) -> KeyControls {
    let mut controls = old.controls.clone();
    if let Some(c) = &mut controls.credits {
        let left = c.remaining_at(old.created_at, now);
        *c = Credits {
            generation: 1,
            ..Credits::new(left, c.refill, now, now)
        };
    }
    controls
}

impl SqlStore {
    /// Rotates key `id` at `now`: the old key keeps working for `grace`
    /// seconds (never past its own expiry), then is expired. Logs a key
    /// change so every gateway drops the cached old record. None if there is
    /// no such key; Conflict if it is revoked, expired or already rotated
    /// (a key is rotated once, into one successor). Audited as the command
    /// line; the API uses [`Self::rotate_api_key_by`].
    pub async fn rotate_api_key(
        &self,
        id: &str,
        grace: i64,
        now: i64,
    ) -> Result<Option<Rotation>, StoreError> {
        self.rotate_api_key_by(id, grace, now, &Actor::cli()).await
    }

    /// [`Self::rotate_api_key`], recording `api_key.rotated` (on the old
    /// key) by `actor` in the same transaction.
    pub async fn rotate_api_key_by(
        &self,
        id: &str,
        grace: i64,
        now: i64,
        actor: &Actor,
    ) -> Result<Option<Rotation>, StoreError> {
        let mut tx = self.begin().await?;
        let rotation = self
            .timed(async {
                let old = key_by_id(&mut tx, id).await.db()?;
                let Some(mut old) = old else { return Ok(None) };
                rotatable(&old, now)?;
                let (secret, new) = successor(&old, now);
                insert_key(&mut tx, &new, &secret).await?;
                let ends = now.saturating_add(grace.max(0));
                let ends = old.expires_at.map_or(ends, |at| at.min(ends));
                // The guard repeats the checks above: a concurrent rotation or
                // revoke that committed first makes this one a conflict.
                let done = sqlx::query(
                    "UPDATE api_keys SET replaced_by = $2, expires_at = $3 WHERE id = $1 \
                     AND replaced_by IS NULL AND revoked_at IS NULL",
                )
                .bind(id)
                .bind(&new.id)
                .bind(ends)
                .execute(&mut *tx)
                .await
                .db()?;
                if done.rows_affected() == 0 {
                    return Err(StoreError::Conflict(
                        "the key changed while being rotated; try again".into(),
                    ));
                }
                self.log_change(&mut tx, &Change::ApiKey { id: id.to_owned() })
                    .await?;
                let org = &old.organization_id;
                let made = Subject::Key(&new.id);
                record_event(&mut tx, "api_key.created", made, org, actor).await?;
                let rotated = Subject::Rotated {
                    old: id,
                    new: &new.id,
                };
                record_event(&mut tx, "api_key.rotated", rotated, org, actor).await?;
                old.replaced_by = Some(new.id.clone());
                old.expires_at = Some(ends);
                Ok(Some(Rotation { secret, new, old }))
            })
            .await?;
        self.commit(tx).await?;
        Ok(rotation)
    }
}
