//! `deploy/rbac.yaml` (with the manager's own namespace's rights, `deploy/manager/service-account.yaml`)
//! grants exactly what the manager calls: a rule nobody uses fails this test
//! as surely as a missing one.
//!
//! The manager runs as the `pgkube` ServiceAccount, with a token of its own and only the rights
//! of `deploy/rbac.yaml`, through a scenario that reaches its controllers' calls on the test
//! bed's real node and Garage: a cluster comes up and its pod is labelled; an earlier version's
//! client Service is deleted; a second replica brings a PodDisruptionBudget that goes again with
//! it; the cluster's NetworkPolicy goes when turned off and comes back; the storage grows (StorageClass read, claim patched); an on-demand backup with
//! `deletionPolicy: Delete` runs as a Job, its retention pass deletes an expired backup object,
//! a restore of it runs as a Job, and its own deletion removes its data through the finalizer;
//! a cluster bootstrapped from a missing backup gets a bootstrap restore, which is refused; a
//! `* * * * *` schedule makes a backup; the manager makes its webhook certificate's Secret; the cluster is deleted through its finalizer; the Lease is taken and released.
//!
//! The test bed's API server audits the requests of pgkube-system's ServiceAccounts
//! (`tests/testbed/up`). The requests made with this manager's token (its JWT id is the audit
//! event's credential id) become (API group, resource[/subresource], verb), the attributes RBAC
//! authorizes. Then: none was refused; each is granted by a rule; and each rule, expanded to
//! (group, resource, verb), was used, save those in [`NOT_REACHED`].

mod manager_common;
mod rbac_common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use manager_common::Manager;
use pgkube_crds::{
    BackupPhase, DeletionPolicy, PostgreSQLBackup, PostgreSQLCluster, RestorePhase, SCHEDULED_LABEL,
};
use pgkube_testkit::{
    TestBucket, TestCluster, TestEnv, TestNamespace, backup_config, create_backup, create_restore,
    create_s3_secret, describe_restore, install_crds, put_object, restore_of_backup,
    restore_reason, test_storage, testbed, wait_backup_ended, wait_restore_ended, wait_until,
};
use rbac_common::{Permission, granted_permissions};

const DEPLOY_NAMESPACE: &str = "pgkube-system";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:pgkube-system:pgkube";
const CLUSTER: &str = "pg";
const S3_SECRET: &str = "s3-keys";
/// 1 January, 00:00: no scheduled backup until the test asks for one.
const NEVER: &str = "0 0 1 1 *";
const STEP_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(300);

/// Rules of `deploy/rbac.yaml` that the scenario cannot show in the audit log, as
/// (API group, resource, verb, resource name or "", what needs it and why the scenario does
/// not reach it). A rule listed here that the scenario did use, or that is not in
/// `deploy/rbac.yaml`, fails the test.
const NOT_REACHED: &[(&str, &str, &str, &str, &str)] = &[
    (
        "",
        "events",
        "list",
        "",
        "reading the kubelet's FailedMount Event of a backup Job's pod that has shown \
         ContainerCreating with no message for 30 s; the test bed's pods start at once, and its \
         node says in the pod itself why one cannot (controllers/tests/\
         backup_job_start_on_real_node.rs sees that reason shown)",
    ),
    (
        "",
        "secrets",
        "update",
        WEBHOOK_SECRET,
        "renewing the webhook certificate, which happens 30 days before it expires (a year)",
    ),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "patch",
        "postgresqlclusters.db.example.com",
        "setting the caBundle of a CRD that converts through the webhook; the test bed's CRDs \
         serve v1beta1 alone (no webhook outlives a test), so there is none to set \
         (tests/conversion_webhook.rs sees it set, with the test bed's admin rights)",
    ),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "patch",
        "postgresqlbackups.db.example.com",
        "the same, for backups",
    ),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "patch",
        "postgresqlrestores.db.example.com",
        "the same, for restores",
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "patch",
        "pgkube",
        "setting the caBundle of the admission webhook's configuration; the test bed has none \
         named pgkube outside tests/conversion_webhook.rs, which sees it set, with the test \
         bed's admin rights (the manager reads it here, and finds none)",
    ),
];
/// The Secret of the webhook's managed certificate, as deploy/ names it.
const WEBHOOK_SECRET: &str = "pgkube-webhook-cert";

