//! Updating an API key in [`SqlStore`]: its name, enabled flag, allowed
//! networks, metadata, own rate limit and credits, never its id,
//! organization, owner, scopes or secret. One transaction writes the
//! fields, logs a key change (every instance drops its cached record within
//! a second) and records `api_key.updated` with the names of the fields
//! changed. The credits an instance spends are written back here too
//! ([`SqlStore::write_back_credits`]), without a change: they are the
//! store's copy of a count kept elsewhere.
use ipnet::IpNet;

use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::keys::{credit_columns, key_by_id};
use super::SqlStore;
use crate::store::controls::ip_allow_text;
use crate::store::{ApiKeyRecord, Change, Credits, KeyStatus, LimitSpec, Refill, StoreError};

/// What to change in a key; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyUpdate {
    /// A new name.
    pub name: Option<String>,
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// New networks, or `Some(None)`: from anywhere.
    pub ip_allow: Option<Option<Vec<IpNet>>>,
    /// New metadata (a JSON object's compact text), or `Some(None)`: none.
    pub meta: Option<Option<String>>,
    /// A new own limit, or `Some(None)`: the policies' quotas.
    pub rate_limit: Option<Option<LimitSpec>>,
    /// New credits.
    pub credits: Option<CreditsUpdate>,
}

/// How an update sets a key's credits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditsUpdate {
    /// No credits: unlimited.
    Unlimited,
    /// `remaining` credits now (`None`: what is left now, or the refill's
    /// amount for a key that had none), and `refill` (`None`: as it is).
    Set {
        /// The count from now on.
        remaining: Option<u64>,
        /// The refill from now on (`Some(None)`: none).
        refill: Option<Option<Refill>>,
    },
}

// === impl KeyUpdate ===

