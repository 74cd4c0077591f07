//! Stage 2: who is asking. The credential of the `Authorization` field,
//! checked against the cached key store, with the brute-force guard per IP
//! and the `mpg_auth_total` counts.
//!
//! The guard's peek protects the store, so it comes before any lookup. A
//! credential the cache answers for at once (or none usable) needs no lookup:
//! then the peek goes in one limiter call with the decision that follows it,
//! stage 3's token or the failure a refusal records, which with Redis is one
//! round trip instead of two. A guard refusal takes neither. Before a lookup
//! the failure is taken ahead, in one atomic step, and given back when the
//! credential is good: concurrency cannot widen the budget.
use http::request;
use std::sync::Arc;

use super::table::{Pipeline, RouteEntry};
use crate::auth::credential::{parse_authorization, Credential, CredentialError};
use crate::auth::jwt::{self, JwtError};
use crate::auth::oidc::{OidcError, JWT_SESSION_ID};
use crate::auth::Principal;
use crate::config::AuthMode;
use crate::error::{AuthReason, GatewayError};
use crate::ip::Client;
use crate::ratelimit::{Decision, Spent};
use crate::secret::{hash_secret, SecretHash};
use crate::store::controls::ip_allowed;
use crate::store::{CachedApiKey, Controls, KeyStatus, SessionAuth, SessionRecord, StoreError};

/// What the `Authorization` field comes to before any store lookup.
enum Probe<'a> {
    /// Known without the store: the principal, or why it is refused.
    Known(Result<Principal, AuthReason>),
    /// A well-formed API key the cache has no fresh answer for.
    ApiKey(SecretHash),
    /// A well-formed session token the cache has no fresh answer for.
    Session(SecretHash),
    /// A JWT (with its hash) the cache has no fresh answer for: to verify.
    Jwt(SecretHash, &'a str),
}

impl Pipeline {
    /// Stage 2: the credential, checked against the cached key store. A
    /// refusal by the brute-force guard leaves its decision in `decided`,
    /// so its 429 carries the rate-limit fields as any other does. With the
    /// principal comes stage 3's decision when it was taken with the guard's.
    pub(super) async fn authenticate(
        &self,
        entry: &RouteEntry,
        head: &request::Parts,
        path_param: Option<&str>,
        client: &Client<'_>,
        decided: &mut Option<Decision>,
    ) -> Result<(Option<Principal>, Option<(Decision, Option<Spent>)>), GatewayError> {
        if entry.route.auth == AuthMode::None {
            return Ok((None, None));
        }
        // IPv6 clients per /64: one host can take any address in its block.
        let ip = client.addr().limit_key();
        let now = crate::clock::unix_now();
        let (result, taken) = match self.probe(entry, head, now) {
            Probe::Known(Ok(principal)) => {
                // A key used from outside its networks spends nothing.
                client_allowed(&principal, client)?;
                // A key with credits spends them in the same step as its token.
                let credit = super::credit_spend(&principal, entry);
                let credit = credit.as_ref().map(|c| (c, now));
                let taken =
                    match self.limit_target(entry, Some(&principal), head, path_param, client) {
                        Some(t) => Some(
                            self.limiter
                                .guarded_spend(ip, t.policy, &t.key, t.quota.as_ref(), credit)
                                .await
                                .map_err(|refusal| guard_refusal(refusal, decided))?,
                        ),
                        None => {
                            self.guard(ip, decided).await?;
                            None
                        }
                    };
                (Ok(principal), taken)
            }
            Probe::Known(Err(reason)) => {
                self.take_failure(ip, decided).await?;
                (Err(GatewayError::Unauthorized(reason)), None)
            }
            // Brute-force guard: an IP that piled up 401s gets 429 before any lookup.
            // The failure is counted before the lookup, so that concurrent guesses
            // cannot all pass one peek, and given back when the store says yes (or
            // cannot answer: a 503 is no failure of the client's).
            probe => {
                self.take_failure(ip, decided).await?;
                let result = self.look_up(probe, now).await;
                if !matches!(result, Err(GatewayError::Unauthorized(_))) {
                    self.limiter.refund_auth_failure(ip).await;
                }
                if let Ok(principal) = &result {
                    client_allowed(principal, client)?;
                }
                (result, None)
            }
        };
        match &result {
            Ok(p) => {
                self.auth_outcomes.increment(("ok", p.auth_kind()));
                if let Principal::ApiKey(key) = p {
                    self.usage.touch(key.id(), now);
                }
            }
            Err(GatewayError::Unauthorized(reason)) => {
                self.auth_outcomes.increment(("refused", reason.as_str()));
                tracing::debug!(
                    client = client.addr().as_str(),
                    reason = reason.as_str(),
                    "authentication failed"
                );
            }
            Err(GatewayError::ServiceUnavailable { what, .. }) if what == KEY_SET => self
                .auth_outcomes
                .increment(("error", "key_set_unavailable")),
            Err(_) => self.auth_outcomes.increment(("error", "store_unavailable")),
        }
        result.map(|p| (Some(p), taken))
    }

