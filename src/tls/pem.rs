//! PEM files, read in one place: the server's certificate and key, the CA
//! certificates trusted for `https://` targets, and the client certificate
//! presented to them. Errors name the file.
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::path::Path;

/// Why a PEM file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// Not readable, or not PEM.
    #[error("cannot read {path}: {what}")]
    Read {
        /// The file.
        path: String,
        /// What is wrong with it.
        what: String,
    },
    /// Readable, but holding no certificate.
    #[error("{path}: no PEM certificate found")]
    NoCertificate {
        /// The file.
        path: String,
    },
}

/// Why a certificate chain and a key do not make one identity.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key is of a kind rustls cannot sign with.
    #[error("{0}")]
    Unusable(String),
    /// The key does not belong to the chain's first certificate.
    #[error("{0}")]
    Mismatch(String),
}

/// The certificates of a PEM file (at least one), in order.
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let read = |what: &dyn ToString| PemError::Read {
        path: path.display().to_string(),
        what: what.to_string(),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| read(&e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read(&e))?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| PemError::Read {
        path: path.display().to_string(),
        what: e.to_string(),
    })
}

/// The chain and its key as one signing identity, checked to belong
/// together.
pub fn certified_key(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, KeyError> {
    let signing = rustls::crypto::aws_lc_rs::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| KeyError::Unusable(e.to_string()))?;
    let ck = CertifiedKey::new(certs, signing);
    ck.keys_match()
        .map_err(|e| KeyError::Mismatch(e.to_string()))?;
    Ok(ck)
}

/// The CA certificates of a PEM file as a root store.
pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(path).map_err(|e| e.to_string())? {
        roots
            .add(c)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// A client certificate chain and its key.
pub type ClientCertificate = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// Reads and checks a client certificate and key (they must match); the
/// error names the setting (`client_cert` or `client_key`) at fault.
pub fn load_identity(cert: &Path, key: &Path) -> Result<ClientCertificate, (&'static str, String)> {
    let certs = certs(cert).map_err(|e| ("client_cert", e.to_string()))?;
    let pk = private_key(key).map_err(|e| ("client_key", e.to_string()))?;
    match certified_key(certs.clone(), pk.clone_key()) {
        Ok(_) => Ok((certs, pk)),
        Err(KeyError::Unusable(e)) => Err(("client_key", format!("{}: {e}", key.display()))),
        Err(KeyError::Mismatch(e)) => {
            Err(("client_key", format!("does not match client_cert: {e}")))
        }
    }
}
