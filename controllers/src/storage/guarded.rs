//! The one place pgkube deletes stored objects (issue 41): retention's expired backups and the
//! WAL they needed, and a deleted PostgreSQLBackup's data, all go through [`delete_in`].
//!
//! A delete names the [`Scope`] it acts in, a directory proven to belong to what is deleted:
//! a cluster's root `<prefix>/<cluster-uid>/` (retention, which then deletes only backups whose
//! manifest records that uid), a cluster's WAL archive root once its owner record is checked
//! (retention), or one backup's directory once its ownership is proven (`backup::ownership`). Every key is checked against the scope before any request is made:
//! one key outside it (another cluster's, a legacy backup's beside the root) refuses the whole
//! delete, so a planning mistake can never reach another cluster's objects. The check is pure
//! ([`Scope::check`]); [`S3Bucket::delete_objects`] is visible to this module only.

use super::keys::{BackupKeys, cluster_root};
use super::{S3Bucket, StorageError};

/// A directory (ending with '/') every key of a delete must be under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    directory: String,
    /// What the directory is, for errors: "the cluster root", "the backup's directory".
    what: &'static str,
}

impl Scope {
    /// The root of the cluster with uid `cluster_uid` under `prefix`.
    pub fn cluster_root(prefix: &str, cluster_uid: &str) -> Scope {
        Scope {
            directory: cluster_root(prefix, cluster_uid),
            what: "the cluster root",
        }
    }

    /// A cluster's WAL archive root (`<prefix>/wal/<cluster>/`), whose owner record the caller
    /// has checked.
    pub fn wal_archive(root: &str) -> Scope {
        Scope {
            directory: root.to_owned(),
            what: "the WAL archive",
        }
    }

    /// The directory of one backup, whose ownership the caller has proven.
    pub fn backup_directory(keys: &BackupKeys) -> Scope {
        Scope {
            directory: keys.directory().to_owned(),
            what: "the backup's directory",
        }
    }

    pub fn directory(&self) -> &str {
        &self.directory
    }

    /// Refuses `keys` unless every one is under the scope's directory (which must not be
    /// empty: an empty directory would be the whole bucket).
    pub fn check(&self, keys: &[String]) -> Result<(), StorageError> {
        if self.directory.is_empty() || !self.directory.ends_with('/') {
            return Err(StorageError::Settings(format!(
                "refusing to delete in {} {:?}: not a directory",
                self.what, self.directory
            )));
        }
        match keys.iter().find(|key| !self.contains(key)) {
            None => Ok(()),
            Some(outside) => Err(StorageError::Settings(format!(
                "refusing to delete {outside:?}: it is outside {} {:?}; nothing was deleted",
                self.what, self.directory
            ))),
        }
    }

    fn contains(&self, key: &str) -> bool {
        key.len() > self.directory.len()
            && key.starts_with(&self.directory)
            && !key[self.directory.len()..]
                .split('/')
                .any(|segment| segment == "..")
    }
}

/// One quiet DeleteObjects request for `keys` (at most 1000), all under `scope`: the keys the
/// store says it did not delete, with its reason.
pub async fn delete_in(
    bucket: &S3Bucket,
    scope: &Scope,
    keys: &[String],
) -> Result<Vec<(String, String)>, StorageError> {
    scope.check(keys)?;
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    bucket.delete_objects(keys).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|key| (*key).to_owned()).collect()
    }

    #[test]
    fn keys_under_the_scope_pass() {
        let root = Scope::cluster_root("team/db", "c1");
        let inside = keys(&[
            "team/db/c1/nightly/u1/manifest.json",
            "team/db/c1/x/u2/globals.sql",
        ]);
        assert!(root.check(&inside).is_ok());
        assert!(root.check(&[]).is_ok());
    }

    #[test]
    fn one_key_outside_refuses_the_whole_delete() {
        let root = Scope::cluster_root("team/db", "c1");
        for outside in [
            "team/db/c2/nightly/u1/manifest.json",
            "team/db/nightly/manifest.json",
            "team/db/c1",
            "team/db/c1/",
            "team/db/c1/../c2/nightly/u1/manifest.json",
            "other/c1/x",
        ] {
            let batch = keys(&["team/db/c1/nightly/u1/manifest.json", outside]);
            let error = root.check(&batch).expect_err(outside);
            assert!(error.to_string().contains("nothing was deleted"), "{error}");
        }
    }

    #[test]
    fn a_backup_directory_scopes_to_that_backup() {
        let own = BackupKeys::new("team/db", "c1", "nightly", "u1").expect("keys");
        let scope = Scope::backup_directory(&own);
        assert!(scope.check(&[own.manifest(), own.globals()]).is_ok());
        let sibling = BackupKeys::new("team/db", "c1", "nightly", "u2").expect("keys");
        assert!(scope.check(&[sibling.manifest()]).is_err());
    }

    #[test]
    fn a_wal_archive_scopes_to_that_archive() {
        let scope = Scope::wal_archive("team/db/wal/main/");
        let own = keys(&["team/db/wal/main/00000001/000000010000000000000001.zst"]);
        assert!(scope.check(&own).is_ok());
        for outside in [
            "team/db/wal/main2/00000001/000000010000000000000001.zst",
            "team/db/c1/nightly/u1/manifest.json",
            "team/db/wal/main/../other/x",
        ] {
            assert!(scope.check(&keys(&[outside])).is_err(), "{outside}");
        }
    }

    #[test]
    fn an_empty_scope_is_never_the_whole_bucket() {
        let nothing = Scope {
            directory: String::new(),
            what: "the cluster root",
        };
        assert!(nothing.check(&keys(&["a/b"])).is_err());
    }
}