impl KeyUpdate {
    /// The names of the fields this update sets, in the API's order.
    pub fn fields(&self) -> Vec<&'static str> {
        [
            ("name", self.name.is_some()),
            ("enabled", self.enabled.is_some()),
            ("ip_allow", self.ip_allow.is_some()),
            ("meta", self.meta.is_some()),
            ("rate_limit", self.rate_limit.is_some()),
            ("credits", self.credits.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    /// `key` as this update leaves it at `now`.
    fn apply(&self, key: &ApiKeyRecord, now: i64) -> ApiKeyRecord {
        let mut key = key.clone();
        if let Some(name) = &self.name {
            key.name = name.clone();
        }
        let controls = &mut key.controls;
        if let Some(enabled) = self.enabled {
            controls.enabled = enabled;
        }
        if let Some(nets) = &self.ip_allow {
            controls.ip_allow = nets.clone();
        }
        if let Some(meta) = &self.meta {
            controls.meta = meta.clone();
        }
        if let Some(limit) = self.rate_limit {
            key.rate_limit = limit;
        }
        match self.credits {
            None => {}
            Some(CreditsUpdate::Unlimited) => controls.credits = None,
            Some(CreditsUpdate::Set { remaining, refill }) => {
                let old = controls.credits;
                let refill = refill.unwrap_or(old.and_then(|c| c.refill));
                let left = old.map(|c| c.remaining_at(key.created_at, now));
                let remaining = remaining.or(left).or(refill.map(|r| r.amount)).unwrap_or(0);
                // The generation is the store's to bump (`write_fields`).
                controls.credits = Some(Credits::new(remaining, refill, key.created_at, now));
            }
        }
        key
    }
}

impl SqlStore {
    /// Applies `update` to key `id` at `now`, logs a key change and records
    /// `api_key.updated` by `actor` naming the fields set. None if there is
    /// no such key; Invalid if it is revoked or the update sets nothing.
    pub async fn update_api_key_by(
        &self,
        id: &str,
        update: &KeyUpdate,
        now: i64,
        actor: &Actor,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let fields = update.fields();
        if fields.is_empty() {
            return Err(StoreError::Invalid("body: no field to change".into()));
        }
        if update.name.as_deref().is_some_and(str::is_empty) {
            return Err(StoreError::Invalid("name".into()));
        }
        let mut tx = self.begin().await?;
        let updated = self
            .timed(async {
                let Some(old) = key_by_id(&mut tx, id).await.db()? else {
                    return Ok(None);
                };
                if old.status(now) == KeyStatus::Revoked {
                    return Err(StoreError::Invalid(format!(
                        "id: key {id} is revoked, and a revoked key cannot change"
                    )));
                }
                let bump = matches!(update.credits, Some(CreditsUpdate::Set { .. }));
                write_fields(&mut tx, &update.apply(&old, now), bump).await?;
                let new = key_by_id(&mut tx, id).await.db()?.unwrap_or(old);
                self.log_change(&mut tx, &Change::ApiKey { id: id.to_owned() })
                    .await?;
                let subject = Subject::KeyFields {
                    key: id,
                    fields: &fields.join(","),
                };
                record_event(
                    &mut tx,
                    "api_key.updated",
                    subject,
                    &new.organization_id,
                    actor,
                )
                .await?;
                Ok(Some(new))
            })
            .await?;
        self.commit(tx).await?;
        Ok(updated)
    }

    /// [`Self::update_api_key_by`] the command line.
    pub async fn update_api_key(
        &self,
        id: &str,
        update: &KeyUpdate,
        now: i64,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        self.update_api_key_by(id, update, now, &Actor::cli()).await
    }

    /// Writes back what instances counted of keys' credits: each (key id,
    /// generation, period, remaining), in one transaction. A count of an
    /// older generation than the stored one (the credits were set since) is
    /// dropped; no change is logged, since no cached entry is wrong for it.
    pub async fn write_back_credits(
        &self,
        counts: &[(String, i64, i64, u64)],
    ) -> Result<(), StoreError> {
        if counts.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        self.timed(async {
            for (id, generation, period, remaining) in counts {
                sqlx::query(
                    "UPDATE api_keys SET credits_remaining = $3, credits_period = $4 \
                     WHERE id = $1 AND credits_generation = $2 \
                     AND credits_remaining IS NOT NULL",
                )
                .bind(id)
                .bind(generation)
                .bind(*remaining as i64)
                .bind(period)
                .execute(&mut *tx)
                .await
                .db()?;
            }
            Ok(())
        })
        .await?;
        self.commit(tx).await
    }
}

/// Writes every field an update may set, as `key` holds them; with `bump`,
/// the credits' generation grows by one. It never goes back, not even
/// through a spell of unlimited credits, so no count kept for an earlier
/// setting is ever taken for a later one.
async fn write_fields(
    conn: &mut sqlx::AnyConnection,
    key: &ApiKeyRecord,
    bump: bool,
) -> Result<(), StoreError> {
    let controls = &key.controls;
    let [remaining, amount, secs] = credit_columns(controls.credits.as_ref());
    sqlx::query(
        "UPDATE api_keys SET name = $2, enabled = $3, ip_allow = $4, meta = $5, \
         rate_limit_requests = $6, rate_limit_per_ms = $7, credits_remaining = $8, \
         credits_refill_amount = $9, credits_refill_secs = $10, credits_period = $11, \
         credits_generation = credits_generation + $12 WHERE id = $1",
    )
    .bind(&key.id)
    .bind(&key.name)
    .bind(i64::from(controls.enabled))
    .bind(controls.ip_allow.as_deref().map(ip_allow_text))
    .bind(controls.meta.as_deref())
    .bind(key.rate_limit.map(|l| i64::from(l.requests.get())))
    .bind(key.rate_limit.as_ref().map(LimitSpec::per_millis))
    .bind(remaining)
    .bind(amount)
    .bind(secs)
    .bind(controls.credits.map_or(0, |c| c.period))
    .bind(i64::from(bump))
    .execute(&mut *conn)
    .await
    .db()?;
    Ok(())
}
