//! The service types the listeners and the pipeline share: what a handler is
//! given about the connection ([`ConnInfo`]), the [`Handler`] itself, what it
//! answers ([`Reply`], with the fields it stamps: [`Stamp`]), and what a
//! listener refused before a handler saw it ([`Refusal`]).
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::http_core::body::{Body, RequestBody};
use crate::ip::ClientAddr;

/// What the pipeline knows about the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The TCP peer's address.
    pub peer: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// The address the connection speaks for: the PROXY protocol header's
    /// source when the listener takes one, else the peer's. Made once per
    /// connection.
    source: ClientAddr,
    /// Whether `source` is a trusted proxy (`[server.client_ip]
    /// trusted_proxies`), whose header may name the client.
    trusted: bool,
    /// What the TLS handshake settled, once it is done.
    pub tls_info: Option<TlsInfo>,
}

/// A TLS connection's protocol version and key exchange group, as the
/// metric and the access log name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsInfo {
    /// `TLSv1.3` or `TLSv1.2`.
    pub version: &'static str,
    /// `X25519MLKEM768`, `X25519`, `secp256r1`, `secp384r1`, or `none` (a
    /// TLS 1.2 resumption, which exchanges no key).
    pub group: &'static str,
}

impl ConnInfo {
    /// A connection from `peer`, speaking for itself, not trusted.
    pub fn new(peer: SocketAddr, tls: bool) -> Self {
        Self::from_source(peer, tls, peer.ip(), false)
    }

    /// A connection from `peer` that speaks for `source` (the peer itself,
    /// or the client of a PROXY protocol header), trusted or not.
    pub fn from_source(peer: SocketAddr, tls: bool, source: IpAddr, trusted: bool) -> Self {
        ConnInfo {
            peer,
            tls,
            source: ClientAddr::new(source),
            trusted,
            tls_info: None,
        }
    }

    /// This connection once its TLS handshake settled `info`.
    pub fn with_tls(&self, info: TlsInfo) -> Self {
        ConnInfo {
            tls_info: Some(info),
            ..self.clone()
        }
    }

    /// The source's IP address as text.
    pub fn source_ip(&self) -> &str {
        self.source.as_str()
    }

    /// Whether the source is a trusted proxy.
    pub fn trusted(&self) -> bool {
        self.trusted
    }

    /// The source's address, its text and rate-limit key.
    pub(crate) fn source(&self) -> &ClientAddr {
        &self.source
    }
}

/// Turns a request into a response; never fails (errors are responses).
pub trait Handler: Send + Sync + 'static {
    /// The fields this handler stamps on its responses (`()`: none).
    type Stamp: Stamp;

    /// Called once per request.
    fn handle(
        &self,
        req: Request<RequestBody>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Reply<Self::Stamp>> + Send;

    /// The response to a request the listener refused before it reached
    /// [`Handler::handle`] (the connection closes after it). By default a
    /// short plain-text body saying why.
    fn refuse(&self, refusal: Refusal) -> Response<Body> {
        refusal.plain_response()
    }
}

/// A request the HTTP/1.1 server refused as it read the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: the head is not valid HTTP/1.1; says what is wrong.
    BadRequest(&'static str),
    /// 431: more header lines, or bytes, than the listener takes.
    HeaderFieldsTooLarge {
        /// The listener's limit on a head's header bytes.
        limit: usize,
    },
}

impl Refusal {
    /// The status it is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            Refusal::HeaderFieldsTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }

    /// The status with a line of plain text saying why.
    fn plain_response(&self) -> Response<Body> {
        let text = match self {
            Refusal::BadRequest(what) => format!("invalid request: {what}\n"),
            Refusal::HeaderFieldsTooLarge { limit } => {
                format!("request header fields exceed {limit} bytes\n")
            }
        };
        let mut res = Response::new(crate::http_core::body::full(text));
        *res.status_mut() = self.status();
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        res
    }
}

