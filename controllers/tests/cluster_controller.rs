//! The PostgreSQLCluster controller against the test bed (kwok makes pods Ready; PVCs bind
//! through the test bed's provisioner; the instance managers of those pods, which never run,
//! are simulated by `common::SimulatedInstances`). Each test runs the controllers in-process on
//! its own namespace.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Running, SimulatedInstances};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use pgkube_controllers::cluster::instances::ReportedRole;
use pgkube_crds::{
    BackupPhase, ClusterPhase, InstanceRole, PostgreSQLBackup, PostgreSQLCluster,
    PostgreSQLRestore, PostgresVersion, RestorePhase,
};
use pgkube_testkit::{condition, wait_until};
use serde_json::json;

const RESYNC: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(120);

async fn patch_spec(running: &Running, name: &str, spec: serde_json::Value) {
    running
        .clusters()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("spec patched");
}

/// Each pod of the test's namespace with its role label, by name.
async fn roles(running: &Running) -> Vec<(String, Option<String>)> {
    let pods: Api<Pod> = running.api();
    let mut roles: Vec<_> = pods
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .iter()
        .map(|pod| {
            let role = pod.labels().get("db.example.com/role").cloned();
            (pod.name_any(), role)
        })
        .collect();
    roles.sort();
    roles
}

fn password(secret: &Secret) -> Vec<u8> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .map(|b| b.0.clone())
        .expect("password")
}

#[tokio::test]
async fn the_sample_runs_scales_up_and_down_and_keeps_its_password() {
    let Some(running) = Running::start("cluster-scale", RESYNC).await else {
        return;
    };
    running.create_sample("my-cluster", 3).await;
    let cluster = running.wait_running("my-cluster", 3, TIMEOUT).await;
    let status = cluster.status.clone().expect("status");
    assert_eq!(status.current_version.as_deref(), Some("16"));
    let ready = condition(&cluster, "Ready").expect("Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.message.as_str()),
        ("True", "All 3 replicas are ready")
    );
    assert!(
        cluster
            .finalizers()
            .iter()
            .any(|f| f == "db.example.com/cleanup")
    );
    let became_running = common::events_with_reason(&running, "my-cluster", "Running").await;
    assert_eq!(
        became_running.len(),
        1,
        "one Event for the change to Running: {became_running:?}"
    );
    assert_eq!(
        became_running[0].note.as_deref(),
        Some("All 3 replicas are ready")
    );

    let sts = running
        .api::<StatefulSet>()
        .get("my-cluster-postgresql")
        .await
        .expect("StatefulSet");
    let template = sts
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod");
    assert_eq!(template.containers[0].image.as_deref(), Some("postgres:16"));
    running
        .api::<Service>()
        .get("my-cluster-postgresql-headless")
        .await
        .expect("headless Service");
    for (service, role) in [
        ("my-cluster-rw", Some("primary")),
        ("my-cluster-ro", Some("replica")),
        ("my-cluster-r", None),
    ] {
        let selector = running
            .api::<Service>()
            .get(service)
            .await
            .expect("client Service")
            .spec
            .and_then(|s| s.selector)
            .expect("selector");
        assert_eq!(
            selector.get("db.example.com/role").map(String::as_str),
            role,
            "{service}"
        );
    }
    assert!(
        running
            .api::<Service>()
            .get_opt("my-cluster-postgresql")
            .await
            .expect("read")
            .is_none(),
        "no single client Service any more"
    );
    running
        .api::<ConfigMap>()
        .get("my-cluster-postgresql-config")
        .await
        .expect("ConfigMap");
    running
        .api::<PodDisruptionBudget>()
        .get("my-cluster-postgresql")
        .await
        .expect("PDB for 3");
    // The API server takes the NetworkPolicy: PostgreSQL's port and the instance managers'.
    let policy = running
        .api::<NetworkPolicy>()
        .get("my-cluster-postgresql")
        .await
        .expect("NetworkPolicy");
    let ports: Vec<Option<IntOrString>> = policy
        .spec
        .and_then(|spec| spec.ingress)
        .into_iter()
        .flatten()
        .flat_map(|rule| rule.ports.unwrap_or_default())
        .map(|port| port.port)
        .collect();
    assert_eq!(
        ports,
        [5432, 8000, 9187].map(|port| Some(IntOrString::Int(port)))
    );
    let secrets = running.api::<Secret>();
    let first_password = password(
        &secrets
            .get("my-cluster-postgresql-credentials")
            .await
            .expect("Secret"),
    );
    assert_eq!(first_password.len(), 32);
    let replication = secrets
        .get("my-cluster-postgresql-replication")
        .await
        .expect("replication Secret");
    assert_eq!(
        replication
            .data
            .as_ref()
            .and_then(|d| d.get("username"))
            .map(|b| b.0.as_slice()),
        Some(&b"streaming_replica"[..])
    );
    let replication_password = password(&replication);
    assert_eq!(replication_password.len(), 32);
    assert_ne!(replication_password, first_password);
    assert!(replication.metadata.owner_references.is_none());
    assert_eq!(
        status.current_primary.as_deref(),
        Some("my-cluster-postgresql-0")
    );
    // Running counts the StatefulSet's ready pods; a pod's role label follows its instance's
    // first report, which can come a reconcile later.
    let expected = [
        ("my-cluster-postgresql-0", "primary"),
        ("my-cluster-postgresql-1", "replica"),
        ("my-cluster-postgresql-2", "replica"),
    ]
    .map(|(pod, role)| (pod.to_owned(), Some(role.to_owned())));
    let labelled = wait_until("each pod labelled with its role", TIMEOUT, || async {
        Ok((roles(&running).await == expected).then_some(()))
    })
    .await;
    if let Err(error) = labelled {
        panic!("{error:#}; roles {:?}", roles(&running).await);
    }
    let instances: Vec<_> = status
        .instances
        .iter()
        .map(|i| (i.name.as_str(), i.role, i.ready, i.lag_bytes, i.streaming))
        .collect();
    assert_eq!(
        instances,
        [
            (
                "my-cluster-postgresql-0",
                InstanceRole::Primary,
                true,
                None,
                None
            ),
            (
                "my-cluster-postgresql-1",
                InstanceRole::Replica,
                true,
                Some(0),
                Some(true)
            ),
            (
                "my-cluster-postgresql-2",
                InstanceRole::Replica,
                true,
                Some(0),
                Some(true)
            ),
        ]
    );
    let streaming = condition(&cluster, "ReplicasStreaming").expect("ReplicasStreaming");
    assert_eq!(
        (streaming.status.as_str(), streaming.message.as_str()),
        ("True", "All 2 replicas are streaming")
    );

    patch_spec(&running, "my-cluster", json!({"replicas": 5})).await;
    running.wait_running("my-cluster", 5, TIMEOUT).await;
    patch_spec(&running, "my-cluster", json!({"replicas": 1})).await;
    running.wait_running("my-cluster", 1, TIMEOUT).await;
    let budgets = running.api::<PodDisruptionBudget>();
    wait_until("the PDB to go with one replica", TIMEOUT, || async {
        Ok(budgets
            .get_opt("my-cluster-postgresql")
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .expect("PDB deleted");
    let sts = running
        .api::<StatefulSet>()
        .get("my-cluster-postgresql")
        .await
        .expect("StatefulSet");
    assert_eq!(sts.spec.and_then(|s| s.replicas), Some(1));
    let after = password(
        &secrets
            .get("my-cluster-postgresql-credentials")
            .await
            .expect("Secret"),
    );
    assert_eq!(
        after, first_password,
        "the generated password must never change"
    );
    let replication_after = password(
        &secrets
            .get("my-cluster-postgresql-replication")
            .await
            .expect("Secret"),
    );
    assert_eq!(replication_after, replication_password);
    running.stop().await;
}

#[tokio::test]
async fn deleted_and_edited_children_are_repaired() {
    let Some(running) = Running::start("cluster-repair", RESYNC).await else {
        return;
    };
    running.create_sample("repair", 2).await;
    running.wait_running("repair", 2, TIMEOUT).await;

    let services = running.api::<Service>();
    let old_uid = services.get("repair-rw").await.expect("Service").uid();
    services
        .delete("repair-rw", &DeleteParams::default())
        .await
        .expect("deleted");
    wait_until("the -rw Service to come back", TIMEOUT, || async {
        let service = services.get_opt("repair-rw").await?;
        Ok(service.filter(|s| s.uid() != old_uid).map(|_| ()))
    })
    .await
    .expect("Service recreated");

    let statefulsets = running.api::<StatefulSet>();
    statefulsets
        .patch(
            "repair-postgresql",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .expect("scaled by hand");
    wait_until(
        "the StatefulSet's replicas to be restored to 2",
        TIMEOUT,
        || async {
            let sts = statefulsets.get("repair-postgresql").await?;
            Ok((sts.spec.and_then(|s| s.replicas) == Some(2)).then_some(()))
        },
    )
    .await
    .expect("replicas restored");

    // An edit of the StatefulSet's metadata alone leaves its generation as it was: the settled
    // fingerprint must still see it.
    const APPLIED_HASH: &str = "db.example.com/applied-hash";
    statefulsets
        .patch(
            "repair-postgresql",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {APPLIED_HASH: "edited"}}})),
        )
        .await
        .expect("annotated by hand");
    wait_until(
        "the StatefulSet's applied hash to be restored",
        TIMEOUT,
        || async {
            let sts = statefulsets.get("repair-postgresql").await?;
            let hash = sts.annotations().get(APPLIED_HASH).cloned();
            Ok(hash.filter(|hash| hash != "edited").map(|_| ()))
        },
    )
    .await
    .expect("annotation restored");
    running.wait_running("repair", 2, TIMEOUT).await;
    running.stop().await;
}

