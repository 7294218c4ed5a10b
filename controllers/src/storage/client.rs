//! The S3 client: its options, and a ready client bound to one bucket.

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::create_multipart_upload::builders::CreateMultipartUploadFluentBuilder;
use aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ServerSideEncryption;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};

use super::credentials::CredentialSource;
use super::error::{StorageError, error_chain, one_line, s3_error};
use super::tls::CaBundle;

/// Everything that decides how the client talks to the store.
#[derive(Clone, Debug)]
pub struct S3Options {
    /// Endpoint URL (`https://minio.example:9000`); AWS's own when `None`.
    pub endpoint: Option<String>,
    /// Region to sign for; most S3-compatible stores accept whatever they were configured with.
    pub region: String,
    /// Bucket every request of the [`S3Bucket`] goes to.
    pub bucket: String,
    /// Address buckets as `<endpoint>/<bucket>` instead of `<bucket>.<endpoint>`.
    pub force_path_style: bool,
    /// Extra CAs to trust for the endpoint.
    pub ca_bundle: Option<CaBundle>,
    /// What every object written must be encrypted with.
    pub encryption: Encryption,
    /// Attempts per request, the first one included, before a transient error is fatal.
    pub max_attempts: u32,
    pub credentials: CredentialSource,
}

impl Default for S3Options {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: "us-east-1".into(),
            bucket: String::new(),
            force_path_style: false,
            ca_bundle: None,
            encryption: Encryption::default(),
            max_attempts: 6,
            credentials: CredentialSource::DefaultChain,
        }
    }
}

/// Server-side encryption that every write must request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Encryption {
    pub algorithm: Option<ServerSideEncryption>,
    /// KMS key for `aws:kms`; the store's default key when `None`.
    pub kms_key_id: Option<String>,
}

/// A ready client and the bucket it works in.
#[derive(Clone, Debug)]
pub struct S3Bucket {
    pub client: Client,
    /// The bucket's name.
    pub name: String,
    pub encryption: Encryption,
    /// Whether part uploads sign their payload's SHA-256: over plain HTTP only (see the module
    /// documentation).
    pub sign_payloads: bool,
    /// Attempts per request ([`S3Options::max_attempts`], at least 1); callers that resume
    /// transfers themselves use it too.
    pub max_attempts: u32,
}

impl S3Bucket {
    /// Builds the client and validates the options. Makes no request.
    pub async fn connect(options: &S3Options) -> Result<Self, StorageError> {
        if options.bucket.is_empty() {
            return Err(StorageError::Settings("the S3 bucket name is empty".into()));
        }
        Ok(Self {
            client: build_client(options).await?,
            name: options.bucket.clone(),
            encryption: options.encryption.clone(),
            sign_payloads: !is_https(options.endpoint.as_deref()),
            max_attempts: options.max_attempts.max(1),
        })
    }

    /// A bucket over a ready client (for tests that bring their own, such as the test bed's):
    /// no server-side encryption, signed payloads, 3 attempts per request.
    pub fn with_client(client: Client, name: &str) -> Self {
        Self {
            client,
            name: name.to_string(),
            encryption: Encryption::default(),
            sign_payloads: true,
            max_attempts: 3,
        }
    }

    /// Size of an object, or `None` when it does not exist.
    pub async fn object_size(&self, key: &str) -> Result<Option<u64>, StorageError> {
        let head = self
            .client
            .head_object()
            .bucket(&self.name)
            .key(key)
            .send()
            .await;
        match head {
            Ok(head) => Ok(Some(
                head.content_length()
                    .and_then(|length| u64::try_from(length).ok())
                    .unwrap_or(0),
            )),
            Err(SdkError::ServiceError(service)) if service.err().is_not_found() => Ok(None),
            Err(error) => Err(s3_error("HeadObject", key, error)),
        }
    }

