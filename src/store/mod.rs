//! The key store: organizations, users, memberships, API keys and sessions
//! in one SQL schema served from SQLite or PostgreSQL ([`SqlStore`]), which
//! answers in records (`records.rs`: [`Organization`], [`ApiKeyRecord`], …)
//! and [`StoreError`]s, never in JSON or HTTP terms; the
//! [`KeyStore`] seam authentication reads through, the [`CachedKeyStore`]
//! decorator the hot path uses, and the background tasks that keep the cache
//! honest and the change log bounded ([`spawn_invalidation`]) and record key
//! usage ([`UsageRecorder`]).
pub mod cache;
mod cached_key;
pub mod controls;
pub mod invalidation;
mod limits;
mod records;
pub mod sql;
#[cfg(test)]
pub(crate) mod testing;
pub mod usage;

pub use cache::{CacheConfig, CachedKeyStore};
pub use cached_key::{CachedApiKey, Controls};
pub use controls::{Credits, KeyControls, Refill};
pub use invalidation::spawn_invalidation;
pub use limits::{org_limit, LimitProblem, LimitSpec, OrgLimit, MAX_LIMIT_PER, MAX_LIMIT_REQUESTS};
pub use records::{
    AdminToken, ApiKeyRecord, AuditEvent, KeyStatus, Membership, Organization, SessionRecord, User,
};
pub use sql::{
    spawn_audit_pruning, Actor, NewApiKey, Removed, Rotation, SqlStore, CHANGE_RETENTION,
};
pub use usage::UsageRecorder;

use crate::secret::SecretHash;
use std::sync::Arc;
use std::time::Duration;

/// Where the store lives and how long one query may take.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `sqlite://PATH` or `postgres://…`.
    pub url: String,
    /// Every query runs under this deadline (→ [`StoreError::Timeout`]).
    pub query_timeout: Duration,
}

/// Errors of the store boundary. Messages never hold a secret.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached: a connect refused or failed, a
    /// connection lost, or the cache's circuit breaker open after such a
    /// failure (the gateway answers 503).
    #[error("key store unreachable")]
    Unreachable(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// The store answered with an error (the gateway answers 503).
    #[error("key store unavailable")]
    Unavailable(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// A query did not finish within `query_timeout` (the gateway answers 503).
    #[error("key store query timed out")]
    Timeout,
    /// The named thing does not exist, e.g. `"organization acme"`.
    #[error("{0} not found")]
    NotFound(String),
    /// The change conflicts with what is stored: the text says how, e.g.
    /// `"organization acme already exists"`.
    #[error("{0}")]
    Conflict(String),
    /// The input is not acceptable; the text says which part.
    #[error("invalid {0}")]
    Invalid(String),
}

impl StoreError {
    /// True for the errors that mean "store down", not "bad request".
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unreachable(_) | StoreError::Unavailable(_) | StoreError::Timeout
        )
    }
}

/// What authentication needs about an API key (cached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyAuth {
    /// The key record.
    pub key: ApiKeyRecord,
    /// The user's current role in the key's organization (None: no member).
    pub role: Option<String>,
    /// The key's organization's overrides of policy quotas (usually none).
    pub org_limits: Vec<OrgLimit>,
}

/// What authentication needs about a session (cached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionAuth {
    /// The session record.
    pub session: SessionRecord,
    /// Every (organization, role) of the session's user.
    pub memberships: Vec<(String, String)>,
    /// The overrides of policy quotas of those organizations (usually none).
    pub org_limits: Vec<OrgLimit>,
    /// For a verified JWT, the token itself: its cache key hashes only the
    /// token's tail, so a hit counts only if the whole token is this one.
    /// `None` for a session of the store.
    pub token: Option<Box<str>>,
}

impl SessionAuth {
    /// The user's role in `org`, if a member.
    pub fn role_in(&self, org: &str) -> Option<&str> {
        self.memberships
            .iter()
            .find(|(o, _)| o == org)
            .map(|(_, role)| role.as_str())
    }
}

/// A user's memberships and their organizations' overrides of policy quotas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UserAccess {
    /// Every (organization, role) of the user.
    pub memberships: Vec<(String, String)>,
    /// The overrides of policy quotas of those organizations.
    pub org_limits: Vec<OrgLimit>,
}

/// One entry of the invalidation log: what cached entries it makes stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An API key was revoked or deleted.
    ApiKey {
        /// The key id.
        id: String,
    },
    /// A user's role in an organization changed.
    Member {
        /// The organization.
        organization_id: String,
        /// The user.
        user_id: String,
    },
    /// A session was removed.
    Session {
        /// The session id.
        id: String,
    },
    /// An organization's overrides of policy quotas changed.
    OrgLimits {
        /// The organization.
        organization_id: String,
    },
    /// Anything may have changed: drop everything.
    All,
}

/// The I/O seam the cache decorates. Called only on cache misses / refreshes.
#[async_trait::async_trait]
pub trait KeyStore: Send + Sync + 'static {
    /// The key with this secret hash and its user's current role, if any.
    /// Called on a cache miss or when a cached entry is older than `cache_ttl`.
    async fn find_api_key(&self, hash: &SecretHash) -> Result<Option<ApiKeyAuth>, StoreError>;
    /// The session with this token hash and its user's memberships, if any.
    /// Called on a cache miss or when a cached entry is older than `cache_ttl`.
    async fn find_session(&self, hash: &SecretHash) -> Result<Option<SessionAuth>, StoreError>;
    /// The keys with these secret hashes, each with its hash (unknown hashes
    /// are left out). The cache asks for every miss waiting at the same
    /// moment in one call; a store that can, answers them in one query.
    async fn find_api_keys(
        &self,
        hashes: &[SecretHash],
    ) -> Result<Vec<(SecretHash, ApiKeyAuth)>, StoreError> {
        let found =
            futures_util::future::try_join_all(hashes.iter().map(|h| self.find_api_key(h))).await?;
        Ok(hashes
            .iter()
            .zip(found)
            .filter_map(|(h, auth)| Some((*h, auth?)))
            .collect())
    }
    /// The sessions with these token hashes, as [`KeyStore::find_api_keys`].
    async fn find_sessions(
        &self,
        hashes: &[SecretHash],
    ) -> Result<Vec<(SecretHash, SessionAuth)>, StoreError> {
        let found =
            futures_util::future::try_join_all(hashes.iter().map(|h| self.find_session(h))).await?;
        Ok(hashes
            .iter()
            .zip(found)
            .filter_map(|(h, auth)| Some((*h, auth?)))
            .collect())
    }
    /// Every (organization, role) of the user `user_id` and those
    /// organizations' overrides, or `None` when the store has no such user:
    /// what a verified JWT of that user may do.
    async fn find_user_access(&self, user_id: &str) -> Result<Option<UserAccess>, StoreError>;
    /// Cheap liveness check, called by readiness probes and, while the
    /// cache's circuit breaker is open, by its probe. Fails fast when the
    /// store refuses connections.
    async fn ping(&self) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_in_finds_membership() {
        let s = SessionAuth {
            session: SessionRecord {
                id: "ses_1".into(),
                user_id: "alice".into(),
                created_at: 0,
                expires_at: 10,
            },
            memberships: vec![("acme".into(), "admin".into())],
            org_limits: vec![],
            token: None,
        };
        assert_eq!(s.role_in("acme"), Some("admin"));
        assert_eq!(s.role_in("other"), None);
        assert!(s.session.is_expired(10));
        assert!(!s.session.is_expired(9));
    }
}
