//! The `v1alpha1` version by name: the same types as the crate root, for code that names both
//! versions side by side (`v1alpha1::PostgreSQLCluster` beside `v1beta1::PostgreSQLCluster`).
//!
//! `v1alpha1` is the version the CRDs serve and store today; [`crate::v1beta1`] is the shape
//! pgkube keeps, and [`crate::conversion`] converts between the two without loss.

pub use crate::backup::*;
pub use crate::cluster::*;
pub use crate::common::*;
pub use crate::restore::*;

/// `apiVersion` of every v1alpha1 object.
pub const API_VERSION: &str = "db.example.com/v1alpha1";
