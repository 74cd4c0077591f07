//! The PROXY protocol header reader (v1 text, v2 binary): any bytes give a
//! header, "more to come" or a refusal, never a panic; a header is never
//! longer than what arrived nor than the limit; and the answer does not
//! depend on how the bytes arrived: every prefix of a header is "more to
//! come", and what follows a header never changes it.
use mpg_gateway::wire::{parse_proxy_header, MAX_PROXY_HEADER};

/// One input.
pub fn run(data: &[u8]) {
    let whole = parse_proxy_header(data);
    let Ok(Some((len, source))) = whole else {
        if let Ok(None) = whole {
            // More to come: the reader asks for more while under the limit.
            assert!(data.len() < MAX_PROXY_HEADER || data.is_empty());
        }
        return;
    };
    assert!(len > 0 && len <= data.len() && len <= MAX_PROXY_HEADER, "{len}");
    // The header alone reads the same as the header with what follows.
    assert_eq!(parse_proxy_header(&data[..len]), Ok(Some((len, source))));
    // Every prefix of it (a few, for long ones) is "more to come".
    let step = (len / 64).max(1);
    for cut in (1..len).step_by(step) {
        assert_eq!(
            parse_proxy_header(&data[..cut]),
            Ok(None),
            "a {cut}-byte prefix of a {len}-byte header"
        );
    }
}
