//! The request-target checks and the router: any bytes that parse as a URI
//! must never panic; an accepted path has no dot, empty or encoded-separator
//! segment; routing it over the shipped route table never panics either.

use http::{HeaderMap, HeaderValue, Method, Uri, Version};
use mpg_gateway::routes::{check_head, check_request_target, RouteMatch, Router};
use std::sync::OnceLock;

fn router() -> &'static Router<usize> {
    static ROUTER: OnceLock<Router<usize>> = OnceLock::new();
    ROUTER.get_or_init(|| {
        let settings = crate::shipped_settings();
        let mut b = Router::builder();
        for (i, r) in settings.routes.iter().enumerate() {
            b.insert(r.method.clone(), &r.path, i)
                .expect("shipped routes insert");
        }
        b.build().expect("shipped routes build")
    })
}

/// One input.
pub fn run(data: &[u8]) {
    // First byte picks the version and method; the next line is a Host; the rest is the target.
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (host, target) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b""[..], rest),
    };
    let Ok(uri) = Uri::try_from(target) else {
        return;
    };
    let version = if selector & 1 == 0 {
        Version::HTTP_11
    } else {
        Version::HTTP_2
    };
    let method = match selector >> 1 & 3 {
        0 => Method::GET,
        1 => Method::POST,
        2 => Method::DELETE,
        _ => Method::PATCH,
    };
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_bytes(host) {
        headers.insert(http::header::HOST, v);
    }
    let _ = check_head(&uri, version, &headers);
    if check_request_target(&uri, version).is_err() {
        return;
    }
    let path = uri.path();
    if path != "/" {
        for seg in path[1..].split('/') {
            assert!(!seg.is_empty() && seg != "." && seg != "..", "{path}");
            let lower = seg.to_ascii_lowercase();
            assert!(!lower.contains("%2e") && !lower.contains("%2f") && !lower.contains("%5c"));
            assert!(!seg.contains('\\'));
        }
    }
    match router().at(&method, path) {
        RouteMatch::Found { params, .. } => {
            // A parameter is one whole segment, never a separator or a dot segment.
            for name in ["id"] {
                if let Some(v) = params.get(name) {
                    assert!(!v.is_empty() && !v.contains('/') && v != "." && v != "..");
                }
            }
        }
        RouteMatch::MethodNotAllowed { allow } => assert!(!allow.is_empty()),
        RouteMatch::NotFound => {}
    }
}