    /// The whole content of a (small) object, or `None` when it does not exist.
    pub async fn read_object(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .read_object_with_metadata(key)
            .await?
            .map(|(bytes, _)| bytes.to_vec()))
    }

    /// The whole content of a (small) object and its user metadata (`x-amz-meta-…`), or `None`
    /// when it does not exist.
    pub async fn read_object_with_metadata(
        &self,
        key: &str,
    ) -> Result<Option<(bytes::Bytes, std::collections::HashMap<String, String>)>, StorageError>
    {
        let answer = self
            .client
            .get_object()
            .bucket(&self.name)
            .key(key)
            .send()
            .await;
        let object = match answer {
            Ok(object) => object,
            Err(SdkError::ServiceError(service)) if service.err().is_no_such_key() => {
                return Ok(None);
            }
            Err(error) => return Err(s3_error("GetObject", key, error)),
        };
        let metadata = object.metadata().cloned().unwrap_or_default();
        let bytes = object
            .body
            .collect()
            .await
            .map_err(|error| StorageError::S3 {
                operation: "GetObject",
                key: key.to_owned(),
                reason: one_line(&error_chain(&error)),
            })?;
        Ok(Some((bytes.into_bytes(), metadata)))
    }

    /// One quiet DeleteObjects request for `keys` (at most 1000): the keys the store says it
    /// did not delete, with its reason. DeleteObjects answers 200 even then, so callers must
    /// look at them.
    pub(super) async fn delete_objects(
        &self,
        keys: &[String],
    ) -> Result<Vec<(String, String)>, StorageError> {
        let first_key = keys.first().map(String::as_str).unwrap_or_default();
        let request_error = |error: &dyn std::error::Error| StorageError::S3 {
            operation: "DeleteObjects",
            key: first_key.to_owned(),
            reason: format!("cannot build the request: {error}"),
        };
        let objects = keys
            .iter()
            .map(|key| ObjectIdentifier::builder().key(key).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| request_error(&error))?;
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(|error| request_error(&error))?;
        let answer = self
            .client
            .delete_objects()
            .bucket(&self.name)
            .delete(delete)
            .send()
            .await
            .map_err(|error| s3_error("DeleteObjects", first_key, error))?;
        Ok(answer.errors().iter().map(failed_key).collect())
    }

    /// Writes `body` at `key` only if no object is there: a HEAD first, then a PutObject with
    /// `If-None-Match: *`. Stores that honour the header (AWS S3, recent MinIO and Ceph RGW)
    /// refuse the write if an object appeared after the HEAD; stores that ignore it on PutObject
    /// (Garage 2.5) rely on the HEAD alone.
    pub async fn put_new_object(
        &self,
        key: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<NewObject, StorageError> {
        if self.object_size(key).await?.is_some() {
            return Ok(NewObject::AlreadyExists);
        }
        let answer = self
            .put_object(key)
            .if_none_match("*")
            .content_type(content_type)
            .body(ByteStream::from(body))
            .send()
            .await;
        match answer {
            Ok(_) => Ok(NewObject::Written),
            Err(SdkError::ServiceError(service))
                if refused_as_existing(service.raw().status().as_u16(), service.err().code()) =>
            {
                Ok(NewObject::AlreadyExists)
            }
            Err(error) => Err(s3_error("PutObject", key, error)),
        }
    }

    /// A PutObject of `key` that requests the bucket's server-side encryption.
    pub fn put_object(&self, key: &str) -> PutObjectFluentBuilder {
        self.client
            .put_object()
            .bucket(&self.name)
            .key(key)
            .set_server_side_encryption(self.encryption.algorithm.clone())
            .set_ssekms_key_id(self.encryption.kms_key_id.clone())
    }

    /// A CreateMultipartUpload of `key` that requests the bucket's server-side encryption.
    pub fn create_multipart_upload(&self, key: &str) -> CreateMultipartUploadFluentBuilder {
        self.client
            .create_multipart_upload()
            .bucket(&self.name)
            .key(key)
            .set_server_side_encryption(self.encryption.algorithm.clone())
            .set_ssekms_key_id(self.encryption.kms_key_id.clone())
    }
}

async fn build_client(options: &S3Options) -> Result<Client, StorageError> {
    let shared = shared_config(options).await?;
    let mut config = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(options.force_path_style)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
    if let Some(endpoint) = &options.endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(Client::from_conf(config.build()))
}

