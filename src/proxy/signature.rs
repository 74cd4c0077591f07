//! `X-Mpg-Signature`: an HMAC-SHA256, under a key the upstream shares, over
//! the identity a forwarded request carries, so that an upstream reachable
//! by other means than the gateway can tell the gateway's identity headers
//! from anyone's.
//!
//! The value is `t=<unix seconds>,n=<nonce>,v1=<hex>,v2=<hex>`, each tag 64
//! lower-case hex digits. `n` is 32 hex digits the gateway draws at random
//! for each request. The `v2` message is `t`, `n`, the method, the path with
//! its query as sent, the values of `X-Mpg-Organization-Id`,
//! `X-Mpg-User-Id`, `X-Mpg-Role`, `X-Mpg-Auth`, `X-Mpg-Key-Id`,
//! `X-Mpg-Scopes` and `X-Request-Id`, and the `Content-Digest` the gateway
//! sent (RFC 9530, SHA-256 of the body), in that order, each followed by
//! `\n`; a field not sent counts as empty. When `X-Mpg-Key-Meta` is sent
//! (`forward_key_meta`), its value and `\n` end the `v2` message. The `v1`
//! message, kept for verifiers written before `v2`, is the same without `n`,
//! the digest and the metadata.
//! docs/signed-identity.md says how to verify it.
use hmac::{Hmac, KeyInit, Mac};
use http::Method;
use sha2::{Digest, Sha256};
use std::fmt;

use super::headers::{Added, F_AUTH, F_KEY_ID, F_ORGANIZATION_ID, F_ROLE, F_SCOPES, F_USER_ID};
use crate::http_core::fields::{Field, F_REQUEST_ID};

/// The fields the signature covers, in the order of the message, which is
/// also the order [`Added::each`] gives them in.
static SIGNED: [&Field; 7] = [
    &F_ORGANIZATION_ID,
    &F_USER_ID,
    &F_ROLE,
    &F_AUTH,
    &F_KEY_ID,
    &F_SCOPES,
    &F_REQUEST_ID,
];

/// Signs the requests to one upstream. Holds the HMAC state keyed once, so
/// a request pays for its message only, not for hashing the key.
#[derive(Clone)]
pub struct IdentitySigner {
    keyed: Hmac<Sha256>,
    content_digest: bool,
}

impl fmt::Debug for IdentitySigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdentitySigner { .. }")
    }
}

/// Hex digits of a nonce: 128 random bits.
pub const NONCE_LEN: usize = 32;

/// `t=` + at most 20 digits + `,n=` + the nonce + `,v1=` and `,v2=` with 64
/// hex digits each.
const MAX_LEN: usize = 2 + 20 + 3 + NONCE_LEN + 2 * (4 + 64);

/// One `X-Mpg-Signature` value, on the stack.
pub struct Signature {
    buf: [u8; MAX_LEN],
    len: usize,
}

impl Signature {
    /// The header value.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A fresh nonce: 128 bits from the thread's CSPRNG, as lower-case hex.
pub fn nonce() -> [u8; NONCE_LEN] {
    let mut out = [0u8; NONCE_LEN];
    hex::encode_to_slice(rand::random::<[u8; NONCE_LEN / 2]>(), &mut out)
        .expect("two digits a byte");
    out
}

/// The `Content-Digest` value of `body` (RFC 9530): `sha-256=:<base64>:`.
pub fn content_digest(body: &[u8]) -> String {
    use base64::Engine as _;
    let hash = Sha256::digest(body);
    let b64 = base64::engine::general_purpose::STANDARD.encode(hash);
    format!("sha-256=:{b64}:")
}

impl IdentitySigner {
    /// A signer with `key` (any length; HMAC hashes a key longer than a
    /// block). `None` only if the HMAC implementation refused the key.
    pub fn new(key: &[u8]) -> Option<IdentitySigner> {
        let keyed = Hmac::<Sha256>::new_from_slice(key).ok()?;
        Some(IdentitySigner {
            keyed,
            content_digest: true,
        })
    }

    /// The same signer, sending bodies with their `Content-Digest` or not
    /// (`sign_content_digest`).
    pub fn with_content_digest(mut self, on: bool) -> IdentitySigner {
        self.content_digest = on;
        self
    }

    /// Whether a request's body goes with its `Content-Digest`, signed.
    pub fn signs_content_digest(&self) -> bool {
        self.content_digest
    }

