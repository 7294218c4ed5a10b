//! TLS for the cluster's PostgreSQL, as the instance manager and the agents use it: the
//! certificate files of a mounted Secret volume copied where PostgreSQL and libpq accept them,
//! and the client settings of a connection to another instance (libpq's, and rustls' for
//! tokio-postgres).
//!
//! The copy is needed because both refuse a private key that anyone but its owner may read,
//! while a kubelet's volume files belong to root with the pod's group, or to another user.
//!
//! [`serving`] is the other side: a server certificate read from files and read again when they
//! change, for the servers pgkube runs itself over rustls.

pub mod serving;

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// Files of the TLS volume: the CA that signed the server's certificate (what clients verify
/// a server with), the server's certificate and key, and the client certificates.
pub const CA_FILE: &str = "ca.crt";
/// The CA that signed the client certificates, what the server verifies them with; without
/// it (a pod made by an older pgkube), `ca.crt`, which then signed both.
pub const CLIENT_CA_FILE: &str = "client-ca.crt";
/// What clients verify the cluster's servers with, written beside the copies: `ca.crt` and
/// `client-ca.crt` together ([`servers_ca`]).
pub const SERVERS_CA_FILE: &str = "servers-ca.crt";
/// The CA of the applications' client certificates (`spec.certificates.clientCASecret`), on
/// instance pods of a cluster that has one.
pub const USER_CLIENT_CA_FILE: &str = "user-client-ca.crt";
/// What the server verifies client certificates with when the user gave a client CA, written
/// beside the copies: `client-ca.crt` and `user-client-ca.crt` together.
pub const CLIENT_CAS_FILE: &str = "client-cas.crt";
pub const SERVER_CERT_FILE: &str = "tls.crt";
pub const SERVER_KEY_FILE: &str = "tls.key";

/// Whose client certificate a connection presents: its common name is the role it logs in as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRole {
    Replication,
    Superuser,
}

impl ClientRole {
    fn file_stem(self) -> &'static str {
        match self {
            ClientRole::Replication => "replication",
            ClientRole::Superuser => "superuser",
        }
    }
}

/// Copies each file of `source` (a Secret volume: its dotted entries are the kubelet's) into
/// `target`, readable by this user only, rewriting only what changed. Returns a digest of the
/// content, which changes whenever a certificate does; `None` when `source` holds no CA, so
/// TLS is not set up for this pod.
pub fn copy_private(source: &Path, target: &Path) -> io::Result<Option<String>> {
    if !source.join(CA_FILE).exists() {
        return Ok(None);
    }
    fs::create_dir_all(target)?;
    let mut names: Vec<String> = fs::read_dir(source)?
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.'))
        .collect();
    names.sort();
    let mut digest = Sha256::new();
    for name in names {
        let content = fs::read(source.join(&name))?;
        digest.update(name.as_bytes());
        digest.update((content.len() as u64).to_le_bytes());
        digest.update(&content);
        let path = target.join(&name);
        write_if_changed(&path, &content)?;
    }
    write_if_changed(&target.join(SERVERS_CA_FILE), &servers_ca(source)?)?;
    write_client_cas(source, target)?;
    Ok(Some(hex::encode(digest.finalize())))
}

/// [`CLIENT_CAS_FILE`] in `target`: pgkube's client CA and the user's, when `source` has the
/// user's; none otherwise.
fn write_client_cas(source: &Path, target: &Path) -> io::Result<()> {
    match fs::read(source.join(USER_CLIENT_CA_FILE)) {
        Ok(user) => {
            let mut bundle = fs::read(source.join(CLIENT_CA_FILE))?;
            append_pem(&mut bundle, &user);
            write_if_changed(&target.join(CLIENT_CAS_FILE), &bundle)
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            remove_if_present(&target.join(CLIENT_CAS_FILE))
        }
        Err(error) => Err(error),
    }
}

/// The CAs a client of the cluster's servers trusts, from the certificates in `dir`: `ca.crt`
/// (what signed the servers' certificates) and `client-ca.crt` (pgkube's CA) when it is
/// another. pgkube's CA signs only this cluster's certificates; trusting it as well lets the
/// pods made before and after a certificate of one's own was added (`spec.certificates`)
/// verify each other while they are replaced, as each side trusts the other's CA.
pub fn servers_ca(dir: &Path) -> io::Result<Vec<u8>> {
    let mut bundle = fs::read(dir.join(CA_FILE))?;
    let client_ca = match fs::read(dir.join(CLIENT_CA_FILE)) {
        Ok(content) => content,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(bundle),
        Err(error) => return Err(error),
    };
    if client_ca != bundle {
        append_pem(&mut bundle, &client_ca);
    }
    Ok(bundle)
}

