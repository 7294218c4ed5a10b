//! The agent's S3 settings (`--s3-*` flags) and the key layout of a backup.
//!
//! The client itself is the project's shared one ([`pgkube_controllers::storage`]): this module
//! turns the flags and the credential variables into its [`S3Options`] and adds where a backup's
//! objects go under the bucket.

use std::path::PathBuf;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::ServerSideEncryption;
use clap::Args;
use pgkube_controllers::storage::{
    self, CaBundle, CredentialSource, Encryption, S3Bucket, S3Options,
};

use super::error::AgentError;

pub use pgkube_controllers::storage::{error_chain, one_line};

/// [`storage::s3_error`] as the agent's error: one line, without credentials.
pub fn s3_error<E>(
    operation: &'static str,
    key: &str,
    error: SdkError<E, HttpResponse>,
) -> AgentError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    storage::s3_error(operation, key, error).into()
}

/// [`storage::secret_from_env_or_file`] as the agent's error.
pub fn secret_from_env_or_file(
    variable: &str,
    file_variable: &str,
) -> Result<Option<String>, AgentError> {
    Ok(storage::secret_from_env_or_file(variable, file_variable)?)
}

/// S3 settings. Credentials are deliberately not flags: see [`CredentialSource::from_env`].
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

impl S3Args {
    /// The shared client's options: these flags, plus the keys from the environment (or the
    /// default chain without them).
    pub fn options(&self) -> Result<S3Options, AgentError> {
        if self.bucket.is_empty() {
            return Err(AgentError::Settings("--s3-bucket is empty".into()));
        }
        let ca_bundle = match &self.ca_bundle {
            Some(path) => Some(CaBundle::from_file(path, "--s3-ca-bundle")?),
            None => None,
        };
        Ok(S3Options {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            bucket: self.bucket.clone(),
            force_path_style: self.force_path_style,
            ca_bundle,
            encryption: self.encryption()?,
            max_attempts: self.max_attempts,
            credentials: CredentialSource::from_env()?,
        })
    }

    fn encryption(&self) -> Result<Encryption, AgentError> {
        let algorithm = match self.server_side_encryption.as_deref() {
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
            kms_key_id: self.sse_kms_key_id.clone().filter(|id| !id.is_empty()),
        })
    }
}

/// The bucket, and where this backup's objects go in it.
#[derive(Clone, Debug)]
pub struct Store {
    /// The shared client and the bucket.
    pub s3: S3Bucket,
    backup_root: String,
}

impl Store {
    /// Builds the client and validates the settings. Makes no request.
    pub async fn connect(args: &S3Args, backup_name: &str) -> Result<Self, AgentError> {
        validate_backup_name(backup_name)?;
        let s3 = S3Bucket::connect(&args.options()?).await?;
        Ok(Self {
            s3,
            backup_root: backup_root(&args.prefix, backup_name),
        })
    }

    /// A store over a ready client (for tests that bring their own, such as the test bed's):
    /// no server-side encryption, signed payloads, 3 attempts per request.
    pub fn with_client(client: Client, bucket: &str, backup_name: &str) -> Self {
        Self {
            s3: S3Bucket::with_client(client, bucket),
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
        Ok(self.s3.object_size(key).await?)
    }
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

    fn args() -> S3Args {
        S3Args {
            endpoint: Some("https://127.0.0.1:9".into()),
            region: "us-east-1".into(),
            bucket: "b".into(),
            prefix: String::new(),
            force_path_style: true,
            ca_bundle: None,
            server_side_encryption: None,
            sse_kms_key_id: None,
            max_attempts: 3,
        }
    }

    #[tokio::test]
    async fn a_ca_bundle_without_a_certificate_is_refused_naming_the_flag() {
        let path = std::env::temp_dir().join(format!("pgkube-not-a-ca-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate\n").expect("writing the bundle");
        let args = S3Args {
            ca_bundle: Some(path.clone()),
            ..args()
        };
        let error = Store::connect(&args, "b1").await.expect_err("refused");
        assert_eq!(
            error.to_string(),
            format!(
                "invalid settings: --s3-ca-bundle {} holds no PEM certificate",
                path.display()
            )
        );
        let _ = std::fs::remove_file(path);
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
    fn unknown_encryption_is_a_settings_error() {
        let mut args = S3Args {
            server_side_encryption: Some("rot13".into()),
            ..args()
        };
        assert!(matches!(args.encryption(), Err(AgentError::Settings(_))));
        args.server_side_encryption = Some("AES256".into());
        let chosen = args.encryption().map(|e| e.algorithm);
        assert!(matches!(chosen, Ok(Some(ServerSideEncryption::Aes256))));
    }

    #[test]
    fn an_empty_bucket_is_refused_naming_the_flag() {
        let args = S3Args {
            bucket: String::new(),
            ..args()
        };
        let error = args.options().expect_err("empty bucket");
        assert_eq!(error.to_string(), "invalid settings: --s3-bucket is empty");
    }
}
