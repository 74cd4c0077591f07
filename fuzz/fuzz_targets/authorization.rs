//! The `Authorization` parser and the secret format checks: arbitrary header
//! values (one per line, so duplicates are exercised) must never panic, and
//! whatever is accepted must pass its own format check. A JWT is also checked
//! against the verifier's test key set, which must refuse it without panicking.
#![no_main]

use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use libfuzzer_sys::fuzz_target;
use mpg_gateway::auth::{jwt, parse_authorization, Credential};
use mpg_gateway::config::OidcSettings;
use std::sync::LazyLock;

/// The key set of the verifier's vectors (minted by Node's crypto).
static KEYS: LazyLock<(jwt::KeySet, OidcSettings)> = LazyLock::new(|| {
    use jsonwebtoken::Algorithm::*;
    let vectors: serde_json::Value =
        serde_json::from_str(include_str!("../../src/auth/jwt/vectors.json")).unwrap();
    let mut settings = OidcSettings::new("https://id.test", &["mpg-api"]);
    settings.algorithms = vec![RS256, PS256, ES256, EdDSA];
    let jwks = vectors["jwks"].to_string();
    (jwt::KeySet::parse(jwks.as_bytes(), &settings.algorithms).unwrap(), settings)
});
use mpg_gateway::secret::{check_api_key_format, check_session_token_format, looks_like_secret};

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n').take(4) {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append(AUTHORIZATION, v);
        }
    }
    match parse_authorization(&headers) {
        Ok(Credential::ApiKey(k)) => assert!(check_api_key_format(k).is_ok()),
        Ok(Credential::Session(s)) => assert!(check_session_token_format(s).is_ok()),
        Ok(Credential::Jwt(t)) => {
            assert_eq!(t.bytes().filter(|&b| b == b'.').count(), 2);
            assert!(t.len() <= jwt::MAX_TOKEN_BYTES);
            let _ = jwt::cache_key(t);
            if jwt::well_formed(t) {
                let (keys, settings) = &*KEYS;
                // Minted by no one: never valid.
                assert!(keys.verify(t, settings, 1_893_456_000).is_err());
            }
        }
        Err(_) => {}
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if check_api_key_format(text).is_ok() || check_session_token_format(text).is_ok() {
            // A well-formed secret is always recognized by the leak detector.
            assert!(looks_like_secret(text.bytes()));
        }
    }
    let _ = looks_like_secret(data.iter().copied());
});
