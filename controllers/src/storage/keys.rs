//! Where a backup's objects are in the bucket: the one place their keys are built (pure).
//!
//! A backup is stored under a directory that names the cluster it was taken from and the
//! PostgreSQLBackup object that took it, by their uids:
//!
//! ```text
//! <prefix>/<cluster-uid>/<backup-name>/<backup-uid>/globals.sql
//! <prefix>/<cluster-uid>/<backup-name>/<backup-uid>/databases/<db-name>.dump
//! <prefix>/<cluster-uid>/<backup-name>/<backup-uid>/manifest.json     written last
//! ```
//!
//! A physical backup's directory holds `base.tar.zst`, `backup_label`, `tablespace_map` (when
//! there is one) and `backup_manifest` beside its `manifest.json`.
//!
//! `<prefix>/<cluster-uid>/` is the cluster's root ([`cluster_root`]): two clusters that share a
//! prefix have disjoint roots, and a backup name used again (after its PostgreSQLBackup was
//! deleted) gets a new directory, since the new object has a new uid.
//!
//! Backups written before the uids were in the keys are under `<prefix>/<backup-name>/`
//! ([`BackupKeys::legacy`]): restores still read them; retention never deletes them (their
//! owner cannot be proven, see `docs/backup.md`).

use super::error::StorageError;

/// File name of a backup's manifest inside its directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of the globals script inside a backup's directory.
pub const GLOBALS_FILE: &str = "globals.sql";
/// Directory of the database dumps inside a backup's directory.
pub const DATABASES_DIR: &str = "databases";
/// A physical backup's base tar, zstd, inside its directory.
pub const BASE_FILE: &str = "base.tar.zst";

/// The keys of one backup: everything is under [`BackupKeys::directory`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupKeys {
    /// The backup's directory, ending with '/'.
    directory: String,
}

impl BackupKeys {
    /// `<prefix>/<cluster-uid>/<backup-name>/<backup-uid>/`: the directory of a backup written now.
    pub fn new(
        prefix: &str,
        cluster_uid: &str,
        backup_name: &str,
        backup_uid: &str,
    ) -> Result<Self, StorageError> {
        check_segment("cluster uid", cluster_uid)?;
        check_segment("backup name", backup_name)?;
        check_segment("backup uid", backup_uid)?;
        Ok(Self {
            directory: format!(
                "{}{backup_name}/{backup_uid}/",
                cluster_root(prefix, cluster_uid)
            ),
        })
    }

    /// `<prefix>/<backup-name>/`: the directory of a backup written before the uids were in the
    /// keys (read only).
    pub fn legacy(prefix: &str, backup_name: &str) -> Result<Self, StorageError> {
        check_segment("backup name", backup_name)?;
        Ok(Self {
            directory: format!("{}{backup_name}/", root(prefix)),
        })
    }

    /// The backup whose manifest is `key` (`<directory>manifest.json`), in either layout.
    pub fn of_manifest(key: &str) -> Option<Self> {
        let directory = key.strip_suffix(MANIFEST_FILE)?;
        let name = directory.strip_suffix('/')?.rsplit('/').next()?;
        check_segment("backup directory", name).ok()?;
        Some(Self {
            directory: directory.to_owned(),
        })
    }

    /// The backup's directory, ending with '/': every key of the backup starts with it.
    pub fn directory(&self) -> &str {
        &self.directory
    }

    pub fn manifest(&self) -> String {
        format!("{}{MANIFEST_FILE}", self.directory)
    }

    pub fn globals(&self) -> String {
        format!("{}{GLOBALS_FILE}", self.directory)
    }

    /// A physical backup's base tar.
    pub fn base(&self) -> String {
        format!("{}{BASE_FILE}", self.directory)
    }

    /// A file of a physical backup stored beside its tar, under its own name: `backup_label`,
    /// `tablespace_map` or `backup_manifest` (fixed names, never user input).
    pub fn backup_file(&self, name: &'static str) -> String {
        format!("{}{name}", self.directory)
    }

    /// The dump of database `database` (any name: see [`escape_key_segment`]).
    pub fn database(&self, database: &str) -> String {
        format!(
            "{}{DATABASES_DIR}/{}.dump",
            self.directory,
            escape_key_segment(database)
        )
    }

    /// Whether this is the directory of backup `backup_name` with uid `backup_uid` under
    /// `prefix`, as [`BackupKeys::new`] builds it for some cluster: the uid in the key says the
    /// objects are that PostgreSQLBackup's and no other's.
    pub fn is_of_backup(&self, prefix: &str, backup_name: &str, backup_uid: &str) -> bool {
        let Some(rest) = self.directory.strip_prefix(&root(prefix)) else {
            return false;
        };
        let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        matches!(
            segments.as_slice(),
            [cluster_uid, name, uid]
                if !cluster_uid.is_empty() && *name == backup_name && *uid == backup_uid
        )
    }
}

/// `<prefix>/<cluster-uid>/`: the root of every backup of the cluster with that uid.
pub fn cluster_root(prefix: &str, cluster_uid: &str) -> String {
    format!("{}{cluster_uid}/", root(prefix))
}

/// `<prefix>/` without empty segments whatever slashes the prefix has; empty for no prefix.
fn root(prefix: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    }
}

