//! A rate limiter's [`Decision`] and the response fields it is written as.
//!
//! Always `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Unix seconds);
//! `Retry-After` on refusal. When `rate_limit.ietf_headers` is on, also the two fields of
//! the IETF draft "RateLimit header fields for HTTP" in its current form
//! (draft-ietf-httpapi-ratelimit-headers-08 to -10, Structured Field lists):
//!
//! ```text
//! RateLimit-Policy: "100-per-60s";q=100;w=60
//! RateLimit: "100-per-60s";r=99;t=1
//! ```
//!
//! `q` is the quota (bucket capacity), `w` the window in seconds (the policy's `per`), `r`
//! the whole requests remaining, and `t` the seconds until the bucket is full again (a
//! delta, unlike the absolute `X-RateLimit-Reset`). The policy item is named after its
//! quota, so the two fields refer to each other without any configuration names on the
//! hot path. Older drafts (-07 and before) used `limit=, remaining=, reset=` instead; we
//! follow the current draft only.

use std::cell::RefCell;
use std::io::Write;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;

use crate::http_core::fields::{field, Field};

/// A limiter's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed (if so, it has been counted).
    pub allowed: bool,
    /// Bucket capacity (`X-RateLimit-Limit`).
    pub limit: u32,
    /// Whole requests left now (`X-RateLimit-Remaining`), never negative.
    pub remaining: u32,
    /// Unix time in whole seconds (rounded up) at which the bucket is full again
    /// (`X-RateLimit-Reset`).
    pub reset_unix: u64,
    /// On refusal: whole seconds (rounded up, at least 1) until the next request would be
    /// allowed (`Retry-After`). `None` when allowed.
    pub retry_after_secs: Option<u64>,
    /// Whole seconds (rounded up) from now until the bucket is full again (the IETF
    /// `RateLimit` field's `t`).
    pub reset_after_secs: u64,
    /// The policy's period in whole seconds, rounded up, at least 1 (the IETF
    /// `RateLimit-Policy` field's `w`).
    pub window_secs: u64,
}

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

field!(F_LIMIT, X_RATELIMIT_LIMIT, b"x-ratelimit-limit: ");
field!(
    F_REMAINING,
    X_RATELIMIT_REMAINING,
    b"x-ratelimit-remaining: "
);
field!(F_RESET, X_RATELIMIT_RESET, b"x-ratelimit-reset: ");
field!(F_RETRY_AFTER, RETRY_AFTER, b"retry-after: ");
field!(F_POLICY, RATELIMIT_POLICY, b"ratelimit-policy: ");
field!(F_RATELIMIT, RATELIMIT, b"ratelimit: ");

/// A value of one of the fields, as [`Decision::each`] gives it.
enum Value<'a> {
    /// A number, with its slot in [`LAST`] (`None`: not cached).
    Number(Option<usize>, u64),
    /// Text formatted on the stack.
    Text(&'a [u8]),
}

