//! Fields the conversion webhook's types do not know survive round trips through it, with the
//! API server in the loop: the situation of an upgrade, when a newer pgkube's CRDs are installed
//! and an older manager still serves the webhook.
//!
//! The CRDs installed are `pgkube crd`'s with fields added to their schemas (the API server
//! prunes fields a schema lacks, so a newer pgkube's fields are in its schema): in both versions
//! (a cluster's `spec.maintenanceWindow`, `spec.backup.verify` and `status.lastVerifiedBackup`, a
//! backup's `status.verifiedAt`), and in v1beta1 only, inside objects v1alpha1 does not have (a
//! cluster's `spec.storage.iops` and `spec.backup.storage.gcs`, a backup's
//! `status.storage.gcs`). The manager serving the webhook watches another namespace, so that
//! nothing but the test writes these objects.
//!
//! With v1beta1 stored, then v1alpha1: an object written in one version, spec and status, is
//! read in the other, written back in it (a label added), and read again in the first: the
//! same, every field there. Then `pgkube migrate-storage` moves every object back to v1beta1,
//! and each reads as before.

mod conversion_common;
mod manager_common;

use conversion_common::{EXIT_TIMEOUT, STEP_TIMEOUT, holding_the_crds, install, move_storage_to};
use futures::FutureExt as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use manager_common::Manager;
use pgkube_crds::conversion::V1BETA1_FIELDS_ANNOTATION;
use pgkube_crds::{StorageVersion, v1alpha1, v1beta1};
use pgkube_testkit::{
    TestCa, TestNamespace, converting_crds_storing, install_crds, testbed, wait_until,
};
use serde_json::{Value, json};

#[tokio::test]
async fn fields_the_webhook_does_not_know_survive_round_trips_through_it() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    holding_the_crds(&client.clone(), async move {
        install_crds(&client).await;
        let namespace = TestNamespace::create(&client, "conversion-fields").await;
        let ns = namespace.name().to_owned();
        let ca = TestCa::new();
        let dir = ca.serving_certificate_dir("conversion-fields");
        let idle = format!("{ns}-unwatched");
        let mut manager = Manager::start(
            &env,
            "manager-conversion-fields",
            &[
                "--watch-namespaces",
                &idle,
                "--webhook-bind-address",
                "127.0.0.1:0",
                "--webhook-cert-dir",
                &dir.to_string_lossy(),
            ],
        );
        let address = manager.endpoint("webhook").await;
        let crds = |storage| newer_crds(converting_crds_storing(address, &ca.pem(), storage));

        let back = StorageVersion::V1beta1;
        let scenario = async {
            for storage in [StorageVersion::V1beta1, StorageVersion::V1alpha1] {
                install(&client, &crds(storage), true).await;
                round_trips(&client, &ns, storage).await;
            }
            // `pgkube migrate-storage` rewrites every object in v1beta1 again, through the
            // webhook: nothing lost, the fields only v1beta1 has included (those written while
            // v1alpha1 was stored were carried in its annotation).
            let before = snapshot(&client, &ns).await;
            assert_eq!(before.len(), 6, "four clusters and two backups");
            move_storage_to(&env, &client, &crds(back), back).await;
            assert_eq!(snapshot(&client, &ns).await, before);
        };
        let outcome = std::panic::AssertUnwindSafe(scenario).catch_unwind().await;
        if let Err(panic) = outcome {
            // Every object stored in v1beta1 again, so that the v1beta1-only CRDs can be put
            // back.
            move_storage_to(&env, &client, &crds(back), back).await;
            panic!("{}\n{}", message_of(&panic), manager.output().join("\n"));
        }
        conversion_common::restore_crds(&client).await;
        namespace.cleanup_without_controllers().await;
        manager.terminate();
        assert_eq!(manager.exit_code(EXIT_TIMEOUT).await, Some(0));
        let _ = std::fs::remove_dir_all(dir);
    })
    .await;
}

/// Every cluster and backup of `ns` as read in v1beta1: name, labels, annotations, spec and
/// status.
async fn snapshot(client: &Client, ns: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for resource in [
        resource::<v1beta1::PostgreSQLCluster>(),
        resource::<v1beta1::PostgreSQLBackup>(),
    ] {
        // A CRD just changed (migrate-storage sets its storedVersions) is served again after a
        // moment.
        let api = api(client, ns, &resource);
        let list = wait_until("a list in v1beta1", STEP_TIMEOUT, || async {
            Ok(api.list(&Default::default()).await.ok())
        })
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
        for object in list.items {
            let object = serde_json::to_value(object).expect("JSON");
            let metadata = &object["metadata"];
            objects.push(json!([
                metadata["name"],
                metadata["labels"],
                metadata["annotations"],
                object["spec"],
                object["status"],
            ]));
        }
    }
    objects
}

fn message_of(panic: &Box<dyn std::any::Any + Send>) -> String {
    (panic.downcast_ref::<String>().cloned())
        .or_else(|| panic.downcast_ref::<&str>().map(|m| (*m).to_owned()))
        .unwrap_or_default()
}

