//! Header hygiene for forwarded requests and relayed responses.
//!
//! `sanitize_request` always runs before the gateway's own headers ([`Added`])
//! are added: a client naming a gateway header in `Connection` can then only
//! remove its own copy.
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONNECTION, HOST};

use crate::auth::Scopes;
use crate::http_core::fields::{field, Field, FieldLines, F_REQUEST_ID, X_REQUEST_ID};
use crate::http_core::hop_by_hop::{connection_named, hop_by_hop_present, HOP_BY_HOP};
use crate::trace::TRACEPARENT;

/// `X-Mpg-Organization-Id`
pub const X_MPG_ORGANIZATION_ID: HeaderName = HeaderName::from_static("x-mpg-organization-id");
/// `X-Mpg-User-Id`
pub const X_MPG_USER_ID: HeaderName = HeaderName::from_static("x-mpg-user-id");
/// `X-Mpg-Role`
pub const X_MPG_ROLE: HeaderName = HeaderName::from_static("x-mpg-role");
/// `X-Mpg-Auth`
pub const X_MPG_AUTH: HeaderName = HeaderName::from_static("x-mpg-auth");
/// `X-Mpg-Key-Id`
pub const X_MPG_KEY_ID: HeaderName = HeaderName::from_static("x-mpg-key-id");
/// `X-Mpg-Scopes`
pub const X_MPG_SCOPES: HeaderName = HeaderName::from_static("x-mpg-scopes");
/// `X-Mpg-Key-Meta` (a key's `meta`, base64url)
pub const X_MPG_KEY_META: HeaderName = HeaderName::from_static("x-mpg-key-meta");
/// `X-Forwarded-For`
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// `X-Mpg-Signature` (see `signature`)
pub const X_MPG_SIGNATURE: HeaderName = HeaderName::from_static("x-mpg-signature");

/// Who the gateway vouches for; becomes the `X-Mpg-*` headers.
#[derive(Debug)]
pub struct Identity<'a> {
    /// The organization the request was authorized for.
    pub organization_id: &'a str,
    /// The user behind the credential.
    pub user_id: &'a str,
    /// The user's role in that organization.
    pub role: &'a str,
    /// `api_key` or `session`.
    pub auth: &'static str,
    /// The API key id (keys only).
    pub key_id: Option<&'a str>,
    /// Effective permissions (space-separated on the wire).
    pub scopes: Scopes<'a>,
}

/// What the `X-Forwarded-*` headers say.
#[derive(Debug)]
pub struct ForwardedFor<'a> {
    /// The `X-Forwarded-For` value: the client's address, then the trusted
    /// proxies it came through, if any.
    pub chain: &'a str,
    /// `https` or `http`.
    pub proto: &'static str,
    /// The host the client asked for.
    pub host: Option<&'a str>,
}

/// Removes what a client may not pass on, plus the `Connection`-named headers.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let present = hop_by_hop_present(headers);
    if present == 0 {
        return;
    }
    // HOP_BY_HOP[0] is `Connection`: the headers it names go too.
    if present & 1 != 0 {
        remove_connection_named(headers);
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
}

