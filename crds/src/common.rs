//! Types shared by several kinds: object references, S3 storage, conditions.

use k8s_openapi::api::core::v1::SecretKeySelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// A reference to an object of a known kind in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct LocalReference {
    /// Name of the referenced object, in the same namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where backups are stored: a bucket in S3-compatible object storage (AWS S3, MinIO, Garage,
/// Ceph RGW, ...). Credentials are only ever read from Secrets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(PLAIN_HTTP_RULE).message(PLAIN_HTTP_MESSAGE))]
pub struct S3Storage {
    /// Bucket name.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// Key prefix under which this cluster's backups are written, without leading slash.
    /// Defaults to `<namespace>/<cluster>`. Retention never touches keys outside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!self.startsWith('/')").message("must not start with '/'"))]
    pub prefix: Option<String>,
    /// Endpoint URL of the S3 API, for example `https://minio.storage.svc:9000`. Empty means AWS S3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("must be an http:// or https:// URL"))]
    pub endpoint: Option<String>,
    /// Region of the bucket; most non-AWS stores accept any value.
    #[serde(default = "default_region")]
    pub region: String,
    /// Address buckets by path (`endpoint/bucket/key`) instead of by virtual host; most non-AWS
    /// stores need this.
    #[serde(default)]
    pub force_path_style: bool,
    /// PEM bundle of the certificate authorities that sign the endpoint's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<SecretKeySelector>,
    /// Access key id and secret access key, as Secret references. Unset: the credentials come
    /// from the identity of the pod that reads or writes (the AWS SDK's default chain: web
    /// identity as set up by IAM roles for service accounts, EKS Pod Identity's container
    /// credentials, instance metadata). The instance pods, the backup and restore Jobs and
    /// pgkube's manager (retention, verification) each need that identity then: see the
    /// cluster's `serviceAccountName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<S3Credentials>,
    /// Server-side encryption to request for uploaded objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_side_encryption: Option<ServerSideEncryption>,
    /// Allow an `http://` endpoint: the storage keys, the WAL and the backups then cross the
    /// network unencrypted. Without it such an endpoint is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plain_http: bool,
}

/// An `http://` endpoint only when the spec says so.
pub const PLAIN_HTTP_RULE: &str = "!has(self.endpoint) || !self.endpoint.startsWith('http://') || (has(self.allowPlainHttp) && self.allowPlainHttp)";
pub const PLAIN_HTTP_MESSAGE: &str = "endpoint is plain http://: the storage keys and the data would cross the network unencrypted; use https://, or set allowPlainHttp: true to accept it";

fn default_region() -> String {
    "us-east-1".to_owned()
}

/// S3 credentials, as Secret references.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Credentials {
    /// The access key id.
    pub access_key_id: SecretKeySelector,
    /// The secret access key.
    pub secret_access_key: SecretKeySelector,
}

/// Server-side encryption of uploaded objects.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ServerSideEncryption {
    /// Keys managed by the store (`AES256`).
    #[serde(rename = "AES256")]
    Aes256,
    /// Keys managed by AWS KMS (`aws:kms`).
    #[serde(rename = "aws:kms")]
    AwsKms,
}

/// Schema of a `conditions` list: standard metav1.Conditions, a list-map keyed by `type`, so
/// server-side apply merges conditions one by one.
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<Condition>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}
