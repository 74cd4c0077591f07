//! The response head from a target: parsed off the connection's buffer
//! (interim 1xx heads dropped), its end-to-end fields kept as they arrived
//! for relaying (`http::relayed`), and its body's framing as RFC 9112 says
//! (the body itself is `incoming`).
use bytes::{Buf, BytesMut};
use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, Response, StatusCode, Version};
use std::mem::MaybeUninit;

use super::error::ClientError;
use super::incoming::{BodyFraming, Incoming, Kind};
use crate::h1::codec::{ends_in_chunked, has_token, parse_length, Framing};
use crate::http_core::hop_by_hop::{connection_named, hop_by_hop_name};
use crate::http_core::relayed::{FieldAt, RelayedFields};

/// Response header fields at most.
const MAX_HEADERS: usize = 128;
/// Fields most response heads stay within: parsed with a table this size
/// first, the full one only for a head with more (a table is zeroed for
/// every head parsed).
const FEW_HEADERS: usize = 24;
/// What [`parse_one`] says of a head with more fields than its table.
const TOO_MANY_FIELDS: &str = "too many header fields";

/// A complete response head at the front of the buffer.
struct Head {
    status: u16,
    version: Version,
    /// Its length in bytes.
    len: usize,
    /// How many fields `FieldAt`s were written for.
    fields: usize,
}

/// A response taken off the front of `buf`: its head (values share the
/// bytes read), how its body is framed, and whether the connection may carry
/// another request. `None` while the head is incomplete. Interim (1xx) heads
/// before it are dropped; a `101` is refused (no upgrades are tunnelled).
pub(crate) fn take_response(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<(Response<Incoming>, BodyFraming, bool)>, ClientError> {
    if buf.is_empty() {
        // Before the first read of every exchange: no table to zero, no parse.
        return Ok(None);
    }
    with_final_head(buf, |buf, head| {
        head.map(|(h, at)| response(buf, h, at, head_request))
            .transpose()
    })
}

/// Runs `then` on the final head at the front of `buf` (see [`final_head`]),
/// if complete, with its fields' positions: found with a small table first,
/// the full one only for a head with more fields.
fn with_final_head<R>(
    buf: &mut BytesMut,
    then: impl FnOnce(&mut BytesMut, Option<(Head, &[FieldAt])>) -> Result<R, ClientError>,
) -> Result<R, ClientError> {
    // On the stack of this function, never in a future: no allocation per
    // response for the field positions.
    let mut few = [[0u32; 4]; FEW_HEADERS];
    match final_head(buf, &mut few) {
        Err(ClientError::Invalid(TOO_MANY_FIELDS)) => {
            let mut all = [[0u32; 4]; MAX_HEADERS];
            let head = final_head(buf, &mut all)?;
            then(buf, head.map(|h| (h, &all[..])))
        }
        head => {
            let head = head?;
            then(buf, head.map(|h| (h, &few[..])))
        }
    }
}

/// The response whose head `h` (fields at `at`) is at the front of `buf`:
/// its end-to-end fields relayed as they are (hop-by-hop ones and those
/// `Connection` names left out), but `Content-Length`, which is the body's
/// size or in the header map.
fn response(
    buf: &mut BytesMut,
    h: Head,
    at: &[FieldAt],
    head_request: bool,
) -> Result<(Response<Incoming>, BodyFraming, bool), ClientError> {
    let head = buf.split_to(h.len).freeze();
    let status =
        StatusCode::from_u16(h.status).map_err(|_| ClientError::Invalid("invalid status code"))?;
    let fields = &at[..h.fields];
    let facts = Facts::read(&head, fields);
    let (framing, keep_alive) = framing(&facts, status, h.version, head_request)?;
    // A body read to its length says that length itself (its exact size
    // hint, which both servers write as `Content-Length`): the map then
    // stays empty, which allocates nothing. A length without such a body
    // (a `HEAD` answer, 304, a length of 0, which hyper's HTTP/2 server
    // would not write for an ended body) is passed on as it came. Beside a
    // transfer coding a length is not the body's (RFC 9112 §6.3): not
    // passed on, since the body is decoded and framed anew.
    let said_by_body =
        matches!(framing, BodyFraming::Known(Framing::Length(n)) if facts.length == Some(n));
    let mut headers = HeaderMap::new();
    if let Some([vs, ve]) = facts
        .length_at
        .filter(|_| facts.last_coding.is_none() && !said_by_body)
    {
        let value = HeaderValue::from_maybe_shared(head.slice(vs as usize..ve as usize))
            .map_err(|_| ClientError::Invalid("invalid Content-Length"))?;
        headers.insert(CONTENT_LENGTH, value);
    }
    let relayed = (facts.relay != 0).then(|| {
        let at = fields
            .iter()
            .enumerate()
            .filter(|&(i, _)| facts.relay & (1 << i) != 0)
            .map(|(_, at)| *at);
        RelayedFields::new(head, at)
    });
    let mut res = Response::new(Incoming {
        kind: Kind::Empty,
        relayed,
    });
    *res.status_mut() = status;
    *res.version_mut() = h.version;
    *res.headers_mut() = headers;
    Ok((res, framing, keep_alive))
}

/// What a response head's framing fields say, and which of its fields are
/// relayed, read in one walk over its fields (their names in any case).
struct Facts<'a> {
    /// Bit `i`: field `i` is relayed (not hop-by-hop, not named by
    /// `Connection`, not `Content-Length`, which the header map carries).
    /// A head has at most `MAX_HEADERS` (128) fields.
    relay: u128,
    /// `Connection` holds `close`.
    close: bool,
    /// The last `Transfer-Encoding` value.
    last_coding: Option<&'a [u8]>,
    /// The length all `Content-Length` fields agree on.
    length: Option<u64>,
    /// Where the first `Content-Length` value lies.
    length_at: Option<[u32; 2]>,
    /// The first fault among the `Content-Length` fields.
    length_error: Option<&'static str>,
}

