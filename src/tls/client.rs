//! The HTTPS client connector of the gateway's own fetches (an identity
//! provider's key set, a trace collector): TLS 1.2/1.3 on aws-lc-rs, trusting
//! the system's roots or a CA file; plain `http://` passes through (where
//! that is allowed is the caller's rule).
use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A connector for HTTP/1.1 over TLS (or plain), trusting `ca_file`'s
/// roots if given, else the system's; connects time out after
/// `connect_timeout`.
pub fn https_connector(
    ca_file: Option<&Path>,
    connect_timeout: Duration,
) -> Result<HttpsConnector<HttpConnector>, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = match ca_file {
        Some(ca) => builder.with_root_certificates(super::pem::load_roots(ca)?),
        None => builder
            .with_native_roots()
            .map_err(|e| format!("no system root certificates: {e}"))?,
    }
    .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.enforce_http(false);
    http.set_nodelay(true);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}
