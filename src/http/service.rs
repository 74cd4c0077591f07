//! The service types the listeners and the pipeline share: what a handler is
//! given about the connection ([`ConnInfo`]), the [`Handler`] itself, and
//! what it answers ([`Reply`], with its request id and rate-limit stamp).
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::http::body::{Body, RequestBody};
use crate::http::fields::{F_REQUEST_ID, X_REQUEST_ID};
use crate::http::rate_limit::Decision;
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
    /// Called once per request.
    fn handle(
        &self,
        req: Request<RequestBody>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Reply> + Send;
}

/// A handler's answer: the response, and the fields stamped on it as it is
/// written.
#[derive(Debug)]
pub struct Reply {
    /// The response.
    pub res: Response<Body>,
    /// Fields that go on it last, over any of the same name.
    pub stamp: Stamp,
}

impl From<Response<Body>> for Reply {
    fn from(res: Response<Body>) -> Self {
        Reply {
            res,
            stamp: Stamp::default(),
        }
    }
}

impl Reply {
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

/// A request's id (`X-Request-Id`): the client's when it is sane, else 32
/// hex digits the gateway made, held inline (no allocation per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestId {
    /// Made by the gateway: lowercase hex digits.
    Made([u8; 32]),
    /// The client's (checked: `[A-Za-z0-9._:-]`, 1–128 bytes).
    Client(HeaderValue),
}

impl RequestId {
    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            RequestId::Made(hex) => hex,
            RequestId::Client(v) => v.as_bytes(),
        }
    }

    /// The id as text (for logs; `-` if it were not ASCII, which neither
    /// kind can be).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("-")
    }

    /// The id as a header value (the client's is moved, not copied).
    pub fn into_header_value(self) -> HeaderValue {
        match self {
            RequestId::Made(hex) => {
                HeaderValue::from_bytes(&hex).unwrap_or_else(|_| HeaderValue::from_static("0"))
            }
            RequestId::Client(v) => v,
        }
    }
}

/// The fields the gateway stamps on a response as it is written:
/// `X-Request-Id`, and a rate-limited route's fields. They replace any
/// field of the same name the response has (the target's, the key
/// service's). The HTTP/1.1 writer writes them as lines beside the header
/// map ([`Stamp::write_to`]) instead of inserting them into it, which hashed
/// each name; hyper's HTTP/2 server gets them in the map ([`Stamp::add_to`]).
#[derive(Debug, Default)]
pub struct Stamp {
    /// `X-Request-Id`.
    pub request_id: Option<RequestId>,
    /// The route's rate-limit decision.
    pub decision: Option<Decision>,
    /// With the IETF draft fields (`rate_limit.ietf_headers`).
    pub ietf: bool,
}

impl Stamp {
    /// The names of the fields stamped.
    fn names(&self) -> impl Iterator<Item = &'static HeaderName> + '_ {
        let rate = self.decision.iter().flat_map(|d| d.names(self.ietf));
        let id = self.request_id.is_some().then_some(&F_REQUEST_ID.name);
        rate.chain(id)
    }

    /// Whether a field named `name` (any case) is stamped, and so not
    /// written from elsewhere: a test made once per response, which tells
    /// most names apart by their length alone.
    pub(crate) fn sets(&self) -> impl Fn(&[u8]) -> bool + '_ {
        let lengths = self
            .names()
            .fold(0u64, |bits, n| bits | 1 << n.as_str().len().min(63));
        move |name: &[u8]| {
            lengths & 1 << name.len().min(63) != 0
                && self
                    .names()
                    .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
        }
    }

    /// Appends the fields as `name: value` lines.
    pub(crate) fn write_to(&self, out: &mut Vec<u8>) {
        if let Some(d) = &self.decision {
            d.write_lines(out, self.ietf);
        }
        if let Some(id) = &self.request_id {
            out.extend_from_slice(F_REQUEST_ID.line);
            out.extend_from_slice(id.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Sets the fields in `headers`, replacing any of the same name.
    ///
    /// The request id differs on every response: it is marked never to be
    /// indexed, so that HTTP/2's header compression sends it as a literal
    /// instead of adding it to the connection's table, where each new id
    /// would evict the fields that repeat (the content type, the limit) and
    /// cost a search of the ids before it.
    pub fn add_to(self, headers: &mut HeaderMap) {
        if let Some(d) = &self.decision {
            d.write_headers(headers, self.ietf);
        }
        if let Some(id) = self.request_id {
            let mut id = id.into_header_value();
            id.set_sensitive(true);
            headers.insert(X_REQUEST_ID, id);
        }
    }
}

/// `res` with its relayed fields (if any) moved into its header map, after
/// the map's own and never over them.
pub(crate) fn into_header_map(mut res: Response<Body>) -> Response<Body> {
    if let Some(relayed) = res.body_mut().take_relayed() {
        relayed.add_to(res.headers_mut());
    }
    res
}

/// Resolves once `stop` was requested (or its sender is gone): how a
/// listener and its connections learn that the gateway is draining.
pub async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
