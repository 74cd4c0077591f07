//! The message body decoder: a body framed by `Content-Length` or `chunked`
//! (extensions and trailers read, bounded and dropped), taken off the front
//! of a connection's buffer. The server decodes requests with it, the
//! upstream client responses.
use bytes::{Buf, Bytes, BytesMut};

use super::framing::Framing;

/// A chunk-size line (with its extensions) longer than this is refused.
const MAX_CHUNK_LINE: usize = 4096;
/// Chunk-extension bytes in one body at most (hyper's limit): extensions
/// are read and dropped, and a body of tiny chunks with long extensions
/// would otherwise cost the gateway far more than the data it carries.
const MAX_EXTENSIONS: usize = 16 * 1024;
/// Trailer bytes after the last chunk (read and dropped) at most, as hyper:
/// the section, its final empty line included, is shorter than this.
const MAX_TRAILERS: usize = 16 * 1024;
/// Trailer fields after the last chunk at most (hyper's limit).
const MAX_TRAILER_FIELDS: u32 = 100;

/// Decodes a message body (a request's here, a response's in the upstream
/// client) off the front of a connection's buffer.
#[derive(Debug, Clone)]
pub(crate) struct Decoder {
    state: State,
    /// Chunk-extension bytes seen so far in this body.
    extensions: usize,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    /// After the last chunk: trailer bytes and fields seen so far.
    Trailers(usize, u32),
    Done,
    /// Abandoned after an error: never done.
    Broken,
}

/// What the bytes at the front of the buffer are.
enum Step {
    /// Body data, this many bytes.
    Data(usize),
    /// Framing, this many bytes, to drop.
    Framing(usize),
    /// More bytes are needed, or the body is done or abandoned.
    Wait,
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
        };
        Decoder {
            state,
            extensions: 0,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Reads no further: the body is never done.
    pub(crate) fn abandon(&mut self) {
        self.state = State::Broken;
    }

    /// Abandoned after an error: the connection cannot be read further.
    pub(crate) fn is_broken(&self) -> bool {
        matches!(self.state, State::Broken)
    }

    /// The bytes still to come of a body framed by `Content-Length`.
    pub(crate) fn length_left(&self) -> Option<u64> {
        match self.state {
            State::Length(left) => Some(left),
            _ => None,
        }
    }

    /// The next piece of body in `buf`: `Some` data, or `None` when more
    /// bytes are needed or the body is done ([`Decoder::is_done`]).
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, &'static str> {
        loop {
            match self.step(buf)? {
                Step::Data(n) => return Ok(Some(buf.split_to(n).freeze())),
                Step::Framing(n) => buf.advance(n),
                Step::Wait => return Ok(None),
            }
        }
    }

    /// Checks the framing of the body bytes already in `buf` without taking
    /// them: an error there is found before anything of the message is
    /// passed on (the upstream client answers 502 for it, not a 200 whose
    /// body breaks off).
    pub(crate) fn check(&self, buf: &[u8]) -> Result<(), &'static str> {
        let mut d = self.clone();
        let mut at = 0;
        loop {
            match d.step(&buf[at..])? {
                Step::Data(n) | Step::Framing(n) => at += n,
                Step::Wait => return Ok(()),
            }
        }
    }

    /// Reads what the front of `buf` is, moving past it in the state (the
    /// caller takes the bytes).
    fn step(&mut self, buf: &[u8]) -> Result<Step, &'static str> {
        match &mut self.state {
            State::Done | State::Broken => Ok(Step::Wait),
            State::Length(left) | State::ChunkData(left) => {
                if buf.is_empty() {
                    return Ok(Step::Wait);
                }
                let take = (*left).min(buf.len() as u64);
                *left -= take;
                if *left == 0 {
                    self.state = match self.state {
                        State::Length(_) => State::Done,
                        _ => State::ChunkEnd,
                    };
                }
                Ok(Step::Data(take as usize))
            }
            State::ChunkSize => {
                let Some(line) = line_len(buf, MAX_CHUNK_LINE, "chunk size line too long")? else {
                    return Ok(Step::Wait);
                };
                let (size, extensions) = chunk_size(&buf[..line - 2])?;
                self.extensions += extensions;
                if self.extensions >= MAX_EXTENSIONS {
                    return Err("chunk extensions too long");
                }
                self.state = match size {
                    0 => State::Trailers(0, 0),
                    n => State::ChunkData(n),
                };
                Ok(Step::Framing(line))
            }
            State::ChunkEnd => {
                if buf.len() < 2 {
                    return Ok(Step::Wait);
                }
                if &buf[..2] != b"\r\n" {
                    return Err("chunk data not followed by CRLF");
                }
                self.state = State::ChunkSize;
                Ok(Step::Framing(2))
            }
            State::Trailers(seen, fields) => {
                let room = MAX_TRAILERS - 1 - *seen;
                let Some(line) = line_len(buf, room, "trailers too long")? else {
                    return Ok(Step::Wait);
                };
                if line == 2 {
                    self.state = State::Done;
                } else if *fields == MAX_TRAILER_FIELDS {
                    return Err("too many trailer fields");
                } else if !is_field_line(&buf[..line - 2]) {
                    return Err("invalid trailer field");
                } else {
                    self.state = State::Trailers(*seen + line, *fields + 1);
                }
                Ok(Step::Framing(line))
            }
        }
    }
}

