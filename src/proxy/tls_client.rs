//! The connector to upstream targets: TCP (nodelay, connect timeout), then
//! rustls for `https://` targets with the system's roots or a configured CA
//! file and an optional client certificate; the whole connect — TCP and TLS
//! handshake — bounded by `connect_timeout`.
use http::Uri;
use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::config::HttpUpstreamSettings;
use crate::http_core::body::BoxError;
use crate::tls::pem::{load_identity, load_roots};

/// A SHA-256 of the files `s`'s connector reads (`ca_file`, then
/// `client_cert` and `client_key`), each with its length, so that a reload
/// can tell whether they changed; `None` if one cannot be read. The
/// system's roots (no `ca_file`) are not included.
pub(crate) fn files_digest(s: &HttpUpstreamSettings) -> Option<[u8; 32]> {
    use sha2::{Digest, Sha256};
    let identity = s.client_identity.as_ref();
    let files = [
        s.ca_file.as_deref(),
        identity.map(|(cert, _)| cert.as_path()),
        identity.map(|(_, key)| key.as_path()),
    ];
    let mut hash = Sha256::new();
    for file in files {
        match file {
            None => hash.update(u64::MAX.to_be_bytes()),
            Some(path) => {
                let bytes = std::fs::read(path).ok()?;
                hash.update((bytes.len() as u64).to_be_bytes());
                hash.update(&bytes);
            }
        }
    }
    Some(hash.finalize().into())
}

/// The rustls client configuration for `s`.
fn client_config(s: &HttpUpstreamSettings) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &s.ca_file {
        Some(ca) => builder.with_root_certificates(load_roots(ca)?),
        None => match builder.clone().with_native_roots() {
            Ok(b) => b,
            Err(e) => {
                // Plain HTTP still works; HTTPS targets will fail to verify.
                tracing::warn!(error = %e, "no system root certificates; https upstreams cannot be verified");
                builder.with_root_certificates(rustls::RootCertStore::empty())
            }
        },
    };
    match &s.client_identity {
        Some((cert, key)) => {
            let (certs, key) = load_identity(cert, key).map_err(|(_, e)| e)?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| e.to_string())
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

/// The connector for one upstream.
pub(crate) fn connector(
    s: &HttpUpstreamSettings,
) -> Result<TimeoutConnector<HttpsConnector<HttpConnector>>, String> {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(s.connect_timeout));
    http.set_nodelay(true);
    http.enforce_http(false);
    let b = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_config(s)?)
        .https_or_http();
    let inner = if s.http2 {
        b.enable_http2().wrap_connector(http)
    } else {
        b.enable_http1().wrap_connector(http)
    };
    Ok(TimeoutConnector {
        inner,
        timeout: s.connect_timeout,
    })
}

/// Bounds a connector's whole connect (TCP and TLS) by `timeout`; hyper-util
/// reports its errors as connect errors, so a stalled handshake is retryable.
#[derive(Clone)]
pub(crate) struct TimeoutConnector<C> {
    inner: C,
    timeout: Duration,
}

/// Connect did not finish within `connect_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("connect timed out after {0:?}")]
pub struct ConnectTimeout(pub Duration);

impl<C> tower_service::Service<Uri> for TimeoutConnector<C>
where
    C: tower_service::Service<Uri> + Send,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let fut = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimeout(timeout)) as BoxError),
            }
        })
    }
}