#[tokio::test]
async fn deleting_the_cluster_removes_the_finalizer_and_children_are_collected_but_credentials_and_data_stay()
 {
    let Some(running) = Running::start("cluster-delete", RESYNC).await else {
        return;
    };
    running.create_sample("doomed", 1).await;
    running.wait_running("doomed", 1, TIMEOUT).await;
    running
        .clusters()
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete asked");
    let clusters = running.clusters();
    wait_until(
        "the cluster to be gone (finalizer removed)",
        TIMEOUT,
        || async { Ok(clusters.get_opt("doomed").await?.is_none().then_some(())) },
    )
    .await
    .expect("cluster deleted");
    let statefulsets = running.api::<StatefulSet>();
    let services = running.api::<Service>();
    let config_maps = running.api::<ConfigMap>();
    let secrets = running.api::<Secret>();
    wait_until(
        "the garbage collector to remove the children",
        TIMEOUT,
        || async {
            let mut gone = statefulsets.get_opt("doomed-postgresql").await?.is_none()
                && config_maps
                    .get_opt("doomed-postgresql-config")
                    .await?
                    .is_none();
            for service in [
                "doomed-rw",
                "doomed-ro",
                "doomed-r",
                "doomed-postgresql-headless",
            ] {
                gone = gone && services.get_opt(service).await?.is_none();
            }
            Ok(gone.then_some(()))
        },
    )
    .await
    .expect("children collected");
    // The credentials outlive the cluster, as its data volume does: a cluster made again under
    // this name must find the password its data was made with.
    for kept in [
        "doomed-postgresql-credentials",
        "doomed-postgresql-replication",
    ] {
        assert!(
            secrets
                .get_opt(kept)
                .await
                .expect("read the Secret")
                .is_some(),
            "{kept} is kept"
        );
    }
    assert!(
        running
            .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
            .get_opt("data-doomed-postgresql-0")
            .await
            .expect("read the claim")
            .is_some(),
        "the data volume is kept"
    );
    running.stop().await;
}

