//! Smoke tests proving the test bed is a real Kubernetes, PostgreSQL and S3: each one exercises a
//! behaviour pgkube relies on (schema and CEL validation, StatefulSets with bound and expandable
//! claims on simulated nodes, garbage collection, Jobs, ServiceAccount tokens and RBAC, S3 batch
//! deletes, SQL) against the servers `tests/testbed/up` starts.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, Resource, ResourceExt};
use pgkube_testkit::aws_sdk_s3::primitives::ByteStream;
use pgkube_testkit::aws_sdk_s3::types::{Delete, ObjectIdentifier};
use pgkube_testkit::{TestBucket, TestDatabase, TestNamespace, testbed, wait_until};
use serde::de::DeserializeOwned;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

/// Builds a typed object from JSON, which reads closer to the YAML people know.
fn object<T: DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("test object matches its type")
}

#[tokio::test]
async fn crd_schema_and_cel_rule_reject_invalid_objects() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "smoke-crd").await;
    // A group of its own per run: CRDs are cluster-wide and runs may overlap.
    let group = format!("{}.smoke.pgkube.dev", namespace.name());
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = crds
        .create(&PostParams::default(), &widget_crd(&group))
        .await
        .expect("CRD accepted");
    wait_until("the CRD to be established", TIMEOUT, || async {
        let crd = crds.get(&crd.name_any()).await?;
        let established = crd.status.and_then(|s| s.conditions).is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        Ok(established.then_some(()))
    })
    .await
    .expect("CRD established");

    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let widgets = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace.name(),
        &ApiResource::from_gvk(&gvk),
    );
    let create = |name: &str, spec: serde_json::Value| {
        let mut widget = DynamicObject::new(name, &ApiResource::from_gvk(&gvk));
        widget.data = json!({ "spec": spec });
        let widgets = widgets.clone();
        async move { widgets.create(&PostParams::default(), &widget).await }
    };

    create("good", json!({"replicas": 3, "minReplicas": 1}))
        .await
        .expect("a valid widget is accepted");
    let schema_error = create("too-many", json!({"replicas": 20, "minReplicas": 1}))
        .await
        .expect_err("replicas above the schema maximum is rejected")
        .to_string();
    assert!(schema_error.contains("spec.replicas"), "{schema_error}");
    let cel_error = create("inverted", json!({"replicas": 2, "minReplicas": 5}))
        .await
        .expect_err("the CEL rule rejects minReplicas > replicas")
        .to_string();
    assert!(cel_error.contains("spec.minReplicas"), "{cel_error}");
    assert!(
        cel_error.contains("minReplicas must not exceed replicas"),
        "{cel_error}"
    );

    crds.delete(&crd.name_any(), &DeleteParams::default())
        .await
        .expect("CRD deleted");
    namespace.cleanup().await;
}

fn widget_crd(group: &str) -> CustomResourceDefinition {
    object(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("widgets.{group}") },
        "spec": {
            "group": group,
            "names": { "kind": "Widget", "plural": "widgets", "singular": "widget" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "properties": {
                            "replicas": { "type": "integer", "minimum": 1, "maximum": 10 },
                            "minReplicas": { "type": "integer", "minimum": 0 }
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.minReplicas <= self.replicas",
                            "message": "minReplicas must not exceed replicas",
                            "fieldPath": ".minReplicas"
                        }]
                    }}
                }}
            }]
        }
    }))
}

#[tokio::test]
async fn statefulset_claims_bind_pods_become_ready_and_claims_expand() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "smoke-sts").await;
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), namespace.name());
    statefulsets
        .create(&PostParams::default(), &database_statefulset())
        .await
        .expect("StatefulSet created");

    wait_until("2 ready replicas of StatefulSet db", TIMEOUT, || async {
        let status = statefulsets.get("db").await?.status.unwrap_or_default();
        Ok((status.ready_replicas == Some(2)).then_some(()))
    })
    .await
    .expect("StatefulSet ready");

    let pods = Api::<Pod>::namespaced(client.clone(), namespace.name());
    for pod in pods.list(&ListParams::default()).await.expect("pods") {
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        assert!(node.starts_with("kwok-node-"), "pod on node {node:?}");
    }
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace.name());
    for claim in claims.list(&ListParams::default()).await.expect("claims") {
        let phase = claim.status.and_then(|s| s.phase);
        assert_eq!(
            phase.as_deref(),
            Some("Bound"),
            "claim {:?}",
            claim.metadata.name
        );
    }

    let grow = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    claims
        .patch("data-db-0", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .expect("claim expansion accepted");
    wait_until("claim data-db-0 to report 2Gi", TIMEOUT, || async {
        let claim = claims.get("data-db-0").await?;
        let capacity = claim.status.and_then(|s| s.capacity).unwrap_or_default();
        Ok((capacity.get("storage").map(|q| q.0.as_str()) == Some("2Gi")).then_some(()))
    })
    .await
    .expect("claim expanded");
    namespace.cleanup().await;
}

