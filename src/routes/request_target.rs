//! The request-target check of the pipeline's first stage: anything that two
//! parsers could read as two different paths is refused before routing.
use http::header::{HeaderValue, HOST};
use http::uri::Authority;
use http::{HeaderMap, Uri, Version};
use std::fmt;

/// Why a request target is refused (always 400). Never echoes the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestTargetError {
    /// Absolute-form, authority-form or `*` on HTTP/1.x.
    NotOriginForm,
    /// A `.` or `..` segment, alone or before `;` parameters.
    DotSegment,
    /// `//` or a trailing `/`.
    EmptySegment,
    /// `%2F`, `%5C` or a raw `\`.
    EncodedSeparator,
    /// `%2E` in any case.
    EncodedDot,
    /// A control byte, raw or encoded, or a byte outside visible ASCII.
    ControlOrInvalidByte,
    /// `%` not followed by two hex digits.
    BadPercentEncoding,
    /// No host named (HTTP/1.0 aside), two `Host` fields, a `Host` or
    /// `:authority` that is not a plain `host[:port]`, or (HTTP/2) a `host`
    /// that disagrees with `:authority`.
    BadHost,
}

impl fmt::Display for RequestTargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RequestTargetError::NotOriginForm => "the target must be a path (origin-form)",
            RequestTargetError::DotSegment => "the path has a . or .. segment (or ..; or .;)",
            RequestTargetError::EmptySegment => "the path has an empty segment (// or a trailing /)",
            RequestTargetError::EncodedSeparator => "the path has an encoded or backslash separator",
            RequestTargetError::EncodedDot => "the path has a percent-encoded dot",
            RequestTargetError::ControlOrInvalidByte => "the target has a control or non-ASCII byte",
            RequestTargetError::BadPercentEncoding => "the target has a malformed percent escape",
            RequestTargetError::BadHost => {
                "the Host header or :authority is missing, repeated or not a plain host[:port], or they disagree"
            }
        })
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes the escape starting at `bytes[i]` (a `%`).
fn escape(bytes: &[u8], i: usize) -> Result<u8, RequestTargetError> {
    match (
        bytes.get(i + 1).copied().and_then(hex),
        bytes.get(i + 2).copied().and_then(hex),
    ) {
        (Some(h), Some(l)) => Ok(h << 4 | l),
        _ => Err(RequestTargetError::BadPercentEncoding),
    }
}

/// Stage 1: refuse every ambiguous target. On HTTP/2 the scheme and authority
/// come from pseudo-headers and are expected; on HTTP/1.x only origin-form.
pub fn check_request_target(uri: &Uri, version: Version) -> Result<(), RequestTargetError> {
    let h2_or_later = version >= Version::HTTP_2;
    if !h2_or_later && (uri.scheme().is_some() || uri.authority().is_some()) {
        return Err(RequestTargetError::NotOriginForm);
    }
    let path = uri.path();
    if !path.starts_with('/') {
        return Err(RequestTargetError::NotOriginForm);
    }
    check_path(path)?;
    if let Some(q) = uri.query() {
        check_query(q)?;
    }
    Ok(())
}

/// Stage 1, the head: the host the request names, checked the same way
/// whichever field carries it (HTTP/1.1 `Host`, HTTP/2 `:authority` and
/// `host`): at most one `Host`, each value a plain `host[:port]` (no
/// userinfo, so a credential put there is refused before anything could
/// log or forward it), and on HTTP/2 an `:authority` and a `host` that name
/// the same authority (RFC 9113 §8.3.1; nginx answers 400 as well). A
/// request must name its host: HTTP/1.1 by `Host` (RFC 9112 §3.2), HTTP/2
/// by either field (nginx: "client sent neither"); only HTTP/1.0 may omit
/// it. Runs after [`check_request_target`]; reads headers only, no allocation.
/// (Framing is the HTTP/1.1 reader's: see `crate::h1`.)
pub fn check_head(
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
) -> Result<(), RequestTargetError> {
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(RequestTargetError::BadHost);
    }
    let host = match host {
        Some(v) if plain_authority(v.as_bytes()) => Some(v.as_bytes()),
        Some(_) => return Err(RequestTargetError::BadHost),
        None => None,
    };
    // Only an HTTP/2 request has an authority in its URI (stage 1 refuses
    // absolute-form on HTTP/1.x): its `:authority`.
    let authority = match uri.authority() {
        Some(a) if plain_authority(a.as_str().as_bytes()) => Some(a.as_str().as_bytes()),
        Some(_) => return Err(RequestTargetError::BadHost),
        None => None,
    };
    match (host, authority) {
        (None, None) if version != Version::HTTP_10 => Err(RequestTargetError::BadHost),
        (Some(host), Some(authority)) if !same_authority(host, authority, uri.scheme_str()) => {
            Err(RequestTargetError::BadHost)
        }
        _ => Ok(()),
    }
}