impl<'a> Facts<'a> {
    fn read(head: &'a [u8], fields: &[FieldAt]) -> Self {
        const _: () = assert!(MAX_HEADERS <= 128);
        let mut f = Facts {
            relay: 0,
            close: false,
            last_coding: None,
            length: None,
            length_at: None,
            length_error: None,
        };
        // Other fields `Connection` names (rare: it usually holds only
        // `keep-alive` or `close`).
        let mut named: Vec<&[u8]> = Vec::new();
        let name_of = |&[ns, ne, _, _]: &FieldAt| &head[ns as usize..ne as usize];
        for (i, at) in fields.iter().enumerate() {
            let [_, _, vs, ve] = *at;
            let name = name_of(at);
            let value = &head[vs as usize..ve as usize];
            match hop_by_hop_name(name) {
                Some(h) if *h == CONNECTION => {
                    f.close |= has_token(value, "close");
                    named.extend(connection_named(value));
                }
                Some(h) if *h == TRANSFER_ENCODING => f.last_coding = Some(value),
                Some(_) => {}
                None if name.eq_ignore_ascii_case(b"content-length") => {
                    f.length_at.get_or_insert([vs, ve]);
                    // The first fault in field order is the one reported.
                    match (parse_length(value), f.length) {
                        (None, _) => {
                            f.length_error = f.length_error.or(Some("invalid Content-Length"))
                        }
                        (Some(n), Some(m)) if n != m => {
                            f.length_error =
                                f.length_error.or(Some("differing Content-Length values"))
                        }
                        (n, _) => f.length = n,
                    }
                }
                None => f.relay |= 1 << i,
            }
        }
        if !named.is_empty() {
            for (i, at) in fields.iter().enumerate() {
                let name = name_of(at);
                if named.iter().any(|n| n.eq_ignore_ascii_case(name)) {
                    f.relay &= !(1 << i);
                }
            }
        }
        f
    }
}

/// Whether a final response head has arrived (interim heads are dropped).
pub(super) fn final_head_ready(buf: &mut BytesMut) -> Result<bool, ClientError> {
    with_final_head(buf, |_, head| Ok(head.is_some()))
}