/// One audited request of the manager.
#[derive(Clone, Debug)]
struct Call {
    permission: Permission,
    code: Option<u64>,
    uri: String,
    /// The object it was about, if it named one.
    name: Option<String>,
}

impl Call {
    /// What the request needed: its own verb and, for a patch that created the object (a
    /// server-side apply answered 201 Created), `create` too, which the API server authorizes
    /// inside the same request.
    fn needs(&self) -> Vec<Permission> {
        let mut needs = vec![self.permission.clone()];
        if self.permission.verb == "patch" && self.code == Some(201) {
            needs.push(Permission {
                verb: "create".to_owned(),
                ..self.permission.clone()
            });
        }
        needs
    }

    /// What the request used of `granted`: the rule for its object by name when there is one
    /// (a rule with `resourceNames`), else the rule for any object.
    fn used(&self, granted: &BTreeMap<Permission, String>) -> Vec<Permission> {
        self.needs()
            .into_iter()
            .map(|need| match &self.name {
                Some(name) if granted.contains_key(&need.clone().named(name)) => need.named(name),
                _ => need,
            })
            .collect()
    }
}

/// The JWT id (`jti`) of a ServiceAccount token: the audit log's credential id is `JTI=<jti>`.
fn token_id(token: &str) -> String {
    let payload = token.split('.').nth(1).expect("a JWT has a payload");
    // base64url without padding -> standard base64, which ByteString decodes from JSON.
    let mut standard: String = payload
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !standard.len().is_multiple_of(4) {
        standard.push('=');
    }
    let bytes: ByteString =
        serde_json::from_value(serde_json::json!(standard)).expect("the JWT payload is base64");
    let claims: serde_json::Value = serde_json::from_slice(&bytes.0).expect("JWT claims JSON");
    claims["jti"]
        .as_str()
        .expect("a bound token has a jti")
        .to_owned()
}

/// The requests audited in `log` that were made with the credential `JTI=<jti>`, one per
/// request (a request has an event per stage), with the code of its last stage.
fn audited_calls(log: &Path, jti: &str) -> Vec<Call> {
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("reading the audit log {}: {e}", log.display()));
    let credential = format!("JTI={jti}");
    let mut calls: BTreeMap<String, Call> = BTreeMap::new();
    for line in text.lines() {
        let event: serde_json::Value = serde_json::from_str(line).expect("audit lines are JSON");
        let ours = event["user"]["extra"]["authentication.kubernetes.io/credential-id"]
            .as_array()
            .is_some_and(|ids| ids.iter().any(|id| id == credential.as_str()));
        if !ours {
            continue;
        }
        assert_eq!(event["user"]["username"], SERVICE_ACCOUNT, "{line}");
        let id = event["auditID"].as_str().expect("auditID").to_owned();
        calls.insert(id, call(&event));
    }
    calls.into_values().collect()
}

fn call(event: &serde_json::Value) -> Call {
    let object = &event["objectRef"];
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
    let mut resource = text(&object["resource"]);
    if let Some(subresource) = object["subresource"].as_str() {
        resource = format!("{resource}/{subresource}");
    }
    Call {
        permission: Permission::new(&text(&object["apiGroup"]), &resource, &text(&event["verb"])),
        code: event["responseStatus"]["code"].as_u64(),
        uri: text(&event["requestURI"]),
        name: object["name"].as_str().map(str::to_owned),
    }
}

/// What differs between the calls and the rules; empty when the rules are exact.
fn differences(
    calls: &[Call],
    granted: &BTreeMap<Permission, String>,
    exceptions: &BTreeMap<Permission, &str>,
) -> Vec<String> {
    let resource_calls: Vec<&Call> = calls
        .iter()
        .filter(|call| !call.permission.resource.is_empty())
        .collect();
    let used: BTreeSet<Permission> = resource_calls
        .iter()
        .flat_map(|c| c.used(granted))
        .collect();
    let mut problems = Vec::new();
    for call in calls.iter().filter(|call| call.code == Some(403)) {
        problems.push(format!("refused: {} ({})", call.permission, call.uri));
    }
    for permission in used.iter().filter(|p| !granted.contains_key(*p)) {
        problems.push(format!("called but granted by no rule: {permission}"));
    }
    for (permission, role) in granted {
        if !used.contains(permission) && !exceptions.contains_key(permission) {
            problems.push(format!("granted by {role} but never called: {permission}"));
        }
    }
    for permission in exceptions.keys() {
        if used.contains(permission) || !granted.contains_key(permission) {
            problems.push(format!(
                "stale NOT_REACHED entry (called, or not a rule): {permission}"
            ));
        }
    }
    problems
}