/// Refuses what could not be one key segment: empty, `.`, `..`, or anything but ASCII letters,
/// digits, '-', '_' and '.' (Kubernetes names and uids are all of those).
pub fn check_segment(what: &str, value: &str) -> Result<(), StorageError> {
    let valid = !value.is_empty()
        && value != "."
        && value != ".."
        && value
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte));
    if valid {
        Ok(())
    } else {
        Err(StorageError::Settings(format!(
            "{what} {value:?} must be non-empty and use only letters, digits, '-', '_' and '.'"
        )))
    }
}

/// Keeps ASCII letters, digits, `_` and `-`; writes every other byte as `%XX`. Dots are escaped
/// too, so no database name can become `.` or `..` in a key.
pub fn escape_key_segment(name: &str) -> String {
    let mut escaped = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            escaped.push(char::from(byte));
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_is_stored_under_its_clusters_uid_then_its_name_and_uid() {
        let keys = BackupKeys::new("/team/db/", "c-uid", "nightly", "b-uid").expect("keys");
        assert_eq!(keys.directory(), "team/db/c-uid/nightly/b-uid/");
        assert_eq!(keys.manifest(), "team/db/c-uid/nightly/b-uid/manifest.json");
        assert_eq!(keys.globals(), "team/db/c-uid/nightly/b-uid/globals.sql");
        assert_eq!(keys.base(), "team/db/c-uid/nightly/b-uid/base.tar.zst");
        assert_eq!(
            keys.backup_file("backup_label"),
            "team/db/c-uid/nightly/b-uid/backup_label"
        );
        assert_eq!(
            keys.database("app/x"),
            "team/db/c-uid/nightly/b-uid/databases/app%2Fx.dump"
        );
        assert_eq!(cluster_root("team/db", "c-uid"), "team/db/c-uid/");
        let bare = BackupKeys::new("", "c", "b1", "u").expect("keys");
        assert_eq!(bare.manifest(), "c/b1/u/manifest.json");
    }

    #[test]
    fn a_name_used_again_or_another_cluster_gets_another_directory() {
        let first = BackupKeys::new("p", "c1", "nightly", "u1").expect("keys");
        let again = BackupKeys::new("p", "c1", "nightly", "u2").expect("keys");
        let other = BackupKeys::new("p", "c2", "nightly", "u1").expect("keys");
        assert_ne!(first.directory(), again.directory());
        assert_ne!(first.directory(), other.directory());
        assert!(!again.directory().starts_with(first.directory()));
        assert!(!cluster_root("p", "c2").starts_with(&cluster_root("p", "c1")));
    }

    #[test]
    fn legacy_backups_are_under_the_prefix_and_their_name() {
        let legacy = BackupKeys::legacy("/ns/main/", "b1").expect("keys");
        assert_eq!(legacy.manifest(), "ns/main/b1/manifest.json");
        assert_eq!(
            BackupKeys::legacy("", "b1").expect("keys").directory(),
            "b1/"
        );
    }

    #[test]
    fn a_manifest_key_gives_its_backups_directory() {
        let keys = BackupKeys::new("p", "c1", "nightly", "u1").expect("keys");
        assert_eq!(BackupKeys::of_manifest(&keys.manifest()), Some(keys));
        let legacy = BackupKeys::of_manifest("ns/main/b1/manifest.json").expect("legacy");
        assert_eq!(legacy.directory(), "ns/main/b1/");
        for bad in [
            "manifest.json",
            "p/b1/other.json",
            "p/../manifest.json",
            "p//manifest.json",
        ] {
            assert_eq!(BackupKeys::of_manifest(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_a_directory_with_the_backups_name_and_uid_is_the_backups_own() {
        let keys = BackupKeys::new("ns/main", "c1", "nightly", "u1").expect("keys");
        assert!(keys.is_of_backup("ns/main", "nightly", "u1"));
        assert!(keys.is_of_backup("/ns/main/", "nightly", "u1"));
        assert!(!keys.is_of_backup("ns/main", "nightly", "u2"));
        assert!(!keys.is_of_backup("ns/main", "other", "u1"));
        assert!(!keys.is_of_backup("ns", "nightly", "u1"));
        let legacy = BackupKeys::legacy("ns/main", "nightly").expect("keys");
        assert!(!legacy.is_of_backup("ns/main", "nightly", "u1"));
    }

    #[test]
    fn segments_that_could_escape_their_place_are_refused() {
        assert!(check_segment("backup name", "nightly-2024.01.01_0300").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "x\n"] {
            assert!(
                check_segment("backup name", bad).is_err(),
                "{bad:?} accepted"
            );
            assert!(
                BackupKeys::new("p", bad, "b", "u").is_err(),
                "{bad:?} accepted"
            );
            assert!(
                BackupKeys::new("p", "c", "b", bad).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn database_names_become_safe_key_segments() {
        assert_eq!(escape_key_segment("app_db-1"), "app_db-1");
        assert_eq!(escape_key_segment("a/b"), "a%2Fb");
        assert_eq!(escape_key_segment(".."), "%2E%2E");
        assert_eq!(escape_key_segment("é"), "%C3%A9");
        assert_ne!(escape_key_segment("a b"), escape_key_segment("a_b"));
    }
}
