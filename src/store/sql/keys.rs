//! API keys in [`SqlStore`]: create, list (keyset pagination with an opaque
//! cursor), get, revoke, delete and usage stamps. The auth lookups are in
//! `key_lookup.rs`, rotation in `rotate.rs`.
use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::list::{in_list, text_list};
use super::{split_page, SqlStore};
use crate::clock::unix_now;
use crate::secret::{generate_api_key, generate_key_id, hash_secret};
use crate::store::controls::{ip_allow_text, parse_cidr};
use crate::store::{ApiKeyRecord, Change, Credits, KeyControls, LimitSpec, Refill, StoreError};
use sqlx::any::AnyRow;
use sqlx::AssertSqlSafe;
use sqlx::Row;

/// What a caller supplies to create an API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    /// The organization the key acts for (must exist).
    pub organization_id: String,
    /// The owning user (must exist).
    pub user_id: String,
    /// Human name.
    pub name: String,
    /// Granted scopes (stored space-separated).
    pub scopes: Vec<String>,
    /// Optional expiry, unix seconds.
    pub expires_at: Option<i64>,
    /// The key's own rate limit, if any.
    pub rate_limit: Option<LimitSpec>,
    /// Enabled, allowed networks, metadata and credits (their period and
    /// generation are set at creation).
    pub controls: KeyControls,
}

/// Columns of an [`ApiKeyRecord`], in `record_from_row` order.
pub(super) const KEY_COLUMNS: &str =
    "k.id, k.name, k.organization_id, k.user_id, k.scopes, k.prefix, \
     k.created_at, k.expires_at, k.revoked_at, k.last_used_at, k.replaced_by, \
     k.rate_limit_requests, k.rate_limit_per_ms, k.enabled, k.ip_allow, k.meta, \
     k.credits_remaining, k.credits_refill_amount, k.credits_refill_secs, \
     k.credits_period, k.credits_generation";

/// Builds a record from a row selected with [`KEY_COLUMNS`].
pub(super) fn record_from_row(row: &AnyRow) -> Result<ApiKeyRecord, sqlx::Error> {
    let scopes: String = row.try_get("scopes")?;
    Ok(ApiKeyRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        organization_id: row.try_get("organization_id")?,
        user_id: row.try_get("user_id")?,
        scopes: scopes.split_whitespace().map(str::to_owned).collect(),
        prefix: row.try_get("prefix")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        last_used_at: row.try_get("last_used_at")?,
        replaced_by: row.try_get("replaced_by")?,
        rate_limit: LimitSpec::from_columns(
            row.try_get("rate_limit_requests")?,
            row.try_get("rate_limit_per_ms")?,
        ),
        controls: controls_from_row(row)?,
    })
}

/// The controls of a row selected with [`KEY_COLUMNS`]. An `ip_allow` entry
/// that does not parse (a hand-edited row) allows nothing rather than
/// anything: the key fails closed.
fn controls_from_row(row: &AnyRow) -> Result<KeyControls, sqlx::Error> {
    let ip_allow: Option<String> = row.try_get("ip_allow")?;
    let ip_allow = ip_allow.map(|text| {
        text.split(',')
            .map(parse_cidr)
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_default()
    });
    let remaining: Option<i64> = row.try_get("credits_remaining")?;
    let amount: Option<i64> = row.try_get("credits_refill_amount")?;
    let secs: Option<i64> = row.try_get("credits_refill_secs")?;
    let refill = match (amount, secs) {
        (Some(amount), Some(secs)) if amount >= 0 && secs > 0 => Some(Refill {
            amount: amount as u64,
            interval: std::time::Duration::from_secs(secs as u64),
        }),
        _ => None,
    };
    let credits = match remaining {
        Some(remaining) => Some(Credits {
            remaining: remaining.max(0) as u64,
            refill,
            period: row.try_get("credits_period")?,
            generation: row.try_get("credits_generation")?,
        }),
        None => None,
    };
    let enabled: i64 = row.try_get("enabled")?;
    Ok(KeyControls {
        enabled: enabled != 0,
        ip_allow,
        meta: row.try_get("meta")?,
        credits,
    })
}

/// The columns of a key's credits, as bound: remaining, refill amount,
/// refill seconds, period, generation (all null but the last two: unlimited).
pub(super) fn credit_columns(credits: Option<&Credits>) -> [Option<i64>; 3] {
    match credits {
        None => [None, None, None],
        Some(c) => [
            Some(c.remaining as i64),
            c.refill.map(|r| r.amount as i64),
            c.refill.map(|r| r.interval.as_secs() as i64),
        ],
    }
}