fn append_pem(bundle: &mut Vec<u8>, pem: &[u8]) {
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(pem);
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// The CAs of a pod's certificates, each as the SHA-256 (hex) of its DER form: those that
/// signed its server certificate (`ca.crt`) and those it verifies other servers with
/// ([`servers_ca`]). The operator moves the primary to an updated replica only when the
/// primary, which rejoins as its standby, trusts the replica's server CA.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaDigests {
    pub server_cas: Vec<String>,
    pub trusted_cas: Vec<String>,
}

/// The CA digests of the certificates mounted in `dir`; none without a `ca.crt`.
pub fn ca_digests(dir: &Path) -> Option<CaDigests> {
    let server = fs::read(dir.join(CA_FILE)).ok()?;
    let trusted = servers_ca(dir).ok()?;
    Some(CaDigests {
        server_cas: pem_digests(&server),
        trusted_cas: pem_digests(&trusted),
    })
}

/// The SHA-256 (hex) of each certificate of a PEM bundle, in order, once each.
pub fn pem_digests(pem: &[u8]) -> Vec<String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut digests: Vec<String> = Vec::new();
    for certificate in CertificateDer::pem_slice_iter(pem).filter_map(Result::ok) {
        let digest = hex::encode(Sha256::digest(certificate.as_ref()));
        if !digests.contains(&digest) {
            digests.push(digest);
        }
    }
    digests
}

/// Writes `content` to `path` unless it holds it already.
fn write_if_changed(path: &Path, content: &[u8]) -> io::Result<()> {
    if fs::read(path).ok().as_deref() == Some(content) {
        return Ok(());
    }
    write_private(path, content)
}

/// Writes `content` to `path` with mode 0600, whole or not at all (a reader never sees half a
/// key).
fn write_private(path: &Path, content: &[u8]) -> io::Result<()> {
    let partial = path.with_extension("partial");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)?;
    file.write_all(content)?;
    file.sync_all()?;
    fs::rename(&partial, path)
}

/// How a connection to another instance uses TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTls {
    /// Verify the server's certificate and name (`verify-full`); otherwise TLS when the server
    /// offers it (`prefer`), while a cluster's instances are still getting their certificates.
    pub verify: bool,
    pub root_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientTls {
    /// The settings for `role`'s certificate among the copied files in `dir`
    /// ([`copy_private`]'s target).
    pub fn new(dir: &Path, role: ClientRole, verify: bool) -> Self {
        let stem = role.file_stem();
        Self {
            verify,
            root_cert: dir.join(SERVERS_CA_FILE),
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        }
    }

    fn sslmode(&self) -> &'static str {
        if self.verify { "verify-full" } else { "prefer" }
    }

    /// libpq's environment for these settings.
    pub fn env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        vec![
            ("PGSSLMODE", self.sslmode().into()),
            ("PGSSLROOTCERT", self.root_cert.clone().into_os_string()),
            ("PGSSLCERT", self.cert.clone().into_os_string()),
            ("PGSSLKEY", self.key.clone().into_os_string()),
        ]
    }

    /// The libpq connection parameters, each value quoted by `quote`.
    pub fn conninfo(&self, quote: impl Fn(&str) -> String) -> String {
        format!(
            "sslmode={} sslrootcert={} sslcert={} sslkey={}",
            self.sslmode(),
            quote(&self.root_cert.to_string_lossy()),
            quote(&self.cert.to_string_lossy()),
            quote(&self.key.to_string_lossy()),
        )
    }

    /// A tokio-postgres TLS connector that trusts the CA and presents the client certificate.
    /// With `verify`, the server's name is checked against its certificate, as `verify-full`.
    pub fn connector(&self) -> Result<tokio_postgres_rustls::MakeRustlsConnect, TlsError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let read = |path: &Path| {
            fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&read(&self.root_cert)?) {
            roots.add(cert.map_err(|e| TlsError::Pem(e.to_string()))?)?;
        }
        let chain = CertificateDer::pem_slice_iter(&read(&self.cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Pem(e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?)
            .map_err(|e| TlsError::Pem(e.to_string()))?;
        let builder = rustls::ClientConfig::builder();
        let config = if self.verify {
            builder
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)?
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoServerCheck(
                    rustls::crypto::CryptoProvider::get_default()
                        .cloned()
                        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider())),
                )))
                .with_client_auth_cert(chain, key)?
        };
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

/// Why the TLS client settings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("not a PEM certificate or key: {0}")]
    Pem(String),
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