impl Decision {
    /// The field names [`Decision::each`] gives, for `ietf` (Retry-After
    /// only on refusal).
    pub(crate) fn names(&self, ietf: bool) -> impl Iterator<Item = &'static HeaderName> {
        let refused = !self.allowed && self.retry_after_secs.is_some();
        [
            Some(&F_LIMIT),
            Some(&F_REMAINING),
            Some(&F_RESET),
            refused.then_some(&F_RETRY_AFTER),
            ietf.then_some(&F_POLICY),
            ietf.then_some(&F_RATELIMIT),
        ]
        .into_iter()
        .flatten()
        .map(|f| &f.name)
    }

    /// Each field in the order sent: X-RateLimit-Limit/-Remaining/-Reset
    /// always; Retry-After when refused; the IETF `RateLimit-Policy` and
    /// `RateLimit` fields when `ietf` (formatted into a stack buffer).
    fn each(&self, ietf: bool, mut field: impl FnMut(&'static Field, Value<'_>)) {
        field(&F_LIMIT, Value::Number(Some(0), self.limit.into()));
        field(&F_REMAINING, Value::Number(Some(1), self.remaining.into()));
        field(&F_RESET, Value::Number(Some(2), self.reset_unix));
        // An allowed request leaves Retry-After alone: an upstream's 409 or 429
        // passes through with its own.
        if let (false, Some(secs)) = (self.allowed, self.retry_after_secs) {
            field(&F_RETRY_AFTER, Value::Number(None, secs.max(1)));
        }
        if ietf {
            let mut buf = [0u8; 128];
            if let Some(n) = format_into(&mut buf, |w| {
                write!(
                    w,
                    "\"{}-per-{}s\";q={};w={}",
                    self.limit, self.window_secs, self.limit, self.window_secs
                )
            }) {
                field(&F_POLICY, Value::Text(&buf[..n]));
            }
            if let Some(n) = format_into(&mut buf, |w| {
                write!(
                    w,
                    "\"{}-per-{}s\";r={};t={}",
                    self.limit, self.window_secs, self.remaining, self.reset_after_secs
                )
            }) {
                field(&F_RATELIMIT, Value::Text(&buf[..n]));
            }
        }
    }

    /// Sets the fields in `headers`, replacing any earlier values (hyper's
    /// HTTP/2 server writes the map).
    ///
    /// Integers go through `HeaderValue::from` (itoa formatting, no `String`), and a
    /// value equal to the thread's last one for the field is shared ([`number`]).
    ///
    /// The fields that count down with every request (`X-RateLimit-Remaining`,
    /// and the IETF `RateLimit`, which carries the same number) are marked
    /// never to be indexed: HTTP/2's header compression then sends them as
    /// literals instead of adding a new value to the connection's table on
    /// each response (see the pipeline's stamp). The limit, the policy and the
    /// reset second repeat, and stay indexed.
    pub fn write_headers(&self, headers: &mut HeaderMap, ietf: bool) {
        self.each(ietf, |f, value| {
            let mut value = match value {
                Value::Number(Some(slot), n) => number(slot, n),
                Value::Number(None, n) => HeaderValue::from(n),
                Value::Text(text) => match HeaderValue::from_bytes(text) {
                    Ok(v) => v,
                    Err(_) => return,
                },
            };
            if std::ptr::eq(f, &F_REMAINING) || std::ptr::eq(f, &F_RATELIMIT) {
                value.set_sensitive(true);
            }
            headers.insert(f.name.clone(), value);
        });
    }

    /// Appends the fields as `name: value` lines (the HTTP/1.1 writer).
    pub(crate) fn write_lines(&self, out: &mut Vec<u8>, ietf: bool) {
        self.each(ietf, |f, value| {
            out.extend_from_slice(f.line);
            match value {
                Value::Number(_, n) => {
                    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes())
                }
                Value::Text(text) => out.extend_from_slice(text),
            }
            out.extend_from_slice(b"\r\n");
        });
    }
}

thread_local! {
    /// The last value made for each of the three `X-RateLimit-*` fields on this
    /// thread (0: limit, 1: remaining, 2: reset), with the number it says.
    static LAST: RefCell<[(u64, HeaderValue); 3]> =
        RefCell::new(std::array::from_fn(|_| (0, HeaderValue::from_static("0"))));
}

/// The header value saying `n`, for field `slot` of [`LAST`]. Consecutive
/// requests mostly repeat a field's number (the limit of their policy, the
/// reset second, a limit that never fires): the last value is then shared
/// (a reference count) instead of formatted into a new allocation.
fn number(slot: usize, n: u64) -> HeaderValue {
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        let (said, value) = &mut last[slot];
        if *said != n {
            *said = n;
            *value = HeaderValue::from(n);
        }
        value.clone()
    })
}

