//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` a request brings, and the one the gateway sends on.
use http::header::{HeaderMap, HeaderName};

/// `traceparent`
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`: passed on as it came when the `traceparent` is valid,
/// removed with an invalid one (the spec's rule: its state belongs to a
/// trace that is not continued).
pub(super) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The length of a version-00 `traceparent`.
const TRACEPARENT_LEN: usize = 55;

/// A valid incoming `traceparent`: the caller's trace and span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Parent {
    /// The trace the request belongs to.
    pub trace_id: [u8; 16],
    /// The caller's span, the gateway's server span's parent.
    pub span_id: [u8; 8],
    /// The caller sampled the trace (flag `01`).
    pub sampled: bool,
}

/// What a request's `traceparent` fields hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Incoming {
    /// None.
    Absent,
    /// One valid value: the caller's trace.
    Valid(Parent),
    /// One the spec calls invalid, or more than one.
    Invalid,
}

/// What the request's `traceparent` fields hold.
pub(super) fn parent_of(headers: &HeaderMap) -> Incoming {
    // The usual request brings none: a look at the names present is
    // cheaper than hashing this one to find it absent.
    if !headers.keys().any(|k| k.as_str() == "traceparent") {
        return Incoming::Absent;
    }
    let mut values = headers.get_all(TRACEPARENT).iter();
    let Some(first) = values.next() else {
        return Incoming::Absent;
    };
    if values.next().is_some() {
        return Incoming::Invalid;
    }
    match parse_traceparent(first.as_bytes()) {
        Some(p) => Incoming::Valid(p),
        None => Incoming::Invalid,
    }
}

/// Parses a `traceparent` value (Trace Context §3.2): version, trace id,
/// parent id and flags in lower-case hex. Version `ff` and all-zero ids are
/// invalid; a later version may carry more after a `-`, which is ignored.
pub(super) fn parse_traceparent(v: &[u8]) -> Option<Parent> {
    if v.len() < TRACEPARENT_LEN || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex::<1>(&v[0..2])?[0];
    match version {
        0xff => return None,
        0 if v.len() != TRACEPARENT_LEN => return None,
        _ if v.len() > TRACEPARENT_LEN && v[TRACEPARENT_LEN] != b'-' => return None,
        _ => {}
    }
    let trace_id = hex::<16>(&v[3..35])?;
    let span_id = hex::<8>(&v[36..52])?;
    let flags = hex::<1>(&v[53..55])?[0];
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// Lower-case hex digits into `N` bytes; upper case is invalid here.
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

thread_local! {
    /// The ids' generator: xoshiro (rand's `SmallRng`, as OpenTelemetry's
    /// SDK uses), seeded once per thread from the system's generator. Ids
    /// must be unique, not secret; a ChaCha draw per id would cost every
    /// traced request hundreds of instructions.
    static IDS: std::cell::RefCell<rand::rngs::SmallRng> =
        std::cell::RefCell::new(rand::make_rng());
}

/// A new trace id (never all zeros).
pub(super) fn new_trace_id() -> [u8; 16] {
    let id: u128 = IDS.with_borrow_mut(rand::RngExt::random);
    id.max(1).to_be_bytes()
}

/// A new span id (never all zeros).
pub(super) fn new_span_id() -> [u8; 8] {
    let id: u64 = IDS.with_borrow_mut(rand::RngExt::random);
    id.max(1).to_be_bytes()
}

/// The version-00 `traceparent` for `span_id` in `trace_id`.
pub(super) fn format_traceparent(
    trace_id: &[u8; 16],
    span_id: &[u8; 8],
    sampled: bool,
) -> [u8; 55] {
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
    lower_hex(trace_id, &mut out[3..35]);
    lower_hex(span_id, &mut out[36..52]);
    if sampled {
        out[54] = b'1';
    }
    out
}

/// Two lower-case hex digits a byte, from a table of every byte's pair:
/// every traced request writes 24 bytes so.
fn lower_hex(bytes: &[u8], out: &mut [u8]) {
    const PAIRS: [[u8; 2]; 256] = {
        let digits = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = [digits[i >> 4], digits[i & 15]];
            i += 1;
        }
        t
    };
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair.copy_from_slice(&PAIRS[usize::from(*b)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use std::collections::HashMap;

    /// What opentelemetry's own propagator makes of a value: the
    /// independent reading the parser is held to.
    fn sdk(value: &str) -> Option<Parent> {
        let carrier = HashMap::from([("traceparent".to_string(), value.to_string())]);
        let cx = TraceContextPropagator::new().extract(&carrier);
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| Parent {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            sampled: sc.is_sampled(),
        })
    }

    #[test]
    fn the_specs_example_parses() {
        let v = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = parse_traceparent(v).unwrap();
        assert_eq!(
            ::hex::encode(p.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(::hex::encode(p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(
            &format_traceparent(&p.trace_id, &p.span_id, true)[..],
            &v[..]
        );
    }

    #[test]
    fn invalid_values_are_refused_as_opentelemetry_refuses_them() {
        let cases = [
            // The spec's and the SDK's examples of invalid values.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "",
        ];
        for v in cases {
            assert_eq!(parse_traceparent(v.as_bytes()), None, "{v}");
            assert_eq!(sdk(v), None, "the SDK reads {v} as valid");
        }
        // Short fields: the spec wants exactly 32, 16 and 2 digits; the
        // SDK reads fewer as numbers with leading zeros, and trims spaces.
        for v in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
        ] {
            assert_eq!(parse_traceparent(v.as_bytes()), None, "{v}");
        }
    }

    #[test]
    fn valid_values_read_as_opentelemetry_reads_them() {
        let cases = [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03",
            // A later version: longer, the rest after a `-` ignored.
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        ];
        for v in cases {
            let ours = parse_traceparent(v.as_bytes());
            assert!(ours.is_some(), "{v}");
            assert_eq!(ours, sdk(v), "{v}");
        }
    }

    #[test]
    fn traceparents_are_written_as_the_hex_crate_writes_them() {
        for _ in 0..1000 {
            let (t, s) = (new_trace_id(), new_span_id());
            let want = format!("00-{}-{}-01", ::hex::encode(t), ::hex::encode(s));
            assert_eq!(&format_traceparent(&t, &s, true)[..], want.as_bytes());
            assert_eq!(
                parse_traceparent(want.as_bytes()).map(|p| (p.trace_id, p.span_id)),
                Some((t, s))
            );
        }
    }

    #[test]
    fn a_second_traceparent_makes_the_request_invalid() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = HeaderMap::new();
        assert_eq!(parent_of(&headers), Incoming::Absent);
        headers.append(TRACEPARENT, v.parse().unwrap());
        assert!(matches!(parent_of(&headers), Incoming::Valid(_)));
        headers.append(TRACEPARENT, v.parse().unwrap());
        assert_eq!(parent_of(&headers), Incoming::Invalid);
    }
}