/// The size a chunk-size line (without its CRLF) gives, and how many bytes
/// of extensions it has: `1*HEXDIG`, optional whitespace, then optional
/// `;` extensions, which are dropped unread (RFC 9112 §7.1; the whitespace
/// and the extension bytes as hyper takes them).
fn chunk_size(line: &[u8]) -> Result<(u64, usize), &'static str> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        // An empty size is not 0: read as the last chunk, it would end
        // the body early and leave the rest to be read as a request.
        return Err("chunk size without a hex digit");
    }
    let mut size = 0u64;
    for &b in &line[..digits] {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(digit)))
            .ok_or("chunk size too large")?;
    }
    let rest = &line[digits..];
    let blank = rest
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count();
    match &rest[blank..] {
        [] => Ok((size, 0)),
        [b';', extensions @ ..] if !extensions.contains(&b'\r') => Ok((size, extensions.len())),
        _ => Err("invalid chunk size line"),
    }
}

/// Whether a trailer line (without its CRLF) is a field line: a token, a
/// colon, then a value of visible bytes, spaces and tabs (as `httparse`
/// reads a header line).
fn is_field_line(line: &[u8]) -> bool {
    let name = line.iter().take_while(|&&b| is_tchar(b)).count();
    name > 0
        && line.get(name) == Some(&b':')
        && line[name + 1..]
            .iter()
            .all(|&b| b == b'\t' || (b >= b' ' && b != 0x7f))
}

