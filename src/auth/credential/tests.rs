use super::*;
use crate::secret::{generate_api_key, generate_session_token};
use http::HeaderValue;
use proptest::prelude::*;

fn with_auth(values: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.append(AUTHORIZATION, v);
        }
    }
    h
}

#[test]
fn accepts_api_key_and_session_any_scheme_case() {
    let (key, _) = generate_api_key();
    let session = generate_session_token();
    let h = with_auth(&[&format!("Bearer {key}")]);
    assert_eq!(parse_authorization(&h), Ok(Credential::ApiKey(&key)));
    let h = with_auth(&[&format!("bEaReR {session}")]);
    assert_eq!(parse_authorization(&h), Ok(Credential::Session(&session)));
}

#[test]
fn missing_header_is_missing() {
    assert_eq!(
        parse_authorization(&HeaderMap::new()),
        Err(CredentialError::Missing)
    );
    assert_eq!(CredentialError::Missing.reason(), "missing");
}

#[test]
fn everything_else_is_malformed() {
    let (key, _) = generate_api_key();
    let session = generate_session_token();
    let bad_checksum = format!(
        "{}{}",
        &key[..41],
        if key.ends_with('0') { '1' } else { '0' }
    );
    let cases = [
        format!("Basic {key}"),
        format!("Bearer  {key}"),
        format!("Bearer {key} "),
        format!("Bearer {key} junk"),
        format!("Bearer\t{key}"),
        format!("Bearer{key}"),
        "Bearer ".to_owned(),
        "Bearer".to_owned(),
        String::new(),
        format!("Bearer {bad_checksum}"),
        format!("Bearer {}", &session[..20]),
        "Bearer hello".to_owned(),
    ];
    for case in &cases {
        let h = with_auth(&[case]);
        assert_eq!(
            parse_authorization(&h),
            Err(CredentialError::Malformed),
            "case {case:?}"
        );
    }
    let two = with_auth(&[&format!("Bearer {key}"), &format!("Bearer {key}")]);
    assert_eq!(parse_authorization(&two), Err(CredentialError::Malformed));
    assert_eq!(CredentialError::Malformed.reason(), "malformed");
}

#[test]
fn debug_never_shows_the_secret() {
    let (key, _) = generate_api_key();
    let shown = format!("{:?}", Credential::ApiKey(&key));
    assert!(!shown.contains(&key[4..]));
}

proptest! {
    #[test]
    fn never_panics_on_arbitrary_header_bytes(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..3)
    ) {
        let mut h = HeaderMap::new();
        for v in values {
            if let Ok(v) = HeaderValue::from_bytes(&v) {
                h.append(AUTHORIZATION, v);
            }
        }
        let _ = parse_authorization(&h);
    }
}
