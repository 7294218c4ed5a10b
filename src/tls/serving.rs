//! A serving certificate read from `tls.crt` and `tls.key` in a directory, and read again when
//! either file changes, so that a renewed certificate is served without a restart. Used as the
//! rustls certificate resolver of the manager's webhook and of the instance manager's port.
//!
//! A change is seen by the files' metadata (modification time, inode, size), looked at on each
//! handshake; the files are parsed again only when it differs. While a renewal is half written
//! (a new `tls.crt` beside the old `tls.key`), the last good certificate is served and the files
//! are read again at the next handshake.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::{SERVER_CERT_FILE, SERVER_KEY_FILE};

/// Why the certificate cannot be served: the file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct CertificateError {
    pub path: PathBuf,
    pub problem: String,
}

/// The serving certificate of a directory, as its files are now.
#[derive(Debug)]
pub struct CertificateFiles {
    directory: PathBuf,
    loaded: Mutex<Option<Loaded>>,
}

/// What tells that a file changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: SystemTime,
    inode: u64,
    len: u64,
}

#[derive(Debug)]
struct Loaded {
    stamps: (Stamp, Stamp),
    key: Arc<CertifiedKey>,
}

impl CertificateFiles {
    /// The certificate of `directory`, read at the first handshake: the files may come later.
    pub fn new(directory: &Path) -> Self {
        Self {
            directory: directory.to_owned(),
            loaded: Mutex::new(None),
        }
    }

    /// Reads the certificate in `directory` now, so that a missing or bad one stops the start.
    pub fn load(directory: &Path) -> Result<Self, CertificateError> {
        let files = Self::new(directory);
        files.current()?;
        Ok(files)
    }

    /// The certificate as the files are now; the last good one while they cannot be read
    /// (an error only when none was ever read).
    pub fn current(&self) -> Result<Arc<CertifiedKey>, CertificateError> {
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let stamps = self
            .stamp(SERVER_CERT_FILE)
            .and_then(|crt| Ok((crt, self.stamp(SERVER_KEY_FILE)?)));
        if let (Ok(stamps), Some(loaded)) = (&stamps, loaded.as_ref())
            && loaded.stamps == *stamps
        {
            return Ok(loaded.key.clone());
        }
        match stamps.and_then(|stamps| Ok((stamps, Arc::new(self.read()?)))) {
            Ok((stamps, key)) => {
                if loaded.is_some() {
                    tracing::info!(directory = %self.directory.display(), "serving a renewed certificate");
                }
                *loaded = Some(Loaded {
                    stamps,
                    key: key.clone(),
                });
                Ok(key)
            }
            Err(error) => match loaded.as_ref() {
                Some(last) => {
                    tracing::warn!(%error, "keeping the certificate last read");
                    Ok(last.key.clone())
                }
                None => Err(error),
            },
        }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.directory.join(file)
    }

    fn stamp(&self, file: &str) -> Result<Stamp, CertificateError> {
        let path = self.path(file);
        let metadata = std::fs::metadata(&path).map_err(|error| problem(&path, &error))?;
        Ok(Stamp {
            modified: metadata
                .modified()
                .map_err(|error| problem(&path, &error))?,
            inode: metadata.ino(),
            len: metadata.len(),
        })
    }

    fn read(&self) -> Result<CertifiedKey, CertificateError> {
        let (crt, key) = (self.path(SERVER_CERT_FILE), self.path(SERVER_KEY_FILE));
        let chain = CertificateDer::pem_file_iter(&crt)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|error| problem(&crt, &error))?;
        if chain.is_empty() {
            return Err(problem(&crt, &"no certificate in the file"));
        }
        let private = PrivateKeyDer::from_pem_file(&key).map_err(|error| problem(&key, &error))?;
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        CertifiedKey::from_der(chain, private, &provider).map_err(|error| problem(&key, &error))
    }
}

fn problem(path: &Path, error: &dyn std::fmt::Display) -> CertificateError {
    CertificateError {
        path: path.to_owned(),
        problem: error.to_string(),
    }
}

impl ResolvesServerCert for CertificateFiles {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match self.current() {
            Ok(key) => Some(key),
            Err(error) => {
                tracing::error!(%error, "no certificate to serve");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgkube_controllers::pki::{self, Issued};

    fn issue(ca: &Issued) -> Issued {
        let now = time::OffsetDateTime::now_utc();
        let hosts = ["localhost".to_owned()];
        pki::issue_server(ca, &hosts, now, time::Duration::days(1)).expect("certificate")
    }

    #[test]
    fn the_files_are_read_again_only_when_changed_and_a_half_written_renewal_is_not_served() {
        let dir = std::env::temp_dir().join(format!("pgkube-serving-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let now = time::OffsetDateTime::now_utc();
        let ca = pki::new_ca("CA", now, time::Duration::days(2)).expect("CA");
        let first = issue(&ca);
        std::fs::write(dir.join(SERVER_CERT_FILE), &first.cert_pem).expect("tls.crt");
        std::fs::write(dir.join(SERVER_KEY_FILE), &first.key_pem).expect("tls.key");
        let files = CertificateFiles::load(&dir).expect("certificate");
        let served = files.current().expect("served");
        assert!(
            Arc::ptr_eq(&served, &files.current().expect("again")),
            "not read again"
        );

        let renewed = issue(&ca);
        std::fs::remove_file(dir.join(SERVER_CERT_FILE)).expect("new inode");
        std::fs::write(dir.join(SERVER_CERT_FILE), &renewed.cert_pem).expect("tls.crt");
        let half = files.current().expect("the last good one");
        assert!(
            Arc::ptr_eq(&served, &half),
            "a certificate without its key is not served"
        );
        std::fs::write(dir.join(SERVER_KEY_FILE), &renewed.key_pem).expect("tls.key");
        let whole = files.current().expect("renewed");
        assert_eq!(
            whole.cert[0].as_ref(),
            CertificateDer::from_pem_slice(renewed.cert_pem.as_bytes())
                .expect("PEM")
                .as_ref()
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
