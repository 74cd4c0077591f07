//! The hop-by-hop fields (RFC 9110 §7.6.1): the fixed set, and the names a
//! `Connection` field lists. Each hop of a proxy reads and drops them: the
//! forwarding rules for a request, the upstream client for a response.
use http::header::{HeaderMap, HeaderName, CONNECTION};

/// Hop-by-hop headers (RFC 9110 §7.6.1 and the usual proxy extras), as parsed
/// names so removing them costs no parsing per request.
pub(crate) static HOP_BY_HOP: [HeaderName; 9] = [
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

/// [`HOP_BY_HOP`]'s names as bytes, in the same order (a test checks):
/// compared by length first, without `HeaderName::as_str`'s lookup per
/// candidate.
static HOP_BY_HOP_TEXT: [&[u8]; 9] = [
    b"connection",
    b"keep-alive",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"proxy-connection",
    b"proxy-authenticate",
    b"proxy-authorization",
];

/// Bit `n` set: some name in [`HOP_BY_HOP`] is `n` bytes long (a test
/// checks). Most names are ruled out by their length alone.
const HOP_BY_HOP_LENGTHS: u32 = 1 << 2 | 1 << 7 | 1 << 10 | 1 << 16 | 1 << 17 | 1 << 18 | 1 << 19;

/// The field names a `Connection` value lists beyond the fixed hop-by-hop
/// set (`keep-alive` is in it; `close` names no field).
pub(crate) fn connection_named(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case(b"keep-alive")
                && !t.eq_ignore_ascii_case(b"close")
        })
}

/// Where a field name (any case) is in [`HOP_BY_HOP`], if it is.
fn hop_by_hop_index(name: &[u8]) -> Option<usize> {
    let len = name.len();
    if len >= 32 || HOP_BY_HOP_LENGTHS & (1 << len) == 0 {
        return None;
    }
    HOP_BY_HOP_TEXT
        .iter()
        .position(|h| h.len() == len && h.eq_ignore_ascii_case(name))
}

/// The hop-by-hop name a field name (any case) is, if it is one.
pub(crate) fn hop_by_hop_name(name: &[u8]) -> Option<&'static HeaderName> {
    hop_by_hop_index(name).map(|i| &HOP_BY_HOP[i])
}

/// Which of [`HOP_BY_HOP`] are in `headers` (bit `i` for entry `i`): a look
/// at the few names present, cheaper than hashing each hop-by-hop name for a
/// removal that usually finds nothing.
pub(crate) fn hop_by_hop_present(headers: &HeaderMap) -> u16 {
    let mut present = 0;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name.as_str().as_bytes()) {
            present |= 1 << i;
        }
    }
    present
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hop_by_hop_texts_are_the_names_in_order() {
        for (name, text) in HOP_BY_HOP.iter().zip(HOP_BY_HOP_TEXT) {
            assert_eq!(name.as_str().as_bytes(), text);
        }
    }

    #[test]
    fn every_hop_by_hop_length_is_in_the_length_mask() {
        for name in &HOP_BY_HOP {
            let len = name.as_str().len();
            assert!(len < 32 && HOP_BY_HOP_LENGTHS & (1 << len) != 0, "{name}");
        }
    }
}
