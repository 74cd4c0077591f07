//! Header hygiene for forwarded requests and relayed responses.
//!
//! `sanitize_request` always runs before `add_identity`: a client naming a
//! gateway header in `Connection` can then only remove its own copy.
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONNECTION, HOST};
use std::net::IpAddr;

/// `X-Request-Id`
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
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
/// `X-Forwarded-For`
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Hop-by-hop headers (RFC 9110 §7.6.1 and the usual proxy extras), as parsed
/// names so removing them costs no parsing per request.
const HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
    HeaderName::from_static("proxy-connection"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
];

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
    /// Effective permissions, space-separated.
    pub scopes: &'a str,
}

/// What the `X-Forwarded-*` headers say.
#[derive(Debug)]
pub struct ForwardedFor<'a> {
    /// The client's address.
    pub client_ip: IpAddr,
    /// `https` or `http`.
    pub proto: &'static str,
    /// The host the client asked for.
    pub host: Option<&'a str>,
}

/// Whether a `Connection` token names a header to remove beyond the fixed
/// hop-by-hop set (`keep-alive` is in it; `close` names no header).
fn names_extra_header(token: &str) -> bool {
    !token.is_empty()
        && !token.eq_ignore_ascii_case("keep-alive")
        && !token.eq_ignore_ascii_case("close")
}

