//! TLS between peers, an option of [`super::TcpNetwork`]: every connection, both ways and for
//! snapshots too, is mutual TLS (rustls, ring) with certificates signed by the cluster's own
//! CA. A node is checked by the address it is dialled at: its certificate must name that IP
//! address. A connection without TLS, or with a certificate of another CA, is refused at the
//! handshake, before its hello is read.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS settings of a node's peer connections. Cheap to clone.
#[derive(Clone)]
pub struct PeerTls {
    pub(super) server: Arc<rustls::ServerConfig>,
    pub(super) client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

/// Why the TLS settings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PeerTlsError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{what}: {detail}")]
    Pem {
        /// Which input (a path, or "the CA" when given bytes).
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// rustls refused the certificates or key (a key that does not match the certificate, say).
    #[error("TLS settings refused: {0}")]
    Rustls(#[from] rustls::Error),
}

impl PeerTls {
    /// From PEM files: the CA certificate(s) every member's certificate is signed by, this
    /// node's certificate chain, and its private key. Errors name the file.
    ///
    /// ```no_run
    /// # use concord_consensus::transport::PeerTls;
    /// let tls = PeerTls::from_files("ca.pem".as_ref(), "node1.pem".as_ref(), "node1.key".as_ref())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<PeerTls, PeerTlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| PeerTlsError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        let (ca_pem, cert_pem, key_pem) = (read(ca)?, read(cert)?, read(key)?);
        let name = |path: &Path| path.display().to_string();
        Self::build(
            (&ca_pem, name(ca)),
            (&cert_pem, name(cert)),
            (&key_pem, name(key)),
        )
    }

    /// [`PeerTls::from_files`] from PEM bytes.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<PeerTls, PeerTlsError> {
        Self::build(
            (ca, "the CA".into()),
            (cert, "the certificate".into()),
            (key, "the key".into()),
        )
    }

    fn build(
        (ca, ca_name): (&[u8], String),
        (cert, cert_name): (&[u8], String),
        (key, key_name): (&[u8], String),
    ) -> Result<PeerTls, PeerTlsError> {
        let certificates = |pem: &[u8], what: &str| {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| PeerTlsError::Pem {
                    what: what.to_string(),
                    detail: error.to_string(),
                })?;
            if certs.is_empty() {
                return Err(PeerTlsError::Pem {
                    what: what.to_string(),
                    detail: "no certificate in it".into(),
                });
            }
            Ok(certs)
        };
        let mut roots = rustls::RootCertStore::empty();
        for certificate in certificates(ca, &ca_name)? {
            roots.add(certificate)?;
        }
        let roots = Arc::new(roots);
        let chain = certificates(cert, &cert_name)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|error| PeerTlsError::Pem {
            what: key_name,
            detail: error.to_string(),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|error| PeerTlsError::Pem {
            what: ca_name,
            detail: error.to_string(),
        })?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(PeerTls {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}