fn not_reached() -> BTreeMap<Permission, &'static str> {
    NOT_REACHED
        .iter()
        .map(|(group, resource, verb, name, why)| {
            let permission = Permission::new(group, resource, verb);
            let permission = if name.is_empty() {
                permission
            } else {
                permission.named(name)
            };
            (permission, *why)
        })
        .collect()
}

/// The calls, one line per permission with how often it was used.
fn summary(calls: &[Call]) -> String {
    let mut counts: BTreeMap<Permission, usize> = BTreeMap::new();
    for permission in calls.iter().flat_map(Call::needs) {
        *counts.entry(permission).or_default() += 1;
    }
    counts
        .iter()
        .map(|(permission, count)| format!("  {permission}: {count}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn kubectl_ok(env: &TestEnv, args: &[&str]) -> String {
    let output = env.kubectl().args(args).output().expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("kubectl prints UTF-8")
}

/// Applies `deploy/`'s namespace and RBAC, and writes a kubeconfig with a new token of the
/// `pgkube` ServiceAccount into `dir`; returns its path and the token's JWT id.
fn service_account_kubeconfig(env: &TestEnv, dir: &Path) -> (String, String) {
    let root = env!("CARGO_MANIFEST_DIR");
    for file in [
        "manager/namespace.yaml",
        "manager/service-account.yaml",
        "rbac.yaml",
    ] {
        kubectl_ok(env, &["apply", "-f", &format!("{root}/deploy/{file}")]);
    }
    let token = kubectl_ok(env, &["create", "token", "pgkube", "-n", DEPLOY_NAMESPACE]);
    let path = dir.join("kubeconfig");
    std::fs::write(&path, env.kubeconfig_with_token(token.trim())).expect("kubeconfig written");
    let path = path.to_str().expect("UTF-8 path").to_owned();
    (path, token_id(token.trim()))
}

/// The scenario's objects, all in one namespace.
struct Scenario {
    env: TestEnv,
    client: Client,
    namespace: TestNamespace,
    bucket: TestBucket,
}

impl Scenario {
    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.namespace.name())
    }

    fn ns(&self) -> &str {
        self.namespace.name()
    }

    async fn patch_cluster(&self, spec: serde_json::Value) {
        self.api::<PostgreSQLCluster>()
            .patch(
                CLUSTER,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": spec })),
            )
            .await
            .expect("cluster patched");
    }

    /// Waits until `check` of the namespace's object `name` of kind `K` holds.
    async fn wait_for<K, F>(&self, what: &str, name: &str, check: F)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + fmt::Debug,
        F: Fn(Option<&K>) -> bool,
    {
        let api = self.api::<K>();
        wait_until(what, STEP_TIMEOUT, || async {
            Ok(check(api.get_opt(name).await?.as_ref()).then_some(()))
        })
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    }
}

/// The cluster, Running on the real node (its pod labelled with its role), with backups to the
/// scenario's bucket that no schedule starts.
async fn start_cluster(scenario: &Scenario) -> TestCluster {
    create_s3_secret(
        &scenario.client,
        &scenario.env,
        scenario.ns(),
        S3_SECRET,
        None,
    )
    .await
    .expect("S3 Secret");
    let storage = test_storage(&scenario.env, scenario.bucket.name(), S3_SECRET);
    TestCluster::builder(CLUSTER)
        .spec(|spec| spec.backup = Some(backup_config(storage, NEVER)))
        .timeout(CLUSTER_TIMEOUT)
        .start(&scenario.namespace)
        .await
        .unwrap_or_else(|error| panic!("the cluster becomes Running: {error:#}"))
}

