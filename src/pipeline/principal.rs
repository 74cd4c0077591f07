//! Who a request is from, once authenticated, and what they may do in an
//! organization: key scopes ∩ the permissions of the user's *current* role
//! (DESIGN.md §3 stage 5).
use std::sync::Arc;

use crate::config::{Permissions, Roles};
use crate::store::{ApiKeyAuth, SessionAuth};

/// An authenticated caller (a cached store entry, shared, not copied).
#[derive(Debug, Clone)]
pub enum Principal {
    /// `Authorization: Bearer mpg_…`
    ApiKey(Arc<ApiKeyAuth>),
    /// `Authorization: Bearer mps_…`
    Session(Arc<SessionAuth>),
}

impl Principal {
    /// `X-Mpg-Auth`.
    pub fn auth_kind(&self) -> &'static str {
        match self {
            Principal::ApiKey(_) => "api_key",
            Principal::Session(_) => "session",
        }
    }

    /// The user behind the credential.
    pub fn user_id(&self) -> &str {
        match self {
            Principal::ApiKey(k) => &k.key.user_id,
            Principal::Session(s) => &s.session.user_id,
        }
    }

    /// The API key id, for keys.
    pub fn key_id(&self) -> Option<&str> {
        match self {
            Principal::ApiKey(k) => Some(&k.key.id),
            Principal::Session(_) => None,
        }
    }

    /// The organization an API key belongs to (sessions have none of their own).
    pub fn home_organization(&self) -> Option<&str> {
        match self {
            Principal::ApiKey(k) => Some(&k.key.organization_id),
            Principal::Session(_) => None,
        }
    }

    /// The user's current role in `org`; `None` = not a member (or, for a key,
    /// another organization than the key's).
    pub fn role_in(&self, org: &str) -> Option<&str> {
        match self {
            Principal::ApiKey(k) if k.key.organization_id == org => k.role.as_deref(),
            Principal::ApiKey(_) => None,
            Principal::Session(s) => s.role_in(org),
        }
    }

    /// Whether the caller, acting with `role`, holds `scope`.
    pub fn allows(&self, roles: &Roles, role: &str, scope: &str) -> bool {
        let scoped = match self {
            Principal::ApiKey(k) => k.key.scopes.iter().any(|s| s == scope),
            Principal::Session(_) => true,
        };
        scoped && roles.allows(role, scope)
    }

    /// Effective permissions, space-separated, for `X-Mpg-Scopes`.
    pub fn effective_scopes(&self, roles: &Roles, role: &str) -> String {
        match self {
            Principal::ApiKey(k) => {
                let mut out = String::new();
                for s in k.key.scopes.iter().filter(|s| roles.allows(role, s)) {
                    if !out.is_empty() {
                        out.push(' ');
                    }
                    out.push_str(s);
                }
                out
            }
            Principal::Session(_) => match roles.permissions(role) {
                Some(Permissions::All) => "*".to_string(),
                Some(Permissions::Only(list)) => list.join(" "),
                None => String::new(),
            },
        }
    }
}