/// Region, retries, timeouts, credentials and the HTTPS client: what any AWS client would share.
async fn shared_config(options: &S3Options) -> Result<SdkConfig, StorageError> {
    let retry = RetryConfig::standard()
        .with_max_attempts(options.max_attempts.max(1))
        .with_initial_backoff(Duration::from_millis(200))
        .with_max_backoff(Duration::from_secs(20));
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(120))
        .build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(options.region.clone()))
        .retry_config(retry)
        .timeout_config(timeouts);
    // Without a provider the loader builds the default chain, over the same HTTP client (so web
    // identity's STS requests trust the CA bundle's CAs too, beside the system roots).
    if let Some(credentials) = options.credentials.static_credentials() {
        loader = loader.credentials_provider(credentials);
    }
    if let Some(bundle) = &options.ca_bundle {
        loader = loader.http_client(bundle.https_client()?);
    }
    Ok(loader.load().await)
}

/// What [`S3Bucket::put_new_object`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewObject {
    Written,
    /// An object was there already: nothing was written.
    AlreadyExists,
}

/// Whether a conditional PutObject was refused because the key exists: 412 Precondition
/// Failed, or 409 ConditionalRequestConflict (another conditional write of the key in flight).
pub(super) fn refused_as_existing(status: u16, code: Option<&str>) -> bool {
    status == 412 || (status == 409 && code == Some("ConditionalRequestConflict"))
}

/// A key DeleteObjects did not delete, and the store's reason in one line.
fn failed_key(error: &aws_sdk_s3::types::Error) -> (String, String) {
    let key = error.key().unwrap_or("?").to_owned();
    let reason = match (error.code(), error.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        (None, message) => message.unwrap_or("no reason given").to_owned(),
    };
    (key, one_line(&reason))
}

/// Whether requests go over TLS: AWS's own endpoint (no endpoint given) or an `https://` URL.
pub fn is_https(endpoint: Option<&str>) -> bool {
    endpoint.is_none_or(|url| {
        url.trim_start()
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
    })
}

#[cfg(test)]
mod tests {
    use aws_sdk_s3::config::ProvideCredentials;

    use super::super::credentials::StaticKeys;
    use super::*;

    #[test]
    fn payloads_are_signed_only_without_tls() {
        assert!(is_https(None));
        assert!(is_https(Some("https://s3.example.com")));
        assert!(is_https(Some("HTTPS://S3.EXAMPLE.COM:9000")));
        assert!(!is_https(Some("http://garage.storage:3900")));
        assert!(!is_https(Some("httpsx")));
    }

    fn options(credentials: CredentialSource) -> S3Options {
        S3Options {
            endpoint: Some("http://127.0.0.1:9".into()),
            bucket: "backups".into(),
            credentials,
            ..S3Options::default()
        }
    }

    #[tokio::test]
    async fn the_client_signs_with_the_static_keys_and_their_session_token() {
        let keys = CredentialSource::Static(StaticKeys {
            access_key_id: "ASIA".into(),
            secret_access_key: "SK".into(),
            session_token: Some("TOKEN".into()),
        });
        let shared = shared_config(&options(keys)).await.expect("config");
        let provider = shared.credentials_provider().expect("a provider");
        let credentials = provider.provide_credentials().await.expect("credentials");
        assert_eq!(credentials.access_key_id(), "ASIA");
        assert_eq!(credentials.session_token(), Some("TOKEN"));
        let bucket = S3Bucket::connect(&options(CredentialSource::DefaultChain)).await;
        assert!(bucket.expect("connect").sign_payloads);
    }

    #[tokio::test]
    async fn without_keys_the_client_uses_the_default_chain() {
        let shared = shared_config(&options(CredentialSource::DefaultChain))
            .await
            .expect("config");
        // Asking the chain for credentials would reach for instance metadata, off loopback:
        // its type is what this test can check.
        let provider = format!("{:?}", shared.credentials_provider().expect("a provider"));
        assert!(provider.contains("DefaultCredentialsChain"), "{provider}");
    }

    #[test]
    fn only_a_failed_precondition_or_a_conditional_conflict_means_the_key_exists() {
        assert!(refused_as_existing(412, Some("PreconditionFailed")));
        assert!(refused_as_existing(412, None));
        assert!(refused_as_existing(409, Some("ConditionalRequestConflict")));
        assert!(!refused_as_existing(409, Some("OperationAborted")));
        assert!(!refused_as_existing(403, Some("AccessDenied")));
    }

    #[tokio::test]
    async fn an_empty_bucket_name_is_refused() {
        let error = S3Bucket::connect(&S3Options::default())
            .await
            .expect_err("no bucket");
        assert_eq!(
            error.to_string(),
            "invalid settings: the S3 bucket name is empty"
        );
    }
}
