//! Which listed keys belong to which backup: the backup agent's layout, read back from a listing.
//!
//! Under a cluster's root `<prefix>/`, a key `<prefix>/<name>/<rest>` belongs to backup `<name>`,
//! and `<prefix>/<name>/manifest.json` is that backup's manifest. Anything else under the root
//! (a loose key `<prefix>/<file>`, or an empty name as in `<prefix>//x`) belongs to no backup,
//! and keys outside the root belong to no backup either. Pure: no request, no clock.

use std::collections::BTreeMap;

/// File name of a backup's manifest inside its directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The keys of one backup directory `<prefix>/<name>/`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackupDir {
    /// `<prefix>/<name>/manifest.json`, when it was listed.
    pub manifest_key: Option<String>,
    /// Every other key under `<prefix>/<name>/`.
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
    /// Backup directories by name.
    pub backups: BTreeMap<String, BackupDir>,
    /// Keys under the root that are in no backup directory.
    pub loose_keys: Vec<String>,
    /// Keys that are not under the root at all (a listing by prefix returns none).
    pub outside_keys: Vec<String>,
}

impl Layout {
    /// Sorts `keys` by backup under `root` (`<prefix>/`, ending with '/').
    pub fn from_keys(root: &str, keys: impl IntoIterator<Item = String>) -> Self {
        let mut layout = Self::default();
        for key in keys {
            layout.add(root, key);
        }
        layout
    }

    /// The manifest keys of all backup directories that have one, by backup name.
    pub fn manifest_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.backups
            .iter()
            .filter_map(|(name, dir)| dir.manifest_key.as_deref().map(|key| (name.as_str(), key)))
    }

    fn add(&mut self, root: &str, key: String) {
        let Some(rest) = key.strip_prefix(root) else {
            self.outside_keys.push(key);
            return;
        };
        match rest.split_once('/') {
            Some((name, file)) if !name.is_empty() => {
                let name = name.to_owned();
                let dir = self.backups.entry(name).or_default();
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
        Layout::from_keys("ns/a/", keys.iter().map(|key| key.to_string()))
    }

    #[test]
    fn keys_are_sorted_into_their_backup_directories() {
        let layout = layout(&[
            "ns/a/b1/manifest.json",
            "ns/a/b1/globals.sql",
            "ns/a/b1/databases/app.dump",
            "ns/a/b2/globals.sql",
        ]);
        let b1 = &layout.backups["b1"];
        assert_eq!(b1.manifest_key.as_deref(), Some("ns/a/b1/manifest.json"));
        assert_eq!(
            b1.data_keys,
            ["ns/a/b1/globals.sql", "ns/a/b1/databases/app.dump"]
        );
        assert_eq!(b1.key_count(), 3);
        assert_eq!(layout.backups["b2"].manifest_key, None);
        let manifests: Vec<_> = layout.manifest_keys().collect();
        assert_eq!(manifests, [("b1", "ns/a/b1/manifest.json")]);
    }

    #[test]
    fn loose_keys_and_empty_names_belong_to_no_backup() {
        let layout = layout(&["ns/a/notes.txt", "ns/a//manifest.json", "ns/a/"]);
        assert!(layout.backups.is_empty());
        assert_eq!(
            layout.loose_keys,
            ["ns/a/notes.txt", "ns/a//manifest.json", "ns/a/"]
        );
    }

    #[test]
    fn a_longer_prefix_with_the_same_start_is_outside_the_root() {
        let layout = layout(&["ns/ab/b1/manifest.json", "ns/a", "other/b1/x"]);
        assert!(layout.backups.is_empty());
        assert_eq!(
            layout.outside_keys,
            ["ns/ab/b1/manifest.json", "ns/a", "other/b1/x"]
        );
    }

    #[test]
    fn a_nested_manifest_is_data_not_the_backups_manifest() {
        let layout = layout(&["ns/a/b1/databases/manifest.json"]);
        let b1 = &layout.backups["b1"];
        assert_eq!(b1.manifest_key, None);
        assert_eq!(b1.data_keys, ["ns/a/b1/databases/manifest.json"]);
    }
}
