//! The verifier against tokens and a key set minted by Node's crypto
//! (`vectors.json`, made by `tests/support/mint_jwt.mjs`): each case of the
//! identity provider's tokens, and the key sets it must refuse.
use super::*;
use jsonwebtoken::Algorithm::*;
use std::time::Duration;

const VECTORS: &str = include_str!("vectors.json");
/// 2030-01-01: after every vector's `iat`, before every `exp` but one.
const NOW: i64 = 1_893_456_000;

fn vectors() -> Value {
    serde_json::from_str(VECTORS).unwrap()
}

fn settings() -> OidcSettings {
    let mut cfg = OidcSettings::new("https://id.test", &["mpg-api"]);
    cfg.algorithms = vec![RS256, PS256, ES256, EdDSA];
    cfg
}

fn key_set(allowed: &[Algorithm]) -> KeySet {
    let jwks = serde_json::to_vec(&vectors()["jwks"]).unwrap();
    KeySet::parse(&jwks, allowed).unwrap()
}

fn verify(name: &str) -> Result<Verified, JwtError> {
    let v = vectors();
    let token = v["tokens"][name]
        .as_str()
        .unwrap_or_else(|| panic!("no vector {name}"));
    key_set(&settings().algorithms).verify(token, &settings(), NOW)
}

#[test]
fn tokens_of_every_algorithm_verify_and_name_their_user() {
    for name in ["rs256", "ps256", "es256", "eddsa", "aud_list"] {
        let verified = verify(name).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(verified.user, "alice", "{name}");
        assert_eq!(
            verified.expires_at,
            4_102_444_800 + 60,
            "{name}: exp plus the leeway"
        );
        assert_eq!(verified.issued_at, 1_700_000_000, "{name}");
    }
    assert_eq!(
        verify("eddsa").unwrap().email.as_deref(),
        Some("alice@example.com")
    );
}

#[test]
fn each_refusal_has_its_reason() {
    let cases = [
        ("wrong_iss", JwtError::Invalid("issuer")),
        ("wrong_aud", JwtError::Invalid("audience")),
        ("expired", JwtError::Expired),
        ("not_yet", JwtError::NotYetValid),
        ("issued_later", JwtError::NotYetValid),
        ("no_exp", JwtError::Invalid("no exp")),
        ("no_sub", JwtError::Invalid("user claim")),
        ("alg_none", JwtError::Invalid("algorithm not allowed")),
        (
            "hs256_public_key",
            JwtError::Invalid("algorithm not allowed"),
        ),
        ("tampered", JwtError::Invalid("signature")),
        ("unknown_kid", JwtError::UnknownKid),
        (
            "alg_off_key",
            JwtError::Invalid("algorithm does not fit the key"),
        ),
        ("crit", JwtError::Invalid("crit header")),
    ];
    for (name, want) in cases {
        assert_eq!(verify(name), Err(want), "{name}");
    }
}

#[test]
fn hs256_with_the_public_key_fails_even_if_hs256_were_listed() {
    // The configuration refuses HS*, but the key set alone must hold too:
    // no RSA key verifies an HMAC.
    let mut cfg = settings();
    cfg.algorithms.push(HS256);
    let v = vectors();
    let token = v["tokens"]["hs256_public_key"].as_str().unwrap();
    let keys = key_set(&cfg.algorithms);
    assert_eq!(
        keys.verify(token, &cfg, NOW),
        Err(JwtError::Invalid("algorithm does not fit the key"))
    );
}

#[test]
fn the_leeway_moves_both_ends() {
    let mut cfg = settings();
    let v = vectors();
    let expired = v["tokens"]["expired"].as_str().unwrap();
    let keys = key_set(&cfg.algorithms);
    // exp = 1_700_000_100: inside the leeway a moment after it.
    assert!(keys.verify(expired, &cfg, 1_700_000_150).is_ok());
    assert_eq!(
        keys.verify(expired, &cfg, 1_700_000_160),
        Err(JwtError::Expired)
    );
    cfg.leeway = Duration::ZERO;
    assert_eq!(
        keys.verify(expired, &cfg, 1_700_000_100),
        Err(JwtError::Expired)
    );
    let later = v["tokens"]["not_yet"].as_str().unwrap();
    assert!(keys.verify(later, &settings(), 4_000_000_000 - 60).is_ok());
}

#[test]
fn algorithms_not_allowed_leave_their_keys_out() {
    let keys = key_set(&[ES256]);
    assert_eq!(keys.len(), 1, "only the P-256 key serves ES256");
    let mut cfg = settings();
    cfg.algorithms = vec![ES256];
    let v = vectors();
    let rs = v["tokens"]["rs256"].as_str().unwrap();
    assert_eq!(
        keys.verify(rs, &cfg, NOW),
        Err(JwtError::Invalid("algorithm not allowed"))
    );
}

