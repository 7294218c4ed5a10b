//! S3 settings, the S3 client, and the key layout of a backup.
//!
//! The client is built for S3-compatible stores as well as AWS: checksums are computed and
//! validated only when an operation requires them (newer SDK defaults send CRC headers that
//! Garage, Ceph RGW and older MinIO reject), path-style addressing is a switch, and a custom CA
//! bundle can be trusted in addition to the system roots. Transient errors (throttling, 5xx,
//! connection resets) are retried by the SDK's standard retry strategy with exponential backoff.
//!
//! Part uploads carry a SigV4 payload hash (a SHA-256 of every part, computed by the SDK and again
//! by the store) only over plain HTTP, where it is the only strong check that the store received
//! the bytes sent. Over HTTPS, TLS already authenticates every byte in transit, so parts are sent
//! as `UNSIGNED-PAYLOAD` and neither side spends a SHA-256 pass on them. Either way the object's
//! size is checked after the upload and its SHA-256 (computed by the agent) goes in the manifest.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{
    Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::ServerSideEncryption;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use clap::Args;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::error::AgentError;

/// S3 settings. Credentials are deliberately not flags: see [`static_credentials`].
#[derive(Args, Debug)]
pub struct S3Args {
    /// S3 endpoint URL (for example https://s3.example.com); AWS's own when absent.
    #[arg(long = "s3-endpoint", env = "PGKUBE_S3_ENDPOINT")]
    pub endpoint: Option<String>,

    /// S3 region (most S3-compatible stores accept any value they were configured with).
    #[arg(
        long = "s3-region",
        env = "PGKUBE_S3_REGION",
        default_value = "us-east-1"
    )]
    pub region: String,

    /// Bucket that holds the backups.
    #[arg(long = "s3-bucket", env = "PGKUBE_S3_BUCKET")]
    pub bucket: String,

    /// Key prefix under which backups are stored (no leading or trailing slash needed).
    #[arg(long = "s3-prefix", env = "PGKUBE_S3_PREFIX", default_value = "")]
    pub prefix: String,

    /// Address buckets as <endpoint>/<bucket> instead of <bucket>.<endpoint>.
    #[arg(long = "s3-force-path-style", env = "PGKUBE_S3_FORCE_PATH_STYLE")]
    pub force_path_style: bool,

    /// PEM file of extra CA certificates to trust for the endpoint.
    #[arg(long = "s3-ca-bundle", env = "PGKUBE_S3_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,

    /// Server-side encryption of stored objects: AES256 or aws:kms.
    #[arg(long = "s3-sse", env = "PGKUBE_S3_SSE")]
    pub server_side_encryption: Option<String>,

    /// KMS key id for --s3-sse aws:kms (the store's default key when absent).
    #[arg(long = "s3-sse-kms-key-id", env = "PGKUBE_S3_SSE_KMS_KEY_ID")]
    pub sse_kms_key_id: Option<String>,

    /// Attempts per S3 request, the first one included, before a transient error is fatal.
    #[arg(
        long = "s3-max-attempts",
        env = "PGKUBE_S3_MAX_ATTEMPTS",
        default_value_t = 6
    )]
    pub max_attempts: u32,
}

/// What every write must carry to honour the server-side encryption setting.
#[derive(Clone, Debug, Default)]
pub struct Encryption {
    pub algorithm: Option<ServerSideEncryption>,
    pub kms_key_id: Option<String>,
}

/// A ready S3 client plus where the backup lives.
#[derive(Clone, Debug)]
pub struct Store {
    pub client: Client,
    pub bucket: String,
    pub encryption: Encryption,
    /// Whether part uploads sign their payload's SHA-256 (plain HTTP endpoints only).
    pub sign_payloads: bool,
    /// Attempts per request (`--s3-max-attempts`); also how often a broken download resumes.
    pub max_attempts: u32,
    backup_root: String,
}

impl Store {
    /// Builds the client and validates the settings. Makes no request.
    pub async fn connect(args: &S3Args, backup_name: &str) -> Result<Self, AgentError> {
        validate_backup_name(backup_name)?;
        if args.bucket.is_empty() {
            return Err(AgentError::Settings("--s3-bucket is empty".into()));
        }
        let client = build_client(args).await?;
        Ok(Self {
            client,
            bucket: args.bucket.clone(),
            encryption: encryption(args)?,
            sign_payloads: !is_https(args.endpoint.as_deref()),
            max_attempts: args.max_attempts.max(1),
            backup_root: backup_root(&args.prefix, backup_name),
        })
    }

    /// A store over a ready client (for tests that bring their own, such as the test bed's):
    /// no server-side encryption, signed payloads, 3 attempts per request.
    pub fn with_client(client: Client, bucket: &str, backup_name: &str) -> Self {
        Self {
            client,
            bucket: bucket.to_string(),
            encryption: Encryption::default(),
            sign_payloads: true,
            max_attempts: 3,
            backup_root: backup_root("", backup_name),
        }
    }

    pub fn manifest_key(&self) -> String {
        format!("{}/manifest.json", self.backup_root)
    }

