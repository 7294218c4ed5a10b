//! Lossless conversion between `v1alpha1` and `v1beta1`, for every kind, in both directions:
//! [`convert`] takes an object as JSON and the `apiVersion` it must come out in (the conversion
//! webhook's entry point).
//!
//! The JSON itself is converted, not a Rust value parsed from it: each kind's fields that are at
//! a different place in each version are listed once (`MOVES` in `cluster.rs`, `backup.rs`,
//! `restore.rs`), and only they move. Everything else stays exactly where it is, fields that
//! neither version's Rust types know included (a newer pgkube's, during an upgrade), values
//! outside the types' enums, and metadata; no default is added (the API server applies each
//! version's defaults itself).
//!
//! Lossless means that v1alpha1 -> v1beta1 -> v1alpha1 and v1beta1 -> v1alpha1 -> v1beta1 both
//! give back the object they started from, whatever JSON it holds (property-tested in
//! `crds/tests/conversion.rs`):
//! - What has no place in the other version is carried in an annotation of the converted object,
//!   as canonical JSON (compact, keys sorted) at its path in the version it comes from:
//!   - [`V1BETA1_FIELDS_ANNOTATION`] (`conversion.db.example.com/v1beta1`), on a v1alpha1 object:
//!     whatever is left, once the moved fields are out, in the objects only v1beta1 has
//!     (`spec.storage`, `spec.backup.schedule`, `spec.backup.retention`, `spec.backup.storage`,
//!     `spec.bootstrap.source.storage`, a backup's `status.storage`, a restore's
//!     `spec.source.storage`): the cluster's `spec.storage.storageClassName`, and any field a newer
//!     pgkube adds there, for example `{"spec":{"storage":{"storageClassName":"fast"}}}`; and a
//!     value v1beta1 has at a place v1alpha1 reads as one of its own fields (`spec.version`, for
//!     example, which v1beta1 does not know).
//!   - [`V1ALPHA1_FIELDS_ANNOTATION`] (`conversion.db.example.com/v1alpha1`), on a v1beta1
//!     object: the same the other way, a value v1alpha1 has at a place v1beta1 reads as one of
//!     its own (`spec.postgresVersion`, `spec.backup.retention`, `spec.backup.storage`,
//!     `spec.bootstrap.source.storage`, a restore's `spec.source.storage`).
//!
//!   An annotation is written only when there is something to carry (replacing any value it
//!   had), and converting back puts its fields back and removes it.
//! - An annotation value that conversion would not have written for the object it is on (it does
//!   not parse, is not in canonical form, has fields at other places, or does not fit the object)
//!   is not an error: it is kept as it is, in both directions, and nothing is read from it. An
//!   error would fail every read of the object in the other version, lists and watches included,
//!   for the sake of an annotation.
//! - The annotation keys are reserved: an object that sets the key its own version's conversion
//!   writes gets the value replaced when there is something to carry, and otherwise keeps it on
//!   the way there; on the way back a value conversion would have written is read as fields.
//! - An empty annotation map may come back absent, which the API server does not distinguish.

mod annotation;
mod backup;
mod cluster;
mod dynamic;
mod path;
mod plan;
mod reshape;
mod restore;

pub use annotation::{V1ALPHA1_FIELDS_ANNOTATION, V1BETA1_FIELDS_ANNOTATION};
pub use dynamic::{ConversionError, convert};