    /// `Err` with the guard's refusal when `ip` has used up its failures.
    async fn guard(&self, ip: &str, decided: &mut Option<Decision>) -> Result<(), GatewayError> {
        match self.limiter.auth_failures_exceeded(ip).await {
            Some(refusal) => Err(guard_refusal(refusal, decided)),
            None => Ok(()),
        }
    }

    /// Counts one authentication failure of `ip` ahead: `Err` with the guard's
    /// refusal when its failures are used up (nothing is counted then).
    async fn take_failure(
        &self,
        ip: &str,
        decided: &mut Option<Decision>,
    ) -> Result<(), GatewayError> {
        match self.limiter.guarded_auth_failure(ip).await {
            Some(refusal) => Err(guard_refusal(refusal, decided)),
            None => Ok(()),
        }
    }

    /// The credential as far as it is known without the store: parsed, its
    /// kind matched to the route's, and its fresh cache entry if there is one.
    fn probe<'h>(&self, entry: &RouteEntry, head: &'h request::Parts, now: i64) -> Probe<'h> {
        let credential = match parse_authorization(&head.headers) {
            Ok(credential) => credential,
            Err(CredentialError::Missing) => return Probe::Known(Err(AuthReason::Missing)),
            Err(CredentialError::Malformed) => return Probe::Known(Err(AuthReason::Malformed)),
        };
        match (credential, entry.route.auth) {
            (Credential::ApiKey(secret), AuthMode::ApiKey) => {
                let hash = hash_secret(secret);
                match self.keys.fresh_api_key(&hash) {
                    Some(found) => Probe::Known(api_key_status(found, now)),
                    None => Probe::ApiKey(hash),
                }
            }
            (Credential::Session(token), AuthMode::Session) => {
                let hash = hash_secret(token);
                match self.keys.fresh_session(&hash) {
                    Some(found) => Probe::Known(session_status(found, now)),
                    None => Probe::Session(hash),
                }
            }
            // Without `[auth.oidc]` a JWT is no credential of ours.
            (Credential::Jwt(_), _) if self.oidc.is_none() => {
                Probe::Known(Err(AuthReason::Malformed))
            }
            (Credential::Jwt(token), AuthMode::Session) => {
                let hash = jwt::cache_key(token);
                match self.keys.fresh_session(&hash) {
                    // The key hashes the token's tail: the entry must hold this very token.
                    Some(Some(found)) if found.token.as_deref() == Some(token) => {
                        Probe::Known(session_status(Some(found), now))
                    }
                    _ if !jwt::well_formed(token) => Probe::Known(Err(AuthReason::Malformed)),
                    _ => Probe::Jwt(hash, token),
                }
            }
            (Credential::Jwt(token), _) if !jwt::well_formed(token) => {
                Probe::Known(Err(AuthReason::Malformed))
            }
            _ => Probe::Known(Err(AuthReason::WrongCredentialType)),
        }
    }

    /// The principal of `probe`, asking the (cached) store what it does not know.
    async fn look_up(&self, probe: Probe<'_>, now: i64) -> Result<Principal, GatewayError> {
        let known = match probe {
            Probe::Known(known) => known,
            Probe::ApiKey(hash) => {
                let found = self.keys.api_key(&hash).await;
                api_key_status(found.map_err(GatewayError::from)?, now)
            }
            Probe::Session(hash) => {
                let found = self.keys.session(&hash).await;
                session_status(found.map_err(GatewayError::from)?, now)
            }
            // Boxed: only JWT routes should carry room for a verification.
            Probe::Jwt(hash, token) => {
                return Box::pin(self.token_session(&hash, token, now)).await
            }
        };
        known.map_err(GatewayError::Unauthorized)
    }

    /// The session a JWT stands for: verified against the identity
    /// provider's key set, then its user's memberships from the (cached)
    /// store; with `provision_users`, an unknown user is created first.
    async fn token_session(
        &self,
        hash: &SecretHash,
        token: &str,
        now: i64,
    ) -> Result<Principal, GatewayError> {
        let Some(oidc) = &self.oidc else {
            return Err(GatewayError::Unauthorized(AuthReason::Malformed));
        };
        let verified = match oidc.verify(token, now).await {
            Ok(verified) => verified,
            Err(OidcError::NoKeySet) => {
                return Err(GatewayError::ServiceUnavailable {
                    what: KEY_SET.into(),
                    retry_after: 5,
                })
            }
            Err(OidcError::Refused(e)) => return Err(GatewayError::Unauthorized(jwt_reason(&e))),
        };
        let record = SessionRecord {
            id: JWT_SESSION_ID.into(),
            user_id: verified.user.clone(),
            created_at: verified.issued_at,
            expires_at: verified.expires_at,
        };
        let unavailable = GatewayError::from;
        let mut found = self
            .keys
            .token_session(hash, token, record.clone())
            .await
            .map_err(unavailable)?;
        if found.is_none() && oidc.settings().provision_users {
            match self
                .store
                .create_user(&verified.user, verified.email.as_deref())
                .await
            {
                // Conflict: another request created it first.
                Ok(_) | Err(StoreError::Conflict(_)) => {
                    tracing::info!(user = %verified.user, "user provisioned from the identity provider");
                }
                Err(StoreError::Invalid(why)) => {
                    tracing::debug!(%why, "a JWT's user cannot be provisioned");
                    return Err(GatewayError::Unauthorized(AuthReason::UnknownUser));
                }
                Err(e) => return Err(unavailable(e)),
            }
            found = self
                .keys
                .token_session(hash, token, record)
                .await
                .map_err(unavailable)?;
        }
        let auth = found.ok_or(GatewayError::Unauthorized(AuthReason::UnknownUser))?;
        session_status(Some(auth), now).map_err(GatewayError::Unauthorized)
    }
}