/// Removes the headers that `Connection` names.
fn remove_connection_named(headers: &mut HeaderMap) {
    let tokens = || {
        headers
            .get_all(CONNECTION)
            .iter()
            .flat_map(|v| connection_named(v.as_bytes()))
    };
    // Usual clients send no `Connection`, or only `keep-alive` / `close`: no
    // list to build then.
    if tokens().next().is_some() {
        let named: Vec<HeaderName> = tokens()
            .filter_map(|t| HeaderName::from_bytes(t).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
}

/// Whether `name` starts with `prefix`, reading `_` in `name` as `-`: many
/// upstream stacks (CGI, WSGI, Rack, nginx) fold `X_Mpg_User_Id` into the
/// same variable as `X-Mpg-User-Id`, so both spellings are the same header.
fn starts_with_folded(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len()
        && name
            .bytes()
            .zip(prefix.bytes())
            .all(|(n, p)| n == p || (n == b'_' && p == b'-'))
}

/// Client headers the gateway never passes on, however spelled: identity it
/// vouches for itself; client-address claims (`X-Forwarded-*`,
/// `Forwarded`, `X-Real-Ip`, `True-Client-Ip`, `X-Client-Ip`, `Client-Ip`,
/// `CF-Connecting-Ip`, `X-Cluster-Client-Ip`: frameworks take the client's
/// address from them); routing overrides (`X-Original-Url`,
/// `X-Rewrite-Url`: Symfony, Laminas and IIS-style stacks route on them, past
/// the path the gateway authorized); method overrides (an upstream
/// honouring one would run a method the route was not authorized for);
/// every `Proxy-*` (hop-by-hop: meant for the proxy they reach, never for
/// the upstream), and `Proxy` itself (httpoxy, CVE-2016-5385: a CGI-style
/// upstream reads it as `HTTP_PROXY` and sends its own requests through
/// the client's proxy); and the fields of
/// [`STACK_TRUSTED_FIELDS`](crate::http_core::fields::STACK_TRUSTED_FIELDS),
/// which a route may keep.
pub(crate) fn is_spoofable(name: &HeaderName) -> bool {
    let n = name.as_str();
    let exact = |want: &str| n.len() == want.len() && starts_with_folded(n, want);
    // Names are lower case: most (`accept`, `user-agent`, …) are settled
    // by their first byte, and the rest mostly by their length.
    match n.as_bytes().first() {
        Some(b'x') => {
            starts_with_folded(n, "x-mpg-")
                || starts_with_folded(n, "x-forwarded-")
                || exact("x-real-ip")
                || exact("x-client-ip")
                || exact("x-cluster-client-ip")
                || exact("x-original-url")
                || exact("x-rewrite-url")
                || exact("x-http-method-override")
                || exact("x-method-override")
                || exact("x-http-method")
                || exact("x-forwarded")
                || exact("x-original-forwarded-for")
                || exact("x-envoy-external-address")
                || exact("x-original-uri")
                || exact("x-original-host")
                || exact("x-original-method")
                || exact("x-middleware-subrequest")
                || exact("x-remote-user")
                || exact("x-auth-request-user")
        }
        Some(b'c') => exact("client-ip") || exact("cf-connecting-ip"),
        Some(b't') => exact("true-client-ip"),
        Some(b'f') => n == "forwarded" || exact("forwarded-for") || exact("fastly-client-ip"),
        Some(b'p') => exact("proxy") || starts_with_folded(n, "proxy-"),
        Some(b'r') => exact("remote-user"),
        _ => false,
    }
}

/// Removes `Authorization`, `Host`, hop-by-hop and `Connection`-named headers,
/// and every client-sent header [`is_spoofable`] names (also spelled with
/// `_`): identity, client-address claims, routing and method overrides,
/// `Proxy` and `Proxy-*`; but not the fields of `keep` (a route's
/// `keep_client_headers`, spelled exactly, in lower case).
pub fn sanitize_request(headers: &mut HeaderMap, keep: &[HeaderName]) {
    remove_hop_by_hop(headers);
    // One look at the names present; only those are removed (a removal
    // hashes its name, found or not).
    let (mut authorization, mut host, mut request_id, mut spoofed) = (false, false, false, false);
    for name in headers.keys() {
        if *name == AUTHORIZATION {
            authorization = true;
        } else if *name == HOST {
            host = true;
        } else if *name == X_REQUEST_ID {
            // The gateway sends its own (the client's, when it is sane): see `Added`.
            request_id = true;
        } else {
            spoofed |= is_spoofable(name);
        }
    }
    if authorization {
        headers.remove(AUTHORIZATION);
    }
    if host {
        headers.remove(HOST);
    }
    if request_id {
        headers.remove(X_REQUEST_ID);
    }
    if spoofed {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|n| is_spoofable(n) && !keep.contains(n))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
    }
}

/// What the gateway adds to a forwarded request: the identity it vouches
/// for, the request id, `X-Forwarded-*` and, for an upstream that asks for
/// it, `X-Mpg-Signature` over them. The HTTP/1.1 client writes these
/// lines straight after the request's own headers ([`FieldLines::write_lines`]);
/// HTTP/2 targets get them in the header map ([`Added::add_to`]). Both come
/// from the one list in [`Added::each`].
#[derive(Debug)]
pub struct Added<'a> {
    /// The caller, on authenticated routes.
    pub identity: Option<Identity<'a>>,
    /// The client's connection.
    pub forwarded: ForwardedFor<'a>,
    /// `X-Mpg-Key-Meta`: the key's `meta` as base64url, for an upstream
    /// with `forward_key_meta`.
    pub key_meta: Option<&'a [u8]>,
    /// `X-Request-Id`.
    pub request_id: &'a [u8],
    /// `traceparent`: the gateway's span for the call, when it traces.
    pub traceparent: Option<&'a [u8]>,
    /// `X-Mpg-Signature`, made from the fields above by
    /// [`IdentitySigner::sign`](super::signature::IdentitySigner::sign).
    pub signature: Option<&'a [u8]>,
}

