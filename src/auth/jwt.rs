//! An identity provider's JWTs: its key set (JWKS) read into verifying keys,
//! and one token checked against it. The signature is `jsonwebtoken`'s work;
//! what is ours is the order of the checks and what each refusal is called:
//! the header's `alg` against the allow-list and against the key `kid`
//! names (so that no key serves an algorithm of another family), then
//! `iss`, `aud`, `exp`, `nbf` and `iat` with the leeway.
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyOperations, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::config::OidcSettings;
use crate::secret::{hash_bytes, SecretHash};

/// The longest token taken: a JWT's claims of a user fit well inside.
pub const MAX_TOKEN_BYTES: usize = 8192;
/// The most keys a key set may hold.
const MAX_KEYS: usize = 100;
/// RSA moduli shorter than this are refused (RFC 7518 §3.3 asks for 2048).
const MIN_RSA_BITS: usize = 2048;

/// How many bytes of a token's end its cache key hashes: one SHA-256 block,
/// all of them signature for every algorithm taken (the shortest, ES256's
/// and EdDSA's, are 86 characters).
const CACHE_KEY_TAIL: usize = 55;

/// The key a verified token is cached under: the SHA-256 of its last
/// [`CACHE_KEY_TAIL`] bytes, which lie in its signature. Hashing the whole
/// token would cost every request six SHA-256 blocks instead of one; the
/// cached entry holds the whole token, and a hit counts only if it matches
/// byte for byte, so the entry still stands for exactly one token.
pub fn cache_key(token: &str) -> SecretHash {
    let bytes = token.as_bytes();
    hash_bytes(&bytes[bytes.len().saturating_sub(CACHE_KEY_TAIL)..])
}

/// Three non-empty base64url parts, the last possibly empty (`alg: none`),
/// at most [`MAX_TOKEN_BYTES`]: the shape of a JWT, checked where the
/// cache cannot vouch for the token.
pub fn well_formed(token: &str) -> bool {
    let base64url = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_');
    let mut parts = token.split('.');
    let (Some(head), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    token.len() <= MAX_TOKEN_BYTES
        && !head.is_empty()
        && !claims.is_empty()
        && [head, claims, signature]
            .iter()
            .all(|p| p.as_bytes().iter().all(base64url))
}

/// The verifying keys of one key set.
pub struct KeySet {
    keys: Vec<VerifyingKey>,
}

struct VerifyingKey {
    /// The key as the set published it (its `kid` included).
    jwk: Jwk,
    key: DecodingKey,
    /// The algorithms this key verifies: those its type (and its own `alg`,
    /// if it names one) fits, that the configuration allows.
    algorithms: Vec<Algorithm>,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    /// Not three base64url parts with a JSON header and claims.
    Malformed,
    /// Signature, issuer, audience, algorithm or claims do not hold; the
    /// text says which, for the debug log.
    Invalid(&'static str),
    /// Past `exp` (and the leeway).
    Expired,
    /// Before `nbf` or `iat` (less the leeway).
    NotYetValid,
    /// The key set has no key of this `kid`: a refresh may bring it.
    UnknownKid,
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The `user_claim`: a `users.id`.
    pub user: String,
    /// `exp` plus the leeway: the token serves until then.
    pub expires_at: i64,
    /// `iat`, or `now` when the token has none.
    pub issued_at: i64,
    /// The `email` claim, if any (for a provisioned user).
    pub email: Option<String>,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    crit: Option<Value>,
}

impl KeySet {
    /// The keys of a JWKS document usable with `allowed`. Refuses the whole
    /// document, naming the key, when one of its signing keys is of a type
    /// we cannot verify with, or symmetric, or too weak: the last good set
    /// then stays in use. Keys for encryption only are passed over.
    pub fn parse(json: &[u8], allowed: &[Algorithm]) -> Result<KeySet, String> {
        let set: JwkSet = serde_json::from_slice(json).map_err(|e| format!("not a JWKS: {e}"))?;
        if set.keys.len() > MAX_KEYS {
            return Err(format!(
                "{} keys; at most {MAX_KEYS} are taken",
                set.keys.len()
            ));
        }
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let name = match &jwk.common.key_id {
                Some(kid) => format!("key {kid:?}"),
                None => format!("key #{i}"),
            };
            if jwk.common.public_key_use == Some(PublicKeyUse::Encryption)
                || jwk
                    .common
                    .key_operations
                    .as_ref()
                    .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
            {
                continue;
            }
            let fits = fitting_algorithms(&jwk.algorithm).map_err(|e| format!("{name}: {e}"))?;
            let fits: Vec<Algorithm> = match jwk.common.key_algorithm {
                Some(named) => {
                    let named = named
                        .to_string()
                        .parse::<Algorithm>()
                        .ok()
                        .filter(|a| fits.contains(a))
                        .ok_or_else(|| {
                            format!("{name}: its alg {named} does not fit its key type")
                        })?;
                    vec![named]
                }
                None => fits,
            };
            let algorithms: Vec<Algorithm> =
                fits.into_iter().filter(|a| allowed.contains(a)).collect();
            if algorithms.is_empty() {
                continue;
            }
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("{name}: {e}"))?;
            keys.push(VerifyingKey {
                jwk: jwk.clone(),
                key,
                algorithms,
            });
        }
        if keys.is_empty() {
            return Err("no key of the set fits the algorithms [auth.oidc] allows".into());
        }
        Ok(KeySet { keys })
    }

    /// Number of usable keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when a key of `old` is not in this set (the same JWK, for the same algorithms).
    pub fn drops_a_key_of(&self, old: &KeySet) -> bool {
        old.keys.iter().any(|o| {
            !self
                .keys
                .iter()
                .any(|n| n.jwk == o.jwk && n.algorithms == o.algorithms)
        })
    }

    /// Always false: a set holds at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks `token` at `now` (unix seconds) as `cfg` says.
    pub fn verify(&self, token: &str, cfg: &OidcSettings, now: i64) -> Result<Verified, JwtError> {
        let header = header(token)?;
        let alg = header
            .alg
            .parse::<Algorithm>()
            .ok()
            .filter(|a| cfg.algorithms.contains(a))
            .ok_or(JwtError::Invalid("algorithm not allowed"))?;
        if header.crit.is_some() {
            // RFC 7515 §4.1.11: extensions we do not understand.
            return Err(JwtError::Invalid("crit header"));
        }
        let key = match header.kid.as_deref() {
            Some(kid) => self
                .keys
                .iter()
                .find(|k| k.jwk.common.key_id.as_deref() == Some(kid))
                .ok_or(JwtError::UnknownKid)?,
            None => match self.keys.as_slice() {
                [only] => only,
                _ => {
                    return Err(JwtError::Invalid(
                        "no kid, and the key set has several keys",
                    ))
                }
            },
        };
        if !key.algorithms.contains(&alg) {
            return Err(JwtError::Invalid("algorithm does not fit the key"));
        }
        let mut validation = Validation::new(alg);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        let claims = match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation)
        {
            Ok(data) => data.claims,
            Err(e) => return Err(decode_error(e.kind())),
        };
        check_claims(&claims, cfg, now)
    }
}