fn database_statefulset() -> StatefulSet {
    let labels = json!({"app": "db"});
    object(json!({
        "metadata": { "name": "db" },
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "podManagementPolicy": "Parallel",
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": { "containers": [{
                    "name": "postgres",
                    "image": "postgres:16",
                    "volumeMounts": [{ "name": "data", "mountPath": "/var/lib/postgresql/data" }]
                }]}
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": { "requests": { "storage": "1Gi" } }
                }
            }]
        }
    }))
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_its_dependents() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "smoke-gc").await;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), namespace.name());
    let owner = config_maps
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "owner"}})),
        )
        .await
        .expect("owner created");
    let owner_ref = owner
        .controller_owner_ref(&())
        .expect("owner has name and uid");
    let dependent: ConfigMap = object(json!({
        "metadata": { "name": "dependent", "ownerReferences": [owner_ref] }
    }));
    config_maps
        .create(&PostParams::default(), &dependent)
        .await
        .expect("dependent created");

    config_maps
        .delete("owner", &DeleteParams::background())
        .await
        .expect("owner deleted");
    wait_until("the dependent to be garbage-collected", TIMEOUT, || async {
        Ok(config_maps
            .get_opt("dependent")
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .expect("dependent collected");
    namespace.cleanup().await;
}

#[tokio::test]
async fn a_job_creates_a_pod() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "smoke-job").await;
    let job: Job = object(json!({
        "metadata": { "name": "backup" },
        "spec": { "template": { "spec": {
            "restartPolicy": "Never",
            "containers": [{ "name": "main", "image": "busybox", "command": ["true"] }]
        }}}
    }));
    Api::<Job>::namespaced(client.clone(), namespace.name())
        .create(&PostParams::default(), &job)
        .await
        .expect("Job created");

    let pods = Api::<Pod>::namespaced(client.clone(), namespace.name());
    let pod = wait_until("a Pod of Job backup", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("job-name=backup"))
            .await?;
        Ok(list.items.into_iter().next())
    })
    .await
    .expect("Job pod created");
    let owner = pod.owner_references().first().map(|o| o.kind.clone());
    assert_eq!(owner.as_deref(), Some("Job"));
    namespace.cleanup().await;
}

#[tokio::test]
async fn a_service_account_token_authenticates_and_rbac_denies_missing_verbs() {
    let Some(env) = testbed() else { return };
    let admin = env.kube_client().await;
    let namespace = TestNamespace::create(&admin, "smoke-rbac").await;
    let ns = namespace.name();
    create_reader_account(&admin, ns).await;

    let token = Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request("reader", &PostParams::default(), &TokenRequest::default())
        .await
        .expect("token issued")
        .status
        .expect("token request has a status")
        .token;
    let reader = env.kube_client_with_token(&token).await;
    let config_maps = Api::<ConfigMap>::namespaced(reader, ns);

    config_maps
        .list(&ListParams::default())
        .await
        .expect("the token authenticates and the Role allows list");
    let denied = config_maps
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "x"}})),
        )
        .await
        .expect_err("the Role does not allow create");
    match denied {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 Forbidden, got {other}"),
    }
    namespace.cleanup().await;
}

/// ServiceAccount `reader`, bound to a Role that may only get and list ConfigMaps.
async fn create_reader_account(admin: &Client, ns: &str) {
    let pp = PostParams::default();
    let account: ServiceAccount = object(json!({"metadata": {"name": "reader"}}));
    let role: Role = object(json!({
        "metadata": { "name": "configmap-reader" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"] }]
    }));
    let binding: RoleBinding = object(json!({
        "metadata": { "name": "reader" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader" },
        "subjects": [{ "kind": "ServiceAccount", "name": "reader", "namespace": ns }]
    }));
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create(&pp, &account)
        .await
        .expect("ServiceAccount created");
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&pp, &role)
        .await
        .expect("Role created");
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&pp, &binding)
        .await
        .expect("RoleBinding created");
}

#[tokio::test]
async fn s3_put_list_and_batch_delete() {
    let Some(env) = testbed() else { return };
    let bucket = TestBucket::create(&env, "smoke-s3").await;
    let s3 = bucket.client();
    let keys = ["backups/a.dump", "backups/b.dump", "backups/c.dump"];
    for key in keys {
        s3.put_object()
            .bucket(bucket.name())
            .key(key)
            .body(ByteStream::from_static(b"dump"))
            .send()
            .await
            .expect("object stored");
    }

    let listed = list_keys(&s3, bucket.name()).await;
    assert_eq!(listed, keys);

    let objects = keys
        .iter()
        .map(|key| ObjectIdentifier::builder().key(*key).build())
        .collect::<Result<Vec<_>, _>>()
        .expect("object identifiers");
    let deleted = s3
        .delete_objects()
        .bucket(bucket.name())
        .delete(
            Delete::builder()
                .set_objects(Some(objects))
                .build()
                .expect("delete"),
        )
        .send()
        .await
        .expect("batch delete");
    assert_eq!(deleted.deleted().len(), 3, "{deleted:?}");
    assert!(deleted.errors().is_empty(), "{deleted:?}");
    assert!(list_keys(&s3, bucket.name()).await.is_empty());
    bucket.cleanup().await;
}

async fn list_keys(s3: &pgkube_testkit::aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    let page = s3
        .list_objects_v2()
        .bucket(bucket)
        .send()
        .await
        .expect("list");
    page.contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn postgres_create_insert_select() {
    let Some(env) = testbed() else { return };
    let database = TestDatabase::create(&env, "smoke-pg").await;
    let db = database.connect().await;
    db.batch_execute("CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL)")
        .await
        .expect("table created");
    db.execute("INSERT INTO notes VALUES ($1, $2)", &[&1i32, &"hello"])
        .await
        .expect("row inserted");
    let row = db
        .query_one("SELECT body FROM notes WHERE id = $1", &[&1i32])
        .await
        .expect("row selected");
    assert_eq!(row.get::<_, String>(0), "hello");
    drop(db);
    database.cleanup().await;
}
