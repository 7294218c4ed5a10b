//! Settled clusters: lets a reconcile skip building and comparing a cluster's children when
//! nothing they depend on changed since a reconcile found them all up to date.
//!
//! Building the desired children and comparing them with the live ones (see `drift`) was the
//! largest part of a reconcile's CPU, and most reconciles find nothing to apply: the cluster is
//! at rest, or its pods are still starting and it is looked at again every few seconds. Yet
//! what the apply step decides is a function of two things only:
//! - the build's inputs: the effective spec, the primary, the synchronous standbys and the
//!   images (the generated passwords matter only for Secrets that do not exist yet, and whether
//!   they exist is part of the live side);
//! - the live children, whose content changes only with their resourceVersion (and whose uid
//!   tells a recreated child from the old one). The StatefulSet is the exception: its
//!   controller writes its status several times while a pod starts, which changes its
//!   resourceVersion but nothing the apply compares (the desired StatefulSet has no status).
//!   So it counts by its uid, its generation (which the API server raises on every change of
//!   its spec, scaling included) and the metadata the desired object sets: labels, annotations
//!   and owner references.
//!
//! So [`fingerprint`] hashes both, and a fingerprint equal to the one recorded after an apply
//! that wrote nothing means that applying again would write nothing either. A recorded
//! fingerprint never turns false (it is about versions that never change), so a stale entry
//! costs memory, never a missed write; entries go when their cluster is deleted.
//!
//! The data volumes are not covered: their expansion is looked at on every reconcile.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Resource;
use sha2::{Digest, Sha256};

use super::build::BuildInput;
use super::read::LiveChildren;
use super::validate::ValidatedCluster;
use crate::compact::Compact;

/// SHA-256 of the inputs and live versions (see the module doc).
pub type Fingerprint = [u8; 32];

/// The fingerprint of each cluster whose last apply wrote nothing, by `namespace/name`.
#[derive(Debug, Default)]
pub struct SettledClusters {
    fingerprints: Mutex<HashMap<String, Fingerprint>>,
}

impl SettledClusters {
    /// Whether the cluster `key` was found up to date with exactly `fingerprint`.
    pub fn is_settled(&self, key: &str, fingerprint: &Fingerprint) -> bool {
        self.fingerprints().get(key) == Some(fingerprint)
    }

    /// Records what the apply of the cluster `key` found: with `wrote` false, its children were
    /// all up to date with `fingerprint`.
    pub fn record(&self, key: &str, fingerprint: Fingerprint, wrote: bool) {
        let mut fingerprints = self.fingerprints();
        if wrote {
            // The writes changed the live versions: the next reconcile compares again.
            fingerprints.remove(key);
        } else {
            fingerprints.insert(key.to_owned(), fingerprint);
        }
    }

    /// Forgets the cluster `key` (deleted).
    pub fn forget(&self, key: &str) {
        self.fingerprints().remove(key);
    }