/// The single client Service of earlier pgkube versions (`<cluster>-postgresql`), as an upgrade
/// finds it: the manager deletes it.
async fn old_client_service_goes(scenario: &Scenario, cluster: &PostgreSQLCluster) {
    let name = format!("{CLUSTER}-postgresql");
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "pgkube"},
            "ownerReferences": [cluster.controller_owner_ref(&())],
        },
        "spec": {"ports": [{"name": "postgresql", "port": 5432}]},
    }))
    .expect("a valid Service");
    scenario
        .api::<Service>()
        .create(&PostParams::default(), &service)
        .await
        .expect("old client Service created");
    scenario
        .wait_for::<Service, _>("the old client Service to go", &name, |s| s.is_none())
        .await;
}

/// Two replicas bring a PodDisruptionBudget; back to one, the manager deletes it.
async fn disruption_budget_comes_and_goes(scenario: &Scenario) {
    let name = format!("{CLUSTER}-postgresql");
    scenario
        .patch_cluster(serde_json::json!({"replicas": 2}))
        .await;
    scenario
        .wait_for::<PodDisruptionBudget, _>("the PodDisruptionBudget", &name, |b| b.is_some())
        .await;
    scenario
        .patch_cluster(serde_json::json!({"replicas": 1}))
        .await;
    scenario
        .wait_for::<PodDisruptionBudget, _>("the budget to go", &name, |b| b.is_none())
        .await;
    scenario
        .wait_for::<StatefulSet, _>("one replica again", &name, |set| {
            set.and_then(|s| s.status.as_ref())
                .is_some_and(|s| s.replicas == 1)
        })
        .await;
}

/// The cluster's NetworkPolicy goes when it is turned off, and comes back.
async fn network_policy_goes_and_comes(scenario: &Scenario) {
    let name = format!("{CLUSTER}-postgresql");
    scenario
        .wait_for::<NetworkPolicy, _>("the NetworkPolicy", &name, |p| p.is_some())
        .await;
    scenario
        .patch_cluster(serde_json::json!({"networkPolicy": {"enabled": false}}))
        .await;
    scenario
        .wait_for::<NetworkPolicy, _>("the NetworkPolicy to go", &name, |p| p.is_none())
        .await;
    scenario
        .patch_cluster(serde_json::json!({"networkPolicy": null}))
        .await;
    scenario
        .wait_for::<NetworkPolicy, _>("the NetworkPolicy back", &name, |p| p.is_some())
        .await;
}

/// The storage grows to 2Gi: the manager reads the StorageClass and patches the data claim.
async fn storage_grows(scenario: &Scenario) {
    scenario
        .patch_cluster(serde_json::json!({"storage": {"size": "2Gi"}}))
        .await;
    let claim = format!("data-{CLUSTER}-postgresql-0");
    scenario
        .wait_for::<PersistentVolumeClaim, _>("the data claim to ask for 2Gi", &claim, |c| {
            c.and_then(|c| c.spec.as_ref()?.resources.as_ref()?.requests.as_ref())
                .and_then(|requests| requests.get("storage"))
                .is_some_and(|quantity| quantity.0 == "2Gi")
        })
        .await;
}

/// An expired (30 days old) backup of the cluster in its own directory, with its PostgreSQLBackup
/// object marked Completed: the retention pass after the next completed backup deletes both.
async fn expired_backup(scenario: &Scenario) {
    use DeletionPolicy::Retain;
    use pgkube_controllers::storage::manifest::{Manifest, StoredObject};
    let ns = scenario.ns();
    let created = create_backup(&scenario.client, ns, "ancient", CLUSTER, Retain).await;
    let backup = created.expect("expired backup");
    let backup_uid = backup.metadata.uid.expect("a uid");
    let cluster = scenario.api::<PostgreSQLCluster>().get(CLUSTER).await;
    let cluster_uid = cluster.expect("the cluster").metadata.uid.expect("a uid");
    let prefix = format!("{ns}/{CLUSTER}/{cluster_uid}/ancient/{backup_uid}/");
    let finished = (chrono::Utc::now() - chrono::Duration::days(30)).to_rfc3339();
    let manifest = Manifest {
        manifest_version: 1,
        cluster: CLUSTER.to_owned(),
        namespace: ns.to_owned(),
        cluster_uid: Some(cluster_uid),
        system_identifier: None,
        backup_name: "ancient".to_owned(),
        backup_uid: Some(backup_uid),
        postgresql_version: "15".to_owned(),
        started_at: finished.clone(),
        finished_at: finished,
        format: "pg_dump-custom".to_owned(),
        physical: None,
        globals: Some(StoredObject {
            key: format!("{prefix}globals.sql"),
            size: 10,
            sha256: "00".repeat(32),
            format: "pg_dumpall-globals-sql".to_owned(),
            compression: None,
        }),
        databases: Vec::new(),
    };
    let manifest = serde_json::to_vec(&manifest).expect("manifest JSON");
    let (s3, bucket) = (scenario.bucket.client(), scenario.bucket.name());
    let globals = b"-- globals".to_vec();
    let key = format!("{prefix}globals.sql");
    put_object(&s3, bucket, &key, globals)
        .await
        .expect("globals");
    let key = format!("{prefix}manifest.json");
    put_object(&s3, bucket, &key, manifest)
        .await
        .expect("manifest");
    scenario
        .api::<PostgreSQLBackup>()
        .patch_status(
            "ancient",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Completed"}})),
        )
        .await
        .expect("marked Completed");
}

