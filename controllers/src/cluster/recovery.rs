//! The cluster's point-in-time recovery (`spec.bootstrap.recovery`), on the operator's side:
//! which base backup and which archive the first instance recovers from, checked before any
//! pod exists.
//!
//! Until the cluster records its database (`status.systemIdentifier`, once the recovered primary
//! has promoted), each reconcile needs the [`RecoveryOrder`] that goes into `instance.json`. It
//! is read once per cluster from storage and kept in memory:
//! - the named PostgreSQLBackup must be a Completed physical backup; its manifest says where its
//!   WAL is archived. With a `source` instead, every physical backup of that archive is read and
//!   the latest that ends before the target is taken ([`pick_backup`]);
//! - the archive is listed: the window runs from the backup's end to the newest segment stored.
//!   A target outside it is refused at once, naming the window ([`check_target`]);
//! - the new cluster must archive elsewhere than the source: two clusters never write one
//!   archive.
//!
//! A refusal is reported as the spec's issue and nothing is built: without its order, the first
//! instance would make a new, empty database instead.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use pgkube_crds::{
    BackupMethod, BackupPhase, BackupStorage, PostgreSQLBackup, PostgreSQLCluster,
    PostgreSQLRestore, Recovery, RecoverySource, RecoveryTarget, S3Storage,
};

use super::Error;
use super::context::ClusterContext;
use crate::backup::access;
use crate::storage::S3Bucket;
use crate::storage::lsn::{Lsn, parse_segment_name};
use crate::storage::manifest::Manifest;
use crate::storage::recovery::{
    BaseObject, Candidate, Point, RecoveryOrder, Window, check_target, describe, pick_backup,
    validate_target,
};
use crate::storage::wal::{WalArchiveTarget, WalFileKind, WalFileName};

/// WAL segments are 16 MiB unless initdb was told otherwise, which pgkube never does.
const SEGMENT_SIZE: u64 = 16 * 1024 * 1024;
/// Manifests read at once when a source's backups are looked for.
const CONCURRENT_READS: usize = 8;

/// Where a cluster's recovery stands for this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Resolution {
    /// No recovery asked, or done (the cluster recorded its database).
    NotAsked,
    /// What the first instance recovers.
    Order(Box<RecoveryOrder>),
    /// It cannot be done as asked: why, for the condition.
    Refused(String),
}

/// The orders found, by cluster uid: storage is read once per cluster.
#[derive(Default)]
pub struct Orders(Mutex<HashMap<String, RecoveryOrder>>);

impl Orders {
    fn get(&self, uid: &str) -> Option<RecoveryOrder> {
        self.lock().get(uid).cloned()
    }

