//! pgkube API types, group `db.example.com`: version `v1alpha1` (served and stored; its types are
//! at the crate root and in [`v1alpha1`]), version [`v1beta1`] (the shape pgkube keeps, not served
//! yet), and the lossless [`conversion`] between them.
//!
//! Three kinds, each namespaced with a status subresource:
//! - [`PostgreSQLCluster`]: a PostgreSQL instance set (StatefulSet, Services, config, credentials)
//!   with optional scheduled backups to S3-compatible storage;
//! - [`PostgreSQLBackup`]: one logical backup of a cluster;
//! - [`PostgreSQLRestore`]: one restore of a backup into a cluster.
//!
//! Validation that the API server can do lives in the schema (ranges, enums, patterns, defaults)
//! and in CEL rules (cross-field rules, immutability); the controllers check the rest and report it
//! as conditions.

mod backup;
mod cluster;
mod common;
pub mod conversion;
mod restore;
pub mod v1alpha1;
pub mod v1beta1;

pub use backup::*;
pub use cluster::*;
pub use common::*;
pub use restore::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every pgkube kind.
pub const GROUP: &str = "db.example.com";
/// The finalizer the cluster controller puts on clusters.
pub const CLEANUP_FINALIZER: &str = "db.example.com/cleanup";

/// The CRDs of all pgkube kinds, in a stable order: v1alpha1 only, until the conversion webhook
/// serves v1beta1 beside it.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        PostgreSQLCluster::crd(),
        PostgreSQLBackup::crd(),
        PostgreSQLRestore::crd(),
    ]
}

/// All CRDs as one multi-document YAML stream, exactly as committed in `crds/`.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
