//! The identity provider's key set (JWKS) parser and the JWT verifier: any
//! document gives a key set or a refusal, never a panic; a key set that is
//! taken verifies (and refuses) the verifier's test tokens without a panic,
//! and never takes a forged one (`alg: none`, HMAC keyed with the public key,
//! a tampered signature), whatever keys it holds. A genuine token may verify
//! under a key set whose `kid`s were shuffled: it was signed by that key.
use mpg_gateway::auth::jwt::KeySet;

/// One input.
pub fn run(data: &[u8]) {
    let v = &*crate::VECTORS;
    let Ok(keys) = KeySet::parse(data, &v.settings.algorithms) else {
        return;
    };
    for token in &v.tokens {
        if keys.verify(token, &v.settings, 1_700_000_000).is_ok() {
            assert!(!v.forged.contains(token), "a forged token verified: {token}");
        }
    }
}
