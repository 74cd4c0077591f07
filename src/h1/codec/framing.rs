//! What a head says of its body: the framing, and the `Content-Length`,
//! `Transfer-Encoding` and `Connection` values it is read from (RFC 9112
//! §6), as hyper reads them. The server reads a request's, the client a
//! response's.

/// How a message body is framed by its head: by neither field (or a
/// length of 0), a `Content-Length`, or `chunked`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
}

/// The largest length a body may declare (hyper's bound).
const MAX_LENGTH: u64 = u64::MAX - 2;

/// A request's `Content-Length` value: digits only, as hyper's server reads
/// it. A list (`5, 5`) is refused, as hyper and nginx do: RFC 9110 §8.6
/// lets a recipient either reject it or take the one value, and a proxy
/// that takes it passes on a length its client never framed by itself.
pub(crate) fn parse_request_length(value: &[u8]) -> Option<u64> {
    digits(value)
}

/// A response's `Content-Length` value: digits, or a list of equal values
/// (RFC 9110 §8.6), as hyper's client reads it.
pub(crate) fn parse_length(value: &[u8]) -> Option<u64> {
    let mut found = None;
    for part in value.split(|&b| b == b',') {
        let n = digits(part.trim_ascii())?;
        match found {
            Some(prev) if prev != n => return None,
            _ => found = Some(n),
        }
    }
    found
}

/// `1*DIGIT` as a length no larger than [`MAX_LENGTH`].
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let mut n = 0u64;
    for &d in value {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    (n <= MAX_LENGTH).then_some(n)
}

/// `chunked` must be the last transfer coding (RFC 9112 §6.3): of a request
/// here, of a response in the upstream client. A value with bytes outside
/// ASCII names no coding hyper knows: not chunked.
pub(crate) fn ends_in_chunked(value: &[u8]) -> bool {
    value.is_ascii()
        && value
            .rsplit(|&b| b == b',')
            .next()
            .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Whether a comma-separated header value holds `token` (case-insensitive).
/// A value with bytes outside ASCII holds none, as hyper reads it.
pub(crate) fn has_token(value: &[u8], token: &str) -> bool {
    value.is_ascii()
        && value
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_parsing_is_strict() {
        let request = |s: &'static str| parse_request_length(s.as_bytes());
        let response = |s: &'static str| parse_length(s.as_bytes());
        for (v, want) in [
            ("0", Some(0)),
            ("42", Some(42)),
            ("0000000000000000000000042", Some(42)),
            ("18446744073709551613", Some(u64::MAX - 2)),
        ] {
            assert_eq!(request(v), want, "{v:?}");
            assert_eq!(response(v), want, "{v:?}");
        }
        // A response's list of equal values is one value.
        assert_eq!(response(" 7 ,7"), Some(7));
        assert_eq!(request("7,7"), None);
        for bad in [
            "",
            "+5",
            "-5",
            "5 5",
            "0x5",
            "7,8",
            "7,",
            "18446744073709551614",
            "18446744073709551616000",
        ] {
            assert_eq!(request(bad), None, "{bad:?}");
            assert_eq!(response(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_value_with_bytes_outside_ascii_holds_no_token() {
        assert!(has_token(b"te, Close", "close"));
        assert!(!has_token(b"close, \x80", "close"));
        assert!(!has_token(b"closed", "close"));
    }

    #[test]
    fn only_an_ascii_value_ending_in_chunked_is_chunked() {
        assert!(ends_in_chunked(b"gzip, Chunked"));
        assert!(ends_in_chunked(b"chunked "));
        for not in [&b"chunked, gzip"[..], b"xchunked", b"", b"\xe9, chunked"] {
            assert!(!ends_in_chunked(not), "{not:?}");
        }
    }
}