/// Refused changes are held back, the rest of the spec still applies and children are still
/// repaired while the refusal stands.
#[tokio::test]
async fn storage_shrink_and_major_upgrade_are_held_back_while_the_rest_is_reconciled() {
    let Some(running) = Running::start("cluster-refuse", RESYNC).await else {
        return;
    };
    running.create_sample("steady", 1).await;
    running.wait_running("steady", 1, TIMEOUT).await;
    let statefulsets = running.api::<StatefulSet>();
    let before = statefulsets
        .get("steady-postgresql")
        .await
        .expect("StatefulSet");

    patch_spec(&running, "steady", json!({"storage": {"size": "50Gi"}})).await;
    let refused = wait_for_progressing_reason(&running, "steady", "StorageShrinkRefused").await;
    assert!(
        condition(&refused, "Progressing")
            .expect("condition")
            .message
            .contains("100Gi")
    );
    let warnings = common::events_with_reason(&running, "steady", "StorageShrinkRefused").await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    let after = statefulsets
        .get("steady-postgresql")
        .await
        .expect("StatefulSet");
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "the StatefulSet keeps its size and is not written"
    );

    patch_spec(
        &running,
        "steady",
        json!({"storage": {"size": "100Gi"}, "postgresVersion": "17"}),
    )
    .await;
    let refused = wait_for_progressing_reason(&running, "steady", "MajorUpgradeNotSupported").await;
    assert_eq!(refused.spec.postgres_version, PostgresVersion::V17);
    assert_eq!(
        refused
            .status
            .as_ref()
            .and_then(|s| s.current_version.clone())
            .as_deref(),
        Some("16")
    );
    assert_eq!(image_of(&running, "steady-postgresql").await, "postgres:16");

    // While the upgrade is refused, a deleted child comes back and a new replica count applies.
    let services = running.api::<Service>();
    let old_uid = services.get("steady-r").await.expect("-r Service").uid();
    services
        .delete("steady-r", &DeleteParams::default())
        .await
        .expect("deleted");
    patch_spec(&running, "steady", json!({"replicas": 2})).await;
    wait_until("the -r Service to come back", TIMEOUT, || async {
        let service = services.get_opt("steady-r").await?;
        Ok(service.filter(|s| s.uid() != old_uid).map(|_| ()))
    })
    .await
    .expect("Service recreated while the upgrade is refused");
    let scaled = running.wait_running("steady", 2, TIMEOUT).await;
    let progressing = condition(&scaled, "Progressing").expect("Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", "MajorUpgradeNotSupported"),
        "the refusal stays while the rest is applied"
    );
    assert!(
        progressing.message.contains("keeps running 16"),
        "{}",
        progressing.message
    );
    let ready = condition(&scaled, "Ready").expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.message.as_str()),
        ("True", "All 2 replicas are ready")
    );
    assert_eq!(
        scaled
            .status
            .as_ref()
            .and_then(|s| s.current_version.clone())
            .as_deref(),
        Some("16")
    );
    let sts = statefulsets
        .get("steady-postgresql")
        .await
        .expect("StatefulSet");
    assert_eq!(sts.spec.as_ref().and_then(|s| s.replicas), Some(2));
    assert_eq!(image_of(&running, "steady-postgresql").await, "postgres:16");
    running.stop().await;
}

/// The image of the StatefulSet's PostgreSQL container.
async fn image_of(running: &Running, statefulset: &str) -> String {
    running
        .api::<StatefulSet>()
        .get(statefulset)
        .await
        .expect("StatefulSet")
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.containers.into_iter().next())
        .and_then(|c| c.image)
        .expect("container image")
}

async fn wait_for_progressing_reason(
    running: &Running,
    name: &str,
    reason: &str,
) -> PostgreSQLCluster {
    let clusters = running.clusters();
    wait_until(&format!("Progressing reason {reason}"), TIMEOUT, || async {
        let cluster = clusters.get(name).await?;
        let found = condition(&cluster, "Progressing")
            .is_some_and(|c| c.status == "False" && c.reason == reason)
            && cluster.status.as_ref().and_then(|s| s.observed_generation)
                == cluster.metadata.generation;
        Ok(found.then_some(cluster))
    })
    .await
    .expect("refusal condition")
}

#[tokio::test]
async fn a_63_character_cluster_name_gets_valid_children_and_runs() {
    let Some(running) = Running::start("cluster-longname", RESYNC).await else {
        return;
    };
    let name = format!("long-{}", "n".repeat(58));
    assert_eq!(name.len(), 63);
    running.create_sample(&name, 2).await;
    running.wait_running(&name, 2, TIMEOUT).await;
    let statefulsets = running.api::<StatefulSet>();
    let sts = statefulsets
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=pgkube"))
        .await
        .expect("list")
        .items
        .pop()
        .expect("one StatefulSet");
    assert!(sts.name_any().len() <= 52, "{}", sts.name_any());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = running.api();
    let pods = pods.list(&ListParams::default()).await.expect("pods").items;
    assert_eq!(pods.len(), 2);
    for pod in pods {
        assert!(pod.name_any().len() <= 63, "{}", pod.name_any());
    }
    running.stop().await;
}

/// 200 clusters created at once all reach Running (a functional check, not a timing one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clusters_created_at_once_all_reach_running() {
    let count: usize = std::env::var("PGKUBE_MANY_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let Some(running) = Running::start("cluster-many", Duration::from_secs(300)).await else {
        return;
    };
    let clusters = running.clusters();
    let template: PostgreSQLCluster = serde_yaml::from_str(common::SAMPLE).expect("sample parses");
    futures::stream::iter(0..count)
        .for_each_concurrent(16, |i| {
            let clusters = clusters.clone();
            let mut cluster = template.clone();
            async move {
                cluster.metadata.name = Some(format!("c{i:03}"));
                cluster.spec.replicas = 1;
                cluster.spec.storage.size = "1Gi".to_owned();
                cluster.spec.backup = None;
                // The test bed's nodes have 48 CPUs in all: the sample's requests would fit
                // 96 pods, not 200.
                cluster.spec.resources = None;
                clusters
                    .create(&PostParams::default(), &cluster)
                    .await
                    .expect("created");
            }
        })
        .await;
    let running_count = wait_until(
        &format!("{count} clusters Running"),
        Duration::from_secs(600),
        || async {
            let list = clusters.list(&ListParams::default()).await?;
            let ready = list
                .items
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(ClusterPhase::Running))
                .count();
            Ok((ready == count).then_some(ready))
        },
    )
    .await
    .expect("all Running");
    assert_eq!(running_count, count);
    running.stop().await;
}

/// An unchanged, ready cluster makes no write request over several resyncs.
#[tokio::test]
async fn a_ready_unchanged_cluster_causes_zero_writes_across_resyncs() {
    let resync = Duration::from_secs(2);
    let Some(running) = Running::start("cluster-idle", resync).await else {
        return;
    };
    running.create_sample("idle", 2).await;
    running.wait_running("idle", 2, TIMEOUT).await;
    // Let the last status write and its Event land, then count from a quiet point.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes_before = running.counts.writes();
    let reads_before = running.counts.reads();
    let asked_before = running.instances.asked();
    let log_before = running.counts.write_log().len();
    tokio::time::sleep(resync * 4 + Duration::from_secs(1)).await;
    let reads = running.counts.reads() - reads_before;
    let writes = running.counts.writes() - writes_before;
    let asked = running.instances.asked() - asked_before;
    eprintln!(
        "idle for {:?}: {reads} reads, {writes} writes, {asked} instance questions",
        resync * 4 + Duration::from_secs(1)
    );
    // Each resync asks the two instances for their status: at least three resyncs ran.
    assert!(
        asked >= 3 * 2,
        "only {asked} instance questions: the periodic reconciles did not run"
    );
    // ... and reads its children from the caches, not from the API server.
    assert_eq!(reads, 0, "reads while idle");
    assert_eq!(
        writes,
        0,
        "writes while idle: {:?}",
        &running.counts.write_log()[log_before..]
    );
    running.stop().await;
}