/// Drops the complete interim heads at the front of `buf`; the final head
/// after them, once it is complete (its fields' positions in `at`).
fn final_head<const N: usize>(
    buf: &mut BytesMut,
    at: &mut [FieldAt; N],
) -> Result<Option<Head>, ClientError> {
    loop {
        match parse_one(buf, at)? {
            Some(h) if h.status == 101 => {
                return Err(ClientError::Invalid(
                    "101 Switching Protocols is not supported",
                ))
            }
            Some(h) if (100..200).contains(&h.status) => buf.advance(h.len),
            head => return Ok(head),
        }
    }
}

/// One response head at the front of `buf`.
fn parse_one<const N: usize>(
    buf: &[u8],
    at: &mut [FieldAt; N],
) -> Result<Option<Head>, ClientError> {
    let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); N];
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, buf, &mut slots)
    {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ClientError::Invalid(TOO_MANY_FIELDS)),
        Err(_) => return Err(ClientError::Invalid("malformed response head")),
    };
    // A head is at most MAX_HEAD (256 KiB) long: offsets fit in u32.
    let offset = |s: &[u8]| (s.as_ptr() as usize - buf.as_ptr() as usize) as u32;
    for (slot, h) in at.iter_mut().zip(res.headers.iter()) {
        let (n, v) = (offset(h.name.as_bytes()), offset(h.value));
        *slot = [n, n + h.name.len() as u32, v, v + h.value.len() as u32];
    }
    Ok(Some(Head {
        status: res.code.unwrap_or(0),
        version: match res.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        },
        len,
        fields: res.headers.len(),
    }))
}

