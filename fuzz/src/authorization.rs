//! The `Authorization` parser and the secret format checks: arbitrary header
//! values (one per line, so duplicates are exercised) must never panic, and
//! whatever is accepted must pass its own format check. A JWT is also checked
//! against the verifier's test key set, which takes only the tokens it signed.

use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use mpg_gateway::auth::{jwt, parse_authorization, Credential};

use mpg_gateway::secret::{check_api_key_format, check_session_token_format, looks_like_secret};

/// One input.
pub fn run(data: &[u8]) {
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
                let v = &*crate::VECTORS;
                if v.keys.verify(t, &v.settings, 1_893_456_000).is_ok() {
                    assert!(v.tokens.iter().any(|m| m == t), "took a token no one minted");
                }
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
}
