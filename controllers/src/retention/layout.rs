//! Which listed keys belong to which backup: the backup agent's layout (see
//! [`crate::storage::keys`]), read back from a listing of one cluster's root.
//!
//! Under a cluster's root `<prefix>/<cluster-uid>/`, a key `<root><name>/<uid>/<rest>` belongs to
//! the backup named `<name>` whose PostgreSQLBackup had uid `<uid>`, and
//! `<root><name>/<uid>/manifest.json` is that backup's manifest. Anything else under the root (a
//! loose key, an empty segment as in `<root>b1//x`) belongs to no backup, and keys outside the
//! root belong to no backup either. Pure: no request, no clock.

use std::collections::BTreeMap;
use std::fmt;

pub use crate::storage::keys::MANIFEST_FILE;

/// One backup directory `<root><name>/<uid>/`: the backup's name and its PostgreSQLBackup's uid.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackupId {
    pub name: String,
    pub uid: String,
}

impl BackupId {
    pub fn new(name: impl Into<String>, uid: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            uid: uid.into(),
        }
    }
}

impl fmt::Display for BackupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.name, self.uid)
    }
}

/// The keys of one backup directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackupDir {
    /// `<root><name>/<uid>/manifest.json`, when it was listed.
    pub manifest_key: Option<String>,
    /// Every other key under `<root><name>/<uid>/`.
    pub data_keys: Vec<String>,
}

impl BackupDir {
    /// How many keys the directory holds, the manifest included.
    pub fn key_count(&self) -> usize {
        self.data_keys.len() + usize::from(self.manifest_key.is_some())
    }
}

/// A listing sorted into backup directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Backup directories by name and uid.
    pub backups: BTreeMap<BackupId, BackupDir>,
    /// Keys under the root that are in no backup directory.
    pub loose_keys: Vec<String>,
    /// Keys that are not under the root at all (a listing by prefix returns none).
    pub outside_keys: Vec<String>,
}

impl Layout {
    /// Sorts `keys` by backup under `root` (`<prefix>/<cluster-uid>/`, ending with '/').
    pub fn from_keys(root: &str, keys: impl IntoIterator<Item = String>) -> Self {
        let mut layout = Self::default();
        for key in keys {
            layout.add(root, key);
        }
        layout
    }

    /// The manifest keys of all backup directories that have one.
    pub fn manifest_keys(&self) -> impl Iterator<Item = (&BackupId, &str)> {
        self.backups
            .iter()
            .filter_map(|(id, dir)| dir.manifest_key.as_deref().map(|key| (id, key)))
    }

    fn add(&mut self, root: &str, key: String) {
        let Some(rest) = key.strip_prefix(root) else {
            self.outside_keys.push(key);
            return;
        };
        let mut segments = rest.splitn(3, '/');
        match (segments.next(), segments.next(), segments.next()) {
            (Some(name), Some(uid), Some(file))
                if !name.is_empty() && !uid.is_empty() && !file.is_empty() =>
            {
                let id = BackupId::new(name, uid);
                let dir = self.backups.entry(id).or_default();
                if file == MANIFEST_FILE {
                    dir.manifest_key = Some(key);
                } else {
                    dir.data_keys.push(key);
                }
            }
            _ => self.loose_keys.push(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(keys: &[&str]) -> Layout {
        Layout::from_keys("ns/a/c1/", keys.iter().map(|key| key.to_string()))
    }

    #[test]
    fn keys_are_sorted_into_their_backup_directories() {
        let layout = layout(&[
            "ns/a/c1/b1/u1/manifest.json",
            "ns/a/c1/b1/u1/globals.sql",
            "ns/a/c1/b1/u1/databases/app.dump",
            "ns/a/c1/b1/u2/globals.sql",
        ]);
        let b1 = &layout.backups[&BackupId::new("b1", "u1")];
        assert_eq!(
            b1.manifest_key.as_deref(),
            Some("ns/a/c1/b1/u1/manifest.json")
        );
        assert_eq!(
            b1.data_keys,
            [
                "ns/a/c1/b1/u1/globals.sql",
                "ns/a/c1/b1/u1/databases/app.dump"
            ]
        );
        assert_eq!(b1.key_count(), 3);
        let reused = &layout.backups[&BackupId::new("b1", "u2")];
        assert_eq!(reused.manifest_key, None);
        let manifests: Vec<_> = layout.manifest_keys().collect();
        assert_eq!(
            manifests,
            [(&BackupId::new("b1", "u1"), "ns/a/c1/b1/u1/manifest.json")]
        );
    }

    #[test]
    fn loose_keys_and_empty_segments_belong_to_no_backup() {
        let loose = [
            "ns/a/c1/notes.txt",
            "ns/a/c1/b1/manifest.json",
            "ns/a/c1//u1/manifest.json",
            "ns/a/c1/b1//manifest.json",
            "ns/a/c1/b1/u1/",
            "ns/a/c1/",
        ];
        let layout = layout(&loose);
        assert!(layout.backups.is_empty(), "{:?}", layout.backups);
        assert_eq!(layout.loose_keys, loose);
    }

    #[test]
    fn other_clusters_and_legacy_backups_are_outside_the_root() {
        let outside = [
            "ns/a/c2/b1/u1/manifest.json",
            "ns/a/c10/b1/u1/manifest.json",
            "ns/a/b1/manifest.json",
            "ns/a/c1",
            "other/b1/x",
        ];
        let layout = layout(&outside);
        assert!(layout.backups.is_empty());
        assert_eq!(layout.outside_keys, outside);
    }

    #[test]
    fn a_nested_manifest_is_data_not_the_backups_manifest() {
        let layout = layout(&["ns/a/c1/b1/u1/databases/manifest.json"]);
        let b1 = &layout.backups[&BackupId::new("b1", "u1")];
        assert_eq!(b1.manifest_key, None);
        assert_eq!(b1.data_keys, ["ns/a/c1/b1/u1/databases/manifest.json"]);
    }
}
