//! The agent's S3 settings (`--s3-*` flags), and the bucket with the keys of one backup.
//!
//! The client itself is the project's shared one ([`pgkube_controllers::storage`]), and so are
//! the keys ([`pgkube_controllers::storage::keys`]): this module turns the flags and the
//! credential variables into the client's [`S3Options`].

use std::path::PathBuf;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::ServerSideEncryption;
use clap::Args;
use pgkube_controllers::storage::keys::BackupKeys;
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

    /// Extra attempts of a multipart part that still fails with a transient error after the
    /// client's own attempts: after 5, then 15, then 40 s (0 to 3).
    #[arg(long = "s3-part-retries", env = "PGKUBE_S3_PART_RETRIES", default_value_t = 3,
        value_parser = clap::value_parser!(u8).range(0..=3))]
    pub part_retries: u8,
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

/// The bucket, and where this backup's objects are in it.
#[derive(Clone, Debug)]
pub struct Store {
    /// The shared client and the bucket.
    pub s3: S3Bucket,
    pub keys: BackupKeys,
    /// Extra attempts of a part after a transient error (see `transient`).
    pub part_retries: usize,
}

impl Store {
    /// Builds the client and validates the settings. Makes no request.
    pub async fn connect(args: &S3Args, keys: BackupKeys) -> Result<Self, AgentError> {
        let s3 = S3Bucket::connect(&args.options()?).await?;
        Ok(Self {
            s3,
            keys,
            part_retries: usize::from(args.part_retries),
        })
    }

    /// A store over a ready client (for tests that bring their own, such as the test bed's):
    /// no server-side encryption, signed payloads, 3 attempts per request, 3 extra ones per
    /// part.
    pub fn with_client(client: Client, bucket: &str, keys: BackupKeys) -> Self {
        Self {
            s3: S3Bucket::with_client(client, bucket),
            keys,
            part_retries: super::transient::PART_RETRY_WAITS.len(),
        }
    }

    /// Size of an object, or `None` when it does not exist.
    pub async fn object_size(&self, key: &str) -> Result<Option<u64>, AgentError> {
        Ok(self.s3.object_size(key).await?)
    }
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
            part_retries: 3,
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
        let keys = BackupKeys::new("", "c1", "b1", "u1").expect("keys");
        let error = Store::connect(&args, keys).await.expect_err("refused");
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
