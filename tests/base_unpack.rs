//! The recovery's unpacking of a base backup against PostgreSQL 15's own tools: a
//! `pg_basebackup` tar of the test bed's server unpacks, verified against its `backup_manifest`
//! as it is written, and `pg_verifybackup` agrees; a file changed or left out of the tar is
//! refused, naming it.

use std::path::{Path, PathBuf};

use pgkube::instance::recover::unpack::unpack_verified;
use pgkube_testkit::scratch::{PG15_BIN, run_pg15};
use pgkube_testkit::{testbed, unique_name};

/// `pg_basebackup` of the test bed's server as one tar, as pgkube's agent takes it.
fn base_backup_tar(pg_url: &str) -> Vec<u8> {
    let output = std::process::Command::new(format!("{PG15_BIN}/pg_basebackup"))
        .args(["-d", pg_url, "-D", "-", "-Ft", "-X", "none"])
        .args(["--checkpoint=fast", "--manifest-checksums=SHA256"])
        .output()
        .expect("pg_basebackup runs");
    assert!(
        output.status.success(),
        "pg_basebackup: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// An empty directory of its own, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique_name("base-unpack"));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tar rebuilt from `tar`'s entries, `change` deciding each one's fate: `None` leaves it
/// out, else its (possibly changed) content.
fn rebuilt(tar: &[u8], change: impl Fn(&Path, Vec<u8>) -> Option<Vec<u8>>) -> Vec<u8> {
    use std::io::Read;
    let mut builder = tar::Builder::new(Vec::new());
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("an entry");
        let path = entry.path().expect("a path").into_owned();
        let mut header = entry.header().clone();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).expect("content");
        if let Some(content) = change(&path, content) {
            header.set_size(content.len() as u64);
            header.set_cksum();
            builder
                .append(&header, content.as_slice())
                .expect("appended");
        }
    }
    builder.into_inner().expect("a tar")
}

#[test]
fn a_real_base_backup_unpacks_verified_and_pg_verifybackup_agrees() {
    let Some(env) = testbed() else { return };
    let tar = base_backup_tar(&env.pg_url);
    let dir = Scratch::new();
    let unpacked = unpack_verified(tar.as_slice(), &dir.0).expect("unpacked and verified");
    assert!(
        unpacked.files > 500 && unpacked.bytes > 10 << 20,
        "a whole data directory: {unpacked:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.0.join("PG_VERSION")).expect("PG_VERSION"),
        "15\n"
    );
    let arguments = ["--no-parse-wal", "--quiet"].map(std::ffi::OsStr::new);
    let dir_argument = dir.0.as_os_str();
    run_pg15(
        "pg_verifybackup",
        &[arguments[0], arguments[1], dir_argument],
    )
    .expect("pg_verifybackup passes on what was unpacked");
}

#[test]
fn a_changed_or_missing_file_is_refused_naming_it() {
    let Some(env) = testbed() else { return };
    let tar = base_backup_tar(&env.pg_url);

    let changed = rebuilt(&tar, |path, content| {
        Some(match path == Path::new("PG_VERSION") {
            true => b"16\n".to_vec(),
            false => content,
        })
    });
    let dir = Scratch::new();
    let error = unpack_verified(changed.as_slice(), &dir.0).expect_err("refused");
    assert!(
        error.contains(
            "1 file(s) of the base backup do not match its backup_manifest: PG_VERSION has SHA-256"
        ),
        "{error}"
    );

    let missing = rebuilt(&tar, |path, content| {
        (path != Path::new("global/pg_filenode.map")).then_some(content)
    });
    let dir = Scratch::new();
    let error = unpack_verified(missing.as_slice(), &dir.0).expect_err("refused");
    assert!(
        error.ends_with(
            "do not match its backup_manifest: global/pg_filenode.map is listed but not in the backup"
        ),
        "{error}"
    );

    let unchanged = rebuilt(&tar, |_, content| Some(content));
    let dir = Scratch::new();
    unpack_verified(unchanged.as_slice(), &dir.0).expect("the same tar rebuilt passes");
}
