//! Request heads: parsed with `httparse`, framed as RFC 9112 says (the
//! rules as hyper's, which the adversarial tests pin).
use crate::h1::codec::{ends_in_chunked, has_token, parse_request_length, Framing};
use crate::http_core::fields::field_name;
use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};
use std::mem::MaybeUninit;

/// Header lines per request at most (hyper's default); more is 431.
const MAX_HEADERS: usize = 100;

/// A parsed request head and what it says about the connection.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) req: Request<()>,
    pub(crate) framing: Framing,
    pub(crate) keep_alive: bool,
    pub(crate) expect_continue: bool,
}

/// Why a head is refused before any handler sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// 400, saying what.
    Bad(&'static str),
    /// 431: too many header lines, or more bytes than the backstop.
    TooLarge,
}

/// Header lines most request heads stay within: parsed with a table this
/// size first, the full one ([`MAX_HEADERS`]) only for a head with more
/// (a table is zeroed for every head parsed).
const FEW_HEADERS: usize = 24;

/// Parses one request head off the front of `buf`; `None` until it is
/// complete.
pub(crate) fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, HeadError> {
    match parse_head_within::<FEW_HEADERS>(buf) {
        // Nothing was taken from `buf`: again, with room for every line.
        Err(HeadError::TooLarge) => parse_head_within::<MAX_HEADERS>(buf),
        parsed => parsed,
    }
}

/// [`parse_head`] for heads of at most `N` header lines (more: `TooLarge`).
fn parse_head_within<const N: usize>(buf: &mut BytesMut) -> Result<Option<Head>, HeadError> {
    let mut spans = [(0u32, 0u32, 0u32, 0u32); N];
    let Some(line) = scan(buf, &mut spans)? else {
        return Ok(None);
    };
    let slice = buf.split_to(line.len).freeze();
    let (start, end) = (line.path.0 as usize, line.path.1 as usize);
    let uri = Uri::from_maybe_shared(slice.slice(start..end))
        .map_err(|_| HeadError::Bad("invalid request target"))?;
    let mut rules = FramingRules::new(line.version == Version::HTTP_11);
    // Only the fields received: what the gateway adds going upstream over
    // HTTP/1.1 is written beside the map, so the map never grows on that
    // path.
    let mut headers = HeaderMap::with_capacity(line.count);
    for &(ns, ne, vs, ve) in &spans[..line.count] {
        let name = field_name(&slice[ns as usize..ne as usize])
            .map_err(|_| HeadError::Bad("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(slice.slice(vs as usize..ve as usize))
            .map_err(|_| HeadError::Bad("invalid header value"))?;
        if rules.keep(&name, &value, &mut headers)? {
            headers.append(name, value);
        }
    }
    let (framing, keep_alive) = rules.framing()?;
    let mut req = Request::new(());
    *req.method_mut() = line.method;
    *req.uri_mut() = uri;
    *req.version_mut() = line.version;
    *req.headers_mut() = headers;
    Ok(Some(Head {
        req,
        framing,
        keep_alive,
        expect_continue: rules.expect_continue,
    }))
}

/// A request line and where its head ends, as [`scan`] found them.
struct RequestLine {
    /// The head's length, blank line included.
    len: usize,
    method: Method,
    /// The request target's offsets in the head.
    path: (u32, u32),
    version: Version,
    /// How many header lines `spans` holds.
    count: usize,
}

/// Parses the head at the front of `buf` with `httparse`, without taking
/// it: its request line, and each header line's (name start, name end,
/// value start, value end) offsets into `spans`. `None` until complete.
fn scan<const N: usize>(
    buf: &[u8],
    spans: &mut [(u32, u32, u32, u32); N],
) -> Result<Option<RequestLine>, HeadError> {
    let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); N];
    let mut req = httparse::Request::new(&mut []);
    let base = buf.as_ptr() as usize;
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(e) => return Err(HeadError::Bad(parse_error(e))),
    };
    let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
    for (span, h) in spans.iter_mut().zip(req.headers.iter()) {
        let (n, v) = (offset(h.name.as_bytes()), offset(h.value));
        *span = (n, n + h.name.len() as u32, v, v + h.value.len() as u32);
    }
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Bad("invalid method"))?;
    let path = req.path.unwrap_or_default();
    let path = (
        offset(path.as_bytes()),
        offset(path.as_bytes()) + path.len() as u32,
    );
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    Ok(Some(RequestLine {
        len,
        method,
        path,
        version,
        count: req.headers.len(),
    }))
}

