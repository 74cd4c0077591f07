//! The HTTP/1.1 request head parser: any bytes give a head, "incomplete" or
//! a refusal, never a panic; a head parses the same whether its bytes came
//! at once or in two pieces (the first byte picks the split); a head with
//! `Transfer-Encoding` keeps no `Content-Length`; and pipelined heads are
//! read one after another off the same buffer.

use bytes::BytesMut;
use mpg_gateway::wire::{parse_request_head, Framing, RequestHead};

/// A head's parts that must not depend on how its bytes arrived.
fn summary(head: &RequestHead) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {} {}",
        head.request.method(),
        head.request.uri(),
        head.request.version(),
        head.request.headers(),
        head.framing,
        head.keep_alive,
        head.expect_continue
    )
}

/// One input.
pub fn run(data: &[u8]) {
    let Some((&split, input)) = data.split_first() else {
        return;
    };
    // Whole.
    let mut whole = BytesMut::from(input);
    let at_once = parse_request_head(&mut whole);
    if let Ok(Some(head)) = &at_once {
        if head.framing == Framing::Chunked {
            assert!(!head.request.headers().contains_key("content-length"));
        }
        assert!(matches!(
            head.framing,
            Framing::Empty | Framing::Length(1..) | Framing::Chunked
        ));
    }
    // In two pieces: nothing before the second, then the same answer.
    let split = usize::from(split) * input.len() / 256;
    let mut buf = BytesMut::from(&input[..split]);
    let first = parse_request_head(&mut buf);
    let in_pieces = match first {
        Ok(None) => {
            buf.extend_from_slice(&input[split..]);
            parse_request_head(&mut buf)
        }
        // A refusal may come before the whole head has: then it must come
        // for the whole too.
        Err(e) => {
            assert!(at_once.is_err(), "refused a prefix: {e}, not the whole");
            return;
        }
        done => {
            buf.extend_from_slice(&input[split..]);
            done
        }
    };
    match (&at_once, &in_pieces) {
        (Ok(Some(a)), Ok(Some(b))) => {
            assert_eq!(summary(a), summary(b));
            assert_eq!(whole, buf, "the same bytes left after the head");
        }
        (Ok(None), Ok(None)) | (Err(_), Err(_)) => {}
        (a, b) => panic!("at once: {a:?}; in two pieces: {b:?}"),
    }
    // Pipelined heads after it (bodies aside), until one is refused or cut.
    for _ in 0..4 {
        match parse_request_head(&mut whole) {
            Ok(Some(_)) => {}
            _ => break,
        }
    }
}
