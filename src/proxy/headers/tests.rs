use super::*;

use std::net::IpAddr;

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

fn added<'a>(
    identity: Option<Identity<'a>>,
    forwarded: ForwardedFor<'a>,
    request_id: &'a HeaderValue,
) -> Added<'a> {
    Added {
        identity,
        forwarded,
        key_meta: None,
        request_id: request_id.as_bytes(),
        traceparent: None,
        signature: None,
    }
}

#[test]
fn a_scope_list_longer_than_the_stack_buffer_is_written_whole() {
    let long: Vec<String> = (0..40).map(|i| format!("scope-number-{i}:read")).collect();
    let mut id = identity();
    id.scopes = Scopes::listed(&long);
    let rid = HeaderValue::from_static("rid");
    let fwd = ForwardedFor {
        chain: "10.1.2.3",
        proto: "http",
        host: None,
    };
    let mut lines = Vec::new();
    added(Some(id), fwd, &rid).write_lines(&mut lines);
    let want = format!("x-mpg-scopes: {}\r\n", long.join(" "));
    assert!(want.len() > 256 + 16);
    assert!(String::from_utf8(lines).unwrap().contains(&want));
}

#[test]
fn the_written_lines_are_the_fields_added_to_a_map_and_bad_values_are_left_out() {
    let mut id = identity();
    id.user_id = "bad\r\nx-injected: 1";
    let rid = HeaderValue::from_static("rid");
    let fwd = || ForwardedFor {
        chain: "10.1.2.3",
        proto: "https",
        host: Some("api.example"),
    };
    let mut lines = Vec::new();
    added(Some(identity()), fwd(), &rid).write_lines(&mut lines);
    let mut map = HeaderMap::new();
    added(Some(identity()), fwd(), &rid).add_to(&mut map);
    let mut from_map = Vec::new();
    for (n, v) in &map {
        from_map.extend_from_slice(format!("{}: {}\r\n", n, v.to_str().unwrap()).as_bytes());
    }
    assert_eq!(
        String::from_utf8(lines).unwrap(),
        String::from_utf8(from_map).unwrap()
    );

    let mut lines = Vec::new();
    added(Some(id), fwd(), &rid).write_lines(&mut lines);
    let text = String::from_utf8(lines).unwrap();
    assert!(
        !text.contains("x-mpg-user-id") && !text.contains("injected"),
        "{text}"
    );
    assert!(text.contains("x-mpg-organization-id: acme\r\n"), "{text}");
}

proptest::proptest! {
    #[test]
    fn the_value_check_is_its_bytewise_definition(value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
        let bytewise = value.iter().all(|&b| (0x20..0x7f).contains(&b) || b == b'\t');
        proptest::prop_assert_eq!(valid_value(&value), bytewise);
    }
}

#[test]
fn header_values_are_visible_ascii_space_and_tab() {
    for ok in [&b""[..], b"acme", b"a b\tc", b"~!*:;/ ", &[0x20; 40]] {
        assert!(valid_value(ok), "{ok:?}");
    }
    for bad in [
        &b"a\rb"[..],
        b"\n",
        b"\x7f",
        b"caf\xc3\xa9",
        b"\0",
        &[0x1f; 40],
    ] {
        assert!(!valid_value(bad), "{bad:?}");
    }
    // One bad byte anywhere in a longer value.
    for at in 0..40 {
        for b in [b'\r', 0x7f, 0x80, 0xff, 0] {
            let mut v = [b'x'; 40];
            v[at] = b;
            assert!(!valid_value(&v), "{b:#x} at {at}");
        }
    }
}

static SCOPES: std::sync::LazyLock<Vec<String>> =
    std::sync::LazyLock::new(|| vec!["clusters:read".into(), "keys:read".into()]);

fn identity() -> Identity<'static> {
    Identity {
        organization_id: "acme",
        user_id: "alice",
        role: "owner",
        auth: "api_key",
        key_id: Some("key_1"),
        scopes: Scopes::listed(&SCOPES),
    }
}