/// The key with this id, read on `conn` (a pooled connection or a
/// transaction's).
pub(super) async fn key_by_id(
    conn: &mut sqlx::AnyConnection,
    id: &str,
) -> Result<Option<ApiKeyRecord>, sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "SELECT {KEY_COLUMNS} FROM api_keys k WHERE k.id = $1"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(record_from_row)
    .transpose()
}

/// The opaque cursor for "after this record": hex of `created_at.id`.
fn encode_cursor(record: &ApiKeyRecord) -> String {
    hex::encode(format!("{}.{}", record.created_at, record.id))
}

/// Decodes [`encode_cursor`]; anything else is `Invalid("cursor")`.
fn decode_cursor(cursor: &str) -> Result<(i64, String), StoreError> {
    let invalid = || StoreError::Invalid("cursor".into());
    if cursor.len() > 512 {
        return Err(invalid());
    }
    let bytes = hex::decode(cursor).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let (at, id) = text.split_once('.').ok_or_else(invalid)?;
    let at = at.parse::<i64>().map_err(|_| invalid())?;
    Ok((at, id.to_owned()))
}

/// Inserts `record` with the hash of `secret`, inside the caller's transaction.
pub(super) async fn insert_key(
    conn: &mut sqlx::AnyConnection,
    record: &ApiKeyRecord,
    secret: &str,
) -> Result<(), StoreError> {
    let controls = &record.controls;
    let [remaining, amount, secs] = credit_columns(controls.credits.as_ref());
    sqlx::query(
        "INSERT INTO api_keys (id, key_hash, prefix, name, organization_id, user_id, \
         scopes, created_at, expires_at, rate_limit_requests, rate_limit_per_ms, \
         enabled, ip_allow, meta, credits_remaining, credits_refill_amount, \
         credits_refill_secs, credits_period, credits_generation) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
         $17, $18, $19)",
    )
    .bind(&record.id)
    .bind(hash_secret(secret).to_hex())
    .bind(&record.prefix)
    .bind(&record.name)
    .bind(&record.organization_id)
    .bind(&record.user_id)
    .bind(record.scopes.join(" "))
    .bind(record.created_at)
    .bind(record.expires_at)
    .bind(record.rate_limit.map(|l| i64::from(l.requests.get())))
    .bind(record.rate_limit.as_ref().map(LimitSpec::per_millis))
    .bind(i64::from(controls.enabled))
    .bind(controls.ip_allow.as_deref().map(ip_allow_text))
    .bind(controls.meta.as_deref())
    .bind(remaining)
    .bind(amount)
    .bind(secs)
    .bind(controls.credits.map_or(0, |c| c.period))
    .bind(controls.credits.map_or(0, |c| c.generation))
    .execute(&mut *conn)
    .await
    .db()?;
    Ok(())
}

impl SqlStore {
    /// [`Self::create_api_key_by`] the command line.
    pub async fn create_api_key(
        &self,
        new: NewApiKey,
    ) -> Result<(String, ApiKeyRecord), StoreError> {
        self.create_api_key_by(new, &Actor::cli()).await
    }

    /// Creates a key and records `api_key.created` by `actor`; returns the
    /// secret (shown once; only its SHA-256 is stored) and the record.
    /// NotFound if the organization or user is missing.
    pub async fn create_api_key_by(
        &self,
        new: NewApiKey,
        actor: &Actor,
    ) -> Result<(String, ApiKeyRecord), StoreError> {
        if new.name.is_empty() {
            return Err(StoreError::Invalid("name".into()));
        }
        if new
            .scopes
            .iter()
            .any(|s| s.is_empty() || s.contains(char::is_whitespace))
        {
            return Err(StoreError::Invalid("scopes".into()));
        }
        let (secret, prefix) = generate_api_key();
        let now = unix_now();
        let mut controls = new.controls;
        if let Some(c) = &mut controls.credits {
            *c = Credits {
                generation: 1,
                ..Credits::new(c.remaining, c.refill, now, now)
            };
        }
        let record = ApiKeyRecord {
            id: generate_key_id(),
            name: new.name,
            organization_id: new.organization_id,
            user_id: new.user_id,
            scopes: new.scopes,
            prefix,
            created_at: now,
            expires_at: new.expires_at,
            revoked_at: None,
            last_used_at: None,
            replaced_by: None,
            rate_limit: new.rate_limit,
            controls,
        };
        let mut tx = self.begin().await?;
        self.timed(async {
            self.require_org_and_user(&mut tx, &record.organization_id, &record.user_id)
                .await?;
            insert_key(&mut tx, &record, &secret).await?;
            let org = &record.organization_id;
            record_event(
                &mut tx,
                "api_key.created",
                Subject::Key(&record.id),
                org,
                actor,
            )
            .await
        })
        .await?;
        self.commit(tx).await?;
        Ok((secret, record))
    }