/// The host a request named, for `X-Forwarded-Host`: its `:authority`, else
/// its `Host`. Only for a request [`check_head`] passed, which makes both
/// plain and, when both are there, the same.
pub fn named_host<'a>(
    authority: Option<&'a Authority>,
    host: Option<&'a HeaderValue>,
) -> Option<&'a str> {
    match authority {
        Some(a) => Some(a.as_str()),
        None => host.and_then(|h| h.to_str().ok()),
    }
}

/// Whether two plain `host[:port]` values name the same authority after the
/// scheme-based normalization RFC 9113 §8.3.1 asks of an intermediary
/// (RFC 3986 §6.2.2-3): the host in any case, an empty port or the
/// scheme's default one the same as none.
fn same_authority(a: &[u8], b: &[u8], scheme: Option<&str>) -> bool {
    let default_port: &[u8] = match scheme {
        Some("https") => b"443",
        Some("http") => b"80",
        _ => b"",
    };
    // A plain value's port follows its last colon, unless that colon is
    // inside an IP literal.
    fn split(v: &[u8]) -> (&[u8], &[u8]) {
        match v.iter().rposition(|&b| b == b':') {
            Some(i) if !v[i..].contains(&b']') => (&v[..i], &v[i + 1..]),
            _ => (v, b""),
        }
    }
    let port = |p: &[u8]| p.is_empty() || p == default_port;
    let ((host_a, port_a), (host_b, port_b)) = (split(a), split(b));
    let same_port = port_a == port_b || (port(port_a) && port(port_b));
    host_a.eq_ignore_ascii_case(host_b) && same_port
}

