//! Entry points into the HTTP/1.1 code, the PROXY header parser and the
//! admin API for `tests/differential.rs` (which runs the same bytes through
//! the HTTP/1.1 code and through hyper) and the fuzz targets in `fuzz/`.
//! Built only with the `fuzzing` feature: the gateway never calls these,
//! and they may change with the code under them.
use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{Request, Response};
use http_body_util::BodyExt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::h1;
use crate::h1::client::{self, BodyFraming, Conn, SendError};
use crate::http_core::service::{ConnInfo, Handler, Reply};

/// Serves HTTP/1.1 requests on `io` with `handler`, through the gateway's
/// own server loop (head parser, body decoder, keep-alive, pipelining,
/// refusals), until the connection ends. A head may be `max_head_bytes`
/// long; the timeouts are 10 s. Returns whether the client opened with the
/// HTTP/2 preface (which the gateway hands to hyper's HTTP/2 server).
pub async fn serve<S, H>(io: &mut S, handler: Arc<H>, max_head_bytes: usize) -> io::Result<bool>
where
    S: AsyncRead + AsyncWrite + Unpin,
    H: Handler,
{
    let limits = h1::ConnectionLimits {
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        max_head_bytes,
        max_header_bytes: max_head_bytes,
    };
    let conn = Arc::new(ConnInfo::new(SocketAddr::from(([127, 0, 0, 1], 0)), false));
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let first_head_by = Instant::now() + limits.header_read_timeout;
    let ended = h1::serve(io, &handler, &conn, limits, first_head_by, &stopped).await?;
    Ok(matches!(ended, h1::Ended::H2(_)))
}

/// A request head parsed off the front of `buf` (taken from it), as the
/// server parses one: `Ok(None)` while incomplete, `Err` with what the 400
/// (or 431) says.
pub fn parse_request_head(buf: &mut BytesMut) -> Result<Option<RequestHead>, String> {
    match h1::parse_head(buf) {
        Ok(Some(h)) => Ok(Some(RequestHead {
            request: h.req,
            framing: h.framing.into(),
            keep_alive: h.keep_alive,
            expect_continue: h.expect_continue,
        })),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("{e:?}")),
    }
}

/// What [`parse_request_head`] found.
#[derive(Debug)]
pub struct RequestHead {
    pub request: Request<()>,
    pub framing: Framing,
    pub keep_alive: bool,
    pub expect_continue: bool,
}

/// How a message body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// None, or a length of 0.
    Empty,
    Length(u64),
    Chunked,
    /// A response body that ends with the connection.
    UntilClose,
    /// No body by rule (a `HEAD` answer, 1xx, 204, 304).
    Bodyless,
}

impl From<h1::codec::Framing> for Framing {
    fn from(f: h1::codec::Framing) -> Self {
        match f {
            h1::codec::Framing::Empty => Framing::Empty,
            h1::codec::Framing::Length(n) => Framing::Length(n),
            h1::codec::Framing::Chunked => Framing::Chunked,
        }
    }
}

/// The body decoder both directions use.
#[derive(Debug, Clone)]
pub struct Decoder(h1::codec::Decoder);

impl Decoder {
    /// A decoder for a body of `framing` (`Empty`, `Length` or `Chunked`).
    pub fn new(framing: Framing) -> Self {
        Decoder(h1::codec::Decoder::new(match framing {
            Framing::Length(n) => h1::codec::Framing::Length(n),
            Framing::Chunked => h1::codec::Framing::Chunked,
            _ => h1::codec::Framing::Empty,
        }))
    }

    /// The next piece of body off the front of `buf`; `None` when more
    /// bytes are needed or the body is done.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, &'static str> {
        self.0.decode(buf)
    }

    /// Checks the framing of the body bytes in `buf` without taking them.
    pub fn check(&self, buf: &[u8]) -> Result<(), &'static str> {
        self.0.check(buf)
    }

    pub fn is_done(&self) -> bool {
        self.0.is_done()
    }
}