/// A larger `storage` expands the existing data volumes; the StatefulSet's immutable claim
/// template keeps its size.
#[tokio::test]
async fn growing_storage_expands_the_data_volumes() {
    let Some(running) = Running::start("cluster-grow", RESYNC).await else {
        return;
    };
    running.create_sample("grow", 1).await;
    running.wait_running("grow", 1, TIMEOUT).await;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = running.api();
    let request = |claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim| {
        claim.spec.as_ref().and_then(|s| {
            s.resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")
                .map(|q| q.0.clone())
        })
    };
    wait_until("the data volume to be bound", TIMEOUT, || async {
        let claim = claims.get("data-grow-postgresql-0").await?;
        Ok((claim.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(()))
    })
    .await
    .expect("bound");
    patch_spec(&running, "grow", json!({"storage": {"size": "150Gi"}})).await;
    wait_until("the data volume to request 150Gi", TIMEOUT, || async {
        let claim = claims.get("data-grow-postgresql-0").await?;
        Ok((request(&claim).as_deref() == Some("150Gi")).then_some(()))
    })
    .await
    .expect("expanded");
    running.wait_running("grow", 1, TIMEOUT).await;
    let sts = running
        .api::<StatefulSet>()
        .get("grow-postgresql")
        .await
        .expect("StatefulSet");
    let template = &sts
        .spec
        .and_then(|s| s.volume_claim_templates)
        .expect("templates")[0];
    assert_eq!(
        request(template).as_deref(),
        Some("100Gi"),
        "the template is immutable"
    );
    running.stop().await;
}

/// Waits until cluster `name` has condition `type_` with `status` for its latest generation.
async fn wait_for_condition(
    running: &Running,
    name: &str,
    type_: &str,
    status: &str,
) -> PostgreSQLCluster {
    let clusters = running.clusters();
    wait_until(&format!("{type_}={status}"), TIMEOUT, || async {
        let cluster = clusters.get(name).await?;
        let found = condition(&cluster, type_).is_some_and(|c| c.status == status)
            && cluster.status.as_ref().and_then(|s| s.observed_generation)
                == cluster.metadata.generation;
        Ok(found.then_some(cluster))
    })
    .await
    .expect("condition reached")
}

/// Waits until cluster `name` reports `phase`.
async fn wait_for_phase(running: &Running, name: &str, phase: ClusterPhase) -> PostgreSQLCluster {
    let clusters = running.clusters();
    wait_until(&format!("phase {phase:?}"), TIMEOUT, || async {
        let cluster = clusters.get(name).await?;
        let found = cluster.status.as_ref().and_then(|s| s.phase) == Some(phase);
        Ok(found.then_some(cluster))
    })
    .await
    .expect("phase reached")
}

/// The single client Service of earlier versions is deleted; a replica that stops streaming
/// and a primary that stops answering show in the status, with Events, and the pods keep their
/// role labels meanwhile.
#[tokio::test]
async fn the_old_client_service_goes_and_instance_troubles_show_in_the_status() {
    let resync = Duration::from_secs(2);
    let Some(running) = Running::start("cluster-roles", resync).await else {
        return;
    };
    let created = running.create_sample("roles", 3).await;
    running.wait_running("roles", 3, TIMEOUT).await;

    // What an earlier version left: a client Service owned by the cluster.
    let old: Service = serde_json::from_value(json!({
        "metadata": {
            "name": "roles-postgresql",
            "labels": {"app.kubernetes.io/managed-by": "pgkube"},
            "ownerReferences": [{
                "apiVersion": "db.example.com/v1beta1",
                "kind": "PostgreSQLCluster",
                "name": "roles",
                "uid": created.uid().expect("uid"),
                "controller": true,
            }],
        },
        "spec": {"ports": [{"name": "postgresql", "port": 5432}]},
    }))
    .expect("Service");
    let services = running.api::<Service>();
    services
        .create(&PostParams::default(), &old)
        .await
        .expect("old Service made");
    wait_until("the old client Service to go", TIMEOUT, || async {
        Ok(services
            .get_opt("roles-postgresql")
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .expect("old Service deleted");

    running.instances.answer("roles-postgresql-1", None);
    let broken = wait_for_condition(&running, "roles", "ReplicasStreaming", "False").await;
    let streaming = condition(&broken, "ReplicasStreaming").expect("condition");
    assert_eq!(
        (streaming.reason.as_str(), streaming.message.as_str()),
        (
            "ReplicasNotStreaming",
            "roles-postgresql-1: instance manager unreachable"
        )
    );
    let status = broken.status.clone().expect("status");
    assert_eq!(status.phase, Some(ClusterPhase::Running));
    assert_eq!(status.instances[1].role, InstanceRole::Unknown);
    let warnings = common::events_with_reason(&running, "roles", "ReplicaNotStreaming").await;
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    // Unreachable, it keeps its label; readiness decides whether it gets traffic.
    assert_eq!(roles(&running).await[1].1.as_deref(), Some("replica"));
    // A stable status: nothing to write while it stays so.
    running
        .assert_no_writes_while_idle(resync, "while a replica does not answer")
        .await;

    running.instances.heal("roles-postgresql-1");
    wait_for_condition(&running, "roles", "ReplicasStreaming", "True").await;
    let recovered = common::events_with_reason(&running, "roles", "ReplicasStreaming").await;
    assert_eq!(recovered[0].type_.as_deref(), Some("Normal"));

    running.instances.answer("roles-postgresql-0", None);
    let degraded = wait_for_phase(&running, "roles", ClusterPhase::Degraded).await;
    let progressing = condition(&degraded, "Progressing").expect("Progressing");
    assert_eq!(
        (progressing.reason.as_str(), progressing.message.as_str()),
        (
            "PrimaryUnavailable",
            "the primary roles-postgresql-0: instance manager unreachable"
        )
    );
    assert_eq!(
        degraded.status.and_then(|s| s.current_primary).as_deref(),
        Some("roles-postgresql-0")
    );
    assert_eq!(roles(&running).await[0].1.as_deref(), Some("primary"));
    running.instances.heal("roles-postgresql-0");
    running.wait_running("roles", 3, TIMEOUT).await;
    running.stop().await;
}

/// Pods on simulated nodes whose instance managers never answer (as with the manager process
/// on kwok nodes): the cluster waits for its primary, says why, and writes nothing at rest.
#[tokio::test]
async fn a_cluster_whose_instances_never_answer_waits_quietly_for_its_primary() {
    let resync = Duration::from_secs(2);
    let Some(running) = Running::start("cluster-silent", resync).await else {
        return;
    };
    for pod in ["silent-postgresql-0", "silent-postgresql-1"] {
        running.instances.answer(pod, None);
    }
    running.create_sample("silent", 2).await;
    let clusters = running.clusters();
    let waiting = wait_until("both pods ready, the primary awaited", TIMEOUT, || async {
        let cluster = clusters.get("silent").await?;
        let ready = cluster.status.as_ref().map(|s| s.ready_replicas) == Some(2)
            && condition(&cluster, "Ready").is_some_and(|c| c.reason == "PrimaryNotReady");
        Ok(ready.then_some(cluster))
    })
    .await
    .expect("waiting for the primary");
    let status = waiting.status.clone().expect("status");
    assert_eq!(status.phase, Some(ClusterPhase::Creating));
    assert_eq!(status.current_primary, None);
    assert_eq!(status.instances.len(), 2);
    assert_eq!(
        condition(&waiting, "Ready").expect("Ready").message,
        "2 of 2 replicas are ready; the primary silent-postgresql-0: instance manager unreachable"
    );
    assert_eq!(
        roles(&running).await,
        [
            ("silent-postgresql-0".to_owned(), None),
            ("silent-postgresql-1".to_owned(), None)
        ]
    );
    running
        .assert_no_writes_while_idle(resync, "while no instance answers")
        .await;
    running.stop().await;
}

/// The primary is whichever instance the status names; a scale-down that would remove it is
/// held back.
#[tokio::test]
async fn the_designated_primary_follows_the_status_and_a_scale_down_keeps_it() {
    let Some(running) = Running::start("cluster-primary", RESYNC).await else {
        return;
    };
    running.create_sample("moved", 3).await;
    running.wait_running("moved", 3, TIMEOUT).await;
    // As after a failover: instance 2 is the primary, instance 0 a replica.
    let instances = &running.instances;
    instances.answer(
        "moved-postgresql-0",
        Some(SimulatedInstances::report(
            "moved-postgresql-0",
            ReportedRole::Replica,
        )),
    );
    instances.answer(
        "moved-postgresql-2",
        Some(SimulatedInstances::report(
            "moved-postgresql-2",
            ReportedRole::Primary,
        )),
    );
    let clusters = running.clusters();
    let config_maps = running.api::<ConfigMap>();
    wait_until("instance 2 to be the primary", TIMEOUT, || async {
        let cluster = clusters.get("moved").await?;
        let current = cluster.status.and_then(|s| s.current_primary);
        if current.as_deref() != Some("moved-postgresql-2") {
            clusters
                .patch_status(
                    "moved",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"currentPrimary": "moved-postgresql-2"}})),
                )
                .await?;
            return Ok(None);
        }
        let config = config_maps.get("moved-postgresql-config").await?;
        let topology: serde_json::Value = serde_json::from_str(
            config
                .data
                .as_ref()
                .and_then(|d| d.get("instance.json"))
                .map_or("{}", String::as_str),
        )?;
        let labels = roles(&running).await;
        let expected = [
            ("moved-postgresql-0".to_owned(), Some("replica".to_owned())),
            ("moved-postgresql-1".to_owned(), Some("replica".to_owned())),
            ("moved-postgresql-2".to_owned(), Some("primary".to_owned())),
        ];
        let done = topology["primary"] == "moved-postgresql-2" && labels == expected;
        Ok(done.then_some(()))
    })
    .await
    .expect("primary moved");
    running.wait_running("moved", 3, TIMEOUT).await;

    patch_spec(&running, "moved", json!({"replicas": 2})).await;
    let held = wait_for_progressing_reason(&running, "moved", "ScaleDownWouldRemovePrimary").await;
    assert!(
        condition(&held, "Progressing")
            .expect("Progressing")
            .message
            .contains("keeps 3 replicas until a switchover"),
        "{:?}",
        condition(&held, "Progressing")
    );
    let sts = running
        .api::<StatefulSet>()
        .get("moved-postgresql")
        .await
        .expect("StatefulSet");
    assert_eq!(sts.spec.and_then(|s| s.replicas), Some(3));
    running.stop().await;
}