/// Whether a `Host` value is exactly `host[:port]` (RFC 3986 §3.2.2-3):
/// a bracketed IP literal, or a name or IPv4 address of unreserved and
/// sub-delimiter characters; then at most a colon and digits. No userinfo,
/// path, list, space or percent-escape. Checked in place: parsing it into
/// an `http::uri::Authority` would copy it. Stricter than that parser (a
/// unit test pins that whatever this accepts, `Authority` accepts too).
fn plain_authority(value: &[u8]) -> bool {
    let (host, rest) = match value.first() {
        Some(b'[') => match value.iter().position(|&b| b == b']') {
            // An IP literal: hex digits, colons, dots (an embedded IPv4
            // address) and the `v` form's characters; at most 8 colons.
            Some(end) => {
                let literal = &value[1..end];
                let colons = literal.iter().filter(|&&b| b == b':').count();
                let ok = !literal.is_empty()
                    && colons <= 8
                    && literal
                        .iter()
                        .all(|&b| b.is_ascii_alphanumeric() || b":.-_~!$&'()*+;=".contains(&b));
                if !ok {
                    return false;
                }
                (&value[..=end], &value[end + 1..])
            }
            None => return false,
        },
        Some(_) => {
            let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
            (&value[..end], &value[end..])
        }
        None => return false,
    };
    let name_ok = host.first() == Some(&b'[')
        || (!host.is_empty()
            && host
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+;=".contains(&b)));
    let port_ok = match rest.split_first() {
        None => true,
        Some((b':', port)) => port.len() <= 5 && port.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    name_ok && port_ok
}

/// Whether every byte of `bytes` is visible ASCII and none is one of
/// `special`. Counted without an early exit, so that the compiler checks
/// whole vectors of bytes: most targets are plain, and for them this is the
/// whole check.
fn visible_except<const N: usize>(bytes: &[u8], special: [u8; N]) -> bool {
    bytes.iter().fold(true, |ok, &b| {
        ok & (b.wrapping_sub(0x21) < 0x5e) & special.iter().fold(true, |o, &s| o & (b != s))
    })
}

fn check_path(path: &str) -> Result<(), RequestTargetError> {
    if path == "/" {
        return Ok(());
    }
    let bytes = path.as_bytes();
    // No escape, backslash or dot: only an empty segment can be wrong.
    if visible_except(bytes, [b'%', b'\\', b'.']) {
        let double = bytes
            .iter()
            .zip(&bytes[1..])
            .fold(false, |found, (&a, &b)| found | ((a == b'/') & (b == b'/')));
        return match double || bytes.ends_with(b"/") {
            true => Err(RequestTargetError::EmptySegment),
            false => Ok(()),
        };
    }
    check_path_bytewise(path)
}

/// [`check_path`] a byte at a time, for a path with escapes, backslashes or
/// dots.
fn check_path_bytewise(path: &str) -> Result<(), RequestTargetError> {
    // Split as bytes: `str::split` with a char costs more on short paths.
    for bytes in path.as_bytes()[1..].split(|&b| b == b'/') {
        if bytes.is_empty() {
            return Err(RequestTargetError::EmptySegment);
        }
        // Tomcat, Jetty and Spring drop a segment's `;` parameters before
        // resolving dots, so `..;` (or `..%3B`) is a `..` to them.
        if matches!(before_parameters(bytes), b"." | b"..") {
            return Err(RequestTargetError::DotSegment);
        }
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => return Err(RequestTargetError::EncodedSeparator),
                b'%' => {
                    match escape(bytes, i)? {
                        b'/' | b'\\' => return Err(RequestTargetError::EncodedSeparator),
                        b'.' => return Err(RequestTargetError::EncodedDot),
                        // Control bytes, DEL, and anything non-ASCII (overlong UTF-8 tricks).
                        v if !(0x20..0x7F).contains(&v) => {
                            return Err(RequestTargetError::ControlOrInvalidByte)
                        }
                        _ => {}
                    }
                    i += 3;
                    continue;
                }
                0x21..=0x7E => {}
                _ => return Err(RequestTargetError::ControlOrInvalidByte),
            }
            i += 1;
        }
    }
    Ok(())
}

/// A segment up to its first `;`, raw or as `%3B` in either case.
fn before_parameters(segment: &[u8]) -> &[u8] {
    let mut i = 0;
    while i < segment.len() {
        match segment[i] {
            b';' => break,
            b'%' if segment[i + 1..].starts_with(b"3b") || segment[i + 1..].starts_with(b"3B") => {
                break
            }
            _ => i += 1,
        }
    }
    &segment[..i]
}

