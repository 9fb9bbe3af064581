//! A certificate authority of the tests' own, in a temporary directory, and certificates it
//! signs for 127.0.0.1.

use std::path::PathBuf;

pub struct TestPki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl TestPki {
    pub fn new() -> TestPki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        TestPki { dir, ca, ca_key }
    }

    /// The CA's certificate (PEM).
    pub fn ca(&self) -> String {
        self.path("ca.pem")
    }

    /// A certificate for 127.0.0.1 and its key, as `name.pem` and `name.key`.
    pub fn issue(&self, name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (cert_file, key_file) = (format!("{name}.pem"), format!("{name}.key"));
        std::fs::write(self.dir.path().join(&cert_file), cert.pem()).unwrap();
        std::fs::write(self.dir.path().join(&key_file), key.serialize_pem()).unwrap();
        (self.path(&cert_file), self.path(&key_file))
    }

    /// A file in the directory, written with `text`.
    pub fn file(&self, name: &str, text: &str) -> String {
        std::fs::write(self.dir.path().join(name), text).unwrap();
        self.path(name)
    }

    fn path(&self, name: &str) -> String {
        PathBuf::from(self.dir.path())
            .join(name)
            .display()
            .to_string()
    }
}
