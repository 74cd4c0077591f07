//! The records the store answers with: an organization, a user, a
//! membership, an API key and its status, a session, an audit event, an
//! admin token. They hold what is stored, times as unix seconds; how the
//! API and the command line show them (RFC 3339 times, field names) is
//! theirs to say (`keys_service/render.rs`, `admin/render.rs`).
use serde::Serialize;

use super::{KeyControls, LimitSpec};

/// An organization as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Organization {
    /// Its id, as its creator chose it.
    pub id: String,
    /// Its display name, if it was given one.
    pub name: Option<String>,
    /// Creation time, unix seconds.
    pub created_at: i64,
}

/// A user as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Their id, as their creator (or the identity provider) chose it.
    pub id: String,
    /// Their email address, if known.
    pub email: Option<String>,
    /// Creation time, unix seconds.
    pub created_at: i64,
}

/// A user's role in an organization. Its fields are the API's and the
/// command line's, as they are: it serializes as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Membership {
    /// The organization.
    pub organization_id: String,
    /// The member.
    pub user_id: String,
    /// Their role there, one of `[roles]`.
    pub role: String,
}

/// An API key as stored (never its secret). Times are unix seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// `key_` + 16 base62.
    pub id: String,
    /// Human name given at creation.
    pub name: String,
    /// The organization the key acts for.
    pub organization_id: String,
    /// The user who owns the key.
    pub user_id: String,
    /// Scopes chosen at creation.
    pub scopes: Vec<String>,
    /// Display prefix: the first 8 characters after `mpg_`.
    pub prefix: String,
    /// Creation time.
    pub created_at: i64,
    /// Expiry time, if any.
    pub expires_at: Option<i64>,
    /// First revocation time, if revoked.
    pub revoked_at: Option<i64>,
    /// Last recorded use (batched, approximate).
    pub last_used_at: Option<i64>,
    /// The id of the key this one was rotated into, if it was.
    pub replaced_by: Option<String>,
    /// The key's own rate limit, used instead of the quota of policies keyed
    /// by credential; `None`: the policies' quotas.
    pub rate_limit: Option<LimitSpec>,
    /// Enabled, allowed networks, metadata and credits.
    pub controls: KeyControls,
}

/// Whether a key may be used now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStatus {
    /// Usable.
    Active,
    /// Past `expires_at`.
    Expired,
    /// Revoked (wins over expired).
    Revoked,
}

// === impl KeyStatus ===

impl KeyStatus {
    /// The JSON / `details.reason` spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyStatus::Active => "active",
            KeyStatus::Expired => "expired",
            KeyStatus::Revoked => "revoked",
        }
    }
}

// === impl ApiKeyRecord ===

impl ApiKeyRecord {
    /// The key's status at `now` (unix seconds); revoked wins over expired.
    pub fn status(&self, now: i64) -> KeyStatus {
        if self.revoked_at.is_some() {
            KeyStatus::Revoked
        } else if self.expires_at.is_some_and(|at| at <= now) {
            KeyStatus::Expired
        } else {
            KeyStatus::Active
        }
    }
}

/// A session as stored (never its token). Times are unix seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// `ses_` + 16 base62.
    pub id: String,
    /// The signed-in user.
    pub user_id: String,
    /// Creation time.
    pub created_at: i64,
    /// The session is unusable from this time on.
    pub expires_at: i64,
}

// === impl SessionRecord ===

impl SessionRecord {
    /// True once `now` has reached `expires_at`.
    pub fn is_expired(&self, now: i64) -> bool {
        self.expires_at <= now
    }
}

/// One recorded lifecycle event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// `evt_` and random characters: opaque, so that ids say nothing of how
    /// many events other organizations had.
    pub id: String,
    /// `api_key.created`, `api_key.rotated`, `api_key.revoked`,
    /// `api_key.deleted`, `organization.created`, `organization.deleted`,
    /// `member.added`, `member.removed`, `limit.set`, `limit.removed`,
    /// `session.created` or `session.revoked`.
    pub action: String,
    /// The key acted on (key events only).
    pub key_id: Option<String>,
    /// What else was acted on: the member's user id, the limit's policy, the
    /// session's id, or the key a rotation made.
    pub subject: Option<String>,
    /// The key's organization.
    pub organization_id: String,
    /// A user id, or `cli`.
    pub actor: String,
    /// The request's `X-Request-Id` (none from the command line).
    pub request_id: Option<String>,
    /// The client's IP address (none from the command line).
    pub client: Option<String>,
    /// When, in unix seconds.
    pub at: i64,
}

/// An admin token as stored (never the token). Times are unix seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminToken {
    /// `adm_` + 16 base62.
    pub id: String,
    /// What it is for, as its maker named it.
    pub name: String,
    /// Creation time.
    pub created_at: i64,
    /// When it was revoked, if it was.
    pub revoked_at: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::testing::api_key_record as record;

    #[test]
    fn status_revoked_wins_over_expired() {
        let mut r = record();
        assert_eq!(r.status(99), KeyStatus::Active);
        assert_eq!(r.status(100), KeyStatus::Expired);
        r.revoked_at = Some(50);
        assert_eq!(r.status(99), KeyStatus::Revoked);
        assert_eq!(r.status(200), KeyStatus::Revoked);
    }
}