/// Runs `write` into `buf`; the length written. `None` only if the buffer
/// were too small, which the widest values (five 20-digit numbers) cannot
/// reach. What is written here (numbers, quotes, `-per-`, `;q=`) is always a
/// valid header value; the map form still checks it as it makes one.
fn format_into(
    buf: &mut [u8],
    write: impl FnOnce(&mut &mut [u8]) -> std::io::Result<()>,
) -> Option<usize> {
    let capacity = buf.len();
    let mut cursor: &mut [u8] = buf;
    write(&mut cursor).ok()?;
    Some(capacity - cursor.len())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn decision(allowed: bool) -> Decision {
        Decision {
            allowed,
            limit: 100,
            remaining: if allowed { 42 } else { 0 },
            reset_unix: 1_700_000_061,
            retry_after_secs: if allowed { None } else { Some(3) },
            reset_after_secs: 61,
            window_secs: 60,
        }
    }

    fn get<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
        h.get(name).map(|v| v.to_str().unwrap())
    }

    #[test]
    fn allowed_writes_the_three_headers_and_keeps_an_upstream_retry_after() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("9"));
        decision(true).write_headers(&mut h, false);
        assert_eq!(get(&h, "x-ratelimit-limit"), Some("100"));
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("42"));
        assert_eq!(get(&h, "x-ratelimit-reset"), Some("1700000061"));
        assert_eq!(get(&h, "retry-after"), Some("9"));
        assert_eq!(get(&h, "ratelimit"), None);
        assert_eq!(h.len(), 4);
    }

    #[test]
    fn the_fields_that_count_down_are_never_indexed_and_the_rest_are() {
        let mut h = HeaderMap::new();
        decision(false).write_headers(&mut h, true);
        let sensitive: Vec<&str> = h
            .iter()
            .filter(|(_, v)| v.is_sensitive())
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(sensitive, ["x-ratelimit-remaining", "ratelimit"]);
        assert_eq!(h.len(), 6);
    }

    #[test]
    fn each_decision_says_its_own_numbers_when_values_repeat_and_change() {
        let mut seen = Vec::new();
        for (limit, remaining, reset) in [
            (100, 42, 7),
            (100, 41, 7),
            (5, 41, 8),
            (0, 0, 0),
            (100, 42, 7),
        ] {
            let d = Decision {
                limit,
                remaining,
                reset_unix: reset,
                ..decision(true)
            };
            let mut h = HeaderMap::new();
            d.write_headers(&mut h, false);
            seen.push((
                get(&h, "x-ratelimit-limit").unwrap().to_string(),
                get(&h, "x-ratelimit-remaining").unwrap().to_string(),
                get(&h, "x-ratelimit-reset").unwrap().to_string(),
            ));
            assert_eq!(
                seen.last().unwrap(),
                &(limit.to_string(), remaining.to_string(), reset.to_string())
            );
        }
    }

    #[test]
    fn the_written_lines_are_the_fields_set_in_a_map() {
        for (allowed, ietf) in [(true, false), (true, true), (false, false), (false, true)] {
            let d = decision(allowed);
            let mut lines = Vec::new();
            d.write_lines(&mut lines, ietf);
            let mut map = HeaderMap::new();
            d.write_headers(&mut map, ietf);
            let from_map: String = map
                .iter()
                .map(|(n, v)| format!("{}: {}\r\n", n, v.to_str().unwrap()))
                .collect();
            assert_eq!(String::from_utf8(lines).unwrap(), from_map);
            let names: Vec<_> = d.names(ietf).collect();
            assert_eq!(names, map.keys().collect::<Vec<_>>());
        }
    }

    #[test]
    fn refused_adds_retry_after() {
        let mut h = HeaderMap::new();
        decision(false).write_headers(&mut h, false);
        assert_eq!(get(&h, "retry-after"), Some("3"));
        assert_eq!(get(&h, "x-ratelimit-remaining"), Some("0"));
    }

    #[test]
    fn ietf_fields_follow_the_current_draft() {
        let mut h = HeaderMap::new();
        decision(true).write_headers(&mut h, true);
        assert_eq!(
            get(&h, "ratelimit-policy"),
            Some("\"100-per-60s\";q=100;w=60")
        );
        assert_eq!(get(&h, "ratelimit"), Some("\"100-per-60s\";r=42;t=61"));
    }

    #[test]
    fn widest_values_fit() {
        let mut d = decision(false);
        d.limit = u32::MAX;
        d.remaining = u32::MAX;
        d.window_secs = u64::MAX;
        d.reset_after_secs = u64::MAX;
        let mut h = HeaderMap::new();
        d.write_headers(&mut h, true);
        assert!(h.contains_key("ratelimit"));
        assert!(h.contains_key("ratelimit-policy"));
    }
}
