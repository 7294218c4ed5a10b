//! Trusting private certificate authorities for an S3 endpoint.

use std::fmt;
use std::path::Path;

use aws_sdk_s3::config::SharedHttpClient;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::error::StorageError;

/// PEM certificates of CAs to trust for the endpoint, in addition to the system's roots.
#[derive(Clone)]
pub struct CaBundle {
    pem: Vec<u8>,
    /// Where the bundle came from, as errors name it (`--s3-ca-bundle /etc/ca.pem`, a Secret's
    /// key, ...).
    origin: String,
}

impl fmt::Debug for CaBundle {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("CaBundle")
            .field("origin", &self.origin)
            .field("bytes", &self.pem.len())
            .finish()
    }
}

impl CaBundle {
    /// A bundle from PEM text (a Secret's value, say) that errors call `origin`.
    pub fn from_pem(pem: impl Into<Vec<u8>>, origin: impl Into<String>) -> Self {
        Self {
            pem: pem.into(),
            origin: origin.into(),
        }
    }

    /// A bundle read from a PEM file; errors call it `<setting> <path>`.
    pub fn from_file(path: &Path, setting: &str) -> Result<Self, StorageError> {
        let pem = std::fs::read(path).map_err(|source| StorageError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::from_pem(pem, format!("{setting} {}", path.display())))
    }

    /// The SDK's HTTPS client (rustls with aws-lc, like the default one) trusting the bundle
    /// and the system roots. Refuses a bundle without a valid certificate.
    pub(super) fn https_client(&self) -> Result<SharedHttpClient, StorageError> {
        self.check_certificates()?;
        let context = TlsContext::builder()
            .with_trust_store(TrustStore::default().with_pem_certificate(self.pem.as_slice()))
            .build()
            .map_err(|error| StorageError::Settings(format!("{}: {error}", self.origin)))?;
        Ok(aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::AwsLc,
            ))
            .tls_context(context)
            .build_https())
    }

    /// The TLS stack skips what it cannot parse, so a wrong file (a key, a DER file, an empty
    /// Secret key) would only show later as an untrusted certificate. Refuse it up front instead.
    fn check_certificates(&self) -> Result<(), StorageError> {
        let mut count = 0;
        for certificate in CertificateDer::pem_slice_iter(&self.pem) {
            certificate.map_err(|error| {
                StorageError::Settings(format!("{} is not valid PEM: {error}", self.origin))
            })?;
            count += 1;
        }
        if count == 0 {
            return Err(StorageError::Settings(format!(
                "{} holds no PEM certificate",
                self.origin
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_bundle_without_a_certificate_is_refused() {
        for content in [
            "",
            "not a certificate\n",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ] {
            let bundle = CaBundle::from_pem(content, "--s3-ca-bundle ca.pem");
            let error = bundle.https_client().expect_err(content);
            assert_eq!(
                error.to_string(),
                "invalid settings: --s3-ca-bundle ca.pem holds no PEM certificate"
            );
        }
        let broken = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
        let error = CaBundle::from_pem(broken, "ca.pem")
            .https_client()
            .expect_err("broken");
        assert!(error.to_string().contains("is not valid PEM"), "{error}");
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let error = CaBundle::from_file(Path::new("/nonexistent/ca.pem"), "--s3-ca-bundle")
            .expect_err("missing");
        assert!(
            error
                .to_string()
                .starts_with("cannot read /nonexistent/ca.pem"),
            "{error}"
        );
    }
}