/// An on-demand backup with `deletionPolicy: Delete` completes (a Job, its pod's result, the S3
/// keys' Secret), the retention pass after it deletes the expired backup object, and deleting
/// the backup removes its data through the finalizer.
async fn backup_runs_prunes_and_goes(scenario: &Scenario) {
    expired_backup(scenario).await;
    let (client, ns) = (&scenario.client, scenario.ns());
    create_backup(client, ns, "doomed", CLUSTER, DeletionPolicy::Delete)
        .await
        .expect("backup created");
    let ended = wait_backup_ended(client, ns, "doomed", STEP_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    let status = ended.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(BackupPhase::Completed), "{status:?}");
    scenario
        .wait_for::<PostgreSQLBackup, _>("the expired backup object to go", "ancient", |b| {
            b.is_none()
        })
        .await;
    restore_runs(scenario, "doomed").await;
    scenario
        .api::<PostgreSQLBackup>()
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("backup deleted");
    scenario
        .wait_for::<PostgreSQLBackup, _>("the Delete backup to go", "doomed", |b| b.is_none())
        .await;
}

/// A restore of backup `backup` into the cluster runs as a Job to Completed (the backup read,
/// the namespace's backups listed, the restore's status written).
async fn restore_runs(scenario: &Scenario, backup: &str) {
    let mut spec = restore_of_backup(backup, CLUSTER);
    spec.drop_existing = true;
    create_restore(&scenario.client, scenario.ns(), "undo", spec)
        .await
        .expect("restore created");
    let ended = wait_restore_ended(&scenario.client, scenario.ns(), "undo", STEP_TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    assert_eq!(
        ended.status.as_ref().and_then(|s| s.phase),
        Some(RestorePhase::Completed),
        "{}",
        describe_restore(&ended)
    );
}

/// A cluster bootstrapped from a backup that does not exist: once its primary runs, the
/// cluster controller creates its bootstrap restore, which the restore controller refuses;
/// then the cluster goes.
async fn bootstrap_restore_is_made(scenario: &Scenario) {
    let mut copy: PostgreSQLCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLCluster",
        "metadata": {"name": "copy"},
        "spec": {
            "replicas": 1,
            "postgresVersion": "15",
            "storage": {"size": "1Gi"},
            "bootstrap": {"backup": {"name": "never-made"}},
        },
    }))
    .expect("cluster manifest");
    // On the real node: the bootstrap restore is made once the primary reports a database
    // that this cluster made.
    pgkube_testkit::local_node_scheduling().apply_to_cluster(&mut copy.spec);
    let clusters = scenario.api::<PostgreSQLCluster>();
    clusters
        .create(&PostParams::default(), &copy)
        .await
        .expect("bootstrapped cluster created");
    let refused = wait_restore_ended(
        &scenario.client,
        scenario.ns(),
        "copy-bootstrap",
        STEP_TIMEOUT,
    )
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    assert_eq!(
        restore_reason(&refused).as_deref(),
        Some("BackupNotFound"),
        "{}",
        describe_restore(&refused)
    );
    clusters
        .delete("copy", &DeleteParams::default())
        .await
        .expect("bootstrapped cluster deleted");
    scenario
        .wait_for::<PostgreSQLCluster, _>("the bootstrapped cluster to go", "copy", |c| c.is_none())
        .await;
}

