//! The `v1alpha1` version: pgkube's first shape, still served beside [`crate::v1beta1`] (the
//! stored version, whose types the crate root has) for clients that still write it;
//! [`crate::conversion`] converts between the two without loss.

pub use crate::archiving::*;
pub use crate::backup::*;
pub use crate::cluster::*;
pub use crate::common::*;
pub use crate::progress::*;
pub use crate::recovery::*;
pub use crate::restore::*;

/// `apiVersion` of every v1alpha1 object.
pub const API_VERSION: &str = "db.example.com/v1alpha1";

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The CRDs of all pgkube kinds with v1alpha1 alone, as the first pgkube installed them;
/// [`crate::crds`] is what pgkube installs now.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        PostgreSQLCluster::crd(),
        PostgreSQLBackup::crd(),
        PostgreSQLRestore::crd(),
    ]
}
