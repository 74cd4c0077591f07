//! `orgs set-limit` and `orgs unset-limit`: an organization's own quota for
//! one configured policy.
use serde_json::{json, Value};

use crate::admin::render::org_limit;
use crate::cli::Failure;
use crate::config::Settings;
use crate::store::sql::SqlStore;
use crate::store::LimitSpec;

/// Failure naming `policy` and the configured ones, unless it is configured.
fn known_policy(settings: &Settings, policy: &str) -> Result<(), Failure> {
    let names: Vec<&str> = settings
        .rate_limit
        .policies
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    if names.contains(&policy) {
        return Ok(());
    }
    Err(Failure::input(format!(
        "--policy: unknown policy {policy:?}; policies in [rate_limit.policies]: {}",
        names.join(", ")
    )))
}

/// Sets `org`'s quota for `policy` to `requests` per `per`.
pub(super) async fn set(
    settings: &Settings,
    store: &SqlStore,
    org: &str,
    policy: &str,
    requests: u64,
    per: &str,
) -> Result<Value, Failure> {
    known_policy(settings, policy)?;
    let limit = LimitSpec::parse(requests, per)
        .map_err(|p| Failure::input(format!("--{}: {}", p.field, p.reason)))?;
    Ok(org_limit(&store.set_org_limit(org, policy, limit).await?))
}

/// `org`'s quotas, by policy; exit 2 for an organization that does not exist.
pub(super) async fn list(store: &SqlStore, org: &str) -> Result<Value, Failure> {
    if store.get_organization(org).await?.is_none() {
        return Err(Failure::input(format!("no organization with id {org:?}")));
    }
    let limits = store.list_org_limits(org).await?;
    let data: Vec<Value> = limits.iter().map(org_limit).collect();
    Ok(json!({ "data": data }))
}

/// Removes `org`'s quota for `policy`; exit 2 if it had none.
pub(super) async fn unset(
    settings: &Settings,
    store: &SqlStore,
    org: &str,
    policy: &str,
) -> Result<Value, Failure> {
    known_policy(settings, policy)?;
    match store.unset_org_limit(org, policy).await? {
        Some(removed) => {
            let mut v = org_limit(&removed);
            v["removed"] = json!(true);
            Ok(v)
        }
        None => Err(Failure::input(format!(
            "organization {org:?} has no limit of its own for policy {policy:?}"
        ))),
    }
}