/// A `* * * * *` schedule: the cron engine makes a backup within about a minute.
async fn schedule_makes_a_backup(scenario: &Scenario) {
    scenario
        .patch_cluster(serde_json::json!({"backup": {"schedule": {"cron": "* * * * *"}}}))
        .await;
    let backups = scenario.api::<PostgreSQLBackup>();
    let scheduled = ListParams::default().labels(SCHEDULED_LABEL);
    wait_until("a scheduled backup", STEP_TIMEOUT, || async {
        Ok(backups
            .list(&scheduled)
            .await?
            .items
            .into_iter()
            .next()
            .map(|_| ()))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
    // No more: the cluster's deletion comes next.
    scenario
        .patch_cluster(serde_json::json!({"backup": {"schedule": {"suspend": true}}}))
        .await;
}

/// Runs the scenario with a manager authenticated by `kubeconfig`; returns its output.
async fn run_scenario(scenario: &Scenario, kubeconfig: &str, lease: &str) -> Vec<String> {
    let webhook_dir = std::env::temp_dir()
        .join(pgkube_testkit::unique_name("pgkube-rbac-webhook"))
        .to_string_lossy()
        .into_owned();
    let mut manager = Manager::start_with_env(
        &scenario.env,
        "manager-rbac-calls",
        &[
            "--watch-namespaces",
            scenario.ns(),
            "--leader-elect",
            "--leader-elect-namespace",
            DEPLOY_NAMESPACE,
            "--leader-elect-id",
            lease,
            "--webhook-bind-address",
            "127.0.0.1:0",
            "--webhook-cert-dir",
            &webhook_dir,
            "--webhook-cert-secret",
            WEBHOOK_SECRET,
            "--webhook-cert-hosts",
            "127.0.0.1",
        ],
        &[
            ("KUBECONFIG", kubeconfig),
            ("POD_NAMESPACE", DEPLOY_NAMESPACE),
        ],
    );
    let steps = async {
        let cluster = start_cluster(scenario).await;
        let live = cluster.get().await.expect("cluster read");
        old_client_service_goes(scenario, &live).await;
        disruption_budget_comes_and_goes(scenario).await;
        network_policy_goes_and_comes(scenario).await;
        storage_grows(scenario).await;
        backup_runs_prunes_and_goes(scenario).await;
        bootstrap_restore_is_made(scenario).await;
        schedule_makes_a_backup(scenario).await;
        cluster.delete(STEP_TIMEOUT).await.expect("cluster deleted");
    };
    if let Err(panic) = AssertUnwindSafe(steps).catch_unwind().await {
        eprintln!("manager output:\n{}", manager.output().join("\n"));
        std::panic::resume_unwind(panic);
    }
    manager.terminate();
    let code = manager.exit_code(Duration::from_secs(30)).await;
    let output = manager.output();
    let _ = std::fs::remove_dir_all(&webhook_dir);
    assert_eq!(code, Some(0), "manager output:\n{}", output.join("\n"));
    output
}

#[tokio::test]
async fn deploy_rbac_grants_exactly_the_calls_the_manager_makes() {
    let Some(env) = testbed() else { return };
    let audit_log = env.audit_log.clone().unwrap_or_else(|| {
        panic!(
            "the test bed has no audit log (PGKUBE_TEST_AUDIT_LOG): it was started by an older \
             tests/testbed/up; restart it (tests/testbed/down, then tests/testbed/up)"
        )
    });
    let client = env.kube_client().await;
    install_crds(&client).await;
    let dir = std::env::temp_dir().join(pgkube_testkit::unique_name("pgkube-rbac-calls"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (kubeconfig, jti) = service_account_kubeconfig(&env, &dir);
    let scenario = Scenario {
        namespace: TestNamespace::create(&client, "rbac-calls").await,
        bucket: TestBucket::create(&env, "rbac-calls").await,
        env: env.clone(),
        client: client.clone(),
    };
    let lease = pgkube_testkit::unique_name("pgkube-rbac-calls");
    let output = run_scenario(&scenario, &kubeconfig, &lease).await;

    let calls = audited_calls(&audit_log, &jti);
    assert!(
        !calls.is_empty(),
        "no audited call with credential JTI={jti}"
    );
    let root = env!("CARGO_MANIFEST_DIR");
    let rbac = ["rbac.yaml", "manager/service-account.yaml"]
        .map(|file| std::fs::read_to_string(format!("{root}/deploy/{file}")).expect(file))
        .join("\n---\n");
    let problems = differences(&calls, &granted_permissions(&rbac), &not_reached());
    assert!(
        problems.is_empty(),
        "deploy/rbac.yaml and deploy/manager/service-account.yaml are not exactly what the manager calls:\n  {}\n\ncalls (from {}):\n{}\n\n\
         manager output:\n{}",
        problems.join("\n  "),
        audit_log.display(),
        summary(&calls),
        output.join("\n")
    );
    kubectl_ok(
        &env,
        &[
            "delete",
            "lease",
            &lease,
            "-n",
            DEPLOY_NAMESPACE,
            "--ignore-not-found",
        ],
    );
    kubectl_ok(
        &env,
        &[
            "delete",
            "secret",
            WEBHOOK_SECRET,
            "-n",
            DEPLOY_NAMESPACE,
            "--ignore-not-found",
        ],
    );
    std::fs::remove_dir_all(&dir).ok();
    scenario.namespace.cleanup().await;
    scenario.bucket.cleanup().await;
}

#[test]
fn rules_expand_to_each_group_resource_and_verb() {
    let yaml = "kind: ServiceAccount\n---\nkind: ClusterRole\nmetadata: {name: r}\nrules:\n\
                - apiGroups: ['', apps]\n  resources: [pods, statefulsets/status]\n  \
                verbs: [get, patch]\n";
    let granted = granted_permissions(yaml);
    assert_eq!(granted.len(), 8);
    assert!(granted.contains_key(&Permission::new("apps", "statefulsets/status", "patch")));
    assert_eq!(
        granted[&Permission::new("", "pods", "get")],
        "ClusterRole r"
    );
}

#[test]
fn unused_rules_missing_rules_and_refusals_are_all_reported() {
    let granted = granted_permissions(
        "kind: Role\nmetadata: {name: r}\nrules:\n- apiGroups: ['']\n  resources: [pods]\n  \
         verbs: [get, delete]\n",
    );
    let call = |verb: &str, code| Call {
        permission: Permission::new("", "pods", verb),
        code: Some(code),
        uri: format!("/api/v1/pods ({verb})"),
        name: None,
    };
    let problems = differences(
        &[call("get", 200), call("list", 403)],
        &granted,
        &BTreeMap::new(),
    );
    assert_eq!(
        problems,
        [
            "refused: list pods (core) (/api/v1/pods (list))",
            "called but granted by no rule: list pods (core)",
            "granted by Role r but never called: delete pods (core)",
        ]
    );
}

#[test]
fn a_rule_with_resource_names_is_used_only_by_calls_on_those_objects() {
    let granted = granted_permissions(
        "kind: Role\nmetadata: {name: r}\nrules:\n- apiGroups: ['']\n  resources: [secrets]\n  \
         resourceNames: [mine]\n  verbs: [get]\n",
    );
    let get = |name: &str| Call {
        permission: Permission::new("", "secrets", "get"),
        code: Some(200),
        uri: format!("/api/v1/namespaces/x/secrets/{name}"),
        name: Some(name.to_owned()),
    };
    assert!(differences(&[get("mine")], &granted, &BTreeMap::new()).is_empty());
    assert_eq!(
        differences(&[get("theirs")], &granted, &BTreeMap::new()),
        [
            "called but granted by no rule: get secrets (core)",
            "granted by Role r but never called: get secrets (core) named mine",
        ]
    );
}

#[test]
fn an_apply_that_creates_needs_create_too() {
    let apply = |code| Call {
        permission: Permission::new("apps", "statefulsets", "patch"),
        code: Some(code),
        uri: String::new(),
        name: None,
    };
    assert_eq!(apply(200).needs().len(), 1);
    assert_eq!(
        apply(201).needs()[1],
        Permission::new("apps", "statefulsets", "create")
    );
}

#[test]
fn the_token_id_is_the_jwt_jti() {
    // {"jti":"abc-1"} in base64url without padding, between a header and a signature.
    let token = "eyJhbGciOiJSUzI1NiJ9.eyJqdGkiOiJhYmMtMSJ9.c2ln";
    assert_eq!(token_id(token), "abc-1");
}
