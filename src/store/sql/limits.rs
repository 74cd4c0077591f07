//! Organizations' overrides of policy quotas in [`SqlStore`]: set, unset,
//! list, and the read that attaches them to a key or session at lookup.
//! A set or unset logs an organization-limits change, so running gateways
//! drop the organization's cached keys and sessions within a second.
use super::audit::{record_event, Actor, Subject};
use super::error::Db;
use super::{check_id, SqlStore};
use crate::store::{Change, LimitSpec, OrgLimit, StoreError};
use sqlx::any::AnyRow;
use sqlx::AssertSqlSafe;
use sqlx::{AnyConnection, Row};

fn org_limit_from_row(row: &AnyRow) -> Result<Option<OrgLimit>, sqlx::Error> {
    let limit = LimitSpec::from_columns(row.try_get("requests")?, row.try_get("per_ms")?);
    let Some(limit) = limit else { return Ok(None) };
    Ok(Some(OrgLimit {
        organization_id: row.try_get("organization_id")?,
        policy: row.try_get("policy")?,
        limit,
    }))
}

/// Every override of the organizations in `orgs` (none: no query).
pub(super) async fn org_limits_of(
    conn: &mut AnyConnection,
    orgs: &[String],
) -> Result<Vec<OrgLimit>, sqlx::Error> {
    if orgs.is_empty() {
        return Ok(Vec::new());
    }
    let list = (1..=orgs.len())
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT organization_id, policy, requests, per_ms FROM org_rate_limits \
         WHERE organization_id IN ({list}) ORDER BY organization_id, policy"
    );
    let mut query = sqlx::query(AssertSqlSafe(sql));
    for org in orgs {
        query = query.bind(org);
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut out = Vec::new();
    for row in &rows {
        out.extend(org_limit_from_row(row)?);
    }
    Ok(out)
}

impl SqlStore {
    /// Sets (inserts or replaces) `org`'s quota for the policy named
    /// `policy`; NotFound if the organization is missing. The caller checks
    /// that the policy is configured.
    pub async fn set_org_limit(
        &self,
        org: &str,
        policy: &str,
        limit: LimitSpec,
    ) -> Result<OrgLimit, StoreError> {
        self.set_org_limit_by(org, policy, limit, &Actor::cli())
            .await
    }

    /// [`Self::set_org_limit`], audited as `actor`'s.
    pub async fn set_org_limit_by(
        &self,
        org: &str,
        policy: &str,
        limit: LimitSpec,
        actor: &Actor,
    ) -> Result<OrgLimit, StoreError> {
        check_id("policy", policy)?;
        let mut tx = self.begin().await?;
        self.timed(async {
            self.require_org(&mut tx, org).await?;
            sqlx::query(
                "INSERT INTO org_rate_limits (organization_id, policy, requests, per_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (organization_id, policy) \
                 DO UPDATE SET requests = excluded.requests, per_ms = excluded.per_ms",
            )
            .bind(org)
            .bind(policy)
            .bind(i64::from(limit.requests.get()))
            .bind(limit.per_millis())
            .execute(&mut *tx)
            .await
            .db()?;
            let change = Change::OrgLimits {
                organization_id: org.to_owned(),
            };
            self.log_change(&mut tx, &change).await?;
            record_event(&mut tx, "limit.set", Subject::Other(policy), org, actor).await
        })
        .await?;
        self.commit(tx).await?;
        Ok(OrgLimit {
            organization_id: org.to_owned(),
            policy: policy.to_owned(),
            limit,
        })
    }

    /// Removes `org`'s override of `policy`; the removed override, or None
    /// if there was none.
    pub async fn unset_org_limit(
        &self,
        org: &str,
        policy: &str,
    ) -> Result<Option<OrgLimit>, StoreError> {
        self.unset_org_limit_by(org, policy, &Actor::cli()).await
    }

    /// [`Self::unset_org_limit`], audited as `actor`'s.
    pub async fn unset_org_limit_by(
        &self,
        org: &str,
        policy: &str,
        actor: &Actor,
    ) -> Result<Option<OrgLimit>, StoreError> {
        let mut tx = self.begin().await?;
        let removed = self
            .timed(async {
                let row = sqlx::query(
                    "SELECT organization_id, policy, requests, per_ms FROM org_rate_limits \
                     WHERE organization_id = $1 AND policy = $2",
                )
                .bind(org)
                .bind(policy)
                .fetch_optional(&mut *tx)
                .await
                .db()?;
                let Some(row) = row else { return Ok(None) };
                sqlx::query(
                    "DELETE FROM org_rate_limits WHERE organization_id = $1 AND policy = $2",
                )
                .bind(org)
                .bind(policy)
                .execute(&mut *tx)
                .await
                .db()?;
                let change = Change::OrgLimits {
                    organization_id: org.to_owned(),
                };
                self.log_change(&mut tx, &change).await?;
                let event = "limit.removed";
                record_event(&mut tx, event, Subject::Other(policy), org, actor).await?;
                org_limit_from_row(&row).db()
            })
            .await?;
        self.commit(tx).await?;
        Ok(removed)
    }

    /// `org`'s overrides, by policy name.
    pub async fn list_org_limits(&self, org: &str) -> Result<Vec<OrgLimit>, StoreError> {
        let mut conn = self.conn().await?;
        self.timed(async { org_limits_of(&mut conn, &[org.to_owned()]).await.db() })
            .await
    }
}
