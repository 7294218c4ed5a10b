//! The manifests in `deploy/` are real: the API server accepts the namespace and RBAC objects,
//! and a manager that authenticates as the `pgkube` ServiceAccount, with only the rights that
//! `deploy/rbac.yaml` grants, wins its Lease and brings a cluster's pods up and reports them in
//! its status without being refused anything. The same holds for the namespaced install
//! (`deploy/namespaced/`): a manager with only the Role in the namespace it watches and the
//! cluster-scoped rules, whose rules are the cluster-wide ones split by scope.
//!
//! The cluster's pods land on the test bed's simulated (kwok) nodes, where nothing runs: their
//! instance managers never answer, so the cluster waits for its primary (phase Creating) and the
//! manager never labels a pod. That right (`patch` on pods) is checked with an access review.

mod manager_common;
mod rbac_common;

use std::time::Duration;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use manager_common::{Manager, RUNNING_TIMEOUT, create_cluster};
use pgkube_crds::PostgreSQLCluster;
use pgkube_testkit::{TestEnv, TestNamespace, install_crds, testbed, wait_for_cluster};
use rbac_common::{Permission, granted_permissions};
use serde::Deserialize as _;
use serde::de::DeserializeOwned;

const DEPLOY_NAMESPACE: &str = "pgkube-system";

fn kubectl_ok(env: &TestEnv, args: &[&str]) -> String {
    let output = env.kubectl().args(args).output().expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("kubectl prints UTF-8")
}

/// A manager that authenticates as ServiceAccount `pgkube` of `account_namespace` (a new
/// token, in a kubeconfig under `dir`), watches `watched` and takes Lease `lease_id` there.
fn start_manager_as_pgkube(
    env: &TestEnv,
    name: &str,
    dir: &std::path::Path,
    account_namespace: &str,
    watched: &str,
    lease_id: &str,
) -> Manager {
    let token = kubectl_ok(env, &["create", "token", "pgkube", "-n", account_namespace]);
    std::fs::create_dir_all(dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, env.kubeconfig_with_token(token.trim()))
        .expect("kubeconfig written");
    Manager::start_with_env(
        env,
        name,
        &[
            "--watch-namespaces",
            watched,
            "--leader-elect",
            "--leader-elect-namespace",
            account_namespace,
            "--leader-elect-id",
            lease_id,
        ],
        &[("KUBECONFIG", kubeconfig.to_str().expect("UTF-8 path"))],
    )
}

/// Creates a 2-replica cluster in `namespace` and waits until both pods are ready and reported
/// (unreachable instance managers): every step ran, the status write included, and the manager
/// was refused nothing.
async fn a_cluster_comes_up_unrefused(client: &kube::Client, manager: &Manager, namespace: &str) {
    let clusters: Api<PostgreSQLCluster> = Api::namespaced(client.clone(), namespace);
    create_cluster(&clusters, "rbac", 2).await;
    let reached = wait_for_cluster(
        client,
        namespace,
        "rbac",
        "2 ready replicas, both instances reported",
        RUNNING_TIMEOUT,
        |cluster| {
            cluster
                .status
                .as_ref()
                .is_some_and(|s| s.ready_replicas == 2 && s.instances.len() == 2)
        },
    )
    .await;
    let output = manager.output().join("\n");
    reached.unwrap_or_else(|error| panic!("{error}\nmanager output:\n{output}"));
    assert!(
        !output.to_lowercase().contains("forbidden"),
        "the manager was refused something:\n{output}"
    );
}

#[tokio::test]
async fn the_manager_runs_with_only_the_rights_of_deploy_rbac() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let root = env!("CARGO_MANIFEST_DIR");
    for file in [
        "manager/namespace.yaml",
        "manager/service-account.yaml",
        "rbac.yaml",
    ] {
        kubectl_ok(&env, &["apply", "-f", &format!("{root}/deploy/{file}")]);
    }
    let dir = std::env::temp_dir().join(format!("pgkube-rbac-{}", std::process::id()));
    let namespace = TestNamespace::create(&client, "deploy-rbac").await;
    let lease_id = format!("pgkube-rbac-{}", std::process::id());
    let mut manager = start_manager_as_pgkube(
        &env,
        "manager-rbac",
        &dir,
        DEPLOY_NAMESPACE,
        namespace.name(),
        &lease_id,
    );
    a_cluster_comes_up_unrefused(&client, &manager, namespace.name()).await;
    let service_account = format!("system:serviceaccount:{DEPLOY_NAMESPACE}:pgkube");
    for (verb, resource) in [
        ("patch", "pods"),
        ("delete", "services"),
        ("create", "secrets"),
    ] {
        let answer = kubectl_ok(
            &env,
            &[
                "auth",
                "can-i",
                verb,
                resource,
                "-n",
                namespace.name(),
                "--as",
                &service_account,
            ],
        );
        assert_eq!(answer.trim(), "yes", "{verb} {resource}");
    }

    manager.terminate();
    assert_eq!(manager.exit_code(Duration::from_secs(30)).await, Some(0));
    kubectl_ok(
        &env,
        &[
            "delete",
            "lease",
            &lease_id,
            "-n",
            DEPLOY_NAMESPACE,
            "--ignore-not-found",
        ],
    );
    std::fs::remove_dir_all(&dir).ok();
    namespace.cleanup().await;
}