/// A token character (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The length of the CRLF-terminated line at the front of `buf` (CRLF
/// included); `None` while incomplete. A bare LF, or no line end within
/// `max` bytes, is an error.
fn line_len(buf: &[u8], max: usize, too_long: &'static str) -> Result<Option<usize>, &'static str> {
    match buf.iter().take(max).position(|&b| b == b'\n') {
        Some(0) => Err("bare LF in chunked framing"),
        Some(lf) if buf[lf - 1] != b'\r' => Err("bare LF in chunked framing"),
        Some(lf) => Ok(Some(lf + 1)),
        None if buf.len() >= max => Err(too_long),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: Framing, input: &[u8]) -> Result<(Vec<u8>, bool), &'static str> {
        let mut d = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        // One byte at a time: every state must cope with a split anywhere.
        for &b in input {
            buf.extend_from_slice(&[b]);
            while let Some(data) = d.decode(&mut buf)? {
                out.extend_from_slice(&data);
            }
        }
        Ok((out, d.is_done()))
    }

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        let body = b"5;ext=1\r\nhello\r\n6 ;a=\"b c\"\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
        assert_eq!(
            decode_all(Framing::Chunked, body),
            Ok((b"hello world".to_vec(), true))
        );
        assert_eq!(
            decode_all(Framing::Length(5), b"hello"),
            Ok((b"hello".to_vec(), true))
        );
        assert_eq!(decode_all(Framing::Length(0), b"x"), Ok((Vec::new(), true)));
        assert_eq!(
            decode_all(Framing::Chunked, b"5\r\nhel"),
            Ok((b"hel".to_vec(), false))
        );
        // Leading zeros and upper-case hex; whitespace after the size.
        assert_eq!(
            decode_all(Framing::Chunked, b"0000A\t \r\n0123456789\r\n00\r\n\r\n"),
            Ok((b"0123456789".to_vec(), true))
        );
        let long = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert!(decode_all(Framing::Chunked, long.as_bytes()).is_err());
    }

    #[test]
    fn malformed_chunked_framing_is_an_error_wherever_it_is_split() {
        for bad in [
            &b"5;x\nhello\r\n0\r\n\r\n"[..],
            b"5\nhello\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"z\r\n",
            b"0\r\nX: a\n\r\n",
            // No hex digit: an empty size is not the last chunk.
            b"1\r\nA\r\n\r\n2\r\nBB\r\n0\r\n\r\n",
            b"\r\n",
            b";ext\r\n",
            b" 1\r\nA\r\n0\r\n\r\n",
            b"\t0\r\n\r\n",
            b"-1\r\n",
            b"+1\r\nA\r\n0\r\n\r\n",
            b"0x1\r\nA\r\n0\r\n\r\n",
            // Junk after the size, whitespace inside it, a bare CR.
            b"1 1\r\nA\r\n0\r\n\r\n",
            b"1x\r\nA\r\n0\r\n\r\n",
            b"1\rA\r\n0\r\n\r\n",
            b"1;a\rb\r\nA\r\n0\r\n\r\n",
            // Past 64 bits.
            b"10000000000000000\r\n",
            // Trailers that are not field lines.
            b"0\r\nno colon\r\n\r\n",
            b"0\r\n: empty name\r\n\r\n",
            b"0\r\nX : a\r\n\r\n",
            b"0\r\n folded\r\n\r\n",
            b"0\r\nX: a\x00b\r\n\r\n",
        ] {
            assert!(decode_all(Framing::Chunked, bad).is_err(), "{bad:?}");
            let mut whole = BytesMut::from(bad);
            let mut d = Decoder::new(Framing::Chunked);
            assert!(d.check(&whole).is_err(), "check {bad:?}");
            assert!(
                std::iter::from_fn(|| Some(d.decode(&mut whole)))
                    .take(64)
                    .any(|r| r.is_err()),
                "whole {bad:?}"
            );
        }
    }

    #[test]
    fn extensions_and_trailers_are_bounded_as_hyper_bounds_them() {
        // Extension bytes add up over the body: below 16 KiB in all.
        let chunks = |ext: usize, n: usize| -> Vec<u8> {
            let mut body = Vec::new();
            for _ in 0..n {
                body.extend_from_slice(format!("1;{}\r\nx\r\n", "e".repeat(ext)).as_bytes());
            }
            body.extend_from_slice(b"0\r\n\r\n");
            body
        };
        assert!(decode_all(Framing::Chunked, &chunks(4000, 4)).is_ok());
        assert!(decode_all(Framing::Chunked, &chunks(4000, 5)).is_err());
        // Trailer fields: at most 100, the section under 16 KiB.
        let trailers = |n: usize, len: usize| -> Vec<u8> {
            let mut body = b"0\r\n".to_vec();
            for i in 0..n {
                body.extend_from_slice(format!("X-{i}: {}\r\n", "v".repeat(len)).as_bytes());
            }
            body.extend_from_slice(b"\r\n");
            body
        };
        assert_eq!(
            decode_all(Framing::Chunked, &trailers(100, 1)),
            Ok((Vec::new(), true))
        );
        assert!(decode_all(Framing::Chunked, &trailers(101, 1)).is_err());
        assert!(decode_all(Framing::Chunked, &trailers(2, 8000)).is_ok());
        assert!(decode_all(Framing::Chunked, &trailers(3, 8000)).is_err());
    }

    #[test]
    fn check_reads_ahead_without_taking_anything() {
        let d = Decoder::new(Framing::Chunked);
        // Complete, partial and broken framing; the state is untouched.
        assert_eq!(d.check(b"5\r\nhello\r\n0\r\n\r\n"), Ok(()));
        assert_eq!(d.check(b"5\r\nhel"), Ok(()));
        assert!(d.check(b"5\r\nhello\r\n\r\n").is_err());
        assert_eq!(
            decode_all(Framing::Chunked, b"5\r\nhello\r\n0\r\n\r\n"),
            Ok((b"hello".to_vec(), true))
        );
    }
}
