//! PostgreSQL's `backup_manifest` (pure): the files a base backup holds, each with its size and
//! SHA-256, and the check `pg_verifybackup` makes of a restored directory against it, made here
//! on the hashes taken while the files were written, so that nothing is read twice.
//!
//! Like `pg_verifybackup`, the manifest's own checksum must hold; every file it lists must have
//! been written with its size and checksum; and no other file may have been, except the ones
//! `pg_verifybackup` ignores by default (the manifest itself, `pg_wal`, `postgresql.auto.conf`,
//! `recovery.signal`, `standby.signal`).

use std::collections::HashMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Paths `pg_verifybackup` ignores by default, with everything under them.
const IGNORED: &[&str] = &[
    "backup_manifest",
    "pg_wal",
    "postgresql.auto.conf",
    "recovery.signal",
    "standby.signal",
];
/// The only checksum pgkube's base backups use (`--manifest-checksums=SHA256`).
const ALGORITHM: &str = "SHA256";
/// Problems named in one error; the rest are counted.
const NAMED_PROBLEMS: usize = 3;

/// A file as written or as listed: its size and SHA-256 (lowercase hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileDigest {
    pub size: u64,
    pub sha256: String,
}

/// The files a `backup_manifest` lists, by path (bytes: PostgreSQL allows any).
#[derive(Debug)]
pub struct BackupManifest {
    files: HashMap<Vec<u8>, FileDigest>,
}

#[derive(Deserialize)]
struct Document {
    #[serde(rename = "PostgreSQL-Backup-Manifest-Version")]
    version: u32,
    #[serde(rename = "Files")]
    files: Vec<Listed>,
    #[serde(rename = "Manifest-Checksum")]
    checksum: String,
}

#[derive(Deserialize)]
struct Listed {
    #[serde(rename = "Path")]
    path: Option<String>,
    #[serde(rename = "Encoded-Path")]
    encoded_path: Option<String>,
    #[serde(rename = "Size")]
    size: u64,
    #[serde(rename = "Checksum-Algorithm")]
    algorithm: Option<String>,
    #[serde(rename = "Checksum")]
    checksum: Option<String>,
}

