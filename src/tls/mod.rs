//! rustls server configuration on the aws-lc-rs provider: certificate
//! loading (PEM files, or a self-signed localhost certificate for
//! development), TLS 1.2/1.3 only, the key exchange groups in the
//! configured order (the hybrid post-quantum `X25519MLKEM768` first by
//! default), ALPN `h2` and `http/1.1`, session resumption by stateless
//! tickets and a bounded session cache. The certificate sits behind a
//! swappable resolver so a reload can replace it without touching open
//! connections.
pub mod client;
pub mod pem;

use arc_swap::ArcSwap;
use rustls::crypto::aws_lc_rs::{default_provider, kx_group};
use rustls::crypto::SupportedKxGroup;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use std::path::Path;
use std::sync::Arc;

/// Why TLS could not be set up; names the file involved.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: String,
        /// What is wrong with it.
        what: String,
    },
    /// The private key does not belong to the certificate, or is unusable.
    #[error("the private key does not match the certificate: {0}")]
    KeyMismatch(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Hands out the current certificate; `replace` swaps it for new handshakes.
#[derive(Debug)]
pub struct CertResolver {
    current: ArcSwap<CertifiedKey>,
}

impl CertResolver {
    /// Replaces the certificate used by new handshakes.
    pub fn replace(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A key exchange group the server may offer (`[server.tls] key_exchange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyExchange {
    /// The hybrid of X25519 and ML-KEM-768: post-quantum.
    X25519MlKem768,
    /// X25519.
    X25519,
    /// ECDH on P-256.
    Secp256r1,
    /// ECDH on P-384.
    Secp384r1,
}

impl KeyExchange {
    /// Every group, in the default order of preference.
    pub const DEFAULT: [KeyExchange; 4] = [
        KeyExchange::X25519MlKem768,
        KeyExchange::X25519,
        KeyExchange::Secp256r1,
        KeyExchange::Secp384r1,
    ];

    /// The group's name, as TLS's registry spells it.
    pub fn name(self) -> &'static str {
        match self {
            KeyExchange::X25519MlKem768 => "X25519MLKEM768",
            KeyExchange::X25519 => "X25519",
            KeyExchange::Secp256r1 => "secp256r1",
            KeyExchange::Secp384r1 => "secp384r1",
        }
    }

    /// The group named `name` (case as in [`Self::name`], or any case).
    pub fn from_name(name: &str) -> Option<KeyExchange> {
        (Self::DEFAULT.into_iter()).find(|k| k.name().eq_ignore_ascii_case(name))
    }

    fn group(self) -> &'static dyn SupportedKxGroup {
        match self {
            KeyExchange::X25519MlKem768 => kx_group::X25519MLKEM768,
            KeyExchange::X25519 => kx_group::X25519,
            KeyExchange::Secp256r1 => kx_group::SECP256R1,
            KeyExchange::Secp384r1 => kx_group::SECP384R1,
        }
    }
}

/// The name of a negotiated group, for the metric and the access log.
pub fn group_name(group: rustls::NamedGroup) -> &'static str {
    match (KeyExchange::DEFAULT.into_iter()).find(|k| k.group().name() == group) {
        Some(k) => k.name(),
        None => "other",
    }
}

/// The rustls server config offering `groups` in that order, and its
/// resolver (kept for reloads).
pub fn server_config(
    key: CertifiedKey,
    groups: &[KeyExchange],
) -> Result<(Arc<ServerConfig>, Arc<CertResolver>), TlsError> {
    let resolver = Arc::new(CertResolver {
        current: ArcSwap::from_pointee(key),
    });
    let mut provider = provider();
    provider.kx_groups = groups.iter().map(|k| k.group()).collect();
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // The server's order of suites, not the client's: see `provider`.
    config.ignore_client_order = true;
    // Resumption: TLS 1.3 clients, and TLS 1.2 ones that take tickets, get
    // stateless tickets (ChaCha20-Poly1305 under a random key of this
    // process, rotated every 6 hours), which hold no server memory however
    // many clients there are; TLS 1.2 clients without ticket support resume
    // by session id from a bounded cache. A reload keeps both: only the
    // certificate is swapped.
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE_SIZE);
    Ok((Arc::new(config), resolver))
}

/// TLS 1.2 sessions kept for resumption by session id, the oldest dropped
/// first: HAProxy's default size, a few MiB when full.
pub const SESSION_CACHE_SIZE: usize = 20_000;

/// aws-lc-rs's suites with AES-128-GCM (SHA-256) ahead of AES-256-GCM
/// (SHA-384), each version's otherwise in the provider's order. Clients (OpenSSL's default
/// among them) list AES-256-GCM first, and its SHA-384 key schedule runs
/// without the SHA extensions that SHA-256 gets, which makes every new
/// connection's handshake dearer. AES-128-GCM is TLS 1.3's mandatory suite;
/// Go's crypto/tls prefers it the same way.
fn provider() -> rustls::crypto::CryptoProvider {
    use rustls::CipherSuite as S;
    let mut p = default_provider();
    p.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            S::TLS13_AES_128_GCM_SHA256
                | S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    p
}

/// Loads a certificate chain and its private key from PEM files.
pub fn load_pem(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, TlsError> {
    certified(pem::certs(cert_path)?, pem::private_key(key_path)?)
}

fn certified(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, TlsError> {
    pem::certified_key(certs, key).map_err(|e| TlsError::KeyMismatch(e.to_string()))
}

impl From<pem::PemError> for TlsError {
    fn from(e: pem::PemError) -> Self {
        match e {
            pem::PemError::Read { path, what } => TlsError::File { path, what },
            pem::PemError::NoCertificate { path } => TlsError::File {
                path,
                what: "no PEM certificate found".into(),
            },
        }
    }
}

/// A certificate for `localhost`, `127.0.0.1` and `::1`, generated in memory.
pub fn self_signed() -> Result<CertifiedKey, TlsError> {
    let names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    let generated = rcgen::generate_simple_self_signed(names)
        .map_err(|e| TlsError::KeyMismatch(e.to_string()))?;
    let cert = generated.cert.der().clone();
    let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
        .map_err(|e| TlsError::KeyMismatch(e.to_string()))?;
    certified(vec![cert], key)
}

/// A self-signed certificate and key as PEM text (for `demo` and tests that need files).
pub fn self_signed_pem() -> Result<(String, String), TlsError> {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let generated = rcgen::generate_simple_self_signed(names)
        .map_err(|e| TlsError::KeyMismatch(e.to_string()))?;
    Ok((generated.cert.pem(), generated.signing_key.serialize_pem()))
}

#[cfg(test)]
mod tests;