/// What a 503 names when no key set of the identity provider was ever fetched.
pub(super) const KEY_SET: &str = "the identity provider's key set";

fn jwt_reason(e: &JwtError) -> AuthReason {
    match e {
        JwtError::Malformed => AuthReason::Malformed,
        JwtError::Expired => AuthReason::Expired,
        JwtError::NotYetValid => AuthReason::NotYetValid,
        JwtError::Invalid(_) | JwtError::UnknownKid => AuthReason::Invalid,
    }
}

/// The 429 of a guard refusal, its decision left in `decided`.
fn guard_refusal(refusal: Decision, decided: &mut Option<Decision>) -> GatewayError {
    let retry_after = refusal.retry_after_secs.unwrap_or(1);
    *decided = Some(refusal);
    GatewayError::TooManyRequests { retry_after }
}

/// 403 `ip_not_allowed` for an API key used from outside its `ip_allow`.
#[inline]
fn client_allowed(principal: &Principal, client: &Client<'_>) -> Result<(), GatewayError> {
    match principal {
        Principal::ApiKey(key) => match key.controls() {
            None => Ok(()),
            Some(controls) => allowed_by(controls, client),
        },
        Principal::Session(_) => Ok(()),
    }
}

/// [`client_allowed`] for a key with controls.
#[cold]
fn allowed_by(controls: &Controls, client: &Client<'_>) -> Result<(), GatewayError> {
    match &controls.ip_allow {
        Some(nets) if !ip_allowed(nets, client.addr().ip()) => {
            Err(GatewayError::ForbiddenRequest {
                reason: "ip_not_allowed",
                message: "the API key may not be used from this client address",
            })
        }
        _ => Ok(()),
    }
}

fn api_key_status(found: Option<Arc<CachedApiKey>>, now: i64) -> Result<Principal, AuthReason> {
    let auth = found.ok_or(AuthReason::Invalid)?;
    match auth.status(now) {
        // A disabled key is known and kept, but refused until enabled again.
        KeyStatus::Active if auth.controls().is_some_and(|c| !c.enabled) => {
            Err(AuthReason::Disabled)
        }
        KeyStatus::Active => Ok(Principal::ApiKey(auth)),
        KeyStatus::Revoked => Err(AuthReason::Revoked),
        KeyStatus::Expired => Err(AuthReason::Expired),
    }
}

fn session_status(found: Option<Arc<SessionAuth>>, now: i64) -> Result<Principal, AuthReason> {
    let auth = found.ok_or(AuthReason::Invalid)?;
    if auth.session.expires_at <= now {
        return Err(AuthReason::Expired);
    }
    Ok(Principal::Session(auth))
}
