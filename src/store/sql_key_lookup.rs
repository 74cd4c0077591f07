//! The batched auth lookup of [`SqlStore`]: the keys of many secret hashes,
//! each with its user's current role, in one query. The cache sends every
//! miss waiting at the same moment here, so a storm of new keys costs one
//! round trip per batch instead of one per key.
use super::schema::Dialect;
use super::sql::SqlStore;
use super::sql_error::Db;
use super::sql_keys::{record_from_row, KEY_COLUMNS};
use super::{ApiKeyAuth, LimitSpec, OrgLimit, StoreError};
use crate::secret::SecretHash;
use sqlx::Row;
use std::collections::HashMap;
use std::fmt::Write as _;

/// The batched lookups on PostgreSQL: the values come as one text array.
const BATCH_LOOKUP_PG: &str = "= ANY($1::text[])";
/// The batched lookups on SQLite: the values come as one JSON array.
const BATCH_LOOKUP_SQLITE: &str = "IN (SELECT value FROM json_each($1))";

/// The condition a batched lookup puts after its column: "in the list bound as `$1`".
pub(super) fn in_list(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => BATCH_LOOKUP_PG,
        Dialect::Sqlite => BATCH_LOOKUP_SQLITE,
    }
}

/// `items` as the one parameter of a batched lookup (see [`in_list`]): a
/// PostgreSQL array literal or a JSON array, each item quoted and escaped.
pub(super) fn text_list<'a>(dialect: Dialect, items: impl Iterator<Item = &'a str>) -> String {
    let (open, close) = match dialect {
        Dialect::Postgres => ('{', '}'),
        Dialect::Sqlite => ('[', ']'),
    };
    let mut list = String::new();
    list.push(open);
    for (i, item) in items.enumerate() {
        if i > 0 {
            list.push(',');
        }
        list.push('"');
        for c in item.chars() {
            match (dialect, c) {
                (_, '"' | '\\') => {
                    list.push('\\');
                    list.push(c);
                }
                // JSON strings hold no raw control characters.
                (Dialect::Sqlite, c) if c.is_control() => {
                    let _ = write!(list, "\\u{:04x}", u32::from(c));
                }
                _ => list.push(c),
            }
        }
        list.push('"');
    }
    list.push(close);
    list
}

/// `hashes` as the one parameter of the batched lookup: `{h1,h2}` (a
/// PostgreSQL array literal) or `["h1","h2"]` (JSON). Hex needs no quoting.
pub(super) fn hash_list(dialect: Dialect, hashes: &[SecretHash]) -> String {
    let (open, quote, close) = match dialect {
        Dialect::Postgres => ('{', "", '}'),
        Dialect::Sqlite => ('[', "\"", ']'),
    };
    let mut list = String::with_capacity(2 + hashes.len() * 67);
    list.push(open);
    for (i, hash) in hashes.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "{quote}{}{quote}", hash.to_hex());
    }
    list.push(close);
    list
}

impl SqlStore {
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
            let rows = sqlx::query(&format!(
                "SELECT {KEY_COLUMNS}, k.key_hash, m.role, l.policy AS limit_policy, \
                 l.requests AS limit_requests, l.per_ms AS limit_per_ms FROM api_keys k \
                 LEFT JOIN memberships m \
                 ON m.organization_id = k.organization_id AND m.user_id = k.user_id \
                 LEFT JOIN org_rate_limits l ON l.organization_id = k.organization_id \
                 WHERE k.key_hash {matching}"
            ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::hash_secret;

    #[test]
    fn hash_lists_and_hex_round_trip() {
        let (a, b) = (hash_secret("a"), hash_secret("b"));
        let pg = hash_list(Dialect::Postgres, &[a, b]);
        assert_eq!(pg, format!("{{{},{}}}", a.to_hex(), b.to_hex()));
        let json = hash_list(Dialect::Sqlite, &[a]);
        assert_eq!(json, format!("[\"{}\"]", a.to_hex()));
    }

    #[test]
    fn text_lists_quote_and_escape_every_item() {
        let items = ["alice", "NULL", "a\"b\\c", "x\ny"];
        let pg = text_list(Dialect::Postgres, items.into_iter());
        assert_eq!(pg, "{\"alice\",\"NULL\",\"a\\\"b\\\\c\",\"x\ny\"}");
        let json = text_list(Dialect::Sqlite, items.into_iter());
        let parsed: Vec<String> = serde_json::from_str(&json).unwrap_or_default();
        assert_eq!(parsed, items);
        assert_eq!(text_list(Dialect::Postgres, std::iter::empty()), "{}");
    }
}