/// A reconcile that keeps failing the same way publishes one ReconcileFailed Event, not one per
/// retry; once the cause is gone the cluster runs.
#[tokio::test]
async fn a_repeated_failure_publishes_one_event() {
    let Some(running) = Running::start("cluster-failing", RESYNC).await else {
        return;
    };
    // A plain Service where the headless one goes: its allocated cluster IP cannot become
    // `None`, so every apply of the headless Service fails.
    let clash: Service = serde_json::from_value(json!({
        "metadata": {"name": "clash-postgresql-headless"},
        "spec": {"ports": [{"name": "postgresql", "port": 5432}]},
    }))
    .expect("Service");
    let services = running.api::<Service>();
    services
        .create(&PostParams::default(), &clash)
        .await
        .expect("clashing Service created");
    running.create_sample("clash", 1).await;

    let headless_path = format!(
        "/api/v1/namespaces/{}/services/clash-postgresql-headless",
        running.namespace.name()
    );
    let attempts = || {
        running
            .counts
            .write_log()
            .iter()
            .filter(|w| w.as_str() == format!("PATCH {headless_path}"))
            .count()
    };
    wait_until("three failed applies", TIMEOUT, || async {
        Ok((attempts() >= 3).then_some(()))
    })
    .await
    .expect("the reconcile is retried");
    // Give a (wrong) Event of the last failure time to be written.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let event_writes: Vec<_> = running
        .counts
        .write_log()
        .into_iter()
        .filter(|w| w.contains("/events"))
        .collect();
    assert_eq!(
        event_writes.len(),
        1,
        "one Event for {} failed attempts: {event_writes:?}",
        attempts()
    );
    let failed = common::events_with_reason(&running, "clash", "ReconcileFailed").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].series.is_none(), "no repeats: {:?}", failed[0]);
    assert!(
        failed[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("clash-postgresql-headless")),
        "{:?}",
        failed[0].note
    );

    services
        .delete("clash-postgresql-headless", &DeleteParams::default())
        .await
        .expect("clash removed");
    running.wait_running("clash", 1, TIMEOUT).await;
    running.stop().await;
}