    /// The signature of a request with `method` and `path` (with its query,
    /// as the transports send it) carrying `added`'s fields and, if it has a
    /// body, `digest` (its `Content-Digest` value), at `unix` seconds, with
    /// `nonce` (from [`nonce`]).
    pub fn sign(
        &self,
        added: &Added<'_>,
        request: (&Method, &str),
        unix: u64,
        nonce: &[u8; NONCE_LEN],
        digest: Option<&[u8]>,
    ) -> Signature {
        let (method, path) = request;
        let mut t = itoa::Buffer::new();
        let t = t.format(unix).as_bytes();
        let (mut v1, mut v2) = (self.keyed.clone(), self.keyed.clone());
        const NL: &[u8] = b"\n";
        for part in [t, NL] {
            v1.update(part);
        }
        for part in [t, NL, nonce, NL] {
            v2.update(part);
        }
        let mut both = |bytes: &[u8]| {
            v1.update(bytes);
            v2.update(bytes);
        };
        for part in [method.as_str().as_bytes(), path.as_bytes()] {
            both(part);
            both(b"\n");
        }
        // The fields come in the message's order; one left out (not sent)
        // is an empty line.
        let mut next = 0;
        added.each(|field, value| {
            let Some(at) = SIGNED[next..].iter().position(|f| std::ptr::eq(*f, field)) else {
                return;
            };
            for _ in 0..at {
                both(b"\n");
            }
            both(value);
            both(b"\n");
            next += at + 1;
        });
        for _ in next..SIGNED.len() {
            both(b"\n");
        }
        v2.update(digest.unwrap_or_default());
        v2.update(b"\n");
        // A key's metadata, when it is sent, is one more line of `v2`'s message.
        if let Some(meta) = added.key_meta {
            v2.update(meta);
            v2.update(b"\n");
        }
        let mut buf = [0u8; MAX_LEN];
        let mut len = 0;
        let mut push = |bytes: &[u8]| {
            buf[len..len + bytes.len()].copy_from_slice(bytes);
            len += bytes.len();
        };
        push(b"t=");
        push(t);
        push(b",n=");
        push(nonce);
        for (label, mac) in [(b",v1=", v1), (b",v2=", v2)] {
            let mut hex = [0u8; 64];
            hex::encode_to_slice(mac.finalize().into_bytes(), &mut hex).expect("two digits a byte");
            push(label);
            push(&hex);
        }
        Signature { buf, len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Scopes;
    use crate::http_core::fields::FieldLines;
    use crate::proxy::headers::{ForwardedFor, Identity};
    use http::{HeaderMap, HeaderValue};

    /// The message as the docs spell it, HMAC'd from scratch.
    fn expected(key: &[u8], message: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(message.as_bytes());
        let tag = mac.finalize().into_bytes();
        tag.iter().map(|b| format!("{b:02x}")).collect()
    }

    const N: [u8; NONCE_LEN] = *b"00112233445566778899aabbccddeeff";

    /// The header value for `t`, with nonce [`N`], over the two messages.
    fn value(key: &[u8], t: &str, v1: &str, v2: &str) -> String {
        let n = std::str::from_utf8(&N).unwrap();
        format!(
            "t={t},n={n},v1={},v2={}",
            expected(key, v1),
            expected(key, v2)
        )
    }

    /// Bob's session in acme (no key id), request id `r`.
    fn bob_session(scopes: &[String]) -> Added<'_> {
        Added {
            identity: Some(Identity {
                organization_id: "acme",
                user_id: "bob",
                role: "viewer",
                auth: "session",
                key_id: None,
                scopes: Scopes::listed(scopes),
            }),
            forwarded: forwarded(),
            key_meta: None,
            request_id: b"r",
            traceparent: None,
            signature: None,
        }
    }

    fn forwarded() -> ForwardedFor<'static> {
        ForwardedFor {
            chain: "10.0.0.1",
            proto: "https",
            host: Some("api.example"),
        }
    }

    #[test]
    fn an_authenticated_request_signs_every_identity_field_in_order() {
        let scopes = vec!["clusters:read".to_string(), "keys:read".to_string()];
        let added = Added {
            identity: Some(Identity {
                organization_id: "acme",
                user_id: "alice",
                role: "owner",
                auth: "api_key",
                key_id: Some("key_1"),
                scopes: Scopes::listed(&scopes),
            }),
            forwarded: forwarded(),
            key_meta: None,
            request_id: b"rid-1",
            traceparent: None,
            signature: None,
        };
        let signer = IdentitySigner::new(b"k3y").unwrap();
        let request = (&Method::POST, "/api/v1/x?a=1&b=2");
        let digest = b"sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:";
        let sig = signer.sign(&added, request, 1_700_000_000, &N, Some(digest));
        let fields = "acme\nalice\nowner\napi_key\nkey_1\nclusters:read keys:read\nrid-1\n";
        let v1 = format!("1700000000\nPOST\n/api/v1/x?a=1&b=2\n{fields}");
        let v2 = format!(
            "1700000000\n{}\nPOST\n/api/v1/x?a=1&b=2\n{fields}{}\n",
            std::str::from_utf8(&N).unwrap(),
            std::str::from_utf8(digest).unwrap()
        );
        let want = value(b"k3y", "1700000000", &v1, &v2);
        assert_eq!(std::str::from_utf8(sig.as_bytes()).unwrap(), want);
    }