    pub fn globals_key(&self) -> String {
        format!("{}/globals.sql", self.backup_root)
    }

    pub fn database_key(&self, database: &str) -> String {
        format!(
            "{}/databases/{}.dump",
            self.backup_root,
            escape_key_segment(database)
        )
    }

    /// Size of an object, or `None` when it does not exist.
    pub async fn object_size(&self, key: &str) -> Result<Option<u64>, AgentError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(head) => Ok(Some(
                head.content_length()
                    .and_then(|length| u64::try_from(length).ok())
                    .unwrap_or(0),
            )),
            Err(SdkError::ServiceError(service)) if service.err().is_not_found() => Ok(None),
            Err(error) => Err(s3_error("HeadObject", key, error)),
        }
    }
}

/// Reduces an SDK error to one line without credentials: the service's code and message when
/// the store answered with them, the HTTP status and its usual cause when it did not (answers
/// to HEAD have no body), otherwise the transport failure (connection refused, timeout, ...).
pub fn s3_error<E>(
    operation: &'static str,
    key: &str,
    error: SdkError<E, HttpResponse>,
) -> AgentError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let reason = match &error {
        SdkError::ServiceError(service) => {
            let err = service.err();
            match (err.code(), err.message()) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(code), None) => code.to_string(),
                _ => status_reason(service.raw().status().as_u16()),
            }
        }
        _ => error_chain(&error),
    };
    AgentError::S3 {
        operation,
        key: key.to_string(),
        reason: one_line(&reason),
    }
}

/// What a bare HTTP status from an S3 store usually means.
fn status_reason(status: u16) -> String {
    let cause = match status {
        301 | 307 => "the bucket is in another region or behind another endpoint",
        400 => "bad request: check --s3-region and the endpoint",
        401 | 403 => "access denied: check the access key, the secret key and the bucket's policy",
        404 => "not found: check the bucket name",
        500..=599 => "the store failed (retries exhausted)",
        _ => "unexpected answer",
    };
    format!("HTTP {status}, no S3 error code ({cause})")
}

/// `outer: cause: root cause`, each error's Display once (no Debug dumps).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn build_client(args: &S3Args) -> Result<Client, AgentError> {
    let retry = RetryConfig::standard()
        .with_max_attempts(args.max_attempts.max(1))
        .with_initial_backoff(Duration::from_millis(200))
        .with_max_backoff(Duration::from_secs(20));
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(120))
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(args.region.clone()))
        .retry_config(retry)
        .timeout_config(timeouts);
    if let Some(credentials) = static_credentials()? {
        loader = loader.credentials_provider(credentials);
    }
    if let Some(path) = &args.ca_bundle {
        loader = loader.http_client(https_client_trusting(path)?);
    }
    let shared = loader.load().await;
    let mut config = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(args.force_path_style)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
    if let Some(endpoint) = &args.endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(Client::from_conf(config.build()))
}

/// Whether requests go over TLS: AWS's own endpoint (no endpoint given) or an `https://` URL.
fn is_https(endpoint: Option<&str>) -> bool {
    endpoint.is_none_or(|url| {
        url.trim_start()
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
    })
}

/// Static keys from files (mounted Secrets) or the standard AWS variables. `None` leaves the
/// SDK's default chain (web identity, instance profile, ...) in charge.
fn static_credentials() -> Result<Option<Credentials>, AgentError> {
    let access_key = secret_from_env_or_file("AWS_ACCESS_KEY_ID", "PGKUBE_S3_ACCESS_KEY_ID_FILE")?;
    let secret_key =
        secret_from_env_or_file("AWS_SECRET_ACCESS_KEY", "PGKUBE_S3_SECRET_ACCESS_KEY_FILE")?;
    match (access_key, secret_key) {
        (Some(access_key), Some(secret_key)) => Ok(Some(Credentials::new(
            access_key, secret_key, None, None, "pgkube",
        ))),
        (None, None) => Ok(None),
        _ => Err(AgentError::Settings(
            "S3 access key id and secret access key must be given together".into(),
        )),
    }
}

/// The value of `file_variable`'s file (trailing newline removed) or else of `variable`.
pub fn secret_from_env_or_file(
    variable: &str,
    file_variable: &str,
) -> Result<Option<String>, AgentError> {
    if let Some(path) = std::env::var_os(file_variable) {
        let path = PathBuf::from(path);
        let content = std::fs::read_to_string(&path)
            .map_err(|source| AgentError::ReadFile { path, source })?;
        return Ok(Some(content.trim_end_matches(['\r', '\n']).to_string()));
    }
    Ok(std::env::var(variable)
        .ok()
        .filter(|value| !value.is_empty()))
}

fn https_client_trusting(
    ca_bundle: &Path,
) -> Result<aws_sdk_s3::config::SharedHttpClient, AgentError> {
    let pem = std::fs::read(ca_bundle).map_err(|source| AgentError::ReadFile {
        path: ca_bundle.to_path_buf(),
        source,
    })?;
    check_pem_certificates(ca_bundle, &pem)?;
    let context = TlsContext::builder()
        .with_trust_store(TrustStore::default().with_pem_certificate(pem))
        .build()
        .map_err(|error| AgentError::Settings(format!("--s3-ca-bundle: {error}")))?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(context)
        .build_https())
}