/// The objects of kind `kind` in the YAML file `deploy/<file>`.
fn deploy_objects<K: DeserializeOwned>(file: &str, kind: &str) -> Vec<K> {
    let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).expect("YAML"))
        .filter(|value| value["kind"].as_str() == Some(kind))
        .map(|value| serde_yaml::from_value(value).expect("the kind's shape"))
        .collect()
}

fn the_one<K: DeserializeOwned>(file: &str, kind: &str) -> K {
    let mut objects = deploy_objects::<K>(file, kind);
    assert_eq!(objects.len(), 1, "one {kind} in deploy/{file}");
    objects.remove(0)
}

#[test]
fn the_namespaced_install_grants_the_cluster_wide_rules_split_by_scope() {
    let granted = |file: &str| -> BTreeSet<Permission> {
        let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        granted_permissions(&text).into_keys().collect()
    };
    let all = granted("rbac.yaml");
    let namespaced = granted("namespaced/watched-namespace.yaml");
    let cluster_scoped = granted("namespaced/cluster-scope.yaml");
    // tests/rbac_calls.rs shows that the cluster-wide rules are exactly what the manager calls.
    assert_eq!(
        namespaced
            .union(&cluster_scoped)
            .cloned()
            .collect::<BTreeSet<_>>(),
        all,
        "the namespaced install's rules, together, are not the cluster-wide install's"
    );
    assert!(namespaced.is_disjoint(&cluster_scoped));
    const CLUSTER_SCOPED: [&str; 3] = [
        "storageclasses",
        "customresourcedefinitions",
        "mutatingwebhookconfigurations",
    ];
    for Permission { resource, .. } in &cluster_scoped {
        assert!(
            CLUSTER_SCOPED.contains(&resource.as_str()),
            "{resource} is not cluster-scoped: it belongs in the Role"
        );
    }
    for Permission { resource, .. } in &namespaced {
        assert!(
            !CLUSTER_SCOPED.contains(&resource.as_str()),
            "{resource} is cluster-scoped: a Role cannot grant it"
        );
    }
}

/// The namespaced install's RBAC for a manager of ServiceAccount `pgkube` in `deploy`, which
/// watches `watched`: the Role and its binding in `watched`, the leader-election Role in
/// `deploy`, and the cluster-scoped rules under names of this test's. The cluster-scoped
/// objects' names, to delete.
async fn namespaced_install(client: &kube::Client, deploy: &str, watched: &str) -> String {
    let create = PostParams::default();
    let account: ServiceAccount = the_one("manager/service-account.yaml", "ServiceAccount");
    let bound_here = |subjects: &mut Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        for subject in subjects.iter_mut().flatten() {
            subject.namespace = Some(deploy.to_owned());
        }
    };
    let mut account = account;
    account.metadata.namespace = Some(deploy.to_owned());
    Api::<ServiceAccount>::namespaced(client.clone(), deploy)
        .create(&create, &account)
        .await
        .expect("ServiceAccount");
    for (file, namespace) in [
        ("namespaced/watched-namespace.yaml", watched),
        ("manager/service-account.yaml", deploy),
    ] {
        for mut role in deploy_objects::<Role>(file, "Role") {
            role.metadata.namespace = Some(namespace.to_owned());
            Api::<Role>::namespaced(client.clone(), namespace)
                .create(&create, &role)
                .await
                .expect("Role");
        }
        for mut binding in deploy_objects::<RoleBinding>(file, "RoleBinding") {
            binding.metadata.namespace = Some(namespace.to_owned());
            bound_here(&mut binding.subjects);
            Api::<RoleBinding>::namespaced(client.clone(), namespace)
                .create(&create, &binding)
                .await
                .expect("RoleBinding");
        }
    }
    let name = format!("pgkube-cluster-scope-{deploy}");
    let mut role: ClusterRole = the_one("namespaced/cluster-scope.yaml", "ClusterRole");
    role.metadata.name = Some(name.clone());
    Api::<ClusterRole>::all(client.clone())
        .create(&create, &role)
        .await
        .expect("ClusterRole");
    let mut binding: ClusterRoleBinding =
        the_one("namespaced/cluster-scope.yaml", "ClusterRoleBinding");
    binding.metadata.name = Some(name.clone());
    binding.role_ref.name = name.clone();
    bound_here(&mut binding.subjects);
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&create, &binding)
        .await
        .expect("ClusterRoleBinding");
    name
}