    fn insert(&self, uid: &str, order: RecoveryOrder) {
        self.lock().insert(uid.to_owned(), order);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, RecoveryOrder>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The storage the recovery reads (for the pod's keys): the source's, or the named backup's as
/// its status records it.
pub(super) fn source_storage(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
) -> Option<S3Storage> {
    let recovery = cluster.spec.bootstrap.as_ref()?.recovery.as_ref()?;
    if let Some(source) = &recovery.source {
        return Some(source.storage.s3.clone());
    }
    let backup = named_backup(context, cluster, recovery)?;
    Some(backup.status.as_ref()?.storage.as_ref()?.s3.clone())
}

fn named_backup(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    recovery: &Recovery,
) -> Option<std::sync::Arc<PostgreSQLBackup>> {
    let name = &recovery.backup.as_ref()?.name;
    let reference = ObjectRef::new(name).within(&cluster.namespace()?);
    context
        .backups
        .iter()
        .find_map(|store| store.get(&reference))
}

/// The recovery order of `cluster`, unless it has none to follow (`recorded`: the cluster has
/// recorded its database, so the recovery is over). `own_archive` is the root the cluster will
/// archive to itself.
pub(super) async fn resolve(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    recorded: bool,
    own_archive: Option<&WalArchiveTarget>,
) -> Result<Resolution, Error> {
    let Some(recovery) = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.recovery.as_ref())
    else {
        return Ok(Resolution::NotAsked);
    };
    if recorded {
        return Ok(Resolution::NotAsked);
    }
    let uid = cluster.uid().unwrap_or_default();
    if let Some(order) = context.recovery_orders.get(&uid) {
        return Ok(Resolution::Order(Box::new(order)));
    }
    let order = match find_order(context, cluster, recovery).await? {
        Ok(order) => order,
        Err(refusal) => return Ok(Resolution::Refused(refusal)),
    };
    if let Some(own) = own_archive.filter(|own| same_archive(own, &order.archive)) {
        return Ok(Resolution::Refused(format!(
            "the cluster would archive its WAL to s3://{}/{}, the archive it recovers from: give it another backup prefix or name",
            own.bucket, own.root
        )));
    }
    tracing::info!(backup = %order.backup, archive = %order.archive.root, target = %describe(&order.target), "recovery planned");
    context.recovery_orders.insert(&uid, order.clone());
    Ok(Resolution::Order(Box::new(order)))
}

/// The order of an in-place recovery by `restore` (a PointInTime PostgreSQLRestore into
/// `cluster`): from the named physical backup, or the latest of the cluster's own archive that
/// ends before the target, replayed from the cluster's own archive. Read once per restore.
pub(super) async fn resolve_in_place(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    restore: &PostgreSQLRestore,
) -> Result<Resolution, Error> {
    let uid = restore.uid().unwrap_or_default();
    if let Some(order) = context.recovery_orders.get(&uid) {
        return Ok(Resolution::Order(Box::new(order)));
    }
    let (Some(storage), Some(root)) = (
        super::validate::wal_archive_storage(&cluster.spec),
        super::validate::archive_root(cluster),
    ) else {
        return Ok(Resolution::Refused(
            "the cluster does not archive its WAL (spec.backup.storage with walArchiving): nothing to recover from".to_owned(),
        ));
    };
    let recovery = Recovery {
        backup: restore.spec.backup.clone(),
        source: restore.spec.backup.is_none().then(|| RecoverySource {
            storage: BackupStorage { s3: storage },
            archive: root.clone(),
        }),
        target: restore.spec.target.clone(),
    };
    let order = match find_order(context, cluster, &recovery).await? {
        Ok(order) => order,
        Err(refusal) => return Ok(Resolution::Refused(refusal)),
    };
    if order.archive.root != root {
        return Ok(Resolution::Refused(format!(
            "backup {} was taken with the archive {}, not this cluster's {root}",
            order.backup, order.archive.root
        )));
    }
    let recorded = cluster
        .status
        .as_ref()
        .and_then(|s| s.system_identifier.as_deref());
    if recorded != Some(order.system_identifier.as_str()) {
        return Ok(Resolution::Refused(format!(
            "backup {} holds database {}, not this cluster's {}",
            order.backup,
            order.system_identifier,
            recorded.unwrap_or("(not recorded yet)")
        )));
    }
    tracing::info!(backup = %order.backup, target = %describe(&order.target), "in-place recovery planned");
    context.recovery_orders.insert(&uid, order.clone());
    Ok(Resolution::Order(Box::new(order)))
}

fn same_archive(own: &WalArchiveTarget, source: &WalArchiveTarget) -> bool {
    own.bucket == source.bucket && own.endpoint == source.endpoint && own.root == source.root
}

/// The order, or why there is none (the outer error: storage could not be read).
async fn find_order(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    recovery: &Recovery,
) -> Result<Result<RecoveryOrder, String>, Error> {
    let target = recovery.target.clone().unwrap_or_default();
    if let Err(error) = validate_target(&target) {
        return Ok(Err(error.to_string()));
    }
    let namespace = cluster.namespace().ok_or(Error::MissingNamespace)?;
    let (storage, candidate, archive_root) = match source_of(context, cluster, recovery) {
        Ok(found) => found,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let bucket = access::connect(&context.base.client, &namespace, &storage)
        .await
        .map_err(|error| Error::RecoverySource(error.to_string()))?;
    let candidates = match candidate {
        Some(key) => vec![read_candidate(&bucket, &key).await?],
        None => source_candidates(&bucket, &archive_root).await?,
    };
    let Some(chosen) =
        pick_backup(&candidates, &target).map_err(|e| Error::RecoverySource(e.to_string()))?
    else {
        return Ok(Err(no_backup_before(&candidates, &target, &archive_root)));
    };
    let Some(first) = chosen.end() else {
        return Ok(Err(format!(
            "backup {} is not a physical backup",
            chosen.manifest_key
        )));
    };
    let root = chosen
        .manifest
        .physical
        .as_ref()
        .map(|p| p.wal_root.clone())
        .unwrap_or(archive_root);
    let last = last_archived(&bucket, &root).await?;
    let Some(last) = last else {
        return Ok(Err(format!(
            "the archive s3://{}/{root} holds no WAL segment",
            storage.bucket
        )));
    };
    let window = Window { first, last };
    if let Err(error) = check_target(&target, &window) {
        return Ok(Err(error.to_string()));
    }
    Ok(order_of(chosen, &storage, root, target))
}

/// The storage, the manifest key of the named backup (none: look for one), and the archive.
fn source_of(
    context: &ClusterContext,
    cluster: &PostgreSQLCluster,
    recovery: &Recovery,
) -> Result<(S3Storage, Option<String>, String), String> {
    if let Some(source) = &recovery.source {
        return Ok((source.storage.s3.clone(), None, source.archive.clone()));
    }
    let name = recovery
        .backup
        .as_ref()
        .map_or_else(String::new, |b| b.name.clone());
    let backup = named_backup(context, cluster, recovery)
        .ok_or_else(|| format!("backup {name} does not exist in the cluster's namespace"))?;
    if backup.spec.method != BackupMethod::Physical {
        return Err(format!(
            "backup {name} is not a physical backup: a point-in-time recovery starts from a base backup (method: Physical)"
        ));
    }
    let status = backup.status.as_ref();
    if status.and_then(|s| s.phase) != Some(BackupPhase::Completed) {
        return Err(format!("backup {name} has not completed"));
    }
    let storage = status
        .and_then(|s| s.storage.as_ref())
        .map(|s| s.s3.clone());
    let key = status.and_then(|s| s.object_key.clone());
    match (storage, key) {
        (Some(storage), Some(key)) => Ok((storage, Some(key), String::new())),
        _ => Err(format!("backup {name} does not record where it is stored")),
    }
}

/// Why no backup serves the target, naming the earliest there is.
fn no_backup_before(candidates: &[Candidate], target: &RecoveryTarget, archive: &str) -> String {
    let earliest = candidates
        .iter()
        .filter_map(|c| Some((c.end()?, &c.manifest_key)))
        .min_by_key(|(end, _)| end.lsn);
    match earliest {
        None => format!("the archive {archive} has no physical backup to start from"),
        Some((end, key)) => format!(
            "recovery target {} is outside the recoverable window: the earliest backup, {key}, ends at {} ({})",
            describe(target),
            end.time,
            end.lsn
        ),
    }
}

fn order_of(
    chosen: &Candidate,
    storage: &S3Storage,
    root: String,
    target: RecoveryTarget,
) -> Result<RecoveryOrder, String> {
    let physical = chosen
        .manifest
        .physical
        .as_ref()
        .ok_or_else(|| format!("backup {} is not a physical backup", chosen.manifest_key))?;
    let system_identifier = chosen.manifest.system_identifier.clone().ok_or_else(|| {
        format!(
            "backup {} does not record its system identifier",
            chosen.manifest_key
        )
    })?;
    Ok(RecoveryOrder {
        archive: super::build::archive_target(storage, root, chosen_cluster(&chosen.manifest)),
        backup: chosen.manifest_key.clone(),
        base: BaseObject {
            key: physical.base.key.clone(),
            size: physical.base.size,
            sha256: physical.base.sha256.clone(),
        },
        system_identifier,
        stop_lsn: physical.stop_lsn.clone(),
        target,
    })
}

fn chosen_cluster(manifest: &Manifest) -> String {
    format!("{}/{}", manifest.namespace, manifest.cluster)
}

async fn read_candidate(bucket: &S3Bucket, key: &str) -> Result<Candidate, Error> {
    let bytes = bucket
        .read_object(key)
        .await
        .map_err(|error| Error::RecoverySource(error.to_string()))?
        .ok_or_else(|| Error::RecoverySource(format!("the manifest {key} is gone")))?;
    let manifest = serde_json::from_slice(&bytes).map_err(|error| {
        Error::RecoverySource(format!("the manifest {key} does not parse: {error}"))
    })?;
    Ok(Candidate {
        manifest_key: key.to_owned(),
        manifest,
    })
}

/// Every physical backup whose WAL is in `archive`: the manifests under the archive's prefix.
async fn source_candidates(bucket: &S3Bucket, archive: &str) -> Result<Vec<Candidate>, Error> {
    let prefix = archive
        .trim_end_matches('/')
        .rsplit_once("wal/")
        .map_or("", |(prefix, _)| prefix);
    let keys: Vec<String> = list(bucket, prefix)
        .await?
        .into_iter()
        .map(|(key, _)| key)
        .filter(|key| key.ends_with("/manifest.json") && !key.starts_with(archive))
        .collect();
    let candidates: Vec<Candidate> = futures::stream::iter(keys)
        .map(|key| async move { read_candidate(bucket, &key).await })
        .buffer_unordered(CONCURRENT_READS)
        .try_collect()
        .await?;
    Ok(candidates
        .into_iter()
        .filter(|c| {
            c.manifest
                .physical
                .as_ref()
                .is_some_and(|p| p.wal_root == archive)
        })
        .collect())
}

/// The end of the newest segment of the archive's highest timeline, and when it was stored.
async fn last_archived(bucket: &S3Bucket, root: &str) -> Result<Option<Point>, Error> {
    let newest = list(bucket, root)
        .await?
        .into_iter()
        .filter_map(|(key, stored)| {
            let name = key.rsplit('/').next()?.strip_suffix(".zst")?;
            let file = WalFileName::parse(name)?;
            (file.kind == WalFileKind::Segment).then_some(())?;
            Some((parse_segment_name(name, SEGMENT_SIZE)?, stored))
        })
        .max_by_key(|((timeline, segment), _)| (*timeline, *segment));
    Ok(newest.map(|((_, segment), stored)| Point {
        time: stored,
        lsn: Lsn((segment + 1) * SEGMENT_SIZE),
    }))
}

/// Every key under `prefix` with when it was stored, all pages.
async fn list(bucket: &S3Bucket, prefix: &str) -> Result<Vec<(String, Timestamp)>, Error> {
    let listed = crate::retention::list_objects(bucket, prefix, &mut Default::default())
        .await
        .map_err(|error| Error::RecoverySource(error.to_string()))?;
    let mut objects = Vec::with_capacity(listed.len());
    for (key, stored) in listed {
        let Some(stored) = stored else { continue };
        let stored = Timestamp::new(stored.secs(), stored.subsec_nanos() as i32)
            .map_err(|error| Error::RecoverySource(error.to_string()))?;
        objects.push((key, stored));
    }
    Ok(objects)
}