/// The TLS stack skips what it cannot parse, so a wrong file (a key, a DER file, an empty
/// Secret key) would only show later as an untrusted certificate. Refuse it up front instead.
fn check_pem_certificates(path: &Path, pem: &[u8]) -> Result<(), AgentError> {
    let mut count = 0;
    for certificate in CertificateDer::pem_slice_iter(pem) {
        certificate.map_err(|error| {
            AgentError::Settings(format!(
                "--s3-ca-bundle {} is not valid PEM: {error}",
                path.display()
            ))
        })?;
        count += 1;
    }
    if count == 0 {
        return Err(AgentError::Settings(format!(
            "--s3-ca-bundle {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(())
}

fn encryption(args: &S3Args) -> Result<Encryption, AgentError> {
    let algorithm = match args.server_side_encryption.as_deref() {
        None | Some("") => None,
        Some(value @ ("AES256" | "aws:kms" | "aws:kms:dsse")) => {
            Some(ServerSideEncryption::from(value))
        }
        Some(other) => {
            return Err(AgentError::Settings(format!(
                "--s3-sse must be AES256, aws:kms or aws:kms:dsse, not {other:?}"
            )));
        }
    };
    Ok(Encryption {
        algorithm,
        kms_key_id: args.sse_kms_key_id.clone().filter(|id| !id.is_empty()),
    })
}

fn validate_backup_name(name: &str) -> Result<(), AgentError> {
    let valid = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte));
    if valid {
        Ok(())
    } else {
        Err(AgentError::Settings(format!(
            "backup name {name:?} must be non-empty and use only letters, digits, '-', '_' and '.'"
        )))
    }
}

/// `<prefix>/<backup-name>`, without empty segments whatever slashes the prefix has.
fn backup_root(prefix: &str, backup_name: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        backup_name.to_string()
    } else {
        format!("{prefix}/{backup_name}")
    }
}

/// Keeps ASCII letters, digits, `_` and `-`; writes every other byte as `%XX`. Dots are escaped
/// too, so no database name can become `.` or `..` in a key.
fn escape_key_segment(name: &str) -> String {
    let mut escaped = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            escaped.push(char::from(byte));
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_bundle_without_a_certificate_is_refused() {
        let path = Path::new("ca.pem");
        for content in [
            "",
            "not a certificate\n",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        ] {
            let error = check_pem_certificates(path, content.as_bytes()).expect_err(content);
            assert_eq!(
                error.to_string(),
                "invalid settings: --s3-ca-bundle ca.pem holds no PEM certificate"
            );
        }
        let broken = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
        let error = check_pem_certificates(path, broken.as_bytes()).expect_err("broken");
        assert!(error.to_string().contains("is not valid PEM"), "{error}");
    }

    #[test]
    fn backup_root_ignores_stray_slashes_in_the_prefix() {
        assert_eq!(backup_root("", "b1"), "b1");
        assert_eq!(backup_root("/", "b1"), "b1");
        assert_eq!(backup_root("/team/db/", "b1"), "team/db/b1");
    }

    #[test]
    fn database_names_become_safe_key_segments() {
        assert_eq!(escape_key_segment("app_db-1"), "app_db-1");
        assert_eq!(escape_key_segment("a/b"), "a%2Fb");
        assert_eq!(escape_key_segment(".."), "%2E%2E");
        assert_eq!(escape_key_segment("é"), "%C3%A9");
        assert_ne!(escape_key_segment("a b"), escape_key_segment("a_b"));
    }

    #[test]
    fn backup_names_that_could_escape_the_prefix_are_rejected() {
        assert!(validate_backup_name("nightly-2024.01.01_0300").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "x\n"] {
            assert!(validate_backup_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn payloads_are_signed_only_without_tls() {
        assert!(is_https(None));
        assert!(is_https(Some("https://s3.example.com")));
        assert!(is_https(Some("HTTPS://S3.EXAMPLE.COM:9000")));
        assert!(!is_https(Some("http://garage.storage:3900")));
        assert!(!is_https(Some("httpsx")));
    }

    #[test]
    fn unknown_encryption_is_a_settings_error() {
        let mut args = S3Args {
            endpoint: None,
            region: "us-east-1".into(),
            bucket: "b".into(),
            prefix: String::new(),
            force_path_style: true,
            ca_bundle: None,
            server_side_encryption: Some("rot13".into()),
            sse_kms_key_id: None,
            max_attempts: 3,
        };
        assert!(matches!(encryption(&args), Err(AgentError::Settings(_))));
        args.server_side_encryption = Some("AES256".into());
        let chosen = encryption(&args).map(|e| e.algorithm);
        assert!(matches!(chosen, Ok(Some(ServerSideEncryption::Aes256))));
    }
}
