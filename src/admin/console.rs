//! The web console: one page and its script and style sheet, embedded in
//! the binary and served under `/console/` on the admin listener. It reads
//! and changes the gateway only through `/admin/v1` with the admin token the
//! operator enters, so it holds no secret and no state of its own. Every
//! answer carries a Content-Security-Policy that allows nothing but this
//! origin's own files (no inline script or style, no framing).
use http::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use http::{Response, StatusCode};

use crate::error::GatewayError;
use crate::http_core::body::{self, Body};

/// Where the console lives on the admin listener.
pub(super) const PREFIX: &str = "/console";

/// The policy every console answer carries.
pub(super) const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// The embedded files: path under the listener, media type, contents.
const FILES: [(&str, &str, &str); 3] = [
    (
        "/console/",
        "text/html; charset=utf-8",
        include_str!("console/index.html"),
    ),
    (
        "/console/console.js",
        "text/javascript; charset=utf-8",
        include_str!("console/console.js"),
    ),
    (
        "/console/console.css",
        "text/css; charset=utf-8",
        include_str!("console/console.css"),
    ),
];

/// The answer to a GET or HEAD of `path` (which starts with [`PREFIX`]).
pub(super) fn serve(path: &str) -> Response<Body> {
    if path == PREFIX {
        let mut res = Response::new(body::empty());
        *res.status_mut() = StatusCode::PERMANENT_REDIRECT;
        res.headers_mut()
            .insert(LOCATION, HeaderValue::from_static("/console/"));
        return secured(res);
    }
    let Some((_, media, text)) = FILES.iter().find(|(p, ..)| *p == path) else {
        return secured(GatewayError::NotFound.into_response());
    };
    let mut res = Response::new(body::full(*text));
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(media));
    // Assets change with the binary: the browser asks again each time.
    res.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    secured(res)
}

/// `res` with the console's security fields.
fn secured(mut res: Response<Body>) -> Response<Body> {
    let h = res.headers_mut();
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_served_with_its_type_and_the_policy() {
        for (path, media, text) in FILES {
            let res = serve(path);
            assert_eq!(res.status(), 200, "{path}");
            assert_eq!(res.headers()[CONTENT_TYPE], media);
            assert_eq!(res.headers()[CONTENT_SECURITY_POLICY], POLICY);
            assert_eq!(res.headers()[X_FRAME_OPTIONS], "DENY");
            assert!(!text.is_empty());
        }
        assert_eq!(serve("/console").status(), 308);
        let missing = serve("/console/nope.js");
        assert_eq!(missing.status(), 404);
        assert_eq!(missing.headers()[CONTENT_SECURITY_POLICY], POLICY);
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let page = FILES[0].2;
        for inline in ["<script>", "style=", "onclick=", "javascript:"] {
            assert!(!page.contains(inline), "index.html holds {inline}");
        }
    }
}
