//! Stage 3: the route's rate-limit policy, keyed by credential, organization
//! or client IP as the policy says, and the decision counted per policy. A
//! policy in shadow mode decides and counts the same way, but lets through
//! what it would refuse. A key with a limit of its own spends its own bucket
//! instead of policies keyed by credential, and an organization's override
//! of a policy replaces that policy's quota for its requests; both come with
//! the cached principal, so a request without them looks nothing up.
use http::request;
use std::borrow::Cow;

use super::table::{Pipeline, RouteEntry};
use super::validate::requested_org_hint;
use crate::auth::Principal;
use crate::config::PolicyKey;
use crate::error::GatewayError;
use crate::ip::Client;
use crate::ratelimit::{Decision, Spent};
use crate::ratelimit::{PolicyId, Quota};
use crate::store::{org_limit, LimitSpec};

/// A quota the request brings instead of its policy's.
enum OwnQuota<'p> {
    /// The key's own limit: its bucket, keyed by this key id.
    Key(&'p str, Quota),
    /// The organization's override: the policy's bucket, this quota.
    Organization(Quota),
}

fn quota(limit: &LimitSpec) -> Quota {
    Quota::new(limit.requests, limit.per)
}

/// What stage 3 decides on: the bucket's policy (or the keys' own), its key,
/// and the quota the request brings instead of the policy's, if any.
pub(super) struct Target<'a> {
    pub(super) policy: PolicyId,
    pub(super) key: Cow<'a, str>,
    pub(super) quota: Option<Quota>,
}

impl Pipeline {
    /// Stage 3: the route's policy, keyed as the policy says, and for a key
    /// with credits their spend, made with the decision (in one Redis call).
    /// `Ok(true)`: a shadow policy would have refused the request, and let it
    /// through. The spend's outcome is `None` when it was not made.
    pub(super) async fn rate_limit(
        &self,
        entry: &RouteEntry,
        principal: Option<&Principal>,
        head: &request::Parts,
        path_param: Option<&str>,
        client: &Client<'_>,
        decided: &mut Option<Decision>,
    ) -> Result<(bool, Option<Spent>), GatewayError> {
        let Some(target) = self.limit_target(entry, principal, head, path_param, client) else {
            return Ok((false, None));
        };
        if let Some(credit) = principal.and_then(|p| super::credit_spend(p, entry)) {
            let now = crate::clock::unix_now();
            let (decision, spent) = self
                .limiter
                .check_spending(
                    target.policy,
                    &target.key,
                    target.quota.as_ref(),
                    Some((&credit, now)),
                )
                .await;
            return Ok((self.settle_limit(entry, decision, decided)?, spent));
        }
        let decision = match &target.quota {
            None => self.limiter.check(target.policy, &target.key).await,
            Some(quota) => {
                self.limiter
                    .check_with(target.policy, &target.key, quota)
                    .await
            }
        };
        Ok((self.settle_limit(entry, decision, decided)?, None))
    }

    /// Stage 3 for a `decision` already taken (with the guard's, in stage 2):
    /// counted, and a refusal answered, as stage 3 does.
    pub(super) fn settle_limit(
        &self,
        entry: &RouteEntry,
        decision: Decision,
        decided: &mut Option<Decision>,
    ) -> Result<bool, GatewayError> {
        let allowed = decision.allowed;
        if let Some((ok, limited)) = &entry.limit_counters {
            if allowed {
                ok.increment(1)
            } else {
                limited.increment(1)
            }
        }
        if allowed {
            *decided = Some(decision);
            return Ok(false);
        }
        let Some(shadow_refusals) = &entry.shadow_refusals else {
            let retry_after = decision.retry_after_secs.unwrap_or(1);
            *decided = Some(decision);
            return Err(GatewayError::TooManyRequests { retry_after });
        };
        // The refusal's headers (Remaining 0, the same Reset), but no
        // Retry-After: the request goes on, and a Retry-After the upstream
        // sends passes through as on any request that was let through.
        shadow_refusals.increment(1);
        *decided = Some(Decision {
            retry_after_secs: None,
            ..decision
        });
        Ok(true)
    }

    /// The bucket the route's policy spends for this request; `None` on a
    /// route without a policy.
    pub(super) fn limit_target<'a>(
        &self,
        entry: &RouteEntry,
        principal: Option<&'a Principal>,
        head: &'a request::Parts,
        path_param: Option<&'a str>,
        client: &'a Client<'_>,
    ) -> Option<Target<'a>> {
        let (policy, key_kind) = entry.policy?;
        let key: Cow<'a, str> = match (key_kind, principal) {
            (PolicyKey::Credential, Some(Principal::ApiKey(k))) => Cow::Borrowed(k.id()),
            (PolicyKey::Credential, Some(Principal::Session(s))) => {
                Cow::Owned(format!("user:{}", s.session.user_id))
            }
            // One bucket per organization (its bare id), whichever
            // credential spends it. A session has no organization of its
            // own: it spends the one the request names directly when the
            // user is a member of it (stage 5 has not run yet: a stranger
            // naming it must not drain its bucket), else one of its user,
            // as `user <id>` (ids hold no space, so no organization's).
            (PolicyKey::Organization, Some(p)) => {
                let named = || {
                    requested_org_hint(entry, head, path_param)
                        .filter(|org| p.role_in(org).is_some())
                };
                match p.home_organization().map(Cow::Borrowed).or_else(named) {
                    Some(org) => org,
                    None => Cow::Owned(format!("user {}", p.user_id())),
                }
            }
            // The client's address; an IPv6 client's /64.
            _ => Cow::Borrowed(client.addr().limit_key()),
        };
        let own =
            principal.and_then(|p| self.own_quota(p, policy, key_kind, entry, head, path_param));
        Some(match own {
            None => Target {
                policy,
                key,
                quota: None,
            },
            Some(OwnQuota::Key(id, quota)) => Target {
                policy: self.limiter.own_limit_policy(),
                key: Cow::Borrowed(id),
                quota: Some(quota),
            },
            Some(OwnQuota::Organization(quota)) => Target {
                policy,
                key,
                quota: Some(quota),
            },
        })
    }
}

impl Pipeline {
    /// The key's own limit when `policy` is keyed by credential, else the
    /// override of `policy` by the organization the request acts for (a
    /// key's own; for a session, the one it names where the user is a
    /// member). `None` at once for a principal without either.
    fn own_quota<'p>(
        &self,
        principal: &'p Principal,
        policy: PolicyId,
        key_kind: PolicyKey,
        entry: &RouteEntry,
        head: &request::Parts,
        path_param: Option<&str>,
    ) -> Option<OwnQuota<'p>> {
        let name = || {
            self.settings
                .rate_limit
                .policies
                .get(policy.0)
                .map(|p| p.name.as_str())
        };
        match principal {
            Principal::ApiKey(k) => {
                if let (PolicyKey::Credential, Some(own)) = (key_kind, k.rate_limit()) {
                    return Some(OwnQuota::Key(k.id(), quota(own)));
                }
                if k.org_limits().is_empty() {
                    return None;
                }
                let limit = org_limit(k.org_limits(), k.organization_id(), name()?)?;
                Some(OwnQuota::Organization(quota(limit)))
            }
            Principal::Session(s) => {
                if s.org_limits.is_empty() {
                    return None;
                }
                let org = requested_org_hint(entry, head, path_param)
                    .filter(|org| s.role_in(org).is_some())?;
                let limit = org_limit(&s.org_limits, &org, name()?)?;
                Some(OwnQuota::Organization(quota(limit)))
            }
        }
    }
}
