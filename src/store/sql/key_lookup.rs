//! The auth lookups of API keys in [`SqlStore`]: the key of one secret hash,
//! and the keys of many in one query, each with its user's current role and
//! its organization's overrides. The cache sends every miss waiting at the
//! same moment to the batched one, so a storm of new keys costs one round
//! trip per batch instead of one per key.
use super::error::Db;
use super::keys::{record_from_row, KEY_COLUMNS};
use super::limits::org_limits_of;
use super::list::{hash_list, in_list};
use super::SqlStore;
use crate::secret::SecretHash;
use crate::store::{ApiKeyAuth, LimitSpec, OrgLimit, StoreError};
use sqlx::AssertSqlSafe;
use sqlx::Row;
use std::collections::HashMap;

impl SqlStore {
    /// The auth lookup: the key with this hash, its user's current role and
    /// its organization's overrides of policy quotas.
    pub(super) async fn find_api_key_by_hash(
        &self,
        hash: &SecretHash,
    ) -> Result<Option<ApiKeyAuth>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async {
            let row = sqlx::query(AssertSqlSafe(format!(
                "SELECT {KEY_COLUMNS}, m.role FROM api_keys k LEFT JOIN memberships m \
                 ON m.organization_id = k.organization_id AND m.user_id = k.user_id \
                 WHERE k.key_hash = $1"
            )))
            .bind(hash.to_hex())
            .fetch_optional(&mut *conn)
            .await
            .db()?;
            let Some(row) = row else { return Ok(None) };
            let key = record_from_row(&row).db()?;
            let org_limits = org_limits_of(&mut conn, std::slice::from_ref(&key.organization_id))
                .await
                .db()?;
            Ok(Some(ApiKeyAuth {
                key,
                role: row.try_get("role").db()?,
                org_limits,
            }))
        })
        .await
    }

    /// The batched auth lookup: every key whose hash is in `hashes`, with
    /// its user's current role, in one query (one statement whatever the
    /// batch size, so it is prepared once per connection).
    pub(super) async fn find_api_keys_by_hashes(
        &self,
        hashes: &[SecretHash],
    ) -> Result<Vec<(SecretHash, ApiKeyAuth)>, StoreError> {
        if hashes.is_empty() {
            return Ok(Vec::new());
        }
        let matching = in_list(self.dialect);
        let list = hash_list(self.dialect, hashes);
        let mut conn = self.conn().await?;
        self.timed(async {
            // Each key comes with its organization's overrides (usually none):
            // one row per override, or one with nulls.
            let rows = sqlx::query(AssertSqlSafe(format!(
                "SELECT {KEY_COLUMNS}, k.key_hash, m.role, l.policy AS limit_policy, \
                 l.requests AS limit_requests, l.per_ms AS limit_per_ms FROM api_keys k \
                 LEFT JOIN memberships m \
                 ON m.organization_id = k.organization_id AND m.user_id = k.user_id \
                 LEFT JOIN org_rate_limits l ON l.organization_id = k.organization_id \
                 WHERE k.key_hash {matching}"
            )))
            .bind(list)
            .fetch_all(&mut *conn)
            .await
            .db()?;
            let mut found: Vec<(SecretHash, ApiKeyAuth)> = Vec::with_capacity(rows.len());
            let mut at: HashMap<SecretHash, usize> = HashMap::with_capacity(rows.len());
            for row in &rows {
                let hex: String = row.try_get("key_hash").db()?;
                let Some(hash) = SecretHash::from_hex(&hex) else {
                    continue;
                };
                let i = match at.get(&hash) {
                    Some(&i) => i,
                    None => {
                        let auth = ApiKeyAuth {
                            key: record_from_row(row).db()?,
                            role: row.try_get("role").db()?,
                            org_limits: Vec::new(),
                        };
                        at.insert(hash, found.len());
                        found.push((hash, auth));
                        found.len() - 1
                    }
                };
                let policy: Option<String> = row.try_get("limit_policy").db()?;
                let limit = LimitSpec::from_columns(
                    row.try_get("limit_requests").db()?,
                    row.try_get("limit_per_ms").db()?,
                );
                if let (Some(policy), Some(limit), Some((_, auth))) =
                    (policy, limit, found.get_mut(i))
                {
                    auth.org_limits.push(OrgLimit {
                        organization_id: auth.key.organization_id.clone(),
                        policy,
                        limit,
                    });
                }
            }
            for (_, auth) in &mut found {
                auth.org_limits.sort_by(|a, b| a.policy.cmp(&b.policy));
            }
            Ok(found)
        })
        .await
    }
}