/// `prefer`'s check of the server: none (the signatures of the handshake still are). Used only
/// while a cluster's instances are getting their certificates, as libpq's `prefer` does.
#[derive(Debug)]
struct NoServerCheck(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoServerCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_are_copied_private_and_the_digest_follows_their_content() {
        let root = std::env::temp_dir().join(format!("pgkube-tls-{}", std::process::id()));
        let (source, target) = (root.join("volume"), root.join("private"));
        fs::create_dir_all(source.join("..2026_01_01")).expect("volume");
        assert_eq!(copy_private(&source, &target).expect("copy"), None);
        fs::write(source.join(CA_FILE), "ca").expect("ca");
        fs::write(source.join(SERVER_KEY_FILE), "key").expect("key");
        let first = copy_private(&source, &target)
            .expect("copy")
            .expect("digest");
        let mode = fs::metadata(target.join(SERVER_KEY_FILE))
            .expect("copied")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!target.join("..2026_01_01").exists());
        assert_eq!(
            copy_private(&source, &target).expect("copy"),
            Some(first.clone())
        );
        fs::write(source.join(SERVER_KEY_FILE), "renewed").expect("key");
        let second = copy_private(&source, &target)
            .expect("copy")
            .expect("digest");
        assert_ne!(first, second);
        assert_eq!(
            fs::read(target.join(SERVER_KEY_FILE)).expect("read"),
            b"renewed"
        );
        assert_eq!(fs::read(target.join(SERVERS_CA_FILE)).expect("read"), b"ca");
        fs::remove_dir_all(root).expect("clean up");
    }

    #[test]
    fn the_server_verifies_clients_with_pgkubes_ca_and_the_users_when_given() {
        let root = std::env::temp_dir().join(format!("pgkube-tls-clients-{}", std::process::id()));
        let (source, target) = (root.join("volume"), root.join("private"));
        fs::create_dir_all(&source).expect("volume");
        fs::write(source.join(CA_FILE), "server CA\n").expect("ca");
        fs::write(source.join(CLIENT_CA_FILE), "pgkube CA").expect("client ca");
        copy_private(&source, &target).expect("copy");
        assert!(
            !target.join(CLIENT_CAS_FILE).exists(),
            "no user CA, no bundle"
        );
        fs::write(source.join(USER_CLIENT_CA_FILE), "user CA\n").expect("user ca");
        copy_private(&source, &target).expect("copy");
        assert_eq!(
            fs::read(target.join(CLIENT_CAS_FILE)).expect("bundle"),
            b"pgkube CA\nuser CA\n"
        );
        fs::remove_file(source.join(USER_CLIENT_CA_FILE)).expect("remove");
        copy_private(&source, &target).expect("copy");
        assert!(
            !target.join(CLIENT_CAS_FILE).exists(),
            "a stale bundle is removed"
        );
        fs::remove_dir_all(root).expect("clean up");
    }

    #[test]
    fn clients_trust_the_server_ca_and_pgkubes_once_each() {
        let dir = std::env::temp_dir().join(format!("pgkube-tls-bundle-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("dir");
        fs::write(dir.join(CA_FILE), "own CA").expect("ca");
        assert_eq!(servers_ca(&dir).expect("bundle"), b"own CA");
        fs::write(dir.join(CLIENT_CA_FILE), "pgkube CA\n").expect("client ca");
        assert_eq!(servers_ca(&dir).expect("bundle"), b"own CA\npgkube CA\n");
        fs::write(dir.join(CA_FILE), "pgkube CA\n").expect("ca");
        assert_eq!(servers_ca(&dir).expect("bundle"), b"pgkube CA\n");
        let client = ClientTls::new(&dir, ClientRole::Replication, true);
        assert_eq!(client.root_cert, dir.join(SERVERS_CA_FILE));
        fs::remove_dir_all(dir).expect("clean up");
    }

    #[test]
    fn a_pod_reports_the_digests_of_its_server_ca_and_of_the_cas_it_trusts() {
        let dir = std::env::temp_dir().join(format!("pgkube-tls-digests-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("dir");
        assert_eq!(ca_digests(&dir), None, "no certificates");
        let now = time::OffsetDateTime::now_utc();
        let ca = |name| {
            pgkube_controllers::pki::new_ca(name, now, time::Duration::days(1))
                .expect("CA")
                .cert_pem
        };
        let (own, pgkube) = (ca("own CA"), ca("pgkube CA"));
        let digest = |pem: &str| pem_digests(pem.as_bytes()).remove(0);
        fs::write(dir.join(CA_FILE), &own).expect("ca");
        fs::write(dir.join(CLIENT_CA_FILE), &pgkube).expect("client ca");
        let reported = ca_digests(&dir).expect("digests");
        assert_eq!(reported.server_cas, [digest(&own)]);
        assert_eq!(reported.trusted_cas, [digest(&own), digest(&pgkube)]);
        // The issued Secret's ca.crt once a CA of one's own was added to it.
        fs::write(dir.join(CA_FILE), format!("{pgkube}{own}")).expect("ca");
        let reported = ca_digests(&dir).expect("digests");
        assert_eq!(reported.server_cas, [digest(&pgkube), digest(&own)]);
        assert_eq!(reported.trusted_cas, reported.server_cas, "each once");
        fs::remove_dir_all(dir).expect("clean up");
    }
}
