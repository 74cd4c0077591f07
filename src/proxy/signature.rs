//! `X-Mpg-Signature`: an HMAC-SHA256, under a key the upstream shares, over
//! the identity a forwarded request carries, so that an upstream reachable
//! by other means than the gateway can tell the gateway's identity headers
//! from anyone's.
//!
//! The value is `t=<unix seconds>,v1=<64 lower-case hex digits>`. The signed
//! message is `t`, the method, the path with its query as sent, and the
//! values of `X-Mpg-Organization-Id`, `X-Mpg-User-Id`, `X-Mpg-Role`,
//! `X-Mpg-Auth`, `X-Mpg-Key-Id`, `X-Mpg-Scopes` and `X-Request-Id`, in that
//! order, each followed by `\n`; a field not sent counts as empty.
//! docs/signed-identity.md says how to verify it.
use hmac::{Hmac, Mac};
use http::Method;
use sha2::Sha256;
use std::fmt;

use super::headers::{Added, F_AUTH, F_KEY_ID, F_ORGANIZATION_ID, F_ROLE, F_SCOPES, F_USER_ID};
use crate::http::fields::{Field, F_REQUEST_ID};

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
}

impl fmt::Debug for IdentitySigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdentitySigner { .. }")
    }
}

/// `t=` + at most 20 digits + `,v1=` + 64 hex digits.
const MAX_LEN: usize = 2 + 20 + 4 + 64;

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

impl IdentitySigner {
    /// A signer with `key` (any length; HMAC hashes a key longer than a
    /// block). `None` only if the HMAC implementation refused the key.
    pub fn new(key: &[u8]) -> Option<IdentitySigner> {
        let keyed = Hmac::<Sha256>::new_from_slice(key).ok()?;
        Some(IdentitySigner { keyed })
    }

    /// The signature of a request with `method` and `path` (with its query,
    /// as the transports send it) carrying `added`'s fields, at `unix`
    /// seconds.
    pub fn sign(&self, added: &Added<'_>, method: &Method, path: &str, unix: u64) -> Signature {
        let mut mac = self.keyed.clone();
        let mut t = itoa::Buffer::new();
        let t = t.format(unix).as_bytes();
        for part in [t, method.as_str().as_bytes(), path.as_bytes()] {
            mac.update(part);
            mac.update(b"\n");
        }
        // The fields come in the message's order; one left out (not sent)
        // is an empty line.
        let mut next = 0;
        added.each(|field, value| {
            let Some(at) = SIGNED[next..].iter().position(|f| std::ptr::eq(*f, field)) else {
                return;
            };
            for _ in 0..at {
                mac.update(b"\n");
            }
            mac.update(value);
            mac.update(b"\n");
            next += at + 1;
        });
        for _ in next..SIGNED.len() {
            mac.update(b"\n");
        }
        let tag = mac.finalize().into_bytes();
        let mut buf = [0u8; MAX_LEN];
        let mut len = 0;
        let mut push = |bytes: &[u8]| {
            buf[len..len + bytes.len()].copy_from_slice(bytes);
            len += bytes.len();
        };
        push(b"t=");
        push(t);
        push(b",v1=");
        for byte in tag {
            let hex = b"0123456789abcdef";
            push(&[hex[usize::from(byte >> 4)], hex[usize::from(byte & 0xf)]]);
        }
        Signature { buf, len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Scopes;
    use crate::proxy::headers::{ForwardedFor, Identity};
    use http::{HeaderMap, HeaderValue};

    /// The message as the docs spell it, HMAC'd from scratch.
    fn expected(key: &[u8], message: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(message.as_bytes());
        let tag = mac.finalize().into_bytes();
        tag.iter().map(|b| format!("{b:02x}")).collect()
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
            request_id: b"rid-1",
            signature: None,
        };
        let signer = IdentitySigner::new(b"k3y").unwrap();
        let sig = signer.sign(&added, &Method::POST, "/api/v1/x?a=1&b=2", 1_700_000_000);
        let message = "1700000000\nPOST\n/api/v1/x?a=1&b=2\nacme\nalice\nowner\napi_key\nkey_1\nclusters:read keys:read\nrid-1\n";
        let want = format!("t=1700000000,v1={}", expected(b"k3y", message));
        assert_eq!(std::str::from_utf8(sig.as_bytes()).unwrap(), want);
    }

    #[test]
    fn absent_fields_are_empty_lines_and_the_signature_is_sent_last() {
        let scopes = Vec::new();
        // A session: no key id.
        let session = Added {
            identity: Some(Identity {
                organization_id: "acme",
                user_id: "bob",
                role: "viewer",
                auth: "session",
                key_id: None,
                scopes: Scopes::listed(&scopes),
            }),
            forwarded: forwarded(),
            request_id: b"r",
            signature: None,
        };
        let signer = IdentitySigner::new(b"k").unwrap();
        let sig = signer.sign(&session, &Method::GET, "/", 7);
        let message = "7\nGET\n/\nacme\nbob\nviewer\nsession\n\n\nr\n";
        assert_eq!(
            sig.as_bytes(),
            format!("t=7,v1={}", expected(b"k", message)).as_bytes()
        );

        // Anonymous: only the request id.
        let mut anonymous = Added {
            identity: None,
            forwarded: forwarded(),
            request_id: b"r",
            signature: None,
        };
        let sig = signer.sign(&anonymous, &Method::GET, "/p", u64::MAX);
        let message = format!("{}\nGET\n/p\n\n\n\n\n\n\nr\n", u64::MAX);
        let want = format!("t={},v1={}", u64::MAX, expected(b"k", &message));
        assert_eq!(sig.as_bytes(), want.as_bytes());
        assert_eq!(sig.as_bytes().len(), MAX_LEN);

        anonymous.signature = Some(sig.as_bytes());
        let mut h = HeaderMap::new();
        anonymous.add_to(&mut h);
        assert_eq!(h["x-mpg-signature"], HeaderValue::from_str(&want).unwrap());
        let mut lines = Vec::new();
        anonymous.write_to(&mut lines);
        let text = String::from_utf8(lines).unwrap();
        assert!(
            text.ends_with(&format!("x-mpg-signature: {want}\r\n")),
            "{text}"
        );
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
            request_id: b"r",
            signature: None,
        };
        let signer = IdentitySigner::new(b"k").unwrap();
        let sig = signer.sign(&added, &Method::GET, "/", 1);
        let message = "1\nGET\n/\nacme\n\nowner\napi_key\nkey_1\n\nr\n";
        assert_eq!(
            sig.as_bytes(),
            format!("t=1,v1={}", expected(b"k", message)).as_bytes()
        );
        assert_eq!(format!("{signer:?}"), "IdentitySigner { .. }");
    }
}
