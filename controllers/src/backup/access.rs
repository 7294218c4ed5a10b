//! Reaching a backup's storage from the manager: the S3 client options of an [`S3Storage`],
//! with the keys (and CA bundle) read from the Secrets it references, or without keys the
//! manager's own identity.

use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
use kube::{Api, Client};
use pgkube_crds::{S3Storage, ServerSideEncryption};

use crate::storage::{CaBundle, CredentialSource, Encryption, S3Bucket, S3Options, StaticKeys};

/// Attempts per S3 request from the manager: enough to ride out a blip, few enough that a
/// reconcile does not hang on a dead store.
const MAX_ATTEMPTS: u32 = 3;

/// Why the storage cannot be reached; one line, never a key.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("cannot read Secret {name}: {source}")]
    ReadSecret {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {name} has no key {key}")]
    MissingKey { name: String, key: String },
    #[error("Secret {name} key {key} is not UTF-8 text")]
    NotText { name: String, key: String },
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
}

/// A client for `storage`, authenticated with the keys its Secrets in `namespace` hold.
pub async fn connect(
    client: &Client,
    namespace: &str,
    storage: &S3Storage,
) -> Result<S3Bucket, AccessError> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let credentials = match &storage.credentials {
        Some(keys) => CredentialSource::Static(StaticKeys {
            access_key_id: secret_value(&secrets, &keys.access_key_id).await?,
            secret_access_key: secret_value(&secrets, &keys.secret_access_key).await?,
            session_token: None,
        }),
        // The manager's own identity: the AWS SDK's default chain in this process.
        None => CredentialSource::DefaultChain,
    };
    let ca_bundle = match &storage.ca_bundle {
        Some(selector) => Some(CaBundle::from_pem(
            secret_value(&secrets, selector).await?,
            format!("Secret {} key {}", selector.name, selector.key),
        )),
        None => None,
    };
    let options = S3Options {
        endpoint: storage.endpoint.clone(),
        region: storage.region.clone(),
        bucket: storage.bucket.clone(),
        force_path_style: storage.force_path_style,
        ca_bundle,
        encryption: encryption(storage.server_side_encryption),
        max_attempts: MAX_ATTEMPTS,
        credentials,
    };
    Ok(S3Bucket::connect(&options).await?)
}

fn encryption(setting: Option<ServerSideEncryption>) -> Encryption {
    let algorithm = setting.map(|sse| match sse {
        ServerSideEncryption::Aes256 => aws_sdk_s3::types::ServerSideEncryption::Aes256,
        ServerSideEncryption::AwsKms => aws_sdk_s3::types::ServerSideEncryption::AwsKms,
    });
    Encryption {
        algorithm,
        kms_key_id: None,
    }
}

/// The text value of one key of a Secret.
async fn secret_value(
    secrets: &Api<Secret>,
    selector: &SecretKeySelector,
) -> Result<String, AccessError> {
    let name = selector.name.clone();
    let secret = secrets
        .get(&name)
        .await
        .map_err(|source| AccessError::ReadSecret {
            name: name.clone(),
            source,
        })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(&selector.key))
        .ok_or_else(|| AccessError::MissingKey {
            name: name.clone(),
            key: selector.key.clone(),
        })?;
    let text = String::from_utf8(bytes.0.clone()).map_err(|_| AccessError::NotText {
        name,
        key: selector.key.clone(),
    })?;
    // Secrets made with `echo` keep its newline; no key or token ends with whitespace.
    Ok(text.trim_end().to_owned())
}