/// Adds a newer pgkube's fields to `pgkube crd`'s schemas (see the module's doc).
fn newer_crds(crds: Vec<CustomResourceDefinition>) -> Vec<CustomResourceDefinition> {
    let text = json!({"type": "string", "maxLength": 63});
    let gcs = json!({"type": "object", "properties": {"bucket": text}});
    crds.into_iter()
        .map(|crd| {
            let mut value = serde_json::to_value(&crd).expect("CRD as JSON");
            let kind = crd.spec.names.kind.as_str();
            for version in ["v1alpha1", "v1beta1"] {
                let mut add = |path: &[&str], name: &str, schema: &Value| {
                    add_property(&mut value, version, path, name, schema.clone());
                };
                match kind {
                    "PostgreSQLCluster" => {
                        add(&["spec"], "maintenanceWindow", &text);
                        add(&["spec", "backup"], "verify", &json!({"type": "boolean"}));
                        add(&["status"], "lastVerifiedBackup", &text);
                        if version == "v1beta1" {
                            add(&["spec", "storage"], "iops", &json!({"type": "integer"}));
                            add(&["spec", "backup", "storage"], "gcs", &gcs);
                        }
                    }
                    "PostgreSQLBackup" => {
                        add(&["status"], "verifiedAt", &text);
                        if version == "v1beta1" {
                            add(&["status", "storage"], "gcs", &gcs);
                        }
                    }
                    _ => {}
                }
            }
            serde_json::from_value(value).expect("a CRD")
        })
        .collect()
}

/// Adds property `name` with `schema` to the object at `path` of `version`'s schema.
fn add_property(crd: &mut Value, version: &str, path: &[&str], name: &str, schema: Value) {
    let versions = crd["spec"]["versions"].as_array_mut().expect("versions");
    let served = (versions.iter_mut())
        .find(|v| v["name"] == version)
        .expect("the version");
    let mut object = &mut served["schema"]["openAPIV3Schema"];
    for step in path {
        object = &mut object["properties"][*step];
    }
    assert_eq!(object["type"], "object", "{path:?} of {version}");
    object["properties"][name] = schema;
}

fn api(client: &Client, ns: &str, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, resource)
}

fn resource<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

/// The round trips of one storage version: a cluster written in each version, and a backup
/// whose status is written in v1beta1.
async fn round_trips(client: &Client, ns: &str, storage: StorageVersion) {
    let alpha_clusters = resource::<v1alpha1::PostgreSQLCluster>();
    let beta_clusters = resource::<v1beta1::PostgreSQLCluster>();
    let suffix = storage.name();

    let written = cluster_in_v1beta1(&format!("from-beta-{suffix}"));
    let status = json!({"lastVerifiedBackup": "nightly-1", "observedGeneration": 1});
    let first = write(client, ns, &beta_clusters, written, status).await;
    let in_alpha = read(client, ns, &alpha_clusters, &first).await;
    // In v1alpha1: the fields both versions have at their place, the others carried.
    assert_eq!(in_alpha["spec"]["maintenanceWindow"], "Sun 03:00");
    assert_eq!(in_alpha["spec"]["backup"]["verify"], true);
    assert_eq!(
        in_alpha["spec"]["backup"]["s3"],
        first["spec"]["backup"]["storage"]["s3"]
    );
    assert_eq!(in_alpha["status"]["lastVerifiedBackup"], "nightly-1");
    let carried = in_alpha["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION]
        .as_str()
        .map(|text| serde_json::from_str::<Value>(text).expect("JSON"));
    assert_eq!(
        carried,
        Some(json!({"spec": {
            "backup": {"storage": {"gcs": {"bucket": "elsewhere"}}},
            "storage": {"iops": 3000, "storageClassName": "fast-ssd"},
        }}))
    );
    round_trip(
        client,
        ns,
        &alpha_clusters,
        &beta_clusters,
        in_alpha,
        &first,
    )
    .await;

    let written = cluster_in_v1alpha1(&format!("from-alpha-{suffix}"));
    let status = json!({"lastVerifiedBackup": "nightly-2"});
    let first = write(client, ns, &alpha_clusters, written, status).await;
    let in_beta = read(client, ns, &beta_clusters, &first).await;
    assert_eq!(in_beta["spec"]["maintenanceWindow"], "Mon 04:00");
    assert_eq!(in_beta["spec"]["backup"]["verify"], false);
    assert_eq!(in_beta["spec"]["backup"]["retention"]["days"], 9);
    assert_eq!(in_beta["status"]["lastVerifiedBackup"], "nightly-2");
    round_trip(client, ns, &beta_clusters, &alpha_clusters, in_beta, &first).await;

    // A status field only v1beta1 has, written and written back through the status
    // subresource: the API server takes the status from the request in the request's version
    // and converts the object for storage after, so the annotation that carries the field in
    // v1alpha1 is stored too.
    backup_status_round_trip(client, ns, suffix).await;
}

/// Writes the backup's status in v1beta1, with fields v1alpha1 lacks, and round-trips it
/// through v1alpha1.
async fn backup_status_round_trip(client: &Client, ns: &str, suffix: &str) {
    let alpha_backups = resource::<v1alpha1::PostgreSQLBackup>();
    let beta_backups = resource::<v1beta1::PostgreSQLBackup>();
    let written = json!({
        "apiVersion": v1beta1::API_VERSION, "kind": "PostgreSQLBackup",
        "metadata": {"name": format!("backup-{suffix}")},
        "spec": {"cluster": {"name": "from-beta"}, "method": "Logical"},
    });
    let status = json!({
        "phase": "Completed",
        "verifiedAt": "2026-01-02T03:04:05Z",
        "storage": {"s3": s3(), "gcs": {"bucket": "elsewhere"}},
    });
    let first = write(client, ns, &beta_backups, written, status).await;
    assert_eq!(first["status"]["storage"]["gcs"]["bucket"], "elsewhere");
    let in_alpha = read(client, ns, &alpha_backups, &first).await;
    assert_eq!(
        in_alpha["status"]["storage"],
        first["status"]["storage"]["s3"]
    );
    assert_eq!(in_alpha["status"]["verifiedAt"], "2026-01-02T03:04:05Z");
    round_trip(client, ns, &alpha_backups, &beta_backups, in_alpha, &first).await;
}

fn s3() -> Value {
    json!({"bucket": "pg-backups", "region": "garage", "credentials": {
        "accessKeyId": {"name": "s3", "key": "id"},
        "secretAccessKey": {"name": "s3", "key": "secret"},
    }})
}

fn cluster_in_v1beta1(name: &str) -> Value {
    json!({
        "apiVersion": v1beta1::API_VERSION, "kind": "PostgreSQLCluster",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1, "postgresVersion": "16", "maintenanceWindow": "Sun 03:00",
            "storage": {"size": "1Gi", "storageClassName": "fast-ssd", "iops": 3000},
            "backup": {
                "schedule": {"cron": "0 3 * * *", "suspend": true},
                "verify": true,
                "storage": {"s3": s3(), "gcs": {"bucket": "elsewhere"}},
            },
        },
    })
}