    fn fingerprints(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fingerprint>> {
        // A panic while holding the lock leaves the map usable: every entry is a true fact.
        self.fingerprints
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The fingerprint of building from `effective` and `input` and applying over `live`.
pub fn fingerprint(
    effective: &ValidatedCluster,
    input: &BuildInput<'_>,
    live: &LiveChildren,
) -> Result<Fingerprint, serde_json::Error> {
    let mut hasher = Sha256::new();
    serde_json::to_writer(&mut hasher, effective)?;
    // Each text is written with its length, so that no two different inputs hash the same
    // bytes. The passwords and the token are left out (see the module doc).
    for text in [
        input.image_repository,
        input.instance_manager_image,
        input.primary,
        input.system_identifier.unwrap_or_default(),
        input.manager_namespace.unwrap_or_default(),
    ] {
        write_text(&mut hasher, text);
    }
    hasher.update(input.synchronous_standbys.to_le_bytes());
    hasher.update([u8::from(input.tls_only)]);
    hasher.update([u8::from(input.client_certificates)]);
    write_text(&mut hasher, &serde_json::to_string(&input.recovery)?);
    write_text(&mut hasher, &serde_json::to_string(&input.in_place)?);
    hasher.update([
        u8::from(live.credentials_exist),
        u8::from(live.replication_credentials_exist),
        u8::from(live.application_credentials_exist),
        u8::from(live.control_token_exists),
    ]);
    write_statefulset(&mut hasher, live.statefulset.as_deref())?;
    // The children kept as text are hashed whole, read in place: the text holds the uid and
    // the resourceVersion, so it changes whenever they do.
    let texts = [
        live.headless_service.as_deref().map(Compact::json),
        live.rw_service.as_deref().map(Compact::json),
        live.ro_service.as_deref().map(Compact::json),
        live.r_service.as_deref().map(Compact::json),
        live.old_client_service.as_deref().map(Compact::json),
        live.config_map.as_deref().map(Compact::json),
        live.pod_disruption_budget.as_deref().map(Compact::json),
        live.network_policy.as_deref().map(Compact::json),
    ];
    for text in texts {
        match text {
            Some(text) => {
                hasher.update([1]);
                write_text(&mut hasher, text);
            }
            None => hasher.update([0]),
        }
    }
    Ok(hasher.finalize().into())
}

/// What the apply compares of the live StatefulSet, status left out (see the module doc).
fn write_statefulset(
    hasher: &mut Sha256,
    statefulset: Option<&StatefulSet>,
) -> Result<(), serde_json::Error> {
    let Some(meta) = statefulset.map(Resource::meta) else {
        hasher.update([0]);
        return Ok(());
    };
    hasher.update([1]);
    write_text(hasher, meta.uid.as_deref().unwrap_or_default());
    hasher.update(meta.generation.unwrap_or_default().to_le_bytes());
    // One JSON array: its brackets and quotes delimit the three parts.
    let compared_metadata = (&meta.labels, &meta.annotations, &meta.owner_references);
    serde_json::to_writer(hasher, &compared_metadata)
}

fn write_text(hasher: &mut Sha256, text: &str) {
    hasher.update((text.len() as u64).to_le_bytes());
    hasher.update(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cluster::validate::{LiveFacts, validate};
    use k8s_openapi::api::apps::v1::StatefulSetStatus;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use pgkube_crds::PostgreSQLCluster;

    const SAMPLE: &str = include_str!("../../../deploy/samples/postgresqlcluster.yaml");

    fn effective() -> ValidatedCluster {
        let mut cluster: PostgreSQLCluster = serde_yaml::from_str(SAMPLE).expect("sample parses");
        cluster.metadata.namespace = Some("team-a".to_owned());
        cluster.metadata.uid = Some("0b5a5c2e-0000-4000-8000-000000000001".to_owned());
        validate(&cluster, &LiveFacts::default())
            .expect("sample is valid")
            .effective
    }

    fn input<'a>(primary: &'a str, password: &'a str) -> BuildInput<'a> {
        BuildInput {
            image_repository: "postgres",
            instance_manager_image: "registry.local/pgkube:1.2",
            primary,
            superuser_password: password,
            replication_password: password,
            application_password: password,
            control_token: password,
            manager_namespace: None,
            synchronous_standbys: 0,
            tls_only: true,
            client_certificates: false,
            system_identifier: None,
            recovery: None,
            in_place: None,
        }
    }

    fn meta(uid: &str, resource_version: &str) -> ObjectMeta {
        ObjectMeta {
            uid: Some(uid.to_owned()),
            resource_version: Some(resource_version.to_owned()),
            ..ObjectMeta::default()
        }
    }

    fn service(uid: &str, resource_version: &str) -> Arc<Compact<Service>> {
        let service = Service {
            metadata: meta(uid, resource_version),
            ..Service::default()
        };
        Arc::new(Compact::new(&service).expect("compact"))
    }

    fn live() -> LiveChildren {
        LiveChildren {
            statefulset: Some(Arc::new(StatefulSet {
                metadata: meta("sts-uid", "10"),
                ..StatefulSet::default()
            })),
            rw_service: Some(service("rw-uid", "11")),
            credentials_exist: true,
            ..LiveChildren::default()
        }
    }

    fn of(
        effective: &ValidatedCluster,
        input: &BuildInput<'_>,
        live: &LiveChildren,
    ) -> Fingerprint {
        fingerprint(effective, input, live).expect("serializable")
    }

    #[test]
    fn the_same_inputs_and_versions_give_the_same_fingerprint_whatever_the_passwords() {
        let base = of(&effective(), &input("pg-0", "one"), &live());
        assert_eq!(base, of(&effective(), &input("pg-0", "two"), &live()));
    }

    #[test]
    fn any_input_or_live_version_that_the_apply_depends_on_changes_the_fingerprint() {
        let base = of(&effective(), &input("pg-0", "one"), &live());
        let mut replicas = effective();
        replicas.replicas += 1;
        let mut parameter = effective();
        parameter
            .parameters
            .insert("work_mem".to_owned(), "8MB".to_owned());
        let statefulset_changed = |change: fn(&mut ObjectMeta)| {
            let mut changed = live();
            if let Some(sts) = changed.statefulset.as_mut() {
                change(&mut Arc::make_mut(sts).metadata);
            }
            changed
        };
        let respecified = statefulset_changed(|meta| meta.generation = Some(3));
        let relabelled = statefulset_changed(|meta| {
            meta.labels = Some([("app".to_owned(), "other".to_owned())].into());
        });
        let reannotated = statefulset_changed(|meta| {
            meta.annotations = Some([("note".to_owned(), "x".to_owned())].into());
        });
        let disowned = statefulset_changed(|meta| meta.owner_references = Some(Vec::new()));
        let sts_recreated = statefulset_changed(|meta| meta.uid = Some("new-sts-uid".to_owned()));
        let mut recreated = live();
        recreated.rw_service = Some(service("new-rw-uid", "11"));
        let mut service_edited = live();
        service_edited.rw_service = Some(service("rw-uid", "12"));
        let mut deleted = live();
        deleted.rw_service = None;
        let mut moved = live();
        // The same version, in another child's place.
        moved.ro_service = moved.rw_service.take();
        let mut secret_gone = live();
        secret_gone.credentials_exist = false;
        let changed = [
            of(&replicas, &input("pg-0", "one"), &live()),
            of(&parameter, &input("pg-0", "one"), &live()),
            of(&effective(), &input("pg-1", "one"), &live()),
            of(&effective(), &input("pg-0", "one"), &respecified),
            of(&effective(), &input("pg-0", "one"), &relabelled),
            of(&effective(), &input("pg-0", "one"), &reannotated),
            of(&effective(), &input("pg-0", "one"), &disowned),
            of(&effective(), &input("pg-0", "one"), &sts_recreated),
            of(&effective(), &input("pg-0", "one"), &recreated),
            of(&effective(), &input("pg-0", "one"), &service_edited),
            of(&effective(), &input("pg-0", "one"), &deleted),
            of(&effective(), &input("pg-0", "one"), &moved),
            of(&effective(), &input("pg-0", "one"), &secret_gone),
        ];
        for (index, fingerprint) in changed.iter().enumerate() {
            assert_ne!(*fingerprint, base, "change {index} kept the fingerprint");
        }
    }

    #[test]
    fn a_change_of_the_statefulsets_status_alone_keeps_the_fingerprint() {
        let base = of(&effective(), &input("pg-0", "one"), &live());
        let mut status_written = live();
        if let Some(sts) = status_written.statefulset.as_mut() {
            let sts = Arc::make_mut(sts);
            sts.metadata.resource_version = Some("13".to_owned());
            sts.status = Some(StatefulSetStatus {
                replicas: 1,
                ready_replicas: Some(1),
                ..StatefulSetStatus::default()
            });
        }
        assert_eq!(
            of(&effective(), &input("pg-0", "one"), &status_written),
            base
        );
    }

    #[test]
    fn a_cluster_is_settled_only_after_an_apply_that_wrote_nothing() {
        let settled = SettledClusters::default();
        let fingerprint = of(&effective(), &input("pg-0", "one"), &live());
        assert!(!settled.is_settled("team-a/main", &fingerprint));
        settled.record("team-a/main", fingerprint, false);
        assert!(settled.is_settled("team-a/main", &fingerprint));
        assert!(!settled.is_settled("team-b/main", &fingerprint));
        assert!(!settled.is_settled("team-a/main", &[0; 32]));
        settled.record("team-a/main", fingerprint, true);
        assert!(!settled.is_settled("team-a/main", &fingerprint));
        settled.record("team-a/main", fingerprint, false);
        settled.forget("team-a/main");
        assert!(!settled.is_settled("team-a/main", &fingerprint));
    }
}
