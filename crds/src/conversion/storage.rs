//! Storage in both versions: v1alpha1 names an [`S3Storage`] directly, v1beta1 wraps it in a
//! [`BackupStorage`] (`{s3: ...}`).

use crate::common::S3Storage;
use crate::{v1alpha1, v1beta1};

/// v1alpha1's storage in v1beta1's shape.
pub(super) fn wrap_s3(s3: S3Storage) -> v1beta1::BackupStorage {
    v1beta1::BackupStorage { s3 }
}

/// v1beta1's storage in v1alpha1's shape.
pub(super) fn unwrap_s3(storage: v1beta1::BackupStorage) -> S3Storage {
    let v1beta1::BackupStorage { s3 } = storage;
    s3
}

pub(super) fn source_to_v1beta1(source: v1alpha1::RestoreSource) -> v1beta1::RestoreSource {
    let v1alpha1::RestoreSource { s3, object_key } = source;
    v1beta1::RestoreSource {
        storage: wrap_s3(s3),
        object_key,
    }
}

pub(super) fn source_to_v1alpha1(source: v1beta1::RestoreSource) -> v1alpha1::RestoreSource {
    let v1beta1::RestoreSource {
        storage,
        object_key,
    } = source;
    v1alpha1::RestoreSource {
        s3: unwrap_s3(storage),
        object_key,
    }
}