    #[test]
    fn absent_fields_are_empty_lines_and_the_signature_is_sent_last() {
        let scopes = Vec::new();
        // A session: no key id.
        let session = bob_session(&scopes);
        let signer = IdentitySigner::new(b"k").unwrap();
        let sig = signer.sign(&session, (&Method::GET, "/"), 7, &N, None);
        let n = std::str::from_utf8(&N).unwrap();
        let v1 = "7\nGET\n/\nacme\nbob\nviewer\nsession\n\n\nr\n";
        let v2 = format!("7\n{n}\nGET\n/\nacme\nbob\nviewer\nsession\n\n\nr\n\n");
        assert_eq!(sig.as_bytes(), value(b"k", "7", v1, &v2).as_bytes());

        // Anonymous: only the request id.
        let mut anonymous = Added {
            identity: None,
            forwarded: forwarded(),
            key_meta: None,
            request_id: b"r",
            traceparent: None,
            signature: None,
        };
        let sig = signer.sign(&anonymous, (&Method::GET, "/p"), u64::MAX, &N, None);
        let max = u64::MAX.to_string();
        let v1 = format!("{max}\nGET\n/p\n\n\n\n\n\n\nr\n");
        let v2 = format!("{max}\n{n}\nGET\n/p\n\n\n\n\n\n\nr\n\n");
        let want = value(b"k", &max, &v1, &v2);
        assert_eq!(sig.as_bytes(), want.as_bytes());
        assert_eq!(sig.as_bytes().len(), MAX_LEN);

        anonymous.signature = Some(sig.as_bytes());
        let mut h = HeaderMap::new();
        anonymous.add_to(&mut h);
        assert_eq!(h["x-mpg-signature"], HeaderValue::from_str(&want).unwrap());
        let mut lines = Vec::new();
        anonymous.write_lines(&mut lines);
        let text = String::from_utf8(lines).unwrap();
        assert!(
            text.ends_with(&format!("x-mpg-signature: {want}\r\n")),
            "{text}"
        );
    }

    /// The session signature of the test above, its tags computed outside the
    /// project by OpenSSL:
    /// `printf '7\nGET\n/\nacme\nbob\nviewer\nsession\n\n\nr\n' | openssl dgst -sha256 -hmac k`
    /// for `v1`, and for `v2` the same with the nonce line after the time and
    /// an empty digest line at the end.
    #[test]
    fn a_signature_matches_tags_computed_by_openssl() {
        let scopes = Vec::new();
        let session = bob_session(&scopes);
        let signer = IdentitySigner::new(b"k").unwrap();
        let sig = signer.sign(&session, (&Method::GET, "/"), 7, &N, None);
        let want = "t=7,n=00112233445566778899aabbccddeeff,\
                    v1=460bb671e82b3cbbd6cad7b11cad95d57a2338eddb3142432d73bc7521297f03,\
                    v2=8fe1a7601fa9b8bb242188f3536f0adf14278cfb716f0010266efce92914cdf2";
        assert_eq!(std::str::from_utf8(sig.as_bytes()).unwrap(), want);
    }

    #[test]
    fn a_value_left_out_as_invalid_is_signed_as_empty() {
        let scopes = Vec::new();
        let added = Added {
            identity: Some(Identity {
                organization_id: "acme",
                user_id: "bad\r\nvalue",
                role: "owner",
                auth: "api_key",
                key_id: Some("key_1"),
                scopes: Scopes::listed(&scopes),
            }),
            forwarded: forwarded(),
            key_meta: None,
            request_id: b"r",
            traceparent: None,
            signature: None,
        };
        let signer = IdentitySigner::new(b"k").unwrap();
        let sig = signer.sign(&added, (&Method::GET, "/"), 1, &N, None);
        let v1 = "1\nGET\n/\nacme\n\nowner\napi_key\nkey_1\n\nr\n";
        let v2 = format!(
            "1\n{}\nGET\n/\nacme\n\nowner\napi_key\nkey_1\n\nr\n\n",
            std::str::from_utf8(&N).unwrap()
        );
        assert_eq!(sig.as_bytes(), value(b"k", "1", v1, &v2).as_bytes());
        assert_eq!(format!("{signer:?}"), "IdentitySigner { .. }");
    }

    #[test]
    fn content_digests_and_nonces_are_what_others_compute() {
        // RFC 9530's own example (its appendix B), and SHA-256("hello") as
        // every implementation gives it.
        assert_eq!(
            content_digest(br#"{"hello": "world"}"#),
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
        );
        assert_eq!(
            content_digest(b"hello"),
            "sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:"
        );
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        assert!(a
            .iter()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}