/// Fields a handler stamps on its response as it is written: they go on
/// last, and replace any field of the same name the response has (in its
/// map, or among a target's relayed fields). The HTTP/1.1 writer writes
/// them as lines beside the header map ([`Stamp::write_lines`]) instead of
/// inserting them into it, which would hash each name; hyper's HTTP/2
/// server gets them in the map ([`Stamp::add_to`]).
pub trait Stamp: Send + 'static {
    /// The names of the fields stamped.
    fn names(&self) -> impl Iterator<Item = &'static HeaderName> + '_;

    /// Appends the fields as `name: value` lines.
    fn write_lines(&self, out: &mut Vec<u8>);

    /// Sets the fields in `headers`, replacing any of the same name.
    fn add_to(self, headers: &mut HeaderMap);
}

/// No fields.
impl Stamp for () {
    fn names(&self) -> impl Iterator<Item = &'static HeaderName> + '_ {
        std::iter::empty()
    }

    fn write_lines(&self, _: &mut Vec<u8>) {}

    fn add_to(self, _: &mut HeaderMap) {}
}

/// Whether a field named `name` (any case) is stamped by `stamp`, and so
/// not written from elsewhere: a test made once per response, which tells
/// most names apart by their length alone.
pub(crate) fn stamped_by<S: Stamp>(stamp: &S) -> impl Fn(&[u8]) -> bool + '_ {
    let lengths = stamp
        .names()
        .fold(0u64, |bits, n| bits | 1 << n.as_str().len().min(63));
    move |name: &[u8]| {
        lengths & 1 << name.len().min(63) != 0
            && stamp
                .names()
                .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    }
}

/// A handler's answer: the response, and the fields stamped on it as it is
/// written.
#[derive(Debug)]
pub struct Reply<S = ()> {
    /// The response.
    pub res: Response<Body>,
    /// Fields that go on it last, over any of the same name.
    pub stamp: S,
}

impl<S: Stamp + Default> From<Response<Body>> for Reply<S> {
    fn from(res: Response<Body>) -> Self {
        Reply {
            res,
            stamp: S::default(),
        }
    }
}

impl<S: Stamp> Reply<S> {
    /// The response with the stamped fields in its header map (what
    /// reads a response's headers rather than writing it: hyper's HTTP/2
    /// server, tests). The target's relayed fields go in after them and
    /// never over them.
    pub fn into_response(self) -> Response<Body> {
        let mut res = self.res;
        let relayed = res.body_mut().take_relayed();
        // Room for every field at once: the map would otherwise grow (and
        // rehash) as the relayed fields go in after the stamped ones.
        let more = self.stamp.names().count() + relayed.as_ref().map_or(0, |r| r.len());
        res.headers_mut().reserve(more);
        self.stamp.add_to(res.headers_mut());
        if let Some(relayed) = relayed {
            relayed.add_to(res.headers_mut());
        }
        res
    }
}

/// Resolves once `stop` was requested (or its sender is gone): how a
/// listener and its connections learn that the gateway is draining.
pub async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// A stamp of fixed fields, for the transport's tests.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct FixedStamp(Vec<(&'static HeaderName, HeaderValue)>);

#[cfg(test)]
impl FixedStamp {
    /// Stamps each `(name, value)`; names are lowercase.
    pub(crate) fn new(fields: &[(&'static str, &'static str)]) -> Self {
        FixedStamp(
            fields
                .iter()
                .map(|&(n, v)| {
                    let name: &'static HeaderName = Box::leak(Box::new(HeaderName::from_static(n)));
                    (name, HeaderValue::from_static(v))
                })
                .collect(),
        )
    }
}

#[cfg(test)]
impl Stamp for FixedStamp {
    fn names(&self) -> impl Iterator<Item = &'static HeaderName> + '_ {
        self.0.iter().map(|(n, _)| *n)
    }

    fn write_lines(&self, out: &mut Vec<u8>) {
        for (n, v) in &self.0 {
            out.extend_from_slice(n.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    fn add_to(self, headers: &mut HeaderMap) {
        for (n, v) in self.0 {
            headers.insert(n.clone(), v);
        }
    }
}
