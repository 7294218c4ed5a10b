//! A base backup's tar unpacked into an empty directory and verified as it is written: each
//! regular file is hashed (SHA-256) while it is written, and a second thread makes each written
//! file durable (`fsync`) while the next ones are written. At the end the hashes are checked
//! against the tar's own `backup_manifest` ([`super::backup_manifest`]), so no file is read
//! twice, and the directories are made durable: the directory is complete, verified and on disk
//! before anything swaps it in.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use sha2::{Digest, Sha256};

use super::backup_manifest::{BackupManifest, FileDigest};

/// The manifest's name in the tar, at its top.
const MANIFEST: &str = "backup_manifest";
/// Bytes read from the tar at a time.
const COPY_BUFFER: usize = 256 << 10;
/// Written files waiting for their `fsync`, each an open file.
const SYNC_QUEUE: usize = 64;
/// The error of a step whose next step stopped first: the next step's error says why.
pub const NEXT_STEP_STOPPED: &str = "the next step of the restore stopped";

/// What was unpacked.
#[derive(Debug)]
pub struct Unpacked {
    pub files: usize,
    pub bytes: u64,
}

/// Unpacks the tar `stream` into `dir` (existing, empty), verified against its
/// `backup_manifest` and made durable.
pub fn unpack_verified(stream: impl Read, dir: &Path) -> Result<Unpacked, String> {
    let (to_sync, written_files) = sync_channel::<(PathBuf, File)>(SYNC_QUEUE);
    let (written, synced) = std::thread::scope(|scope| {
        let syncing = scope.spawn(move || make_durable(written_files));
        let written = write_entries(stream, dir, to_sync);
        let synced = syncing
            .join()
            .unwrap_or_else(|_| Err("the thread that syncs the files panicked".to_owned()));
        (written, synced)
    });
    let written = match (written, synced) {
        (Err(error), Err(synced)) if error == NEXT_STEP_STOPPED => return Err(synced),
        (written, synced) => {
            let written = written?;
            synced?;
            written
        }
    };
    let manifest = written
        .manifest
        .ok_or_else(|| format!("the base backup's tar has no {MANIFEST}"))?;
    BackupManifest::parse(&manifest)?.check(&written.files)?;
    for directory in written.directories.iter().rev() {
        sync_path(directory)?;
    }
    sync_path(dir)?;
    Ok(Unpacked {
        files: written.files.len(),
        bytes: written.files.values().map(|file| file.size).sum(),
    })
}

/// What the tar held.
struct Written {
    files: HashMap<Vec<u8>, FileDigest>,
    manifest: Option<Vec<u8>>,
    directories: Vec<PathBuf>,
}

fn write_entries(
    stream: impl Read,
    dir: &Path,
    to_sync: SyncSender<(PathBuf, File)>,
) -> Result<Written, String> {
    let unreadable =
        |error: std::io::Error| format!("the base backup's tar is unreadable: {error}");
    let mut archive = tar::Archive::new(stream);
    archive.set_preserve_permissions(true);
    let mut written = Written {
        files: HashMap::new(),
        manifest: None,
        directories: vec![],
    };
    let mut links: Vec<PathBuf> = vec![];
    let mut buffer = vec![0u8; COPY_BUFFER];
    for entry in archive.entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        let path = relative_path(&entry.path_bytes())?;
        let shown = path.display().to_string();
        if links.iter().any(|link| path.starts_with(link)) {
            return Err(format!(
                "the base backup writes {shown} through a symbolic link"
            ));
        }
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let target = dir.join(&path);
                let keep = path == Path::new(MANIFEST);
                let size = entry.header().size().map_err(unreadable)?;
                let (file, digest, kept) = write_file(&mut entry, &target, &mut buffer, keep)?;
                if digest.size != size {
                    return Err(format!("the base backup's tar ends inside {shown}"));
                }
                if keep {
                    written.manifest = kept;
                }
                let name = path.as_os_str().as_bytes().to_vec();
                written.files.insert(name, digest);
                to_sync
                    .send((target, file))
                    .map_err(|_| NEXT_STEP_STOPPED.to_owned())?;
            }
            tar::EntryType::Directory | tar::EntryType::Symlink => {
                let directory = entry.header().entry_type().is_dir();
                entry
                    .unpack_in(dir)
                    .map_err(|error| format!("cannot unpack {shown}: {error}"))?;
                match directory {
                    true => written.directories.push(dir.join(&path)),
                    false => links.push(path),
                }
            }
            other => {
                return Err(format!(
                    "the base backup holds {shown} of type {other:?}, which a data directory never has"
                ));
            }
        }
    }
    Ok(written)
}

