//! Stage 2: who is asking. The credential of the `Authorization` field,
//! checked against the cached key store, with the brute-force guard per IP
//! and the `mpg_auth_total` counts.
use http::request;

use super::table::{Pipeline, RouteEntry};
use crate::auth::credential::{parse_authorization, Credential, CredentialError};
use crate::auth::Principal;
use crate::config::AuthMode;
use crate::error::{AuthReason, GatewayError};
use crate::http::rate_limit::Decision;
use crate::ip::Client;
use crate::secret::hash_secret;
use crate::store::KeyStatus;

impl Pipeline {
    /// Stage 2: the credential, checked against the cached key store. A
    /// refusal by the brute-force guard leaves its decision in `decided`,
    /// so its 429 carries the rate-limit fields as any other does.
    pub(super) async fn authenticate(
        &self,
        entry: &RouteEntry,
        head: &request::Parts,
        client: &Client<'_>,
        decided: &mut Option<Decision>,
    ) -> Result<Option<Principal>, GatewayError> {
        if entry.route.auth == AuthMode::None {
            return Ok(None);
        }
        // IPv6 clients per /64: one host can take any address in its block.
        let ip = client.addr().limit_key();
        // Brute-force guard: an IP that piled up 401s gets 429 before any lookup.
        if let Some(d) = self.limiter.auth_failures_exceeded(ip).await {
            let retry_after = d.retry_after_secs.unwrap_or(1);
            *decided = Some(d);
            return Err(GatewayError::TooManyRequests { retry_after });
        }
        let result = self.check_credential(entry, head).await;
        match &result {
            Ok(p) => self.auth_outcomes.increment(("ok", p.auth_kind())),
            Err(GatewayError::Unauthorized(reason)) => {
                self.auth_outcomes.increment(("refused", reason.as_str()));
                tracing::debug!(
                    client = client.addr().as_str(),
                    reason = reason.as_str(),
                    "authentication failed"
                );
                self.limiter.record_auth_failure(ip).await;
            }
            Err(_) => self.auth_outcomes.increment(("error", "store_unavailable")),
        }
        result.map(Some)
    }

    async fn check_credential(
        &self,
        entry: &RouteEntry,
        head: &request::Parts,
    ) -> Result<Principal, GatewayError> {
        let credential = parse_authorization(&head.headers).map_err(|e| {
            GatewayError::Unauthorized(match e {
                CredentialError::Missing => AuthReason::Missing,
                CredentialError::Malformed => AuthReason::Malformed,
            })
        })?;
        let now = crate::clock::unix_now();
        match (credential, entry.route.auth) {
            (Credential::ApiKey(secret), AuthMode::ApiKey) => {
                let found = self
                    .keys
                    .api_key(&hash_secret(secret))
                    .await
                    .map_err(crate::store::unavailable)?;
                let auth = found.ok_or(GatewayError::Unauthorized(AuthReason::Invalid))?;
                match auth.status(now) {
                    KeyStatus::Active => {}
                    KeyStatus::Revoked => {
                        return Err(GatewayError::Unauthorized(AuthReason::Revoked))
                    }
                    KeyStatus::Expired => {
                        return Err(GatewayError::Unauthorized(AuthReason::Expired))
                    }
                }
                self.usage.touch(auth.id(), now);
                Ok(Principal::ApiKey(auth))
            }
            (Credential::Session(token), AuthMode::Session) => {
                let found = self
                    .keys
                    .session(&hash_secret(token))
                    .await
                    .map_err(crate::store::unavailable)?;
                let auth = found.ok_or(GatewayError::Unauthorized(AuthReason::Invalid))?;
                if auth.session.expires_at <= now {
                    return Err(GatewayError::Unauthorized(AuthReason::Expired));
                }
                Ok(Principal::Session(auth))
            }
            _ => Err(GatewayError::Unauthorized(AuthReason::WrongCredentialType)),
        }
    }
}