field!(
    pub(super) F_ORGANIZATION_ID,
    X_MPG_ORGANIZATION_ID,
    b"x-mpg-organization-id: "
);
field!(pub(super) F_USER_ID, X_MPG_USER_ID, b"x-mpg-user-id: ");
field!(pub(super) F_ROLE, X_MPG_ROLE, b"x-mpg-role: ");
field!(pub(super) F_AUTH, X_MPG_AUTH, b"x-mpg-auth: ");
field!(pub(super) F_KEY_ID, X_MPG_KEY_ID, b"x-mpg-key-id: ");
field!(pub(super) F_SCOPES, X_MPG_SCOPES, b"x-mpg-scopes: ");
field!(pub(super) F_KEY_META, X_MPG_KEY_META, b"x-mpg-key-meta: ");
field!(F_FORWARDED_FOR, X_FORWARDED_FOR, b"x-forwarded-for: ");
field!(F_FORWARDED_PROTO, X_FORWARDED_PROTO, b"x-forwarded-proto: ");
field!(F_FORWARDED_HOST, X_FORWARDED_HOST, b"x-forwarded-host: ");
field!(F_SIGNATURE, X_MPG_SIGNATURE, b"x-mpg-signature: ");
field!(F_TRACEPARENT, TRACEPARENT, b"traceparent: ");

/// Whether `value` is a valid header value: visible ASCII, space and tab.
fn valid_value(value: &[u8]) -> bool {
    // Counted without an early exit; a tab (rare) takes the second look.
    // (Wider checks, 16-byte blocks or eight bytes to a word, are slower on
    // values this short.)
    let plain = value
        .iter()
        .fold(true, |ok, &b| ok & (b.wrapping_sub(0x20) < 0x5f));
    plain
        || value
            .iter()
            .all(|&b| (0x20..0x7f).contains(&b) || b == b'\t')
}

impl Added<'_> {
    /// Each field, in the order sent. A value that is not a valid header
    /// value (visible ASCII, space, tab) is left out, never a panic (the
    /// signature covers the fields as given here, so it agrees).
    pub(super) fn each(&self, mut field: impl FnMut(&'static Field, &[u8])) {
        let mut put = |f: &'static Field, value: &[u8]| {
            if valid_value(value) {
                field(f, value);
            }
        };
        if let Some(id) = &self.identity {
            put(&F_ORGANIZATION_ID, id.organization_id.as_bytes());
            put(&F_USER_ID, id.user_id.as_bytes());
            put(&F_ROLE, id.role.as_bytes());
            put(&F_AUTH, id.auth.as_bytes());
            if let Some(key_id) = id.key_id {
                put(&F_KEY_ID, key_id.as_bytes());
            }
            // Rendered on the stack; a list longer than the buffer (rare)
            // on the heap.
            let mut stack = [0u8; 256];
            match id.scopes.fill(&mut stack) {
                Some(n) => put(&F_SCOPES, &stack[..n]),
                None => put(&F_SCOPES, &id.scopes.to_vec()),
            }
        }
        if let Some(meta) = self.key_meta {
            put(&F_KEY_META, meta);
        }
        put(&F_REQUEST_ID, self.request_id);
        put(&F_FORWARDED_FOR, self.forwarded.chain.as_bytes());
        put(&F_FORWARDED_PROTO, self.forwarded.proto.as_bytes());
        if let Some(host) = self.forwarded.host {
            put(&F_FORWARDED_HOST, host.as_bytes());
        }
        if let Some(traceparent) = self.traceparent {
            put(&F_TRACEPARENT, traceparent);
        }
        if let Some(signature) = self.signature {
            put(&F_SIGNATURE, signature);
        }
    }

    /// Inserts the fields into `headers` (replacing any of the same name).
    pub fn add_to(&self, headers: &mut HeaderMap) {
        self.each(|f, value| {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                headers.insert(f.name.clone(), v);
            }
        });
    }
}

/// The HTTP/1.1 client writes the fields straight after the request's own.
impl FieldLines for Added<'_> {
    fn write_lines(&self, out: &mut Vec<u8>) {
        self.each(|f, value| {
            out.extend_from_slice(f.line);
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        });
    }
}

/// Removes hop-by-hop and `Connection`-named headers from an upstream response.
pub fn sanitize_response(headers: &mut HeaderMap) {
    remove_hop_by_hop(headers);
}

#[cfg(test)]
mod tests;
