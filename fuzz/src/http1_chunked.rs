//! The HTTP/1.1 body decoder (chunked, and by length), which frames both
//! request bodies and upstream responses: any bytes, cut into pieces
//! anywhere, give the same data, the same end and the same refusal as the
//! bytes at once, never a panic; the look-ahead check that the upstream
//! client runs on buffered bytes refuses exactly what decoding refuses.

use bytes::BytesMut;
use mpg_gateway::wire::{Decoder, Framing};

/// What decoding `pieces` one after another gives: the data, whether the
/// body ended, and whether the framing was refused.
fn decode<'a>(framing: Framing, pieces: impl Iterator<Item = &'a [u8]>) -> (Vec<u8>, bool, bool) {
    let mut d = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match d.decode(&mut buf) {
                Ok(Some(data)) => {
                    assert!(!data.is_empty(), "an empty piece of data");
                    out.extend_from_slice(&data);
                }
                Ok(None) => break,
                Err(_) => return (out, false, true),
            }
        }
        if d.is_done() {
            break;
        }
    }
    (out, d.is_done(), false)
}

/// One input.
pub fn run(data: &[u8]) {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    let framing = match control & 3 {
        0 => Framing::Length(u64::from(control >> 2)),
        _ => Framing::Chunked,
    };
    let whole = decode(framing, std::iter::once(input));
    // Refused at once exactly when the look-ahead check refuses.
    let checked = Decoder::new(framing).check(input);
    assert_eq!(checked.is_err(), whole.2, "check {checked:?}, decode {whole:?}");
    // Byte by byte, and in pieces whose sizes the control byte sets.
    let step = usize::from(control >> 2).max(1);
    for pieces in [input.chunks(1), input.chunks(step)] {
        let cut = decode(framing, pieces);
        assert_eq!(cut, whole, "split every {step} bytes");
    }
    if let Framing::Length(n) = framing {
        let n = n as usize;
        assert_eq!(whole.0, input[..n.min(input.len())]);
        assert_eq!(whole.1, input.len() >= n);
    }
}
