//! The `v1alpha1` version by name: the same types as the crate root, for code that names both
//! versions side by side (`v1alpha1::PostgreSQLCluster` beside `v1beta1::PostgreSQLCluster`).
//!
//! `v1alpha1` is the version the CRDs store today, served beside [`crate::v1beta1`], the shape
//! pgkube keeps; [`crate::conversion`] converts between the two without loss.

pub use crate::backup::*;
pub use crate::cluster::*;
pub use crate::common::*;
pub use crate::restore::*;

/// `apiVersion` of every v1alpha1 object.
pub const API_VERSION: &str = "db.example.com/v1alpha1";

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The CRDs of all pgkube kinds with v1alpha1 alone: no second version, so no conversion
/// webhook is needed. For API servers that cannot reach one (the test bed, whose managers come
/// and go with the tests); [`crate::crds`] is what pgkube installs.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        PostgreSQLCluster::crd(),
        PostgreSQLBackup::crd(),
        PostgreSQLRestore::crd(),
    ]
}
