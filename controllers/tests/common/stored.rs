//! Backups put into a test bucket as the backup agent lays them out
//! (`<prefix>/<cluster-uid>/<name>/<uid>/globals.sql`, `databases/app.dump`, `manifest.json`
//! with a given `finishedAt` and owner), or as it did before the uids named the directory
//! (`<prefix>/<name>/`); physical backups and a WAL archive as the agent and the instance
//! manager lay them out; and the keys a bucket holds afterwards.

use std::collections::BTreeSet;

use aws_sdk_s3::Client;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::{StreamExt, TryStreamExt};
use pgkube_controllers::storage::manifest::{
    BACKUP_LABEL_FORMAT, BACKUP_MANIFEST_FORMAT, BASE_BACKUP_FORMAT, DATABASE_FORMAT,
    DatabaseObject, GLOBALS_FORMAT, MANIFEST_VERSION, Manifest, PhysicalBackup, StoredCompression,
    StoredObject,
};
use pgkube_controllers::storage::wal::{ArchiveOwner, MARKER, WalFileName};

/// Objects uploaded at once while filling a bucket.
const CONCURRENT_UPLOADS: usize = 32;

/// A cluster whose backups go under `<prefix>/<uid>/`.
#[derive(Clone, Copy)]
pub struct Cluster {
    pub prefix: &'static str,
    pub uid: &'static str,
}

impl Cluster {
    /// The directory of its backup `name`, made by the PostgreSQLBackup of uid `<name>-uid`.
    pub fn dir(&self, name: &str) -> String {
        format!("{}/{}/{name}/{}/", self.prefix, self.uid, uid(name))
    }
}

/// The uid of the PostgreSQLBackup that made backup `name` here.
pub fn uid(name: &str) -> String {
    format!("{name}-uid")
}

pub fn stored(key: String, format: &str) -> StoredObject {
    StoredObject {
        key,
        size: 4,
        sha256: "00".repeat(32),
        format: format.into(),
        compression: None,
    }
}

/// The manifest of a backup in `dir`, recording `owner` (cluster uid, backup uid) or no uid.
pub fn manifest_json(
    dir: &str,
    name: &str,
    owner: Option<(&str, &str)>,
    finished_at: DateTime<Utc>,
) -> Vec<u8> {
    let finished_at = finished_at.to_rfc3339_opts(SecondsFormat::Secs, true);
    let manifest = Manifest {
        manifest_version: MANIFEST_VERSION,
        cluster: "a".into(),
        namespace: "ns".into(),
        cluster_uid: owner.map(|(cluster, _)| cluster.to_owned()),
        system_identifier: None,
        backup_name: name.into(),
        backup_uid: owner.map(|(_, backup)| backup.to_owned()),
        postgresql_version: "16.4".into(),
        started_at: finished_at.clone(),
        finished_at,
        format: DATABASE_FORMAT.into(),
        physical: None,
        globals: Some(stored(format!("{dir}globals.sql"), GLOBALS_FORMAT)),
        databases: vec![DatabaseObject {
            name: "app".into(),
            object: stored(format!("{dir}databases/app.dump"), DATABASE_FORMAT),
        }],
    };
    serde_json::to_vec(&manifest).expect("a manifest serialises")
}

/// Where a physical backup's WAL starts, and whose database it is of.
#[derive(Clone, Copy)]
pub struct WalStart<'a> {
    pub wal_root: &'a str,
    pub first_wal: &'a str,
    pub system_identifier: &'a str,
}

/// The manifest of a physical backup of `cluster` in `dir`, whose WAL starts at `start`.
pub fn physical_manifest_json(
    cluster: Cluster,
    dir: &str,
    name: &str,
    finished_at: DateTime<Utc>,
    start: WalStart,
) -> Vec<u8> {
    let mut manifest: Manifest = serde_json::from_slice(&manifest_json(
        dir,
        name,
        Some((cluster.uid, &uid(name))),
        finished_at,
    ))
    .expect("a manifest parses");
    manifest.format = BASE_BACKUP_FORMAT.into();
    manifest.system_identifier = Some(start.system_identifier.into());
    manifest.globals = None;
    manifest.databases = Vec::new();
    let timeline = u32::from_str_radix(&start.first_wal[..8], 16).expect("a timeline");
    manifest.physical = Some(PhysicalBackup {
        start_lsn: "0/0".into(),
        start_timeline: timeline,
        stop_lsn: "0/0".into(),
        stop_timeline: timeline,
        source: "pg-1".into(),
        from_standby: true,
        wal_root: start.wal_root.into(),
        first_wal: start.first_wal.into(),
        last_wal: start.first_wal.into(),
        base: StoredObject {
            compression: Some(StoredCompression::Zstd),
            ..stored(format!("{dir}base.tar.zst"), BASE_BACKUP_FORMAT)
        },
        backup_label: stored(format!("{dir}backup_label"), BACKUP_LABEL_FORMAT),
        tablespace_map: None,
        backup_manifest: stored(format!("{dir}backup_manifest"), BACKUP_MANIFEST_FORMAT),
    });
    manifest.manifest_version = manifest.required_version();
    serde_json::to_vec(&manifest).expect("a manifest serialises")
}

