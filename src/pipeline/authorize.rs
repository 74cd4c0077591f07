//! Stage 5: whether the caller may act here: the organization is its own
//! (or one it is a member of), then the route's scope against the scopes
//! its credential and role grant.
use super::table::{Pipeline, RouteEntry};
use crate::auth::Principal;
use crate::error::GatewayError;

/// The caller's grant for this request, from stage 5: borrowed from the
/// principal and the request, so granting allocates nothing.
pub(super) struct Grant<'a> {
    pub(super) principal: &'a Principal,
    pub(super) organization: &'a str,
    pub(super) role: &'a str,
}

impl Pipeline {
    /// Stage 5: same organization, then scopes ∩ the user's current role.
    pub(super) fn authorize<'a>(
        &self,
        entry: &RouteEntry,
        principal: &'a Principal,
        requested: Option<&'a str>,
    ) -> Result<Grant<'a>, GatewayError> {
        let organization = match (requested, principal.home_organization()) {
            (Some(org), _) => org,
            (None, Some(home)) => home,
            // Config validation guarantees a session route with a scope names an organization.
            (None, None) => "",
        };
        // Another organization's resource, or not a member: the caller cannot see it.
        let role = match principal.role_in(organization) {
            Some(role) => role,
            None if principal.home_organization() == Some(organization) => "",
            None if entry.route.scope.is_none() && organization.is_empty() => "",
            None => return Err(GatewayError::NotFound),
        };
        if let Some(scope) = &entry.route.scope {
            if !principal.allows(&self.settings.roles, role, scope) {
                return Err(GatewayError::Forbidden {
                    required_scope: scope.clone(),
                });
            }
        }
        Ok(Grant {
            principal,
            organization,
            role,
        })
    }
}
