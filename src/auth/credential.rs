//! The `Authorization` header, read by the authentication stage: exactly one
//! `Bearer <token>` whose token is a well-formed API key or session token.
use crate::auth::jwt::MAX_TOKEN_BYTES;
use crate::secret::{
    check_api_key_format, check_session_token_format, API_KEY_PREFIX, SESSION_PREFIX,
};
use http::header::AUTHORIZATION;
use http::HeaderMap;
use std::fmt;

/// A bearer credential borrowed from the request headers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Credential<'a> {
    /// An `mpg_` API key that passed the format check.
    ApiKey(&'a str),
    /// A session token that passed the format check.
    Session(&'a str),
    /// A token with two dots, at most
    /// [`MAX_TOKEN_BYTES`](crate::auth::jwt::MAX_TOKEN_BYTES): a JWT to verify
    /// (its alphabet is [`jwt::well_formed`](crate::auth::jwt::well_formed)'s to check).
    Jwt(&'a str),
}

impl Credential<'_> {
    /// The secret itself (hash it; never log it).
    pub fn secret(&self) -> &str {
        match self {
            Credential::ApiKey(s) | Credential::Session(s) | Credential::Jwt(s) => s,
        }
    }
}

impl fmt::Debug for Credential<'_> {
    // Never print the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::ApiKey(_) => f.write_str("Credential::ApiKey(<redacted>)"),
            Credential::Session(_) => f.write_str("Credential::Session(<redacted>)"),
            Credential::Jwt(_) => f.write_str("Credential::Jwt(<redacted>)"),
        }
    }
}

/// Why no usable credential was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// No `Authorization` header.
    #[error("missing credentials")]
    Missing,
    /// A header that is not exactly one well-formed `Bearer <token>`.
    #[error("malformed credentials")]
    Malformed,
}

impl CredentialError {
    /// The `details.reason` this error maps to.
    pub fn reason(&self) -> &'static str {
        match self {
            CredentialError::Missing => "missing",
            CredentialError::Malformed => "malformed",
        }
    }
}

/// Exactly one `Authorization` header, scheme `Bearer` (case-insensitive), one
/// space, a token with no whitespace. Two Authorization headers, another scheme,
/// empty token, trailing junk: Malformed. Prefix `mpg_` = API key (bad length,
/// alphabet or checksum = Malformed); two dots = JWT (at most 8 KiB, else
/// Malformed); anything else = session token (must pass
/// [`check_session_token_format`], else Malformed).
pub fn parse_authorization(headers: &HeaderMap) -> Result<Credential<'_>, CredentialError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(CredentialError::Missing)?;
    if values.next().is_some() {
        return Err(CredentialError::Malformed);
    }
    let value = value.as_bytes();
    let space = value.iter().position(|&b| b == b' ');
    let (scheme, token) = space
        .map(|i| (&value[..i], &value[i + 1..]))
        .ok_or(CredentialError::Malformed)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
        return Err(CredentialError::Malformed);
    }
    // Both format checks below take base62 only after the prefix, so a
    // token with whitespace or any byte outside ASCII fails them.
    let token = std::str::from_utf8(token).map_err(|_| CredentialError::Malformed)?;
    if token.starts_with(API_KEY_PREFIX) {
        check_api_key_format(token).map_err(|_| CredentialError::Malformed)?;
        Ok(Credential::ApiKey(token))
    } else if !token.starts_with(SESSION_PREFIX)
        && token.bytes().filter(|&b| b == b'.').count() == 2
    {
        // Its alphabet is checked only where the cache cannot vouch for it
        // (`jwt::well_formed`): a cached token matched byte for byte passed.
        if token.len() > MAX_TOKEN_BYTES {
            return Err(CredentialError::Malformed);
        }
        Ok(Credential::Jwt(token))
    } else {
        check_session_token_format(token).map_err(|_| CredentialError::Malformed)?;
        Ok(Credential::Session(token))
    }
}

#[cfg(test)]
mod tests;