/// What a request's framing and connection fields say, field by field
/// ([`FramingRules::keep`]), then as a whole ([`FramingRules::framing`]).
struct FramingRules {
    http11: bool,
    keep_alive: bool,
    expect_continue: bool,
    /// The Content-Length, while no Transfer-Encoding has been seen.
    length: Option<u64>,
    saw_length: bool,
    saw_te: bool,
    te_chunked: bool,
    saw_close: bool,
}

impl FramingRules {
    fn new(http11: bool) -> Self {
        FramingRules {
            http11,
            keep_alive: http11,
            expect_continue: false,
            length: None,
            saw_length: false,
            saw_te: false,
            te_chunked: false,
            saw_close: false,
        }
    }

    /// Reads one field; whether it goes into the request's map. A
    /// Content-Length after a Transfer-Encoding, or repeating one, does
    /// not; a Transfer-Encoding takes out a Content-Length already there.
    #[inline]
    fn keep(
        &mut self,
        name: &HeaderName,
        value: &HeaderValue,
        headers: &mut HeaderMap,
    ) -> Result<bool, HeadError> {
        if name == header::TRANSFER_ENCODING {
            if !self.http11 {
                return Err(HeadError::Bad("Transfer-Encoding in an HTTP/1.0 request"));
            }
            self.saw_te = true;
            if self.length.take().is_some() {
                headers.remove(header::CONTENT_LENGTH);
            }
            self.te_chunked = ends_in_chunked(value.as_bytes());
        } else if name == header::CONTENT_LENGTH {
            self.saw_length = true;
            if self.saw_te {
                return Ok(false);
            }
            let n = parse_request_length(value.as_bytes())
                .ok_or(HeadError::Bad("invalid Content-Length"))?;
            match self.length {
                Some(prev) if prev != n => {
                    return Err(HeadError::Bad("differing Content-Length values"))
                }
                Some(_) => return Ok(false),
                None => self.length = Some(n),
            }
        } else if name == header::CONNECTION {
            if self.saw_close || has_token(value.as_bytes(), "close") {
                self.saw_close = true;
                self.keep_alive = false;
            } else if !self.keep_alive {
                self.keep_alive = has_token(value.as_bytes(), "keep-alive");
            }
        } else if name == header::EXPECT {
            // An HTTP/1.0 client's expectation is ignored (RFC 9110 §10.1.1).
            self.expect_continue =
                self.http11 && value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        }
        Ok(true)
    }

    /// The body's framing and whether the connection may be kept, once
    /// every field is read.
    fn framing(&self) -> Result<(Framing, bool), HeadError> {
        if self.saw_te && !self.te_chunked {
            return Err(HeadError::Bad("Transfer-Encoding other than chunked"));
        }
        // Both framings named: the connection closes after the answer.
        let keep_alive = self.keep_alive && !(self.saw_te && self.saw_length);
        let framing = match (self.saw_te, self.length) {
            (true, _) => Framing::Chunked,
            (false, Some(0) | None) => Framing::Empty,
            (false, Some(n)) => Framing::Length(n),
        };
        Ok((framing, keep_alive))
    }
}