/// Removes what a client may not pass on, plus the `Connection`-named headers.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let tokens = || {
        headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| names_extra_header(t))
    };
    // Usual clients send no `Connection`, or only `keep-alive` / `close`: no
    // list to build then.
    if tokens().next().is_some() {
        let named: Vec<HeaderName> = tokens()
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    // Looking at the few names present is cheaper than hashing every
    // hop-by-hop name for a removal that usually finds nothing.
    if headers.keys().any(|n| HOP_BY_HOP.contains(n)) {
        for name in &HOP_BY_HOP {
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
/// vouches for itself, client-address claims, and method overrides (an
/// upstream honouring one would run a method the route was not authorized for).
fn is_spoofable(name: &HeaderName) -> bool {
    let n = name.as_str();
    let exact = |want: &str| n.len() == want.len() && starts_with_folded(n, want);
    starts_with_folded(n, "x-mpg-")
        || starts_with_folded(n, "x-forwarded-")
        || n == "forwarded"
        || exact("x-real-ip")
        || exact("x-http-method-override")
        || exact("x-method-override")
        || exact("x-http-method")
}

/// Removes `Authorization`, `Host`, hop-by-hop and `Connection`-named headers,
/// every client-sent `X-Mpg-*`, `X-Forwarded-*`, `Forwarded` and `X-Real-Ip`
/// (also spelled with `_`), and the method-override headers.
pub fn sanitize_request(headers: &mut HeaderMap) {
    remove_hop_by_hop(headers);
    headers.remove(AUTHORIZATION);
    headers.remove(HOST);
    let spoofable = is_spoofable;
    if headers.keys().any(spoofable) {
        let names: Vec<HeaderName> = headers.keys().filter(|n| spoofable(n)).cloned().collect();
        for name in names {
            headers.remove(name);
        }
    }
}

fn put(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    // A value that is not a valid header value is not sent (never a panic).
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

/// Adds the identity, request id and `X-Forwarded-*` headers.
pub fn add_identity(
    headers: &mut HeaderMap,
    id: Option<&Identity<'_>>,
    fwd: &ForwardedFor<'_>,
    request_id: &HeaderValue,
) {
    if let Some(id) = id {
        put(headers, X_MPG_ORGANIZATION_ID, id.organization_id);
        put(headers, X_MPG_USER_ID, id.user_id);
        put(headers, X_MPG_ROLE, id.role);
        headers.insert(X_MPG_AUTH, HeaderValue::from_static(id.auth));
        if let Some(key_id) = id.key_id {
            put(headers, X_MPG_KEY_ID, key_id);
        }
        put(headers, X_MPG_SCOPES, id.scopes);
    }
    headers.insert(X_REQUEST_ID, request_id.clone());
    headers.insert(X_FORWARDED_FOR, ip_value(fwd.client_ip));
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(fwd.proto));
    if let Some(host) = fwd.host {
        put(headers, X_FORWARDED_HOST, host);
    }
}

/// An IP address as a header value, formatted on the stack (an address is
/// always a valid value).
fn ip_value(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_str(crate::ip::IpText::new(ip).as_str())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Removes hop-by-hop and `Connection`-named headers from an upstream response.
pub fn sanitize_response(headers: &mut HeaderMap) {
    remove_hop_by_hop(headers);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn identity() -> Identity<'static> {
        Identity {
            organization_id: "acme",
            user_id: "alice",
            role: "owner",
            auth: "api_key",
            key_id: Some("key_1"),
            scopes: "clusters:read",
        }
    }

    #[test]
    fn connection_close_and_keep_alive_name_nothing_else_but_other_tokens_still_count() {
        let mut h = map(&[
            ("connection", "Close, KEEP-ALIVE"),
            ("keep-alive", "timeout=5"),
            ("x-kept", "1"),
        ]);
        sanitize_request(&mut h);
        assert!(!h.contains_key("connection") && !h.contains_key("keep-alive"));
        assert_eq!(h["x-kept"], "1");
        let mut h = map(&[("connection", "close,  x-a ,,"), ("x-a", "1"), ("x-b", "2")]);
        sanitize_request(&mut h);
        assert!(!h.contains_key("x-a"));
        assert_eq!(h["x-b"], "2");
    }

    #[test]
    fn client_addresses_of_both_families_become_header_values() {
        let v6: IpAddr = "2001:db8:ffff:ffff:ffff:ffff:255.255.255.255"
            .parse()
            .unwrap();
        assert_eq!(ip_value(v6), "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff");
        assert_eq!(ip_value("10.0.0.1".parse().unwrap()), "10.0.0.1");
    }

    #[test]
    fn connection_tricks_cannot_remove_what_the_gateway_adds() {
        let mut h = map(&[
            (
                "connection",
                "x-mpg-user-id, X-Request-Id, x-forwarded-for, authorization, x-secret",
            ),
            ("connection", "keep-alive"),
            ("x-secret", "gone"),
            ("authorization", "Bearer mpg_x"),
            ("keep-alive", "timeout=5"),
            ("x-kept", "yes"),
        ]);
        sanitize_request(&mut h);
        let fwd = ForwardedFor {
            client_ip: "10.1.2.3".parse().unwrap(),
            proto: "https",
            host: Some("api.example"),
        };
        add_identity(
            &mut h,
            Some(&identity()),
            &fwd,
            &HeaderValue::from_static("rid"),
        );
        assert_eq!(h["x-mpg-user-id"], "alice");
        assert_eq!(h["x-request-id"], "rid");
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
        assert_eq!(h["x-forwarded-host"], "api.example");
        assert_eq!(h["x-kept"], "yes");
        for gone in ["connection", "x-secret", "authorization", "keep-alive"] {
            assert!(!h.contains_key(gone), "{gone} survived");
        }
    }

    #[test]
    fn underscore_spellings_and_method_overrides_are_removed() {
        let mut h = map(&[
            ("x_mpg_user_id", "mallory"),
            ("X-Mpg_Scopes", "*"),
            ("x_forwarded_for", "6.6.6.6"),
            ("x_real_ip", "6.6.6.6"),
            ("x-http-method-override", "DELETE"),
            ("x-method-override", "DELETE"),
            ("x-http-method", "DELETE"),
            ("x_http_method_override", "DELETE"),
            ("x-http-methods", "kept"),
            ("x-mpgx", "kept"),
            ("x-real-ip-note", "kept"),
        ]);
        sanitize_request(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-http-methods", "x-mpgx", "x-real-ip-note"]);
    }

    #[test]
    fn spoofed_identity_and_forwarding_headers_are_replaced() {
        let mut h = map(&[
            ("x-mpg-organization-id", "evil"),
            ("X-Mpg-Anything", "evil"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "http"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("host", "evil.example"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
        ]);
        sanitize_request(&mut h);
        assert!(h.is_empty(), "{h:?}");
        let fwd = ForwardedFor {
            client_ip: "127.0.0.1".parse().unwrap(),
            proto: "http",
            host: None,
        };
        add_identity(
            &mut h,
            Some(&identity()),
            &fwd,
            &HeaderValue::from_static("r"),
        );
        assert_eq!(h.get_all("x-mpg-organization-id").iter().count(), 1);
        assert_eq!(h["x-mpg-organization-id"], "acme");
        assert_eq!(h["x-mpg-key-id"], "key_1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert!(!h.contains_key("x-forwarded-host"));
    }

    #[test]
    fn unauthenticated_routes_get_no_identity_and_responses_lose_hop_headers() {
        let mut h = HeaderMap::new();
        let fwd = ForwardedFor {
            client_ip: "::1".parse().unwrap(),
            proto: "http",
            host: Some("h"),
        };
        add_identity(&mut h, None, &fwd, &HeaderValue::from_static("r"));
        assert!(!h.keys().any(|k| k.as_str().starts_with("x-mpg-")));
        let mut res = map(&[
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("retry-after", "7"),
            ("keep-alive", "1"),
        ]);
        sanitize_response(&mut res);
        assert_eq!(res.len(), 1);
        assert_eq!(res["retry-after"], "7");
    }
}