/// A new image for the same major version (here: the manager restarted with another image
/// repository, as when moving to a mirror) rolls every pod onto it; the cluster shows
/// Upgrading, then Running again, and is quiet afterwards.
#[tokio::test]
async fn a_new_image_repository_rolls_the_pods_and_the_cluster_runs_again() {
    let resync = Duration::from_secs(2);
    let Some(mut running) = Running::start("cluster-roll", resync).await else {
        return;
    };
    running.create_sample("roll", 3).await;
    running.wait_running("roll", 3, TIMEOUT).await;
    let pods: Api<Pod> = running.api();
    let old_pods: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .iter()
        .map(|pod| pod.uid().expect("uid"))
        .collect();
    assert_eq!(old_pods.len(), 3);
    let phases = record_phases(&running, "roll");

    const MIRROR: &str = "mirror.example/library/postgres";
    running
        .restart_with(|settings| settings.postgres_image_repository = MIRROR.to_owned())
        .await;
    let new_image = format!("{MIRROR}:16");
    wait_until(
        "the StatefulSet's template to use the mirror",
        TIMEOUT,
        || async { Ok((image_of(&running, "roll-postgresql").await == new_image).then_some(())) },
    )
    .await
    .expect("template updated");
    // The replicas are replaced first; the primary waits for a replica that streams from it
    // (the simulated replicas do not say whom they follow).
    let old_primary = pods.get("roll-postgresql-0").await.expect("pod").uid();
    let waiting = wait_until("the replicas to be replaced", TIMEOUT, || async {
        let mut replicas_new = true;
        for ordinal in [1, 2] {
            let uid = pods
                .get_opt(&format!("roll-postgresql-{ordinal}"))
                .await?
                .and_then(|pod| pod.uid());
            replicas_new &= uid.is_some_and(|uid| !old_pods.contains(&uid));
        }
        let cluster = running.clusters().get("roll").await?;
        let message = condition(&cluster, "Progressing").map(|c| c.message.clone());
        let waits = message.as_deref().is_some_and(|m| {
            m.contains("waits for every replica to be an updated replica streaming from it")
        });
        Ok((replicas_new && waits).then_some(message))
    })
    .await
    .expect("replicas replaced, the primary waits");
    eprintln!("while the primary waits: {waiting:?}");
    assert_eq!(
        pods.get("roll-postgresql-0").await.expect("pod").uid(),
        old_primary,
        "the primary is not replaced before its switchover"
    );
    // The replicas stream from the primary: a switchover to one of them, which the simulated
    // instances then carry out.
    let instances = &running.instances;
    for ordinal in [1, 2] {
        let pod = format!("roll-postgresql-{ordinal}");
        let mut report = SimulatedInstances::report(&pod, ReportedRole::Replica);
        report.following = Some("roll-postgresql-0".to_owned());
        instances.answer(&pod, Some(report));
    }
    let clusters = running.clusters();
    let change = wait_until("a switchover for the rolling update", TIMEOUT, || async {
        let cluster = clusters.get("roll").await?;
        Ok(cluster
            .status
            .and_then(|s| s.primary_change)
            .filter(|change| change.reason.starts_with("rolling update")))
    })
    .await
    .expect("switchover recorded");
    assert_eq!(change.kind, pgkube_crds::PrimaryChangeKind::Switchover);
    let target = change.to.clone();
    instances.answer(
        &target,
        Some(SimulatedInstances::report(&target, ReportedRole::Primary)),
    );
    for pod in [
        "roll-postgresql-0",
        "roll-postgresql-1",
        "roll-postgresql-2",
    ] {
        if pod != target {
            let mut report = SimulatedInstances::report(pod, ReportedRole::Replica);
            report.following = Some(target.clone());
            instances.answer(pod, Some(report));
        }
    }
    let statefulsets = running.api::<StatefulSet>();
    wait_until("the roll to finish", TIMEOUT, || async {
        let sts = statefulsets.get("roll-postgresql").await?;
        let status = sts.status.clone().unwrap_or_default();
        let rolled = status.observed_generation == sts.metadata.generation
            && status.update_revision.is_some()
            && status.updated_replicas == Some(3)
            && status.ready_replicas == Some(3);
        Ok(rolled.then_some(()))
    })
    .await
    .expect("StatefulSet rolled");
    let cluster = running.wait_running("roll", 3, TIMEOUT).await;
    let new_pods = pods.list(&ListParams::default()).await.expect("pods").items;
    assert_eq!(new_pods.len(), 3);
    for pod in &new_pods {
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.as_deref());
        assert_eq!(image, Some(new_image.as_str()), "{}", pod.name_any());
        let uid = pod.uid().expect("uid");
        assert!(
            !old_pods.contains(&uid),
            "{} was not replaced",
            pod.name_any()
        );
    }
    assert_eq!(
        cluster
            .status
            .as_ref()
            .and_then(|s| s.current_version.as_deref()),
        Some("16")
    );
    let seen = phases.lock().expect("phases").clone();
    eprintln!("phases during the roll: {seen:?}");
    assert!(
        seen.contains(&ClusterPhase::Upgrading),
        "the roll shows as Upgrading: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&ClusterPhase::Running), "{seen:?}");
    assert!(
        !seen.contains(&ClusterPhase::Degraded),
        "a planned roll is not a degradation: {seen:?}"
    );
    let upgrading = common::events_with_reason(&running, "roll", "Upgrading").await;
    assert_eq!(upgrading[0].type_.as_deref(), Some("Normal"));

    // The new image is the desired state now: no more writes once settled.
    running
        .assert_no_writes_while_idle(resync, "after the roll")
        .await;
    running.stop().await;
}