#[test]
fn connection_close_and_keep_alive_name_nothing_else_but_other_tokens_still_count() {
    let mut h = map(&[
        ("connection", "Close, KEEP-ALIVE"),
        ("keep-alive", "timeout=5"),
        ("x-kept", "1"),
    ]);
    sanitize_request(&mut h, &[]);
    assert!(!h.contains_key("connection") && !h.contains_key("keep-alive"));
    assert_eq!(h["x-kept"], "1");
    let mut h = map(&[("connection", "close,  x-a ,,"), ("x-a", "1"), ("x-b", "2")]);
    sanitize_request(&mut h, &[]);
    assert!(!h.contains_key("x-a"));
    assert_eq!(h["x-b"], "2");
}

#[test]
fn client_addresses_of_both_families_become_header_values() {
    let v6: IpAddr = "2001:db8:ffff:ffff:ffff:ffff:255.255.255.255"
        .parse()
        .unwrap();
    let forwarded_for = |ip: IpAddr| {
        let rid = HeaderValue::from_static("r");
        let conn = crate::http_core::service::ConnInfo::new((ip, 1).into(), false);
        let fwd = ForwardedFor {
            chain: conn.source_ip(),
            proto: "http",
            host: None,
        };
        let mut h = HeaderMap::new();
        added(None, fwd, &rid).add_to(&mut h);
        h[X_FORWARDED_FOR].clone()
    };
    assert_eq!(forwarded_for(v6), "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff");
    assert_eq!(forwarded_for("10.0.0.1".parse().unwrap()), "10.0.0.1");
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
    sanitize_request(&mut h, &[]);
    let fwd = ForwardedFor {
        chain: "10.1.2.3",
        proto: "https",
        host: Some("api.example"),
    };
    let rid = HeaderValue::from_static("rid");
    added(Some(identity()), fwd, &rid).add_to(&mut h);
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
        ("proxy", "http://evil:1"),
        ("proxy-foo", "1"),
        ("proxy_bar", "2"),
        ("proxyish", "kept"),
        ("x-original-url", "/admin"),
        ("x_rewrite_url", "/admin"),
        ("true-client-ip", "6.6.6.6"),
        ("x-client-ip", "6.6.6.6"),
        ("client_ip", "6.6.6.6"),
        ("cf-connecting-ip", "6.6.6.6"),
        ("x-cluster-client-ip", "6.6.6.6"),
        ("client-ips", "kept"),
        ("cf-ray", "kept"),
        ("true-client", "kept"),
        ("content-type", "kept"),
    ]);
    sanitize_request(&mut h, &[]);
    let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(
        left,
        [
            "cf-ray",
            "client-ips",
            "content-type",
            "proxyish",
            "true-client",
            "x-http-methods",
            "x-mpgx",
            "x-real-ip-note"
        ]
    );
}

#[test]
fn fields_some_stacks_trust_are_removed_unless_the_route_keeps_one() {
    let fields = crate::http_core::fields::STACK_TRUSTED_FIELDS;
    let mut pairs: Vec<(String, &str)> = fields.iter().map(|f| (f.to_string(), "x")).collect();
    // Also spelled with `_`, and lookalikes that are not on the list.
    pairs.push(("x_middleware_subrequest".into(), "x"));
    pairs.push(("remote_user".into(), "x"));
    pairs.push(("x-original-uris".into(), "kept"));
    pairs.push(("referer".into(), "kept"));
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let mut h = map(&refs);
    sanitize_request(&mut h, &[]);
    let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(left, ["referer", "x-original-uris"]);
    // A route that keeps one keeps only that spelling of it.
    let mut h = map(&refs);
    sanitize_request(&mut h, &[HeaderName::from_static("x-original-uri")]);
    assert!(h.contains_key("x-original-uri"));
    assert!(
        !h.contains_key("x-middleware-subrequest") && !h.contains_key("x_middleware_subrequest")
    );
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
        ("x-request-id", "mpg_not_to_be_forwarded"),
    ]);
    sanitize_request(&mut h, &[]);
    assert!(h.is_empty(), "{h:?}");
    let fwd = ForwardedFor {
        chain: "127.0.0.1",
        proto: "http",
        host: None,
    };
    let rid = HeaderValue::from_static("r");
    added(Some(identity()), fwd, &rid).add_to(&mut h);
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
        chain: "::1",
        proto: "http",
        host: Some("h"),
    };
    let rid = HeaderValue::from_static("r");
    added(None, fwd, &rid).add_to(&mut h);
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
