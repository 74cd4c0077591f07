//! What the request wrapper records of every request: its id (the client's
//! when sane, else a new one) and its bounded metric labels.
use super::stamp::RequestId;
use crate::http_core::fields::X_REQUEST_ID;
use crate::secret::looks_like_secret;

/// The client's `X-Request-Id` when it is sane (1–128 of `[A-Za-z0-9._:-]`,
/// not an `mpg_`/`mps_` secret), else a new one.
pub(super) fn request_id(headers: &http::HeaderMap) -> RequestId {
    if let Some(v) = headers.get(X_REQUEST_ID) {
        let b = v.as_bytes();
        // A client that sends its key as a request id must not get it logged and forwarded.
        if (1..=128).contains(&b.len())
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(c))
            && !looks_like_secret(b.iter().copied())
        {
            return RequestId::Client(v.clone());
        }
    }
    // 32 lowercase hex digits into a buffer on the stack: cheaper than
    // `format!` through `core::fmt`, for every request that brings no id of its own.
    let id: u128 = rand::random();
    let mut hex = [0u8; 32];
    hex::encode_to_slice(id.to_be_bytes(), &mut hex).expect("two digits a byte");
    RequestId::Made(hex)
}

/// Methods as bounded labels for metrics and the access log (anything
/// unusual is `OTHER`).
pub(super) fn method_label(m: &http::Method) -> &'static str {
    match m.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    }
}

/// Status codes as static label strings (no allocation per request): the
/// codes the gateway and typical upstreams give, else the class.
#[allow(clippy::match_overlapping_arm)] // exact codes first, then their class
pub(super) fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        201 => "201",
        204 => "204",
        301 => "301",
        302 => "302",
        304 => "304",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        409 => "409",
        413 => "413",
        429 => "429",
        431 => "431",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_request_ids_are_32_lowercase_hex_digits_and_differ() {
        let none = http::HeaderMap::new();
        let a = request_id(&none);
        let b = request_id(&none);
        for id in [&a, &b] {
            let s = id.as_str();
            assert_eq!(s.len(), 32, "{s}");
            assert!(
                s.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
                "{s}"
            );
        }
        assert_ne!(a, b);
    }
}
