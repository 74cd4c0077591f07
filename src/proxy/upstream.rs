//! The upstream client: a pooled hyper-util client (plain HTTP, or HTTPS
//! through rustls with the system's roots), targets taken in turn, the
//! connect and response timeouts, and errors sorted for 502 / 504 / 413.
use http::uri::{Parts, PathAndQuery};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::headers::sanitize_response;
use crate::body::{Body, BoxError};

/// One upstream's settings.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `http://` or `https://` base URIs (no path).
    pub targets: Vec<Uri>,
    /// TCP (and TLS) connect timeout.
    pub connect_timeout: Duration,
    /// Response headers must arrive within this.
    pub request_timeout: Duration,
}

/// Why forwarding failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The target could not be reached (→ 502).
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] BoxError),
    /// No response headers within `request_timeout` (→ 504).
    #[error("the upstream did not answer in time")]
    Timeout,
    /// The connection failed mid-request (→ 502).
    #[error("the upstream connection failed: {0}")]
    Reset(#[source] BoxError),
    /// The client's request body went over `max_body_bytes` while streaming (→ 413).
    #[error("the request body is too large")]
    BodyTooLarge,
    /// The upstream configuration is unusable.
    #[error("invalid upstream: {0}")]
    Config(String),
}

/// A named upstream with its targets and connection pool.
pub struct Upstream {
    name: String,
    targets: Vec<(http::uri::Scheme, http::uri::Authority)>,
    next: AtomicUsize,
    request_timeout: Duration,
    client: Client<HttpsConnector<HttpConnector>, Body>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("targets", &self.targets)
            .finish()
    }
}

fn tls_connector(http: HttpConnector) -> Result<HttpsConnector<HttpConnector>, UpstreamError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(b) => b,
        Err(e) => {
            // No system roots: plain HTTP still works; HTTPS targets will fail to verify.
            tracing::warn!(error = %e, "no system root certificates; https upstreams cannot be verified");
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| UpstreamError::Config(e.to_string()))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    Ok(builder.https_or_http().enable_http1().wrap_connector(http))
}

impl Upstream {
    /// Builds the pool for `cfg`.
    pub fn new(name: &str, cfg: UpstreamConfig) -> Result<Self, UpstreamError> {
        let mut targets = Vec::with_capacity(cfg.targets.len());
        for t in &cfg.targets {
            let parts = t.clone().into_parts();
            match (parts.scheme, parts.authority) {
                (Some(s), Some(a)) => targets.push((s, a)),
                _ => {
                    return Err(UpstreamError::Config(format!(
                        "target {t} needs a scheme and host"
                    )))
                }
            }
        }
        if targets.is_empty() {
            return Err(UpstreamError::Config("no targets".into()));
        }
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(cfg.connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .build(tls_connector(http)?);
        Ok(Upstream {
            name: name.to_string(),
            targets,
            next: AtomicUsize::new(0),
            request_timeout: cfg.request_timeout,
            client,
        })
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `req` (origin-form URI; headers already sanitized) to the next
    /// target, streaming the body both ways.
    pub async fn forward(&self, mut req: Request<Body>) -> Result<Response<Body>, UpstreamError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len();
        let (scheme, authority) = &self.targets[i];
        let mut parts = Parts::default();
        parts.scheme = Some(scheme.clone());
        parts.authority = Some(authority.clone());
        parts.path_and_query = Some(
            req.uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        *req.uri_mut() =
            Uri::from_parts(parts).map_err(|e| UpstreamError::Config(e.to_string()))?;
        let res = match tokio::time::timeout(self.request_timeout, self.client.request(req)).await {
            Err(_) => return Err(UpstreamError::Timeout),
            Ok(Err(e)) => return Err(classify(e)),
            Ok(Ok(res)) => res,
        };
        let (mut parts, body) = res.into_parts();
        sanitize_response(&mut parts.headers);
        Ok(Response::from_parts(
            parts,
            body.map_err(|e| Box::new(e) as BoxError).boxed(),
        ))
    }
}

fn classify(e: hyper_util::client::legacy::Error) -> UpstreamError {
    if source_chain_has::<http_body_util::LengthLimitError>(&e) {
        return UpstreamError::BodyTooLarge;
    }
    if e.is_connect() {
        return UpstreamError::Connect(Box::new(e));
    }
    UpstreamError::Reset(Box::new(e))
}

/// Whether any error in `e`'s source chain is a `T`.
pub fn source_chain_has<T: std::error::Error + 'static>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{Limited, StreamBody};
    use hyper::body::Frame;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn cfg(addr: std::net::SocketAddr, timeout_ms: u64) -> UpstreamConfig {
        UpstreamConfig {
            targets: vec![format!("http://{addr}").parse().unwrap()],
            connect_timeout: Duration::from_millis(500),
            request_timeout: Duration::from_millis(timeout_ms),
        }
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(crate::body::empty()).unwrap()
    }

    /// A one-shot raw server: reads the request head, then runs `reply`.
    async fn raw_server(
        reply: &'static [u8],
        close_early: bool,
        stall: bool,
    ) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                if stall {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                let _ = s.write_all(reply).await;
                if close_early {
                    drop(s);
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn forwards_and_strips_hop_headers_from_the_response() {
        let addr = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close, x-hop\r\nx-hop: 1\r\nRetry-After: 3\r\n\r\nok", false, false).await;
        let up = Upstream::new("t", cfg(addr, 2000)).unwrap();
        let res = up.forward(get("/a?b=c")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(!res.headers().contains_key("x-hop"));
        assert_eq!(res.headers()["retry-after"], "3");
        assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
    }

    #[tokio::test]
    async fn refused_reset_and_stalled_targets_are_told_apart() {
        let refused = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let up = Upstream::new("t", cfg(refused, 2000)).unwrap();
        assert!(matches!(
            up.forward(get("/")).await,
            Err(UpstreamError::Connect(_))
        ));

        let addr = raw_server(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
            true,
            false,
        )
        .await;
        let up = Upstream::new("t", cfg(addr, 2000)).unwrap();
        match up.forward(get("/")).await {
            // Headers arrived; the body then fails mid-stream.
            Ok(res) => assert!(res.into_body().collect().await.is_err()),
            Err(e) => assert!(matches!(e, UpstreamError::Reset(_)), "{e}"),
        }
        let addr = raw_server(b"", true, false).await;
        let up = Upstream::new("t", cfg(addr, 2000)).unwrap();
        assert!(matches!(
            up.forward(get("/")).await,
            Err(UpstreamError::Reset(_))
        ));

        let addr = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false, true).await;
        let up = Upstream::new("t", cfg(addr, 200)).unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(
            up.forward(get("/")).await,
            Err(UpstreamError::Timeout)
        ));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn an_oversized_streamed_body_is_body_too_large() {
        let addr = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false, true).await;
        let up = Upstream::new("t", cfg(addr, 3000)).unwrap();
        let chunks = futures_util::stream::iter((0..64).map(|_| {
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(vec![b'x'; 1024])))
        }));
        let body: Body = Limited::new(StreamBody::new(chunks), 4096).boxed();
        let req = Request::post("/").body(body).unwrap();
        assert!(matches!(
            up.forward(req).await,
            Err(UpstreamError::BodyTooLarge)
        ));
    }
}
