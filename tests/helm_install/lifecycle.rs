//! `helm upgrade` and `helm uninstall`: what must have changed, and what must have stayed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use pgkube_testkit::{TestCluster, TestEnv, wait_until};

use super::Release;
use super::checks::{is_ready, manager_pods, wait_leader_among};

const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// After `helm upgrade` to text logs and 80Mi of memory: two new Ready pods with the new args
/// and resources, none of `before` left, one of the new ones leading, and logging text.
pub async fn the_manager_rolled(
    env: &TestEnv,
    client: &Client,
    release: &Release<'_>,
    before: &BTreeSet<String>,
) {
    let pods = wait_until("the manager's new pods", STEP_TIMEOUT, || async {
        let pods = manager_pods(client, release).await?;
        let rolled = pods.len() == 2
            && pods
                .iter()
                .all(|p| !before.contains(&p.name_any()) && is_ready(p));
        Ok(rolled.then_some(pods))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    for pod in &pods {
        let container = &pod.spec.as_ref().expect("a spec").containers[0];
        let args = container.args.clone().unwrap_or_default();
        assert!(args.iter().any(|a| a == "--log-format=text"), "{args:?}");
        let requests = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref());
        let memory = requests.and_then(|r| r.get("memory")).map(|q| q.0.as_str());
        assert_eq!(memory, Some("80Mi"));
    }
    let names: BTreeSet<String> = pods.iter().map(ResourceExt::name_any).collect();
    wait_leader_among(client, release, &names).await;
    // Text, not JSON: the value reached the process.
    let pod = names.first().expect("a pod");
    let logs = env
        .kubectl()
        .args(["logs", "-n", &release.namespace, pod])
        .output()
        .expect("kubectl logs");
    let logs = String::from_utf8_lossy(&logs.stdout);
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.iter().any(|l| l.contains("INFO")), "{logs}");
    assert!(
        !lines.iter().any(|l| l.starts_with('{')),
        "JSON lines: {logs}"
    );
}

/// The upgraded manager reconciles a change: a new `work_mem` reaches the cluster's status as
/// its observed generation.
pub async fn the_manager_still_reconciles(cluster: &TestCluster) {
    let patch = serde_json::json!({"spec": {"postgresql": {"parameters": {"work_mem": "8MB"}}}});
    let patched = cluster
        .api()
        .patch(
            cluster.name(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("the cluster patched");
    let generation = patched.metadata.generation.expect("a generation");
    wait_until("the change reconciled", STEP_TIMEOUT, || async {
        let status = cluster.get().await?.status.unwrap_or_default();
        Ok((status.observed_generation >= Some(generation)).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// The cluster's volume claims and Secrets, by name, with their uids.
pub async fn cluster_objects(client: &Client, cluster: &TestCluster) -> BTreeMap<String, String> {
    let selector = format!("app.kubernetes.io/instance={}", cluster.name());
    let list = ListParams::default().labels(&selector);
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), cluster.namespace())
        .list(&list)
        .await
        .expect("claims");
    let secrets = Api::<Secret>::namespaced(client.clone(), cluster.namespace())
        .list(&list)
        .await
        .expect("Secrets");
    let claims = claims
        .items
        .iter()
        .map(|c| (format!("claim {}", c.name_any()), c.uid()));
    let secrets = secrets
        .items
        .iter()
        .map(|s| (format!("Secret {}", s.name_any()), s.uid()));
    claims
        .chain(secrets)
        .map(|(name, uid)| (name, uid.unwrap_or_default()))
        .collect()
}

/// After `helm uninstall`: no manager pod, Deployment or RBAC left.
pub async fn the_manager_is_gone(client: &Client, release: &Release<'_>, watched: &str) {
    wait_until("the manager's pods to go", STEP_TIMEOUT, || async {
        Ok(manager_pods(client, release)
            .await?
            .is_empty()
            .then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let deployments = Api::<Deployment>::namespaced(client.clone(), &release.namespace);
    assert!(
        deployments
            .get_opt(&release.name)
            .await
            .expect("read")
            .is_none()
    );
    let scope = format!("{}-manager-cluster-scope", release.name);
    let cluster_roles = Api::<ClusterRole>::all(client.clone());
    assert!(cluster_roles.get_opt(&scope).await.expect("read").is_none());
    let roles = Api::<Role>::namespaced(client.clone(), watched);
    let manager_role = format!("{}-manager", release.name);
    assert!(roles.get_opt(&manager_role).await.expect("read").is_none());
}

/// After `helm uninstall`: the cluster, the same claims and Secrets (`kept`), and its data.
pub async fn the_cluster_and_its_data_stay(
    client: &Client,
    cluster: &TestCluster,
    kept: &BTreeMap<String, String>,
) {
    assert!(kept.keys().any(|k| k.starts_with("claim ")), "{kept:?}");
    assert!(kept.keys().any(|k| k.starts_with("Secret ")), "{kept:?}");
    cluster.get().await.expect("the cluster stays");
    assert_eq!(&cluster_objects(client, cluster).await, kept);
    let sql = cluster.sql().await.expect("SQL after the uninstall");
    let row = sql
        .query_one("SELECT note FROM kept", &[])
        .await
        .expect("the row written before");
    assert_eq!(row.get::<_, String>(0), "before");
}
