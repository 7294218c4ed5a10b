//! Lossless conversion between `v1alpha1` and `v1beta1`, for every kind, in both directions.
//!
//! Typed: `From` impls between each kind's two versions, for example
//! `v1beta1::PostgreSQLCluster::from(v1alpha1_cluster)`. Dynamic, for the conversion webhook:
//! [`convert`] takes an object as JSON and the `apiVersion` it must come out in.
//!
//! Lossless means that v1alpha1 -> v1beta1 -> v1alpha1 and v1beta1 -> v1alpha1 -> v1beta1 both
//! give back the object they started from (property-tested in `crds/tests/conversion.rs`):
//! - Metadata passes through untouched (name, namespace, uid, resourceVersion, labels, owner
//!   references, finalizers, ...), except for the one annotation below.
//! - A field only v1beta1 has (today only the cluster's `spec.storage.storageClassName`) is
//!   carried on the v1alpha1 object in the annotation [`V1BETA1_FIELDS_ANNOTATION`]
//!   (`conversion.db.example.com/v1beta1`), as canonical JSON at its v1beta1 path:
//!   `{"spec":{"storage":{"storageClassName":"fast"}}}`. Converting back restores the field and
//!   removes the annotation. It is written only when there is something to carry.
//! - v1alpha1 has no field v1beta1 lacks; [`V1ALPHA1_FIELDS_ANNOTATION`] is reserved for one.
//! - An annotation value that conversion did not write (it does not parse, has other fields, or
//!   is not in canonical form) is not an error: it is kept as it is, in both directions, and the
//!   fields stay unset. An error would fail every read of the object in the other version, lists
//!   and watches included, for the sake of an annotation.
//! - The annotation keys are reserved: a v1beta1 object that sets
//!   `conversion.db.example.com/v1beta1` itself and also has a storage class gets the value
//!   replaced on the way down and the annotation removed on the way back; one with no storage
//!   class keeps its value on the way down, and on the way back a value in canonical form is
//!   read as a storage class.
//! - An empty annotation map may come back absent, which the API server does not distinguish.

mod annotation;
mod backup;
mod cluster;
mod dynamic;
mod restore;
mod storage;

pub use annotation::{V1ALPHA1_FIELDS_ANNOTATION, V1BETA1_FIELDS_ANNOTATION};
pub use cluster::storage_class_name;
pub use dynamic::{ConversionError, convert};