#[test]
fn malformed_tokens_are_malformed() {
    let keys = key_set(&settings().algorithms);
    for token in ["a.b.c", "e30.e30.", "..", "eyJhbGciOiJFUzI1NiJ9", "x.y.z.w"] {
        assert_eq!(
            keys.verify(token, &settings(), NOW),
            Err(JwtError::Malformed),
            "{token}"
        );
    }
}

fn parse_error(jwks: Value) -> String {
    match KeySet::parse(jwks.to_string().as_bytes(), &settings().algorithms) {
        Ok(_) => panic!("accepted {jwks}"),
        Err(e) => e,
    }
}

#[test]
fn key_sets_we_cannot_use_are_refused_naming_the_key() {
    assert!(parse_error(json_of("not json")).starts_with("not a JWKS"));
    let e =
        parse_error(serde_json::json!({"keys": [{"kty": "oct", "kid": "s1", "k": "c2VjcmV0"}]}));
    assert!(e.contains("\"s1\"") && e.contains("symmetric"), "{e}");
    let e = parse_error(serde_json::json!({"keys": [{"kty": "XYZ", "kid": "odd"}]}));
    assert!(e.contains("\"odd\"") && e.contains("not supported"), "{e}");
    let e = parse_error(
        serde_json::json!({"keys": [{"kty": "EC", "crv": "P-521", "kid": "p5", "x": "AA", "y": "AA"}]}),
    );
    assert!(e.contains("P521"), "{e}");
    let short = URL_SAFE_NO_PAD.encode([0xff_u8; 128]);
    let e = parse_error(
        serde_json::json!({"keys": [{"kty": "RSA", "kid": "weak", "n": short, "e": "AQAB"}]}),
    );
    assert!(e.contains("1024 bits"), "{e}");
    let mut ec = vectors()["jwks"]["keys"][1].clone();
    ec["alg"] = "RS256".into();
    let e = parse_error(serde_json::json!({ "keys": [ec] }));
    assert!(e.contains("does not fit its key type"), "{e}");
    let e = parse_error(serde_json::json!({"keys": []}));
    assert!(e.contains("no key"), "{e}");
}

#[test]
fn encryption_keys_are_passed_over() {
    let mut v = vectors();
    v["jwks"]["keys"][0]["use"] = "enc".into();
    let keys = KeySet::parse(v["jwks"].to_string().as_bytes(), &settings().algorithms).unwrap();
    assert_eq!(keys.len(), 2);
    let rs = v["tokens"]["rs256"].as_str().unwrap();
    assert_eq!(keys.verify(rs, &settings(), NOW), Err(JwtError::UnknownKid));
}

fn json_of(text: &str) -> Value {
    Value::String(text.into())
}

#[test]
fn a_cache_key_hashes_one_block_of_the_signature_and_the_shape_is_checked_apart() {
    let v = vectors();
    for name in ["rs256", "es256", "eddsa"] {
        let token = v["tokens"][name].as_str().unwrap();
        let signature = token.rsplit('.').next().unwrap();
        assert!(
            signature.len() >= CACHE_KEY_TAIL,
            "{name}: the tail lies in the signature"
        );
        assert_eq!(
            cache_key(token),
            crate::secret::hash_secret(&token[token.len() - 55..])
        );
        assert!(well_formed(token), "{name}");
    }
    assert!(
        well_formed(v["tokens"]["alg_none"].as_str().unwrap()),
        "an empty signature has the shape"
    );
    for bad in [
        "a.b", "a..c", ".b.c", "a.b.c.d", "a.b!.c", "a.b.c d", "ä.b.c",
    ] {
        assert!(!well_formed(bad), "{bad}");
    }
    assert!(!well_formed(&format!(
        "{}.b.c",
        "a".repeat(MAX_TOKEN_BYTES)
    )));
}

#[test]
fn a_set_drops_a_key_only_when_one_is_withdrawn() {
    let v = vectors();
    let all = key_set(&settings().algorithms);
    let again = key_set(&settings().algorithms);
    assert!(!again.drops_a_key_of(&all), "the same set, fetched again");
    let mut fewer = v["jwks"].clone();
    fewer["keys"].as_array_mut().unwrap().remove(0);
    let fewer = KeySet::parse(fewer.to_string().as_bytes(), &settings().algorithms).unwrap();
    assert!(fewer.drops_a_key_of(&all), "the RSA key withdrawn");
    assert!(!all.drops_a_key_of(&fewer), "a key added");
}