#[tokio::test]
async fn the_manager_runs_with_only_a_role_in_the_namespace_it_watches() {
    let Some(env) = testbed() else { return };
    // The kustomization builds: the manager, watching its own namespace, with a Role there and
    // no ClusterRole but the cluster-scoped rules.
    let root = env!("CARGO_MANIFEST_DIR");
    let built = kubectl_ok(&env, &["kustomize", &format!("{root}/deploy/namespaced")]);
    let kinds_and_names: Vec<(String, String)> = serde_yaml::Deserializer::from_str(&built)
        .map(|document| serde_yaml::Value::deserialize(document).expect("YAML"))
        .map(|value| {
            let text = |v: &serde_yaml::Value| v.as_str().unwrap_or_default().to_owned();
            (text(&value["kind"]), text(&value["metadata"]["name"]))
        })
        .collect();
    let has = |kind: &str, name: &str| {
        kinds_and_names
            .iter()
            .any(|(k, n)| (k.as_str(), n.as_str()) == (kind, name))
    };
    assert!(has("Role", "pgkube-manager") && has("RoleBinding", "pgkube-manager"));
    assert!(has("Deployment", "pgkube") && has("ServiceAccount", "pgkube"));
    assert!(has("NetworkPolicy", "pgkube"));
    let cluster_roles: Vec<&str> = kinds_and_names
        .iter()
        .filter(|(kind, _)| kind == "ClusterRole")
        .map(|(_, name)| name.as_str())
        .collect();
    assert_eq!(cluster_roles, ["pgkube-manager-cluster-scope"]);
    assert!(
        built.contains("--watch-namespaces=pgkube-system"),
        "{built}"
    );

    let client = env.kube_client().await;
    install_crds(&client).await;
    let deploy = TestNamespace::create(&client, "ns-install").await;
    let watched = TestNamespace::create(&client, "ns-watched").await;
    let cluster_scope = namespaced_install(&client, deploy.name(), watched.name()).await;
    // The API server takes the manager's NetworkPolicy.
    let mut policy: NetworkPolicy = the_one("manager/network-policy.yaml", "NetworkPolicy");
    policy.metadata.namespace = Some(deploy.name().to_owned());
    Api::<NetworkPolicy>::namespaced(client.clone(), deploy.name())
        .create(&PostParams::default(), &policy)
        .await
        .expect("the manager's NetworkPolicy");
    let dir = std::env::temp_dir().join(format!("pgkube-ns-rbac-{}", std::process::id()));
    let mut manager = start_manager_as_pgkube(
        &env,
        "manager-ns-rbac",
        &dir,
        deploy.name(),
        watched.name(),
        "pgkube-leader",
    );
    a_cluster_comes_up_unrefused(&client, &manager, watched.name()).await;
    // Its rights end at the namespace it watches.
    let account = format!("system:serviceaccount:{}:pgkube", deploy.name());
    let can = |verb: &str, resource: &str, scope: &[&str]| {
        let mut args = vec!["auth", "can-i", verb, resource, "--as", &account];
        args.extend_from_slice(scope);
        let output = env.kubectl().args(&args).output().expect("kubectl runs");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(can("patch", "pods", &["-n", watched.name()]), "yes");
    assert_eq!(can("list", "secrets", &["-n", "default"]), "no");
    assert_eq!(can("list", "statefulsets", &["--all-namespaces"]), "no");

    manager.terminate();
    assert_eq!(manager.exit_code(Duration::from_secs(30)).await, Some(0));
    let delete = DeleteParams::default();
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete(&cluster_scope, &delete)
        .await
        .expect("ClusterRoleBinding deleted");
    Api::<ClusterRole>::all(client.clone())
        .delete(&cluster_scope, &delete)
        .await
        .expect("ClusterRole deleted");
    std::fs::remove_dir_all(&dir).ok();
    watched.cleanup().await;
    deploy.cleanup().await;
}