fn cluster_in_v1alpha1(name: &str) -> Value {
    json!({
        "apiVersion": v1alpha1::API_VERSION, "kind": "PostgreSQLCluster",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1, "version": "16", "storage": "1Gi", "maintenanceWindow": "Mon 04:00",
            "backup": {"schedule": "0 4 * * *", "retentionDays": 9, "verify": false, "s3": s3()},
        },
    })
}

/// Creates `object` with `resource`'s version, writes `status` through the status subresource
/// in that version, and reads it back.
async fn write(
    client: &Client,
    ns: &str,
    resource: &ApiResource,
    object: Value,
    status: Value,
) -> Value {
    let api = api(client, ns, resource);
    let object: DynamicObject = serde_json::from_value(object).expect("an object");
    let name = object.metadata.name.clone().expect("a name");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|error| panic!("creating {name} in {}: {error}", resource.version));
    let patch = Patch::Merge(json!({"status": status}));
    let written = api
        .patch_status(&name, &PatchParams::default(), &patch)
        .await
        .unwrap_or_else(|error| panic!("status of {name} in {}: {error}", resource.version));
    serde_json::to_value(written).expect("JSON")
}

/// `first`, read with `resource`'s version.
async fn read(client: &Client, ns: &str, resource: &ApiResource, first: &Value) -> Value {
    let name = first["metadata"]["name"].as_str().expect("a name");
    let read = api(client, ns, resource)
        .get(name)
        .await
        .unwrap_or_else(|error| panic!("reading {name} in {}: {error}", resource.version));
    serde_json::to_value(read).expect("JSON")
}

/// Writes `other` (read in `other_resource`'s version) back in that version, a label added to
/// it and its status written too, then reads it in `first_resource`'s version: the same as
/// `first` but for the label (and what the API server changes on every write).
async fn round_trip(
    client: &Client,
    ns: &str,
    other_resource: &ApiResource,
    first_resource: &ApiResource,
    mut other: Value,
    first: &Value,
) {
    let name = first["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned();
    other["metadata"]["labels"]["round-trip"] = json!(other_resource.version);
    let other: DynamicObject = serde_json::from_value(other).expect("an object");
    let api = api(client, ns, other_resource);
    let replaced = api
        .replace(&name, &PostParams::default(), &other)
        .await
        .unwrap_or_else(|error| {
            panic!("writing {name} back in {}: {error}", other_resource.version)
        });
    api.replace_status(&name, &PostParams::default(), &replaced)
        .await
        .unwrap_or_else(|error| panic!("writing {name}'s status back: {error}"));

    let last = read(client, ns, first_resource, first).await;
    for part in ["spec", "status"] {
        assert_eq!(last[part], first[part], "{part} of {name}");
    }
    let mut labels = last["metadata"]["labels"].clone();
    assert_eq!(labels["round-trip"], json!(other_resource.version));
    labels.as_object_mut().map(|l| l.remove("round-trip"));
    assert_eq!(
        labels,
        first["metadata"]
            .get("labels")
            .cloned()
            .unwrap_or(json!({}))
    );
    assert_eq!(
        last["metadata"].get("annotations"),
        first["metadata"].get("annotations"),
        "annotations of {name}"
    );
}
