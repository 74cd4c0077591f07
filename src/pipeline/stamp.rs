//! What the pipeline stamps on every reply: `X-Request-Id`, and a
//! rate-limited route's fields ([`ReplyStamp`]).
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use crate::http_core::fields::{F_REQUEST_ID, X_REQUEST_ID};
use crate::http_core::service::Stamp;
use crate::ratelimit::Decision;

/// `X-Credits-Remaining`: what a key with credits has left.
static X_CREDITS_REMAINING: HeaderName = HeaderName::from_static("x-credits-remaining");

/// A request's id (`X-Request-Id`): the client's when it is sane, else 32
/// hex digits the gateway made, held inline (no allocation per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestId {
    /// Made by the gateway: lowercase hex digits.
    Made([u8; 32]),
    /// The client's (checked: `[A-Za-z0-9._:-]`, 1–128 bytes).
    Client(HeaderValue),
}

impl RequestId {
    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Made(hex) => hex,
            RequestId::Client(v) => v.as_bytes(),
        }
    }

    /// The id as text (for logs; `-` if it were not ASCII, which neither
    /// kind can be).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("-")
    }

    /// The id as a header value (the client's is moved, not copied).
    pub fn into_header_value(self) -> HeaderValue {
        match self {
            RequestId::Made(hex) => {
                HeaderValue::from_bytes(&hex).unwrap_or_else(|_| HeaderValue::from_static("0"))
            }
            RequestId::Client(v) => v,
        }
    }
}

/// The fields the gateway stamps on a response: `X-Request-Id`, and a
/// rate-limited route's fields. They replace any field of the same name the
/// response has (the target's, the key service's).
#[derive(Debug, Default)]
pub struct ReplyStamp {
    /// `X-Request-Id`.
    pub request_id: Option<RequestId>,
    /// The route's rate-limit decision.
    pub decision: Option<Decision>,
    /// `X-Credits-Remaining`, for a key that has credits.
    pub credits: Option<u64>,
    /// With the IETF draft fields (`rate_limit.ietf_headers`).
    pub ietf: bool,
}

impl Stamp for ReplyStamp {
    fn names(&self) -> impl Iterator<Item = &'static HeaderName> + '_ {
        let rate = self.decision.iter().flat_map(|d| d.names(self.ietf));
        let id = self.request_id.is_some().then_some(&F_REQUEST_ID.name);
        let credits = self.credits.is_some().then_some(&X_CREDITS_REMAINING);
        rate.chain(id).chain(credits)
    }

    fn write_lines(&self, out: &mut Vec<u8>) {
        if let Some(d) = &self.decision {
            d.write_lines(out, self.ietf);
        }
        if let Some(id) = &self.request_id {
            out.extend_from_slice(F_REQUEST_ID.line);
            out.extend_from_slice(id.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(n) = self.credits {
            out.extend_from_slice(b"x-credits-remaining: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The request id differs on every response: it is marked never to be
    /// indexed, so that HTTP/2's header compression sends it as a literal
    /// instead of adding it to the connection's table, where each new id
    /// would evict the fields that repeat (the content type, the limit) and
    /// cost a search of the ids before it.
    fn add_to(self, headers: &mut HeaderMap) {
        if let Some(d) = &self.decision {
            d.write_headers(headers, self.ietf);
        }
        if let Some(id) = self.request_id {
            let mut id = id.into_header_value();
            id.set_sensitive(true);
            headers.insert(X_REQUEST_ID, id);
        }
        if let Some(n) = self.credits {
            headers.insert(X_CREDITS_REMAINING.clone(), HeaderValue::from(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::decision_for_tests as decision;

    #[test]
    fn a_stamped_request_id_is_never_indexed() {
        let stamp = ReplyStamp {
            request_id: Some(RequestId::Made([b'a'; 32])),
            decision: Some(decision(true)),
            credits: None,
            ietf: false,
        };
        let mut h = HeaderMap::new();
        stamp.add_to(&mut h);
        assert!(h["x-request-id"].is_sensitive());
        assert!(!h["x-ratelimit-limit"].is_sensitive());
    }

    #[test]
    fn the_lines_and_the_map_say_the_same_fields() {
        let stamp = || ReplyStamp {
            request_id: Some(RequestId::Client(HeaderValue::from_static("ours"))),
            decision: Some(decision(false)),
            credits: Some(7),
            ietf: true,
        };
        let mut lines = Vec::new();
        stamp().write_lines(&mut lines);
        let mut map = HeaderMap::new();
        stamp().add_to(&mut map);
        let from_map: String = map
            .iter()
            .map(|(n, v)| format!("{n}: {}\r\n", v.to_str().unwrap()))
            .collect();
        let mut a: Vec<&str> = std::str::from_utf8(&lines).unwrap().split("\r\n").collect();
        let mut b: Vec<&str> = from_map.split("\r\n").collect();
        a.sort();
        b.sort();
        assert_eq!(a, b);
        let names: Vec<&str> = stamp().names().map(|n| n.as_str()).collect();
        assert_eq!(names.len(), map.len());
        assert!(names.iter().all(|n| map.contains_key(*n)));
    }
}