fn parse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Token => "invalid method or request target",
        httparse::Error::Version => "unsupported HTTP version",
        _ => "malformed request head",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Option<Head>, HeadError> {
        parse_head(&mut BytesMut::from(raw))
    }

    fn framing(raw: &str) -> Result<(Framing, bool), HeadError> {
        head(raw).map(|h| {
            let h = h.expect("complete head");
            (h.framing, h.keep_alive)
        })
    }

    #[test]
    fn parses_a_head_and_leaves_what_follows() {
        let mut buf = BytesMut::from(
            "GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Two: 1\r\nX-Two: 2\r\n\r\nGET /next",
        );
        let h = parse_head(&mut buf).unwrap().unwrap();
        assert_eq!(h.req.method(), Method::GET);
        assert_eq!(h.req.uri(), "/a?b=1");
        assert_eq!(h.req.version(), Version::HTTP_11);
        assert_eq!(h.req.headers()["host"], "x");
        assert_eq!(h.req.headers().get_all("x-two").iter().count(), 2);
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, true));
        assert_eq!(&buf[..], b"GET /next");
        assert!(head("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = |extra: &str| framing(&format!("POST / HTTP/1.1\r\nHost: x\r\n{extra}\r\n"));
        assert_eq!(h("Content-Length: 5\r\n"), Ok((Framing::Length(5), true)));
        assert_eq!(h("Content-Length: 0\r\n"), Ok((Framing::Empty, true)));
        // Equal lengths on separate lines are one; a length leading zeros
        // pad is still that length (both as hyper).
        assert_eq!(
            h("Content-Length: 5\r\nContent-Length: 5\r\n"),
            Ok((Framing::Length(5), true))
        );
        assert_eq!(
            h("Content-Length: 000000000000000000000000005\r\n"),
            Ok((Framing::Length(5), true))
        );
        assert_eq!(
            h("Transfer-Encoding: chunked\r\n"),
            Ok((Framing::Chunked, true))
        );
        assert_eq!(
            h("Transfer-Encoding: gzip, Chunked\r\n"),
            Ok((Framing::Chunked, true))
        );
        // Both: chunked wins, the length is dropped, the connection closes after.
        for both in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 60\r\n",
        ] {
            let parsed = head(&format!("POST / HTTP/1.1\r\nHost: x\r\n{both}\r\n"))
                .unwrap()
                .unwrap();
            assert_eq!(
                (parsed.framing, parsed.keep_alive),
                (Framing::Chunked, false)
            );
            assert!(parsed.req.headers().get("content-length").is_none());
        }
        for bad in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: 5, 6\r\n",
            // A list, even of equal values, is refused (as hyper and nginx).
            "Content-Length: 5, 5\r\n",
            "Content-Length: 70000,70000\r\n",
            "Content-Length: 18446744073709551614\r\n",
            "Transfer-Encoding: é, chunked\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 0x5\r\n",
            "Content-Length: 5 5\r\n",
            "Content-Length: 99999999999999999999999\r\n",
            "Transfer-Encoding: xchunked\r\n",
            "Transfer-Encoding: chunked, identity\r\n",
            "Transfer-Encoding : chunked\r\n",
            "X-Folded: a\r\n Transfer-Encoding: chunked\r\n",
            "X-A: a\rContent-Length: 99\r\n",
        ] {
            assert!(matches!(h(bad), Err(HeadError::Bad(_))), "{bad:?}");
        }
        assert!(matches!(
            framing("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(HeadError::Bad(_))
        ));
    }

    #[test]
    fn keep_alive_by_version_and_connection_header() {
        assert_eq!(
            framing("GET / HTTP/1.0\r\n\r\n"),
            Ok((Framing::Empty, false))
        );
        assert_eq!(
            framing("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"),
            Ok((Framing::Empty, true))
        );
        assert_eq!(
            framing("GET / HTTP/1.1\r\nConnection: te, close\r\n\r\n"),
            Ok((Framing::Empty, false))
        );
        // A later keep-alive does not undo a close.
        assert_eq!(
            framing("GET / HTTP/1.0\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n"),
            Ok((Framing::Empty, false))
        );
    }

    #[test]
    fn too_many_headers_is_431_and_garbage_is_400() {
        let lines = |n: usize| -> String { (0..n).map(|i| format!("X-H{i}: v{i}\r\n")).collect() };
        // Past the small first table, within the limit: every line kept.
        for n in [FEW_HEADERS, FEW_HEADERS + 1, MAX_HEADERS - 1] {
            let parsed = head(&format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", lines(n)))
                .unwrap()
                .unwrap();
            assert_eq!(parsed.req.headers().len(), n + 1, "{n} lines");
            assert_eq!(
                parsed.req.headers()[format!("x-h{}", n - 1)],
                format!("v{}", n - 1)
            );
        }
        assert_eq!(
            head(&format!("GET / HTTP/1.1\r\n{}\r\n", lines(150))).unwrap_err(),
            HeadError::TooLarge
        );
        for bad in [
            "GARBAGE\r\n\r\n",
            "GET /x HTTP/9.9\r\n\r\n",
            "GET  / HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(head(bad), Err(HeadError::Bad(_))), "{bad:?}");
        }
    }
}