impl BackupManifest {
    /// Reads a `backup_manifest` whose own checksum holds and whose files are all SHA-256'd.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let document: Document = serde_json::from_slice(bytes)
            .map_err(|error| format!("backup_manifest is not readable: {error}"))?;
        if !(1..=2).contains(&document.version) {
            return Err(format!(
                "backup_manifest has version {}, which this pgkube does not read",
                document.version
            ));
        }
        check_own_checksum(bytes, &document.checksum)?;
        let files = document
            .files
            .into_iter()
            .map(listed_file)
            .collect::<Result<HashMap<_, _>, String>>()?;
        Ok(Self { files })
    }

    /// Checks `written` (path to what was written) against the listed files.
    pub fn check(&self, written: &HashMap<Vec<u8>, FileDigest>) -> Result<(), String> {
        let mut problems: Vec<String> = Vec::new();
        for (path, listed) in self.files.iter().filter(|(path, _)| !ignored(path)) {
            let name = String::from_utf8_lossy(path);
            match written.get(path) {
                None => problems.push(format!("{name} is listed but not in the backup")),
                Some(found) if found.size != listed.size => problems.push(format!(
                    "{name} has {} bytes, the manifest lists {}",
                    found.size, listed.size
                )),
                Some(found) if found.sha256 != listed.sha256 => problems.push(format!(
                    "{name} has SHA-256 {}, the manifest lists {}",
                    found.sha256, listed.sha256
                )),
                Some(_) => {}
            }
        }
        for path in written.keys() {
            if !ignored(path) && !self.files.contains_key(path) {
                let name = String::from_utf8_lossy(path);
                problems.push(format!("{name} is in the backup but not listed"));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        problems.sort();
        let count = problems.len();
        let mut named = problems[..count.min(NAMED_PROBLEMS)].join("; ");
        if count > NAMED_PROBLEMS {
            named.push_str(&format!(" (and {} more)", count - NAMED_PROBLEMS));
        }
        Err(format!(
            "{count} file(s) of the base backup do not match its backup_manifest: {named}"
        ))
    }
}

/// The manifest's checksum covers every byte up to its penultimate newline, the line before the
/// one that holds the checksum (as PostgreSQL computes it).
fn check_own_checksum(bytes: &[u8], recorded: &str) -> Result<(), String> {
    let newlines: Vec<usize> = bytes
        .iter()
        .enumerate()
        .filter(|(_, byte)| **byte == b'\n')
        .map(|(index, _)| index)
        .collect();
    let covered = match newlines.as_slice() {
        [.., penultimate, _] => &bytes[..=*penultimate],
        _ => return Err("backup_manifest has too few lines to hold its checksum".to_owned()),
    };
    let computed = hex::encode(Sha256::digest(covered));
    if !computed.eq_ignore_ascii_case(recorded) {
        return Err(format!(
            "backup_manifest is corrupt: its checksum is {recorded}, its content hashes to {computed}"
        ));
    }
    Ok(())
}

fn listed_file(listed: Listed) -> Result<(Vec<u8>, FileDigest), String> {
    let path = match (listed.path, listed.encoded_path) {
        (Some(path), _) => path.into_bytes(),
        (None, Some(encoded)) => hex::decode(&encoded).map_err(|error| {
            format!("backup_manifest has a bad Encoded-Path {encoded:?}: {error}")
        })?,
        (None, None) => return Err("backup_manifest lists a file without a path".to_owned()),
    };
    let name = String::from_utf8_lossy(&path).into_owned();
    let algorithm = listed.algorithm.unwrap_or_else(|| "NONE".to_owned());
    let sha256 = match (algorithm.as_str(), listed.checksum) {
        (ALGORITHM, Some(checksum)) => checksum.to_ascii_lowercase(),
        _ => {
            return Err(format!(
                "backup_manifest checksums {name} with {algorithm}: a recovery verifies SHA256 checksums only, which pgkube's base backups record"
            ));
        }
    };
    let digest = FileDigest {
        size: listed.size,
        sha256,
    };
    Ok((path, digest))
}

fn ignored(path: &[u8]) -> bool {
    IGNORED.iter().any(|ignored| {
        let ignored = ignored.as_bytes();
        path == ignored || (path.starts_with(ignored) && path.get(ignored.len()) == Some(&b'/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// A manifest as PostgreSQL writes it, its checksum computed over all but the last line.
    fn manifest(files: &[(&str, u64, &str)]) -> Vec<u8> {
        let mut text = "{ \"PostgreSQL-Backup-Manifest-Version\": 1,\n\"Files\": [\n".to_owned();
        let lines: Vec<String> = files
            .iter()
            .map(|(path, size, sha)| {
                format!(
                    "{{ \"Path\": \"{path}\", \"Size\": {size}, \"Last-Modified\": \"2026-12-06 11:19:06 GMT\", \"Checksum-Algorithm\": \"SHA256\", \"Checksum\": \"{sha}\" }}"
                )
            })
            .collect();
        text.push_str(&lines.join(",\n"));
        text.push_str("\n],\n\"WAL-Ranges\": [\n{ \"Timeline\": 1, \"Start-LSN\": \"0/2000028\", \"End-LSN\": \"0/2000100\" }\n],\n");
        let checksum = hex::encode(Sha256::digest(text.as_bytes()));
        text.push_str(&format!("\"Manifest-Checksum\": \"{checksum}\"}}\n"));
        text.into_bytes()
    }

    fn written(files: &[(&str, u64, &str)]) -> HashMap<Vec<u8>, FileDigest> {
        files
            .iter()
            .map(|(path, size, sha)| {
                let digest = FileDigest {
                    size: *size,
                    sha256: (*sha).to_owned(),
                };
                (path.as_bytes().to_vec(), digest)
            })
            .collect()
    }

    #[test]
    fn the_files_listed_with_their_sizes_and_checksums_pass() {
        let files = [
            ("tablespace_map", 0, EMPTY_SHA256),
            ("base/1/112", 0, EMPTY_SHA256),
        ];
        let manifest = BackupManifest::parse(&manifest(&files)).expect("a manifest");
        let mut found = written(&files);
        found.insert(
            b"backup_manifest".to_vec(),
            FileDigest {
                size: 9,
                sha256: "x".into(),
            },
        );
        found.insert(
            b"pg_wal/archive_status/x".to_vec(),
            FileDigest {
                size: 1,
                sha256: "y".into(),
            },
        );
        assert_eq!(manifest.check(&found), Ok(()));
    }

    #[test]
    fn a_file_changed_missing_or_extra_is_named() {
        let other = "ab".repeat(32);
        let files = [
            ("a", 0, EMPTY_SHA256),
            ("b", 0, EMPTY_SHA256),
            ("c", 5, EMPTY_SHA256),
        ];
        let manifest = BackupManifest::parse(&manifest(&files)).expect("a manifest");
        let found = written(&[
            ("a", 0, &other),
            ("c", 4, EMPTY_SHA256),
            ("d", 0, EMPTY_SHA256),
        ]);
        let error = manifest.check(&found).expect_err("refused");
        assert_eq!(
            error,
            format!(
                "4 file(s) of the base backup do not match its backup_manifest: a has SHA-256 {other}, the manifest lists {EMPTY_SHA256}; b is listed but not in the backup; c has 4 bytes, the manifest lists 5 (and 1 more)"
            )
        );
        let only_extra = written(&[
            ("a", 0, EMPTY_SHA256),
            ("b", 0, EMPTY_SHA256),
            ("c", 5, EMPTY_SHA256),
            ("pg_walx", 0, EMPTY_SHA256),
        ]);
        assert!(
            manifest
                .check(&only_extra)
                .expect_err("refused")
                .ends_with("pg_walx is in the backup but not listed"),
            "a name that only starts like an ignored one is checked"
        );
    }

    #[test]
    fn a_manifest_whose_own_checksum_fails_is_refused() {
        let mut bytes = manifest(&[("a", 0, EMPTY_SHA256)]);
        let at = bytes.iter().position(|byte| *byte == b'0').expect("a size");
        bytes[at] = b'1';
        let error = BackupManifest::parse(&bytes).expect_err("refused");
        assert!(
            error.starts_with("backup_manifest is corrupt: its checksum is"),
            "{error}"
        );
    }

    #[test]
    fn other_checksum_algorithms_and_encoded_paths() {
        let text = manifest(&[("a", 0, EMPTY_SHA256)]);
        let text = String::from_utf8(text).expect("UTF-8");
        let crc = text.replace("\"SHA256\"", "\"CRC32C\"");
        let crc = rechecksum(&crc);
        let error = BackupManifest::parse(crc.as_bytes()).expect_err("refused");
        assert!(error.contains("checksums a with CRC32C"), "{error}");

        let encoded = rechecksum(&text.replace("\"Path\": \"a\"", "\"Encoded-Path\": \"ff61\""));
        let manifest = BackupManifest::parse(encoded.as_bytes()).expect("a manifest");
        let mut found = HashMap::new();
        found.insert(
            vec![0xff, b'a'],
            FileDigest {
                size: 0,
                sha256: EMPTY_SHA256.to_owned(),
            },
        );
        assert_eq!(manifest.check(&found), Ok(()));
    }

    /// `text` with its last line's checksum computed again.
    fn rechecksum(text: &str) -> String {
        let cut = text
            .rfind("\"Manifest-Checksum\"")
            .expect("a checksum line");
        let body = &text[..cut];
        let checksum = hex::encode(Sha256::digest(body.as_bytes()));
        format!("{body}\"Manifest-Checksum\": \"{checksum}\"}}\n")
    }
}