/// Algorithms a key of these parameters can verify.
fn fitting_algorithms(params: &AlgorithmParameters) -> Result<Vec<Algorithm>, String> {
    use Algorithm::*;
    match params {
        AlgorithmParameters::RSA(rsa) => {
            let n = URL_SAFE_NO_PAD
                .decode(rsa.n.trim_end_matches('='))
                .map_err(|_| "its modulus n is not base64url".to_string())?;
            let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
            if bits < MIN_RSA_BITS {
                return Err(format!(
                    "an RSA key of {bits} bits; at least {MIN_RSA_BITS} are required"
                ));
            }
            Ok(vec![RS256, RS384, RS512, PS256, PS384, PS512])
        }
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Ok(vec![ES256]),
            EllipticCurve::P384 => Ok(vec![ES384]),
            ref other => Err(format!(
                "curve {other:?} is not supported (P-256 and P-384 are)"
            )),
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => Ok(vec![EdDSA]),
            ref other => Err(format!(
                "curve {other:?} is not supported for OKP (Ed25519 is)"
            )),
        },
        AlgorithmParameters::OctetKey(_) => {
            Err("a symmetric key (kty \"oct\") has no place in a public key set".into())
        }
        AlgorithmParameters::Other(other) => match other.fields.get("kty") {
            Some(kty) => Err(format!(
                "key type {kty} is not supported (RSA, EC and OKP are)"
            )),
            None => Err("no kty, or parameters that do not fit it".into()),
        },
        _ => Err("a key type that is not supported".into()),
    }
}

/// The token's header, read before any key is chosen.
fn header(token: &str) -> Result<Header, JwtError> {
    let mut parts = token.split('.');
    let (Some(head), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed);
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| JwtError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| JwtError::Malformed)
}

fn decode_error(kind: &jsonwebtoken::errors::ErrorKind) -> JwtError {
    use jsonwebtoken::errors::ErrorKind as K;
    match kind {
        K::Base64(_) | K::Json(_) | K::Utf8(_) | K::InvalidToken => JwtError::Malformed,
        K::InvalidSignature => JwtError::Invalid("signature"),
        K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => {
            JwtError::Invalid("algorithm")
        }
        _ => JwtError::Invalid("key"),
    }
}

/// `iss`, `aud`, `exp` (required), `nbf`, `iat` and the user claim.
fn check_claims(
    claims: &Map<String, Value>,
    cfg: &OidcSettings,
    now: i64,
) -> Result<Verified, JwtError> {
    if claims.get("iss").and_then(Value::as_str) != Some(cfg.issuer.as_str()) {
        return Err(JwtError::Invalid("issuer"));
    }
    let ours = |v: &Value| {
        v.as_str()
            .is_some_and(|a| cfg.audiences.iter().any(|c| c == a))
    };
    let audience_ok = match claims.get("aud") {
        Some(Value::Array(list)) => list.iter().any(ours),
        Some(one) => ours(one),
        None => false,
    };
    if !audience_ok {
        return Err(JwtError::Invalid("audience"));
    }
    let leeway = i64::try_from(cfg.leeway.as_secs()).unwrap_or(i64::MAX);
    let exp = time_claim(claims, "exp")?.ok_or(JwtError::Invalid("no exp"))?;
    let expires_at = exp.saturating_add(leeway);
    if expires_at <= now {
        return Err(JwtError::Expired);
    }
    for name in ["nbf", "iat"] {
        if time_claim(claims, name)?.is_some_and(|t| t.saturating_sub(leeway) > now) {
            return Err(JwtError::NotYetValid);
        }
    }
    let user = claims
        .get(&cfg.user_claim)
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty() && u.len() <= 128 && !u.chars().any(char::is_control))
        .ok_or(JwtError::Invalid("user claim"))?;
    Ok(Verified {
        user: user.to_owned(),
        expires_at,
        issued_at: time_claim(claims, "iat")?.unwrap_or(now),
        email: claims
            .get("email")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

/// A NumericDate claim, whole seconds (a fraction is dropped).
fn time_claim(claims: &Map<String, Value>, name: &'static str) -> Result<Option<i64>, JwtError> {
    match claims.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
            .map(Some)
            .ok_or(JwtError::Invalid("a time claim that is not a number")),
    }
}

#[cfg(test)]
mod tests;