/// How the body of a response with these fields is framed, and whether the
/// connection may carry another request after it: no body for a `HEAD`
/// request or a 1xx/204/304; a `Transfer-Encoding` ending in `chunked` wins
/// over `Content-Length` (any other coding: the body ends with the
/// connection); differing lengths are invalid; with neither, the body ends
/// with the connection.
fn framing(
    facts: &Facts<'_>,
    status: StatusCode,
    version: Version,
    head_request: bool,
) -> Result<(BodyFraming, bool), ClientError> {
    let mut keep_alive = version == Version::HTTP_11 && !facts.close;
    if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((BodyFraming::None, keep_alive));
    }
    if let Some(last) = facts.last_coding {
        // RFC 9112 §6.1: its framing is faulty (hyper refuses it too).
        if version == Version::HTTP_10 {
            return Err(ClientError::Invalid(
                "Transfer-Encoding in an HTTP/1.0 response",
            ));
        }
        // A length beside a coding is ignored; the connection is not reused.
        if facts.length_at.is_some() {
            keep_alive = false;
        }
        if ends_in_chunked(last) {
            return Ok((BodyFraming::Known(Framing::Chunked), keep_alive));
        }
        return Ok((BodyFraming::UntilClose, false));
    }
    if let Some(e) = facts.length_error {
        return Err(ClientError::Invalid(e));
    }
    Ok(match facts.length {
        Some(0) => (BodyFraming::Known(Framing::Empty), keep_alive),
        Some(n) => (BodyFraming::Known(Framing::Length(n)), keep_alive),
        None => (BodyFraming::UntilClose, false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `res` as the gateway's server passes it to hyper: its relayed fields
    /// in the header map.
    fn with_relayed_in_map(res: Response<Incoming>) -> Response<crate::http_core::body::Body> {
        let (parts, mut body) = res.into_parts();
        let relayed = body.take_relayed();
        let body = crate::http_core::body::empty().relaying(relayed);
        crate::http_core::service::Reply::<()>::from(Response::from_parts(parts, body))
            .into_response()
    }

    fn response(
        raw: &[u8],
        head_request: bool,
    ) -> Result<(Response<Incoming>, BodyFraming, bool), ClientError> {
        let mut buf = BytesMut::from(raw);
        Ok(take_response(&mut buf, head_request)?.expect("a complete head"))
    }

    fn framing_of(raw: &str) -> (&'static str, bool) {
        match response(raw.as_bytes(), false) {
            Ok((_, BodyFraming::None, ka)) => ("none", ka),
            Ok((_, BodyFraming::Known(Framing::Empty), ka)) => ("empty", ka),
            Ok((_, BodyFraming::Known(Framing::Length(_)), ka)) => ("length", ka),
            Ok((_, BodyFraming::Known(Framing::Chunked), ka)) => ("chunked", ka),
            Ok((_, BodyFraming::UntilClose, ka)) => ("close", ka),
            Err(_) => ("error", false),
        }
    }

    #[test]
    fn response_bodies_are_framed_as_rfc_9112_says() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                ("length", true),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                ("empty", true),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                ("chunked", true),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n",
                ("chunked", false),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                ("close", false),
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", ("close", false)),
            (
                "HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
                ("none", true),
            ),
            ("HTTP/1.1 304 Not Modified\r\n\r\n", ("none", true)),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
                ("length", false),
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n",
                ("length", false),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                ("length", true),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                ("error", false),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n",
                ("error", false),
            ),
            // RFC 9112 §6.1: an HTTP/1.0 message's coding is faulty framing.
            (
                "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                ("error", false),
            ),
            (
                "HTTP/1.0 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
                ("none", false),
            ),
            // A coding with bytes outside ASCII is not chunked (as hyper).
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: \u{e9}, chunked\r\n\r\n",
                ("close", false),
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(framing_of(raw), want, "{raw:?}");
        }
        // Beside a coding, the length is not passed on.
        let (res, _, _) = response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\nX-A: b\r\n\r\n",
            false,
        )
        .unwrap();
        let res = with_relayed_in_map(res);
        assert!(!res.headers().contains_key("content-length"));
        assert!(!res.headers().contains_key("transfer-encoding"));
        assert_eq!(res.headers()["x-a"], "b");
        // A HEAD answer has no body, whatever its length says; the length
        // is passed on in the map. A body's own length is its size.
        let (res, f, _) = response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true).unwrap();
        assert!(matches!(f, BodyFraming::None));
        assert_eq!(res.headers()["content-length"], "5");
        let (res, f, _) = response(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(matches!(f, BodyFraming::None));
        assert_eq!(res.headers()["content-length"], "7");
        let (res, f, _) = response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false).unwrap();
        assert!(matches!(f, BodyFraming::Known(Framing::Length(5))));
        assert!(res.headers().is_empty());
        let (res, _, _) = response(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false).unwrap();
        assert_eq!(res.headers()["content-length"], "0");
    }

    #[test]
    fn interim_heads_are_skipped_and_101_refused() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 201 Created\r\nX-A: b\r\nContent-Length: 2\r\n\r\nok";
        let mut buf = BytesMut::from(&raw[..]);
        let (res, _, _) = take_response(&mut buf, false).unwrap().unwrap();
        assert_eq!(res.status(), 201);
        let res = with_relayed_in_map(res);
        assert_eq!(res.headers()["x-a"], "b");
        // Taken off the buffer: the body's bytes are next.
        assert_eq!(&buf[..], b"ok");

        let mut partial = BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2"[..]);
        assert!(!final_head_ready(&mut partial).unwrap());
        assert_eq!(&partial[..], b"HTTP/1.1 2");

        let take = |raw: &[u8]| take_response(&mut BytesMut::from(raw), false).map(|r| r.is_some());
        assert!(take(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n").is_err());
        assert!(take(b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n").is_err());
        assert!(!take(b"HTTP/1.1 200 OK\r\nX: y\r\n").unwrap());
    }

    #[test]
    fn heads_past_the_small_field_table_are_whole_and_past_the_limit_refused() {
        let head = |n: usize| {
            let fields: String = (0..n).map(|i| format!("X-F{i}: v{i}\r\n")).collect();
            BytesMut::from(format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 0\r\n\r\n").as_str())
        };
        for n in [FEW_HEADERS, FEW_HEADERS + 1, MAX_HEADERS - 1] {
            assert!(final_head_ready(&mut head(n)).unwrap(), "{n} fields");
            let (res, _, _) = take_response(&mut head(n), false).unwrap().unwrap();
            let res = with_relayed_in_map(res);
            // A length of 0 stays in the map.
            assert_eq!(res.headers().len(), n + 1, "{n} fields");
            assert_eq!(
                res.headers()[format!("x-f{}", n - 1)],
                format!("v{}", n - 1)
            );
        }
        assert!(take_response(&mut head(MAX_HEADERS + 1), false).is_err());
        assert!(final_head_ready(&mut head(MAX_HEADERS + 1)).is_err());
    }
}