/// Scheduling fields go verbatim into the pod template and roll the pods; the API server keeps
/// them as written, so the cluster is quiet afterwards; removing them removes them.
#[tokio::test]
async fn scheduling_fields_reach_the_pods_and_are_quiet_once_applied() {
    let resync = Duration::from_secs(2);
    let Some(running) = Running::start("cluster-sched", resync).await else {
        return;
    };
    running.create_sample("sched", 1).await;
    running.wait_running("sched", 1, TIMEOUT).await;
    let pods: Api<Pod> = running.api();
    let old_pod = pods.get("sched-postgresql-0").await.expect("pod").uid();

    // Every node of the test bed is linux; the toleration and the preference change nothing
    // about where the pod can go.
    let scheduling = json!({
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "example.com/dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"},
            {"key": "example.com/flaky", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
        ],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 50,
            "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "sched"}}
            }
        }]}}
    });
    patch_spec(&running, "sched", scheduling.clone()).await;
    let pod_spec_of = |pod: &Pod| serde_json::to_value(pod.spec.clone()).expect("json");
    // A pod the StatefulSet controller recreates mid-roll can come from the old revision first
    // (when its status still counts the pod as current), so wait for one with the new fields.
    let new_pod = wait_until("the pod to be replaced", TIMEOUT, || async {
        let pod = pods.get_opt("sched-postgresql-0").await?;
        Ok(pod.filter(|pod| {
            pod.uid() != old_pod && pod_spec_of(pod)["nodeSelector"] == scheduling["nodeSelector"]
        }))
    })
    .await
    .expect("pod rolled");
    let sts = running
        .api::<StatefulSet>()
        .get("sched-postgresql")
        .await
        .expect("StatefulSet");
    let template = serde_json::to_value(sts.spec.map(|s| s.template.spec)).expect("json");
    let pod_spec = pod_spec_of(&new_pod);
    for field in ["nodeSelector", "tolerations", "affinity"] {
        assert_eq!(template[field], scheduling[field], "template {field}");
    }
    assert_eq!(pod_spec["nodeSelector"], scheduling["nodeSelector"]);
    assert_eq!(pod_spec["affinity"], scheduling["affinity"]);
    // The API server adds its default not-ready/unreachable tolerations to pods.
    let pod_tolerations = pod_spec["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for toleration in scheduling["tolerations"].as_array().expect("tolerations") {
        assert!(
            pod_tolerations.contains(toleration),
            "{toleration} missing from {pod_tolerations:?}"
        );
    }
    running.wait_running("sched", 1, TIMEOUT).await;

    // Applied as written: no drift to correct, so no writes while idle.
    running
        .assert_no_writes_while_idle(resync, "once the scheduling fields were applied")
        .await;

    patch_spec(
        &running,
        "sched",
        json!({"nodeSelector": null, "tolerations": null, "affinity": null}),
    )
    .await;
    let statefulsets = running.api::<StatefulSet>();
    // What is left is the default spread: a preference for nodes without another instance.
    let default_affinity = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {
                "app.kubernetes.io/name": "postgresql",
                "app.kubernetes.io/instance": "sched",
            }}
        }
    }]}});
    wait_until(
        "the scheduling fields to leave the template",
        TIMEOUT,
        || async {
            let sts = statefulsets.get("sched-postgresql").await?;
            let template = serde_json::to_value(sts.spec.map(|s| s.template.spec))?;
            let gone = ["nodeSelector", "tolerations"]
                .iter()
                .all(|field| template.get(field).is_none());
            Ok((gone && template["affinity"] == default_affinity).then_some(()))
        },
    )
    .await
    .expect("fields removed");
    running.wait_running("sched", 1, TIMEOUT).await;
    running.stop().await;
}

/// The nodes the pods `pod_names` run on, once each is scheduled.
async fn nodes_of(running: &Running, pod_names: &[String]) -> Vec<String> {
    let pods: Api<Pod> = running.api();
    wait_until("the pods to be scheduled", TIMEOUT, || async {
        let mut nodes = Vec::new();
        for name in pod_names {
            let node = pods
                .get_opt(name)
                .await?
                .and_then(|pod| pod.spec.and_then(|spec| spec.node_name));
            match node {
                Some(node) => nodes.push(node),
                None => return Ok(None),
            }
        }
        Ok(Some(nodes))
    })
    .await
    .expect("pods scheduled")
}

/// On the test bed's three simulated nodes: by default the instances prefer nodes of their
/// own; with `Required`, a fourth instance finds none and stays Pending, and the scheduler says
/// why.
#[tokio::test]
async fn instances_spread_over_nodes_and_a_required_spread_leaves_a_fourth_pending() {
    let Some(running) = Running::start("cluster-spread", RESYNC).await else {
        return;
    };
    running.create_sample("preferred", 3).await;
    let mut required: PostgreSQLCluster =
        serde_yaml::from_str(common::SAMPLE).expect("sample parses");
    required.metadata.name = Some("required".to_owned());
    required.spec.replicas = 4;
    required.spec.backup = None;
    required.spec.spread =
        Some(serde_json::from_value(json!({"nodeAntiAffinity": "Required"})).expect("spread"));
    running
        .clusters()
        .create(&PostParams::default(), &required)
        .await
        .expect("cluster created");

    running.wait_running("preferred", 3, TIMEOUT).await;
    let preferred_pods: Vec<String> = (0..3)
        .map(|i| format!("preferred-postgresql-{i}"))
        .collect();
    let mut nodes = nodes_of(&running, &preferred_pods).await;
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "one instance per node: {nodes:?}");
    let pod = running
        .api::<Pod>()
        .get("preferred-postgresql-0")
        .await
        .expect("pod");
    let affinity = serde_json::to_value(pod.spec.and_then(|spec| spec.affinity)).expect("json");
    assert_eq!(
        affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"],
        "preferred"
    );

    let required_pods: Vec<String> = (0..3).map(|i| format!("required-postgresql-{i}")).collect();
    let mut nodes = nodes_of(&running, &required_pods).await;
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "one instance per node: {nodes:?}");
    let pods: Api<Pod> = running.api();
    let unschedulable = wait_until(
        "the fourth instance to be unschedulable",
        TIMEOUT,
        || async {
            let pod = pods.get_opt("required-postgresql-3").await?;
            let condition = pod
                .and_then(|pod| pod.status)
                .and_then(|status| status.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            Ok(condition)
        },
    )
    .await
    .expect("the fourth instance Pending");
    assert_eq!(unschedulable.reason.as_deref(), Some("Unschedulable"));
    let pod = pods.get("required-postgresql-3").await.expect("pod");
    assert_eq!(pod.spec.and_then(|spec| spec.node_name), None);
    running.stop().await;
}