    /// One page of `org`'s keys in stable (created_at, id) order, and the
    /// cursor of the next page if there is one. A bad cursor is Invalid.
    pub async fn list_api_keys(
        &self,
        org: &str,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<(Vec<ApiKeyRecord>, Option<String>), StoreError> {
        if limit == 0 {
            return Err(StoreError::Invalid("limit".into()));
        }
        let (after_at, after_id) = match cursor {
            Some(c) => decode_cursor(c)?,
            None => (i64::MIN, String::new()),
        };
        let mut conn = self.conn().await?;
        let page = self
            .timed(async {
                sqlx::query(AssertSqlSafe(format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys k WHERE k.organization_id = $1 \
                     AND (k.created_at > $2 OR (k.created_at = $2 AND k.id > $3)) \
                     ORDER BY k.created_at, k.id LIMIT $4"
                )))
                .bind(org)
                .bind(after_at)
                .bind(after_id)
                .bind(i64::from(limit) + 1)
                .fetch_all(&mut *conn)
                .await
                .db()?
                .iter()
                .map(record_from_row)
                .collect::<Result<Vec<_>, _>>()
                .db()
            })
            .await?;
        Ok(split_page(page, limit, encode_cursor))
    }

    /// The key with this id, if any.
    pub async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async { key_by_id(&mut conn, id).await.db() })
            .await
    }

    /// [`Self::revoke_api_key_by`] the command line.
    pub async fn revoke_api_key(
        &self,
        id: &str,
        now: i64,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        self.revoke_api_key_by(id, now, &Actor::cli()).await
    }

    /// Revokes a key at `now`; idempotent (keeps the first `revoked_at`).
    /// Logs a key change and records `api_key.revoked` by `actor` the first
    /// time. None if there is no such key.
    pub async fn revoke_api_key_by(
        &self,
        id: &str,
        now: i64,
        actor: &Actor,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let mut tx = self.begin().await?;
        let record = self
            .timed(async {
                let done = sqlx::query(
                    "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
                )
                .bind(id)
                .bind(now)
                .execute(&mut *tx)
                .await
                .db()?;
                let record = key_by_id(&mut tx, id).await.db()?;
                if let (true, Some(r)) = (done.rows_affected() > 0, &record) {
                    self.log_change(&mut tx, &Change::ApiKey { id: id.to_owned() })
                        .await?;
                    let org = &r.organization_id;
                    record_event(&mut tx, "api_key.revoked", Subject::Key(id), org, actor).await?;
                }
                Ok(record)
            })
            .await?;
        self.commit(tx).await?;
        Ok(record)
    }

    /// [`Self::delete_api_key_by`] the command line.
    pub async fn delete_api_key(&self, id: &str) -> Result<bool, StoreError> {
        self.delete_api_key_by(id, &Actor::cli()).await
    }

    /// Deletes a key; logs a key change and records `api_key.deleted` by
    /// `actor`. False if there was none.
    pub async fn delete_api_key_by(&self, id: &str, actor: &Actor) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let deleted = self
            .timed(async {
                let org: Option<String> =
                    sqlx::query_scalar("SELECT organization_id FROM api_keys WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await
                        .db()?;
                let Some(org) = org else { return Ok(false) };
                let done = sqlx::query("DELETE FROM api_keys WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .db()?;
                if done.rows_affected() > 0 {
                    self.log_change(&mut tx, &Change::ApiKey { id: id.to_owned() })
                        .await?;
                    record_event(&mut tx, "api_key.deleted", Subject::Key(id), &org, actor).await?;
                }
                Ok(done.rows_affected() > 0)
            })
            .await?;
        self.commit(tx).await?;
        Ok(deleted)
    }

    /// Stamps `last_used_at` for a batch of (key id, unix seconds), in one
    /// transaction; a stamp never moves backwards. Keys used in the same second
    /// share one `UPDATE`, their ids bound as one list ([`in_list`]): a flush
    /// after a burst of many keys costs a few statements, not one per key, and
    /// it is one statement whatever the number of ids, so each connection
    /// prepares it once instead of once for every length of list.
    pub async fn record_key_usage(&self, used: &[(String, i64)]) -> Result<(), StoreError> {
        if used.is_empty() {
            return Ok(());
        }
        let mut by_second: std::collections::BTreeMap<i64, Vec<&str>> = Default::default();
        for (id, at) in used {
            by_second.entry(*at).or_default().push(id);
        }
        let sql: std::sync::Arc<str> = format!(
            "UPDATE api_keys SET last_used_at = $2 WHERE id {} \
             AND (last_used_at IS NULL OR last_used_at < $2)",
            in_list(self.dialect)
        )
        .into();
        let mut tx = self.begin().await?;
        self.timed(async {
            for (at, ids) in &by_second {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(text_list(self.dialect, ids.iter().copied()))
                    .bind(*at)
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

#[cfg(test)]
mod tests;
