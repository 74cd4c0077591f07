//! The upstream client's response parser: any bytes give a response,
//! "incomplete" or a refusal, never a panic; the same in two pieces; a
//! response that is taken frames its body, and the body decodes (or is
//! refused) without a panic.

use bytes::BytesMut;
use mpg_gateway::wire::{parse_response_head, Decoder, Framing, ResponseHead};

fn summary(head: &ResponseHead) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {}",
        head.response.status(),
        head.response.version(),
        head.response.headers(),
        head.framing,
        head.keep_alive
    )
}

/// One input.
pub fn run(data: &[u8]) {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    let head_request = control & 1 == 1;
    let mut whole = BytesMut::from(input);
    let at_once = parse_response_head(&mut whole, head_request);
    let split = usize::from(control >> 1) * input.len() / 128;
    let mut buf = BytesMut::from(&input[..split.min(input.len())]);
    let in_pieces = match parse_response_head(&mut buf, head_request) {
        Ok(None) => {
            buf.extend_from_slice(&input[split.min(input.len())..]);
            parse_response_head(&mut buf, head_request)
        }
        Err(e) => {
            assert!(at_once.is_err(), "refused a prefix: {e}, not the whole");
            return;
        }
        done => {
            buf.extend_from_slice(&input[split.min(input.len())..]);
            done
        }
    };
    match (&at_once, &in_pieces) {
        (Ok(Some(a)), Ok(Some(b))) => assert_eq!(summary(a), summary(b)),
        (Ok(None), Ok(None)) | (Err(_), Err(_)) => {}
        (a, b) => panic!("at once: {a:?}; in two pieces: {b:?}"),
    }
    let Ok(Some(head)) = at_once else {
        return;
    };
    if head_request {
        assert_eq!(head.framing, Framing::Bodyless);
    }
    if let f @ (Framing::Length(_) | Framing::Chunked) = head.framing {
        let mut d = Decoder::new(f);
        while let Ok(Some(piece)) = d.decode(&mut whole) {
            assert!(!piece.is_empty());
        }
    }
}
