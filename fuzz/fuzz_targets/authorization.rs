//! The `Authorization` parser and the secret format checks: arbitrary header
//! values (one per line, so duplicates are exercised) must never panic, and
//! whatever is accepted must pass its own format check.
#![no_main]

use http::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use libfuzzer_sys::fuzz_target;
use mpg_gateway::auth::{parse_authorization, Credential};
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
