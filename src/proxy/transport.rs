//! How a request reaches one target: over a pooled (or new) HTTP/1.1
//! connection of the gateway's own client (`client`, `pool`), or over
//! hyper-util's client for `http2 = true` upstreams; and what a failure of
//! either means for the upstream ([`UpstreamError`]).
use http::uri::PathAndQuery;
use http::{request, Request, Response};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::time::Instant;

use super::error::UpstreamError;
use super::headers::Added;
use super::target::Target;
use super::tls_client::TimeoutConnector;
use crate::h1::client::{self, ClientError, Conn, Incoming, SendError};
use crate::http_core::body::Body;

pub(super) type Connector = TimeoutConnector<HttpsConnector<HttpConnector>>;
pub(super) type HttpClient = Client<Connector, Body>;

/// How requests reach an upstream's targets.
pub(crate) enum Transport {
    /// HTTP/1.1, plain or TLS: per-target pools of connections.
    Http1(Connector),
    /// HTTP/2 (`http2 = true`): hyper-util's client, whose task per
    /// connection multiplexes the requests of every task.
    Http2(Box<HttpClient>),
}

impl Transport {
    /// Sends the request `parts` with `body` to `target`: the response
    /// head, and the HTTP/1.1 connection it came on when the response is
    /// already whole (otherwise its body gives the connection back when it
    /// ends). [`UpstreamError::Timeout`] when the head has not come by
    /// `deadline`. HTTP/1.1 borrows the head; hyper's HTTP/2 client takes
    /// it, from `parts` itself when `last` (nothing will send it again),
    /// else as a copy.
    pub(crate) async fn send(
        &self,
        target: &Target,
        parts: &mut request::Parts,
        mut body: Body,
        last: bool,
        added: Option<&Added<'_>>,
        deadline: Instant,
    ) -> Result<(Response<Incoming>, Option<Conn>), UpstreamError> {
        match self {
            Transport::Http2(client) => {
                let parts = if last {
                    std::mem::replace(parts, Request::new(()).into_parts().0)
                } else {
                    parts.clone()
                };
                let mut req = Request::from_parts(parts, body);
                if let Some(added) = added {
                    added.add_to(req.headers_mut());
                }
                let path = req.uri().path_and_query().cloned();
                *req.uri_mut() = target.uri(path)?;
                let res = tokio::time::timeout_at(deadline.into(), client.request(req))
                    .await
                    .map_err(|_| UpstreamError::Timeout)?
                    .map_err(classify)?;
                Ok((res.map(Incoming::h2), None))
            }
            Transport::Http1(connector) => loop {
                let (conn, reused) = match target.pool.take() {
                    Some(c) => (c, true),
                    // Boxed: a new connection is the exception.
                    None => {
                        let connecting = connect(connector, target);
                        match Box::pin(tokio::time::timeout_at(deadline.into(), connecting)).await {
                            Ok(conn) => (conn?, false),
                            Err(_) => return Err(UpstreamError::Timeout),
                        }
                    }
                };
                match conn.send(parts, &target.host, body, added, deadline).await {
                    Ok(sent) => return Ok(sent),
                    // A kept-alive connection the target had closed: nothing
                    // of the request went out, so it goes on another.
                    Err(SendError::Unsent(b)) if reused => body = b,
                    Err(SendError::Unsent(_)) => {
                        return Err(UpstreamError::Reset(
                            "the connection closed before the request went out".into(),
                        ))
                    }
                    Err(SendError::Failed(e)) => return Err(classify_sent(e)),
                }
            },
        }
    }
}

/// A new connection to `target`: TCP (and TLS), all within `connect_timeout`.
async fn connect(connector: &Connector, target: &Target) -> Result<Conn, UpstreamError> {
    let uri = target.uri(Some(PathAndQuery::from_static("/")))?;
    let io = tower_service::Service::call(&mut connector.clone(), uri)
        .await
        .map_err(UpstreamError::Connect)?;
    Ok(Conn::new(client::io(io)))
}

/// A request that went (at least partly) out failed.
fn classify_sent(e: ClientError) -> UpstreamError {
    if let ClientError::TimedOut = e {
        return UpstreamError::Timeout;
    }
    if source_chain_has::<crate::http_core::body::TooLarge>(&e) {
        return UpstreamError::BodyTooLarge;
    }
    UpstreamError::Reset(Box::new(e))
}

fn classify(e: hyper_util::client::legacy::Error) -> UpstreamError {
    if source_chain_has::<crate::http_core::body::TooLarge>(&e) {
        return UpstreamError::BodyTooLarge;
    }
    if e.is_connect() {
        return UpstreamError::Connect(Box::new(e));
    }
    UpstreamError::Reset(Box::new(e))
}

/// Whether any error in `e`'s source chain is a `T`.
pub(crate) fn source_chain_has<T: std::error::Error + 'static>(
    e: &(dyn std::error::Error + 'static),
) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<T>() {
            return true;
        }
        cur = err.source();
    }
    false
}