/// A tar path as a path relative to the data directory, refused when it could leave it.
fn relative_path(bytes: &[u8]) -> Result<PathBuf, String> {
    let path = Path::new(std::ffi::OsStr::from_bytes(bytes));
    let mut relative = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir => {}
            _ => {
                return Err(format!(
                    "the base backup holds {}, a path outside its data directory",
                    path.display()
                ));
            }
        }
    }
    match relative.as_os_str().is_empty() {
        true => Err("the base backup holds an entry without a name".to_owned()),
        false => Ok(relative),
    }
}

/// Writes one file, hashing it; returns it open (for its `fsync`) with its digest, and its
/// content when `keep`.
fn write_file(
    entry: &mut impl Read,
    target: &Path,
    buffer: &mut [u8],
    keep: bool,
) -> Result<(File, FileDigest, Option<Vec<u8>>), String> {
    let failed =
        |what: &str, error: std::io::Error| format!("cannot {what} {}: {error}", target.display());
    if let Some(parent) = target.parent().filter(|parent| !parent.exists()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|error| failed("create the directory of", error))?;
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(target)
        .map_err(|error| failed("create", error))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut kept = keep.then(Vec::new);
    loop {
        let count = entry
            .read(buffer)
            .map_err(|error| failed("read the backup's content of", error))?;
        if count == 0 {
            break;
        }
        let chunk = &buffer[..count];
        hasher.update(chunk);
        file.write_all(chunk)
            .map_err(|error| failed("write", error))?;
        if let Some(kept) = &mut kept {
            kept.extend_from_slice(chunk);
        }
        size += count as u64;
    }
    let digest = FileDigest {
        size,
        sha256: hex::encode(hasher.finalize()),
    };
    Ok((file, digest, kept))
}

/// `fsync`s each written file as it comes.
fn make_durable(files: Receiver<(PathBuf, File)>) -> Result<(), String> {
    for (path, file) in files {
        file.sync_all()
            .map_err(|error| format!("cannot make {} durable: {error}", path.display()))?;
    }
    Ok(())
}

fn sync_path(path: &Path) -> Result<(), String> {
    crate::instance::datadir::sync_directory(path)
        .map_err(|error| format!("cannot make {} durable: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of `files`, names written into the header as given (even `..`).
    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, content) in files {
            let mut header = tar::Header::new_old();
            header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_size(content.len() as u64);
            header.set_mode(0o600);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            builder.append(&header, *content).expect("appended");
        }
        builder.into_inner().expect("a tar")
    }

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().expect("a scratch directory")
    }

    #[test]
    fn a_path_out_of_the_directory_is_refused_before_anything_is_written() {
        let dir = scratch();
        let tar = tar_of(&[("../escaped", b"x")]);
        let error = unpack_verified(tar.as_slice(), &dir.path().join("data")).expect_err("refused");
        assert_eq!(
            error,
            "the base backup holds ../escaped, a path outside its data directory"
        );
        assert!(!dir.path().join("escaped").exists());
    }

    #[test]
    fn a_tar_without_its_manifest_is_refused() {
        let dir = scratch();
        let tar = tar_of(&[("PG_VERSION", b"15\n")]);
        let error = unpack_verified(tar.as_slice(), dir.path()).expect_err("refused");
        assert_eq!(error, "the base backup's tar has no backup_manifest");
    }

    #[test]
    fn a_cut_tar_is_refused() {
        let dir = scratch();
        let tar = tar_of(&[("PG_VERSION", &[b'x'; 2000])]);
        let error = unpack_verified(&tar[..1024], dir.path()).expect_err("refused");
        assert_eq!(error, "the base backup's tar ends inside PG_VERSION");
    }
}