/// A bucket being filled: objects to upload, then [`Fill::upload`].
pub struct Fill {
    objects: Vec<(String, Vec<u8>)>,
}

impl Fill {
    pub fn new() -> Self {
        Self {
            objects: Vec::new(),
        }
    }

    /// A complete backup of `cluster`: globals, one database, `extra` more objects and its
    /// manifest.
    pub fn backup(
        self,
        cluster: Cluster,
        name: &str,
        finished_at: DateTime<Utc>,
        extra: usize,
    ) -> Self {
        let dir = cluster.dir(name);
        let manifest = manifest_json(&dir, name, Some((cluster.uid, &uid(name))), finished_at);
        self.incomplete(&dir, extra)
            .object(&format!("{dir}manifest.json"), manifest)
    }

    /// A complete physical backup of `cluster`: the base tar, the backup label, PostgreSQL's
    /// backup manifest and the manifest, recording where its WAL starts.
    pub fn physical(
        self,
        cluster: Cluster,
        name: &str,
        finished_at: DateTime<Utc>,
        start: WalStart,
    ) -> Self {
        let dir = cluster.dir(name);
        let manifest = physical_manifest_json(cluster, &dir, name, finished_at, start);
        self.object(&format!("{dir}base.tar.zst"), b"tar".to_vec())
            .object(&format!("{dir}backup_label"), b"START WAL".to_vec())
            .object(&format!("{dir}backup_manifest"), b"{}".to_vec())
            .object(&format!("{dir}manifest.json"), manifest)
    }

    /// A WAL archive at `root` owned by `owner`, holding `files` (WAL file names).
    pub fn wal_archive(mut self, root: &str, owner: &ArchiveOwner, files: &[&str]) -> Self {
        let record = serde_json::to_vec(owner).expect("an owner record serialises");
        self = self.object(&format!("{root}{MARKER}"), record);
        for name in files {
            let file = WalFileName::parse(name).expect("a WAL file name");
            self = self.object(&file.key(root), b"zstd".to_vec());
        }
        self
    }

    /// A backup stored before the uids named its directory: `<prefix>/<name>/`, a manifest
    /// without uids.
    pub fn legacy(self, prefix: &str, name: &str, finished_at: DateTime<Utc>) -> Self {
        let dir = format!("{prefix}/{name}/");
        let manifest = manifest_json(&dir, name, None, finished_at);
        self.incomplete(&dir, 0)
            .object(&format!("{dir}manifest.json"), manifest)
    }

    /// The objects of a backup in `dir` whose manifest was never written.
    pub fn incomplete(mut self, dir: &str, extra: usize) -> Self {
        self = self.object(&format!("{dir}globals.sql"), b"SET;".to_vec());
        self = self.object(&format!("{dir}databases/app.dump"), b"PGDM".to_vec());
        for index in 0..extra {
            let key = format!("{dir}databases/extra-{index:05}.dump");
            self = self.object(&key, b"PGDM".to_vec());
        }
        self
    }

    pub fn object(mut self, key: &str, body: Vec<u8>) -> Self {
        self.objects.push((key.to_owned(), body));
        self
    }

    pub fn keys(&self) -> BTreeSet<String> {
        self.objects.iter().map(|(key, _)| key.clone()).collect()
    }

    pub async fn upload(&self, client: &Client, bucket: &str) {
        futures::stream::iter(&self.objects)
            .map(|(key, body)| async move {
                client
                    .put_object()
                    .bucket(bucket)
                    .key(key)
                    .body(body.clone().into())
                    .send()
                    .await
                    .map_err(|error| format!("putting {key}: {error:?}"))
            })
            .buffer_unordered(CONCURRENT_UPLOADS)
            .try_collect::<Vec<_>>()
            .await
            .expect("uploading the test objects");
    }
}

/// Every key in `bucket`.
pub async fn all_keys(client: &Client, bucket: &str) -> BTreeSet<String> {
    client
        .list_objects_v2()
        .bucket(bucket)
        .into_paginator()
        .send()
        .try_collect()
        .await
        .expect("listing the bucket")
        .iter()
        .flat_map(|page| page.contents())
        .filter_map(|object| object.key().map(str::to_owned))
        .collect()
}

/// The keys of `keys` under `dir`.
pub fn keys_of(keys: &BTreeSet<String>, dir: &str) -> BTreeSet<String> {
    keys.iter()
        .filter(|key| key.starts_with(dir))
        .cloned()
        .collect()
}