/// pgkube-testkit names a cluster's children and credentials keys as the controllers do (its
/// end-to-end helpers find a cluster's Service and Secret by these names).
#[test]
fn the_testkit_agrees_with_the_controllers_on_child_names_and_keys() {
    use pgkube_controllers::cluster::build::{ChildNames, PASSWORD_KEY, USERNAME_KEY};
    let longest = "a".repeat(pgkube_testkit::MAX_CLUSTER_NAME);
    use pgkube_testkit::ClusterService;
    for name in ["db", "my-cluster-2", longest.as_str()] {
        let names = ChildNames::for_cluster(name);
        assert_eq!(ClusterService::ReadWrite.name(name), names.rw_service);
        assert_eq!(ClusterService::ReadOnly.name(name), names.ro_service);
        assert_eq!(ClusterService::Any.name(name), names.r_service);
        assert_eq!(pgkube_testkit::credentials_secret_name(name), names.secret);
        assert_eq!(
            pgkube_testkit::replication_secret_name(name),
            names.replication_secret
        );
    }
    assert_eq!(pgkube_testkit::USERNAME_KEY, USERNAME_KEY);
    assert_eq!(pgkube_testkit::PASSWORD_KEY, PASSWORD_KEY);
    assert_eq!(
        pgkube_testkit::ROLE_LABEL,
        pgkube_controllers::cluster::build::ROLE_LABEL
    );
}

/// Creates, in `namespace`, backup `nightly` of `cluster` (kept when deleted) and restore `back`
/// of a backup that does not exist into it.
async fn backup_and_restore_of(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
) -> (Api<PostgreSQLBackup>, Api<PostgreSQLRestore>) {
    let backups = Api::<PostgreSQLBackup>::namespaced(client.clone(), namespace);
    let backup: PostgreSQLBackup = serde_json::from_value(json!({
        "apiVersion": "db.example.com/v1beta1", "kind": "PostgreSQLBackup",
        "metadata": {"name": "nightly"},
        "spec": {"cluster": {"name": cluster}, "deletionPolicy": "Retain"},
    }))
    .expect("a backup");
    backups
        .create(&PostParams::default(), &backup)
        .await
        .expect("backup created");
    let restores = Api::<PostgreSQLRestore>::namespaced(client.clone(), namespace);
    let restore: PostgreSQLRestore = serde_json::from_value(json!({
        "apiVersion": "db.example.com/v1beta1", "kind": "PostgreSQLRestore",
        "metadata": {"name": "back"},
        "spec": {"backup": {"name": "missing"}, "cluster": {"name": cluster}},
    }))
    .expect("a restore");
    restores
        .create(&PostParams::default(), &restore)
        .await
        .expect("restore created");
    (backups, restores)
}

/// The distinct successive phases of cluster `name`, as a watch sees them from now on.
fn record_phases(running: &Running, name: &str) -> Arc<Mutex<Vec<ClusterPhase>>> {
    let phases = Arc::new(Mutex::new(Vec::new()));
    let recorded = phases.clone();
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = kube::runtime::watcher(running.clusters(), config).applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(cluster)) = stream.next().await {
            let Some(phase) = cluster.status.and_then(|s| s.phase) else {
                continue;
            };
            let mut phases = recorded.lock().expect("phases");
            if phases.last() != Some(&phase) {
                phases.push(phase);
            }
        }
    });
    phases
}

/// One Controller of each kind serves every watched namespace: with two namespaces and one
/// reconcile at a time, a cluster in each reaches Running, each with its own children, and a
/// backup and a restore in each are reconciled (the backup waits, its cluster having no
/// storage; the restore of a backup that does not exist fails).
#[tokio::test]
async fn one_controller_of_each_kind_serves_every_watched_namespace() {
    let Some(mut running) = Running::start("cluster-ns-a", Duration::from_secs(300)).await else {
        return;
    };
    let other = pgkube_testkit::TestNamespace::create(&running.client, "cluster-ns-b").await;
    let other_name = other.name().to_owned();
    running
        .restart_with(|settings| {
            settings.watch_namespaces.push(other_name.clone());
            settings.max_concurrent_reconciles = 1;
        })
        .await;
    running.create_sample("first", 1).await;
    let mut second: PostgreSQLCluster = serde_yaml::from_str(common::SAMPLE).expect("sample");
    second.metadata.name = Some("second".to_owned());
    second.spec.replicas = 1;
    second.spec.backup = None;
    let in_other = Api::<PostgreSQLCluster>::namespaced(running.client.clone(), &other_name);
    in_other
        .create(&PostParams::default(), &second)
        .await
        .expect("created in the second namespace");
    running.wait_running("first", 1, TIMEOUT).await;
    wait_until("the second namespace's cluster to run", TIMEOUT, || async {
        let cluster = in_other.get("second").await?;
        let phase = cluster.status.and_then(|s| s.phase);
        Ok((phase == Some(ClusterPhase::Running)).then_some(()))
    })
    .await
    .expect("Running in the second namespace");
    for (namespace, cluster) in [
        (running.namespace.name(), "first"),
        (other_name.as_str(), "second"),
    ] {
        let (backups, restores) = backup_and_restore_of(&running.client, namespace, cluster).await;
        wait_until(
            &format!("the backup in {namespace} to wait"),
            TIMEOUT,
            || async {
                let backup = backups.get("nightly").await?;
                let phase = backup.status.and_then(|s| s.phase);
                Ok((phase == Some(BackupPhase::Pending)).then_some(()))
            },
        )
        .await
        .expect("the backup reconciled in its namespace");
        let refused = wait_until(
            &format!("the restore in {namespace} to fail"),
            TIMEOUT,
            || async {
                let restore = restores.get("back").await?;
                let status = restore.status.unwrap_or_default();
                Ok((status.phase == Some(RestorePhase::Failed)).then_some(status))
            },
        )
        .await
        .expect("the restore reconciled in its namespace");
        let message = refused.message.unwrap_or_default();
        assert!(message.contains("missing does not exist"), "{message}");
    }
    let statefulsets = Api::<StatefulSet>::namespaced(running.client.clone(), &other_name);
    statefulsets
        .get("second-postgresql")
        .await
        .expect("the second cluster's StatefulSet, in its namespace");
    running.stop().await;
    // The controllers are gone: the second namespace's cluster keeps its finalizer otherwise.
    other.cleanup_without_controllers().await;
}
