//! TLS for the HTTP listener (rustls, ring): the server's certificate chain and key from PEM
//! files; clients are not asked for certificates (the admin token guards what needs it).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The listener's TLS settings from `cert` (the chain, leaf first) and `key`; errors name the
/// file.
pub(crate) fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let named = |path: &Path, detail: String| format!("{}: {detail}", path.display());
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|error| named(cert, error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| named(cert, error.to_string()))?;
    if chain.is_empty() {
        return Err(named(cert, "no certificate in it".into()));
    }
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|error| named(key, error.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|error| format!("{} and {}: {error}", cert.display(), key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
