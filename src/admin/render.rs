//! The JSON of the accounts the admin API and the admin commands show
//! (API-SPEC.md): an organization, a user, a membership, a session (never
//! its token), an organization's limit, an admin token (never the token).
//! Times are RFC 3339 UTC or null, as the key service writes them.
use serde_json::{json, Value};

use crate::config::format_duration;
use crate::keys_service::render::rfc3339;
use crate::store::{AdminToken, Membership, OrgLimit, Organization, SessionRecord, User};

/// `{"id", "name", "created_at"}`.
pub fn organization(org: &Organization) -> Value {
    json!({"id": org.id, "name": org.name, "created_at": rfc3339(Some(org.created_at))})
}

/// `{"id", "email", "created_at"}`.
pub fn user(user: &User) -> Value {
    json!({"id": user.id, "email": user.email, "created_at": rfc3339(Some(user.created_at))})
}

/// `{"organization_id", "user_id", "role"}`: the record as it serializes.
pub fn membership(membership: &Membership) -> Value {
    serde_json::to_value(membership).unwrap_or_default()
}

/// `{"id", "user_id", "created_at", "expires_at"}`: never the token.
pub fn session(session: &SessionRecord) -> Value {
    json!({
        "id": session.id,
        "user_id": session.user_id,
        "created_at": rfc3339(Some(session.created_at)),
        "expires_at": rfc3339(Some(session.expires_at)),
    })
}

/// `{"organization_id", "policy", "requests", "per"}`.
pub fn org_limit(limit: &OrgLimit) -> Value {
    json!({
        "organization_id": limit.organization_id,
        "policy": limit.policy,
        "requests": limit.limit.requests.get(),
        "per": format_duration(limit.limit.per),
    })
}

/// `{"id", "name", "created_at", "revoked_at"}`: never the token.
pub fn admin_token(token: &AdminToken) -> Value {
    json!({
        "id": token.id,
        "name": token.name,
        "created_at": rfc3339(Some(token.created_at)),
        "revoked_at": rfc3339(token.revoked_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LimitSpec;

    #[test]
    fn accounts_show_their_fields_with_rfc3339_times_and_nulls() {
        let org = Organization {
            id: "acme".into(),
            name: None,
            created_at: 0,
        };
        assert_eq!(
            serde_json::to_string(&organization(&org)).ok().as_deref(),
            Some(r#"{"created_at":"1970-01-01T00:00:00Z","id":"acme","name":null}"#)
        );
        let alice = User {
            id: "alice".into(),
            email: Some("a@example.com".into()),
            created_at: 60,
        };
        assert_eq!(
            user(&alice),
            json!({"id": "alice", "email": "a@example.com", "created_at": "1970-01-01T00:01:00Z"})
        );
        let member = Membership {
            organization_id: "acme".into(),
            user_id: "alice".into(),
            role: "owner".into(),
        };
        assert_eq!(
            serde_json::to_string(&membership(&member)).ok().as_deref(),
            Some(r#"{"organization_id":"acme","role":"owner","user_id":"alice"}"#)
        );
    }

    #[test]
    fn sessions_limits_and_admin_tokens_never_show_a_secret() {
        let s = SessionRecord {
            id: "ses_1".into(),
            user_id: "alice".into(),
            created_at: 0,
            expires_at: 3600,
        };
        assert_eq!(
            session(&s),
            json!({"id": "ses_1", "user_id": "alice", "created_at": "1970-01-01T00:00:00Z",
                   "expires_at": "1970-01-01T01:00:00Z"})
        );
        let limit = OrgLimit {
            organization_id: "acme".into(),
            policy: "default".into(),
            limit: LimitSpec::parse(20, "1s").unwrap_or_else(|e| panic!("{e:?}")),
        };
        assert_eq!(
            org_limit(&limit),
            json!({"organization_id": "acme", "policy": "default", "requests": 20, "per": "1s"})
        );
        let token = AdminToken {
            id: "adm_1".into(),
            name: "ci".into(),
            created_at: 0,
            revoked_at: None,
        };
        assert_eq!(
            admin_token(&token),
            json!({"id": "adm_1", "name": "ci", "created_at": "1970-01-01T00:00:00Z",
                   "revoked_at": null})
        );
    }
}