fn check_query(q: &str) -> Result<(), RequestTargetError> {
    let bytes = q.as_bytes();
    if visible_except(bytes, [b'%']) {
        return Ok(());
    }
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let v = escape(bytes, i)?;
                if v < 0x20 || v == 0x7F {
                    return Err(RequestTargetError::ControlOrInvalidByte);
                }
                i += 3;
                continue;
            }
            0x21..=0x7E => {}
            _ => return Err(RequestTargetError::ControlOrInvalidByte),
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(target: &str) -> Result<(), RequestTargetError> {
        check_request_target(&target.parse::<Uri>().unwrap(), Version::HTTP_11)
    }

    #[test]
    fn plain_targets_pass() {
        for ok in [
            "/",
            "/api/v1/clusters",
            "/api/v1/clusters?organization_id=acme",
            "/api/v1/api-keys/key_AbC123/revoke",
            "/api/v1/clust%65rs",
            "/api/v1/clusters;x=1",
            "/api/v1/clusters?q=a%20b&x=%2F",
            "/a/..b/c.d/.e",
            "/a/...;/b;x=..",
            "/a/x..;/b",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn every_ambiguous_form_is_refused() {
        use RequestTargetError::*;
        let cases = [
            ("/api/../clusters", DotSegment),
            ("/api/./clusters", DotSegment),
            ("/api/v1/..", DotSegment),
            ("/api/v1/clusters/..;", DotSegment),
            ("/api/v1/clusters/..;x=1", DotSegment),
            ("/api/v1/clusters/.;", DotSegment),
            ("/api/v1/..;/clusters", DotSegment),
            ("/api/v1/..%3B/clusters", DotSegment),
            ("/api/v1/..%3bjsessionid=1/x", DotSegment),
            ("/api//clusters", EmptySegment),
            ("/api/v1/clusters/", EmptySegment),
            ("//api", EmptySegment),
            ("/api/%2e%2e/clusters", EncodedDot),
            ("/api/%2E%2E/clusters", EncodedDot),
            ("/api/.%2e/clusters", EncodedDot),
            ("/api/%2e/clusters", EncodedDot),
            ("/api%2Fv1", EncodedSeparator),
            ("/api%2fv1", EncodedSeparator),
            ("/api%5Cv1", EncodedSeparator),
            ("/api%5cv1", EncodedSeparator),
            ("/api/%00", ControlOrInvalidByte),
            ("/api/%0a", ControlOrInvalidByte),
            ("/api/%7F", ControlOrInvalidByte),
            ("/api/%c0%ae%c0%ae/x", ControlOrInvalidByte),
            ("/api/%e2%80%ae", ControlOrInvalidByte),
            ("/api/%zz", BadPercentEncoding),
            ("/api/%2", BadPercentEncoding),
            ("/api?x=%0d%0a", ControlOrInvalidByte),
            ("/api?x=%g0", BadPercentEncoding),
            ("http://evil.example/api/v1/clusters", NotOriginForm),
            ("*", NotOriginForm),
        ];
        for (target, want) in cases {
            assert_eq!(check(target), Err(want), "{target}");
        }
    }

    #[test]
    fn backslashes_are_refused_when_the_parser_lets_them_through() {
        if let Ok(uri) = "/api\\v1".parse::<Uri>() {
            assert_eq!(
                check_request_target(&uri, Version::HTTP_11),
                Err(RequestTargetError::EncodedSeparator)
            );
        }
    }

    #[test]
    fn h2_targets_carry_scheme_and_authority() {
        let uri: Uri = "https://localhost:8443/api/v1/clusters?organization_id=a"
            .parse()
            .unwrap();
        assert_eq!(check_request_target(&uri, Version::HTTP_2), Ok(()));
        assert_eq!(
            check_request_target(&uri, Version::HTTP_11),
            Err(RequestTargetError::NotOriginForm)
        );
        let uri: Uri = "https://localhost:8443/api/../x".parse().unwrap();
        assert_eq!(
            check_request_target(&uri, Version::HTTP_2),
            Err(RequestTargetError::DotSegment)
        );
    }

    fn head(
        version: Version,
        target: &str,
        pairs: &[(&str, &str)],
    ) -> Result<(), RequestTargetError> {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        check_head(&target.parse::<Uri>().unwrap(), version, &h)
    }

    #[test]
    fn host_and_framing_must_be_unambiguous() {
        use RequestTargetError::*;
        let v11 = Version::HTTP_11;
        assert_eq!(head(v11, "/", &[("host", "api.example:8443")]), Ok(()));
        assert_eq!(head(Version::HTTP_10, "/", &[]), Ok(()));
        assert_eq!(head(v11, "/", &[]), Err(BadHost));
        for good in ["a", "127.0.0.1:80", "[::1]", "[::1]:8443", "a.b-c_d~e"] {
            assert_eq!(head(v11, "/", &[("host", good)]), Ok(()), "{good:?}");
        }
        for bad in [
            "",
            "a, b",
            "user@evil",
            "evil/x",
            "a b",
            "evil?x",
            "[::1",
            "a:1:2",
            "a:x",
            ":80",
            "a%20b",
            "[fe80::1%25eth0]",
            "[]",
            "[::1]x",
            "a[::1]",
            "a:123456",
            "a\tb",
        ] {
            assert_eq!(head(v11, "/", &[("host", bad)]), Err(BadHost), "{bad:?}");
        }
        assert_eq!(
            head(v11, "/", &[("host", "a"), ("host", "a")]),
            Err(BadHost)
        );
        let h2 = Version::HTTP_2;
        assert_eq!(head(h2, "http://a.example/x", &[]), Ok(()));
        assert_eq!(
            head(h2, "http://a.example/x", &[("host", "A.example")]),
            Ok(())
        );
        assert_eq!(
            head(h2, "http://a.example/x", &[("host", "b.example")]),
            Err(BadHost)
        );
    }

    #[test]
    fn authority_gets_the_host_check_and_must_agree_with_host() {
        use RequestTargetError::*;
        let h2 = Version::HTTP_2;
        // Whatever `Host` may not be, `:authority` may not be either
        // (those `http::Uri` parses at all).
        for bad in [
            "user@a.example",
            "mpg_secret@a.example",
            "user:pass@a.example:8443",
            "a,b",
            "a:x",
            "a:123456",
            ":80",
            "[::1]x",
            "[fe80::1%25eth0]",
        ] {
            let Ok(uri) = format!("http://{bad}/x").parse::<Uri>() else {
                panic!("{bad:?} does not parse as an authority");
            };
            assert_eq!(
                check_head(&uri, h2, &HeaderMap::new()),
                Err(BadHost),
                "{bad:?}"
            );
        }
        // A request names its host: by `:authority` or `host` on h2.
        assert_eq!(head(h2, "/x", &[]), Err(BadHost));
        assert_eq!(head(h2, "/x", &[("host", "a.example")]), Ok(()));
        assert_eq!(head(h2, "/x", &[("host", "u@a.example")]), Err(BadHost));
        // Scheme-based normalization: case, and an empty or default port.
        for (target, host) in [
            ("https://a.example/x", "a.example:443"),
            ("https://a.example:443/x", "A.EXAMPLE"),
            ("http://a.example:/x", "a.example:80"),
            ("http://[::1]:80/x", "[::1]"),
        ] {
            assert_eq!(
                head(h2, target, &[("host", host)]),
                Ok(()),
                "{target} {host}"
            );
        }
        for (target, host) in [
            ("https://a.example/x", "a.example:80"),
            ("http://a.example:8080/x", "a.example"),
            ("http://[::1]/x", "[::2]"),
            ("http://a.example/x", "a.example.evil"),
        ] {
            assert_eq!(
                head(h2, target, &[("host", host)]),
                Err(BadHost),
                "{target} {host}"
            );
        }
    }

    #[test]
    fn the_named_host_is_the_authority_else_the_host_field() {
        let uri: Uri = "https://a.example:8443/x".parse().unwrap();
        let host = http::HeaderValue::from_static("a.example:8443");
        assert_eq!(
            named_host(uri.authority(), Some(&host)),
            Some("a.example:8443")
        );
        assert_eq!(named_host(None, Some(&host)), Some("a.example:8443"));
        assert_eq!(named_host(None, None), None);
    }

    proptest! {
        #[test]
        fn the_plain_path_check_agrees_with_the_bytewise_one(s in "/[a-z/.%2eEfF\\\\ ~\x01\u{e9}]{0,24}") {
            prop_assume!(s != "/"); // answered before either
            prop_assert_eq!(check_path(&s), check_path_bytewise(&s), "{:?}", s);
        }

        /// Whatever the in-place check accepts, `http`'s parser accepts.
        #[test]
        fn plain_authority_is_no_looser_than_http(host in "[\\[\\]a-zA-Z0-9:.%@/?#,;=&!$'()*+_~ -]{0,24}") {
            if plain_authority(host.as_bytes()) {
                prop_assert!(http::uri::Authority::try_from(host.as_bytes()).is_ok(), "{:?}", host);
            }
        }

        #[test]
        fn check_head_never_panics(host in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut h = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_bytes(&host) {
                h.insert(HOST, v);
            }
            let uri: Uri = "http://a.example/x".parse().unwrap();
            let _ = check_head(&uri, Version::HTTP_2, &h);
            let _ = check_head(&Uri::from_static("/x"), Version::HTTP_11, &h);
        }

        #[test]
        fn never_panics_and_accepted_paths_have_no_dot_or_empty_segments(s in "/[ -~]{0,40}") {
            if let Ok(uri) = s.parse::<Uri>() {
                if check_request_target(&uri, Version::HTTP_11).is_ok() {
                    let path = uri.path();
                    if path != "/" {
                        for seg in path[1..].split('/') {
                            prop_assert!(!seg.is_empty() && seg != "." && seg != "..", "{}", path);
                            prop_assert!(!seg.to_ascii_lowercase().contains("%2e"), "{}", path);
                            prop_assert!(!seg.to_ascii_lowercase().contains("%2f"), "{}", path);
                        }
                    }
                }
            }
        }
    }
}