/// A response head parsed off the front of `buf` as the upstream client
/// parses one (interim heads dropped, the relayed fields in the header
/// map): `Ok(None)` while incomplete.
pub fn parse_response_head(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<ResponseHead>, String> {
    let Some((res, framing, keep_alive)) =
        client::take_response(buf, head_request).map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let framing = match framing {
        BodyFraming::None => Framing::Bodyless,
        BodyFraming::Known(f) => f.into(),
        BodyFraming::UntilClose => Framing::UntilClose,
    };
    Ok(Some(ResponseHead {
        response: with_relayed_fields(res),
        framing,
        keep_alive,
    }))
}

/// What [`parse_response_head`] found.
#[derive(Debug)]
pub struct ResponseHead {
    pub response: Response<()>,
    pub framing: Framing,
    pub keep_alive: bool,
}

/// Sends `request` (no body) on `stream` with the gateway's upstream
/// client, and reads the response to its end: the response (relayed fields
/// in the header map) and its body, or why either failed.
pub async fn fetch(
    stream: TcpStream,
    request: Request<()>,
) -> Result<(Response<()>, Result<Bytes, String>), String> {
    let conn = Conn::new(client::io(hyper_rustls::MaybeHttpsStream::Http(
        hyper_util::rt::TokioIo::new(stream),
    )));
    let (parts, ()) = request.into_parts();
    let host = HeaderValue::from_static("reference.test");
    let deadline = Instant::now() + Duration::from_secs(10);
    let sent = conn
        .send(
            &parts,
            &host,
            crate::http_core::body::empty(),
            None::<&(dyn crate::http_core::fields::FieldLines + Sync)>,
            deadline,
        )
        .await;
    let (res, _) = match sent {
        Ok(sent) => sent,
        Err(SendError::Unsent(_)) => return Err("the request was not sent".into()),
        Err(SendError::Failed(e)) => return Err(e.to_string()),
    };
    let (parts, mut body) = res.into_parts();
    let relayed = body.take_relayed();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string());
    Ok((with_fields(parts, relayed), body))
}

/// `res` with its relayed fields in its header map.
fn with_relayed_fields(res: Response<client::Incoming>) -> Response<()> {
    let (parts, mut body) = res.into_parts();
    let relayed = body.take_relayed();
    with_fields(parts, relayed)
}

/// A response head of `parts` with `relayed` in its header map.
fn with_fields(
    parts: http::response::Parts,
    relayed: Option<crate::http_core::relayed::RelayedFields>,
) -> Response<()> {
    let res = Response::from_parts(parts, crate::http_core::body::empty().relaying(relayed));
    let (parts, _) = Reply::<()>::from(res).into_response().into_parts();
    Response::from_parts(parts, ())
}

/// The PROXY protocol header at the front of `buf`, as a listener reads
/// one: `Ok(None)` while all of `buf` is header and more is to come, else
/// the header's length and the client address it names (`None` for a
/// balancer's own connection); `Err` says why it is refused.
pub fn parse_proxy_header(buf: &[u8]) -> Result<Option<(usize, Option<std::net::IpAddr>)>, String> {
    crate::server::proxy_protocol::classify(buf).map_err(|e| e.to_string())
}

/// The most bytes a PROXY header may take before it is refused.
pub const MAX_PROXY_HEADER: usize = crate::server::proxy_protocol::MAX_HEADER;

/// Serves one `/admin/v1` request with `store` and `settings`, as the
/// admin listener does (the token in its `Authorization` field is looked
/// up in `store`): the status and the body.
pub async fn admin_api(
    store: &crate::store::sql::SqlStore,
    settings: &crate::config::Settings,
    request: Request<Bytes>,
) -> (http::StatusCode, Bytes) {
    let req = request.map(crate::http_core::body::RequestBody::full);
    let res = crate::admin::api::serve(store, settings, req, "127.0.0.1").await;
    let status = res.status();
    let body = res.into_body().collect().await.map(|c| c.to_bytes());
    (status, body.unwrap_or_default())
}
