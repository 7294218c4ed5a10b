//! The test bed's real node, `testbed-local`: pods bound to it run as local processes, and the
//! API server, the scheduler and kube-controller-manager see them as a kubelet reports them.
//! These tests run small shell pods (the `busybox` image maps to the host's shell and tools).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, ContainerStateTerminated, ContainerStatus, PersistentVolumeClaim, Pod, PodSpec,
    Secret, Service,
};
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use pgkube_testkit::{
    TestEnv, TestNamespace, http_get, local_node_scheduling, testbed, unique_name, wait_until,
};
use serde_json::json;

const POD_TIMEOUT: Duration = Duration::from_secs(60);

/// A pod on the real node whose one container runs `script` with the host's shell;
/// `container` and `pod` are merged into the container and the pod.
fn shell_pod(
    name: &str,
    script: &str,
    container: serde_json::Value,
    pod: serde_json::Value,
) -> Pod {
    let mut main =
        json!({ "name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script] });
    merge_values(&mut main, container);
    let mut pod_json = json!({
        "metadata": { "name": name, "labels": { "app": name } },
        "spec": { "containers": [main] },
    });
    merge_values(&mut pod_json, pod);
    let mut pod: Pod = serde_json::from_value(pod_json).expect("pod JSON");
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    local_node_scheduling().apply_to_pod(spec);
    pod
}

/// Merges `patch` into `target`: objects merge key by key, anything else replaces.
fn merge_values(target: &mut serde_json::Value, patch: serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(target), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                merge_values(target.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (target, patch) => *target = patch,
    }
}

async fn create_pod(pods: &Api<Pod>, pod: &Pod) -> Pod {
    pods.create(&PostParams::default(), pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod: {e}"))
}

/// Waits until the pod satisfies `done`, showing its status if it never does.
async fn wait_pod(pods: &Api<Pod>, name: &str, what: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    let result = wait_until(&format!("pod {name} {what}"), POD_TIMEOUT, || async {
        let pod = pods.get(name).await?;
        Ok(done(&pod).then_some(pod))
    })
    .await;
    match result {
        Ok(pod) => pod,
        Err(error) => {
            let status = pods.get(name).await.ok().and_then(|p| p.status);
            panic!("{error:#}\nlast status: {status:#?}")
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn first_container(pod: &Pod) -> Option<ContainerStatus> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first().cloned())
}

fn container(pod: &Pod) -> ContainerStatus {
    first_container(pod).expect("a container status")
}

/// Waits until the pod's container runs again after exactly one restart; returns how its first
/// run ended.
async fn wait_for_one_restart(pods: &Api<Pod>, name: &str) -> ContainerStateTerminated {
    let restarted = wait_pod(pods, name, "running again after one restart", |p| {
        first_container(p).is_some_and(|status| {
            status.restart_count == 1 && status.state.is_some_and(|s| s.running.is_some())
        })
    })
    .await;
    container(&restarted)
        .last_state
        .and_then(|s| s.terminated)
        .expect("the first run's end")
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a pod IP")
}

async fn logs(pods: &Api<Pod>, name: &str) -> String {
    pods.logs(name, &LogParams::default())
        .await
        .unwrap_or_else(|e| panic!("logs of {name}: {e}"))
}

async fn setup(prefix: &str) -> Option<(Client, TestNamespace)> {
    let env = testbed()?;
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, prefix).await;
    Some((client, namespace))
}

#[tokio::test]
async fn a_failing_pod_ends_failed_with_its_exit_code_and_termination_message() {
    let Some((client, namespace)) = setup("node-exit").await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    let never = json!({ "spec": { "restartPolicy": "Never" } });
    let message = shell_pod(
        "message",
        "echo 'to the log'; echo 'the reason it stopped' > /dev/termination-log; exit 3",
        json!({}),
        never.clone(),
    );
    let fallback = shell_pod(
        "fallback",
        "echo 'first line'; echo 'last words'; exit 2",
        json!({ "terminationMessagePolicy": "FallbackToLogsOnError" }),
        never,
    );
    create_pod(&pods, &message).await;
    create_pod(&pods, &fallback).await;

    let failed = wait_pod(&pods, "message", "Failed", |p| phase(p) == "Failed").await;
    let terminated = container(&failed)
        .state
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(terminated.exit_code, 3);
    assert_eq!(terminated.reason.as_deref(), Some("Error"));
    assert_eq!(
        terminated.message.as_deref(),
        Some("the reason it stopped\n")
    );
    // `kubectl logs` goes through the API server to the node's kubelet API.
    assert_eq!(logs(&pods, "message").await, "to the log\n");

    let failed = wait_pod(&pods, "fallback", "Failed", |p| phase(p) == "Failed").await;
    let terminated = container(&failed)
        .state
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(terminated.exit_code, 2);
    assert_eq!(
        terminated.message.as_deref(),
        Some("first line\nlast words")
    );
    namespace.cleanup().await;
}

#[tokio::test]
async fn a_job_runs_to_completion() {
    let Some((client, namespace)) = setup("node-job").await else {
        return;
    };
    // The pod sees its own name as hostname, its namespace and address through the downward
    // API, its Secret as a file with the requested mode (behind the kubelet's `..data` link),
    // in its working directory.
    let template = shell_pod(
        "unused",
        r#"test "$(hostname)" = "$POD_NAME" && test "$(cat token)" = s3cr3t &&
           test "$(stat -L -c %a token)" = 400 && echo "done in $POD_NAMESPACE at $POD_IP""#,
        json!({
            "workingDir": "/secret",
            "env": [
                { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
            ],
            "volumeMounts": [{ "name": "secret", "mountPath": "/secret", "readOnly": true }],
        }),
        json!({ "spec": {
            "restartPolicy": "Never",
            "volumes": [{ "name": "secret", "secret": { "secretName": "job-secret", "defaultMode": 0o400 } }],
        } }),
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), namespace.name());
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "job-secret" }, "stringData": { "token": "s3cr3t" },
            }))
            .expect("secret JSON"),
        )
        .await
        .expect("secret created");
    let job: Job = serde_json::from_value(json!({
        "metadata": { "name": "once" },
        "spec": {
            "backoffLimit": 0,
            "template": { "spec": serde_json::to_value(template.spec).expect("pod spec") },
        },
    }))
    .expect("job JSON");
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace.name());
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("job created");
    let complete = wait_until("job once Complete", POD_TIMEOUT, || async {
        let job = jobs.get("once").await?;
        let status = job.status.clone().unwrap_or_default();
        if status.failed.unwrap_or(0) > 0 {
            anyhow::bail!("the job's pod failed: {status:?}");
        }
        let complete = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        Ok(complete.then_some(job))
    })
    .await
    .expect("the job completes");
    assert_eq!(complete.status.and_then(|s| s.succeeded), Some(1));
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    let job_pods = pods
        .list(&kube::api::ListParams::default().labels("job-name=once"))
        .await
        .expect("job pods");
    let pod = job_pods.items.first().expect("one job pod");
    let name = pod.metadata.name.clone().expect("pod name");
    assert_eq!(
        logs(&pods, &name).await,
        format!("done in {} at {}\n", namespace.name(), pod_ip(pod))
    );
    namespace.cleanup().await;
}

#[tokio::test]
async fn a_service_name_resolves_from_inside_another_pod() {
    let Some((client, namespace)) = setup("node-dns").await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace.name());
    // The server listens on 0.0.0.0:8080; on this node that is its own address, so it does not
    // collide with anything else listening on 8080.
    let server = shell_pod(
        "web",
        "mkdir -p /tmp/site && echo hello-from-web > /tmp/site/index.html && cd /tmp/site && exec python3 -m http.server 8080",
        json!({
            "ports": [{ "name": "http", "containerPort": 8080 }],
            "readinessProbe": { "tcpSocket": { "port": "http" }, "periodSeconds": 1 },
            "livenessProbe": { "httpGet": { "path": "/", "port": 8080 }, "periodSeconds": 2 },
        }),
        json!({}),
    );
    create_pod(&pods, &server).await;
    let services: Api<Service> = Api::namespaced(client.clone(), namespace.name());
    services
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "web" },
            "spec": { "selector": { "app": "web" }, "ports": [{ "port": 8080, "targetPort": "http" }] },
        })).expect("service JSON"))
        .await
        .expect("service created");
    let server = wait_pod(&pods, "web", "Ready", is_ready).await;
    let server_ip = pod_ip(&server);

    let fetch = format!(
        "getent hosts web.{ns}.svc && getent hosts web.{ns}.svc.cluster.local && \
         python3 -c \"import urllib.request; print(urllib.request.urlopen('http://web.{ns}.svc:8080/').read().decode().strip())\"",
        ns = namespace.name()
    );
    let client_pod = shell_pod(
        "client",
        &fetch,
        json!({}),
        json!({ "spec": { "restartPolicy": "Never" } }),
    );
    create_pod(&pods, &client_pod).await;
    let client_pod = wait_pod(&pods, "client", "finished", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await;
    let output = logs(&pods, "client").await;
    assert_eq!(phase(&client_pod), "Succeeded", "client output: {output}");
    let lines: Vec<&str> = output.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{server_ip} ")),
        "web.NS.svc resolved as {lines:?}, the server is {server_ip}"
    );
    assert!(
        lines[1].starts_with(&format!("{server_ip} ")),
        "the cluster.local name: {lines:?}"
    );
    assert_eq!(lines[2], "hello-from-web");
    // The test process reaches the pod's address directly too.
    let address = format!("{server_ip}:8080").parse().expect("an address");
    let (status, body) = http_get(address, "/").await.expect("GET the pod");
    assert_eq!((status, body.trim()), (200, "hello-from-web"));
    namespace.cleanup().await;
}

/// PIDs of the processes that belong to the pod with this address (the node agent gives every
/// process of a pod the variable PGKUBE_TESTBED_POD_IP).
fn processes_of_pod(ip: &str) -> Vec<u32> {
    let needle = format!("PGKUBE_TESTBED_POD_IP={ip}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test]
async fn deleting_a_pod_stops_its_processes_within_the_grace_period() {
    let Some((client, namespace)) = setup("node-delete").await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    let out = tempfile_dir();
    // PID 1 ignores SIGTERM: only the SIGKILL at the end of the grace period stops it.
    let stubborn = shell_pod(
        "stubborn",
        "trap '' TERM; sleep 3600 & wait; sleep 3600",
        json!({}),
        json!({ "spec": { "terminationGracePeriodSeconds": 3 } }),
    );
    // This one stops on SIGTERM and says so in a file the test can read afterwards.
    let polite = shell_pod(
        "polite",
        "trap 'echo got-TERM > /out/polite; exit 0' TERM; sleep 3600 & wait",
        json!({ "volumeMounts": [{ "name": "out", "mountPath": "/out" }] }),
        json!({ "spec": {
            "terminationGracePeriodSeconds": 30,
            "volumes": [{ "name": "out", "hostPath": { "path": out.to_str().expect("utf-8 path") } }],
        } }),
    );
    create_pod(&pods, &stubborn).await;
    create_pod(&pods, &polite).await;
    for name in ["stubborn", "polite"] {
        let pod = wait_pod(&pods, name, "Running", |p| phase(p) == "Running").await;
        let ip = pod_ip(&pod);
        // sh and sleep: the pod's processes are there before the deletion.
        wait_until(&format!("two processes of {name}"), POD_TIMEOUT, || async {
            Ok((processes_of_pod(&ip).len() >= 2).then_some(()))
        })
        .await
        .expect("the pod's processes run");
        let started = Instant::now();
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("pod deleted");
        wait_until(
            &format!("{name}'s processes gone"),
            Duration::from_secs(40),
            || async { Ok(processes_of_pod(&ip).is_empty().then_some(())) },
        )
        .await
        .expect("the processes stop");
        let took = started.elapsed();
        match name {
            // Killed when its 3 s ran out, not before.
            "stubborn" => assert!(
                took >= Duration::from_millis(2500),
                "stubborn stopped after {took:?}"
            ),
            // Stopped by SIGTERM, long before its 30 s.
            _ => assert!(
                took < Duration::from_secs(20),
                "polite stopped after {took:?}"
            ),
        }
        wait_until(
            &format!("{name} removed from the API"),
            Duration::from_secs(40),
            || async { Ok(pods.get_opt(name).await?.is_none().then_some(())) },
        )
        .await
        .expect("the pod object goes once its processes are gone");
    }
    assert_eq!(
        std::fs::read_to_string(out.join("polite")).expect("polite's file"),
        "got-TERM\n"
    );
    std::fs::remove_dir_all(&out).ok();
    namespace.cleanup().await;
}

/// A directory for a hostPath volume that any user can write.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique_name("pgkube-node-test"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    set_mode(&dir, 0o777);
    dir
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[tokio::test]
async fn a_restarted_container_and_a_new_pod_keep_the_volume_data() {
    let Some((client, namespace)) = setup("node-volume").await else {
        return;
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace.name());
    claims
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "data" },
            "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "1Gi" } } },
        })).expect("claim JSON"))
        .await
        .expect("claim created");
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    // The first run writes a line and fails; the restart finds the line, adds one and stays.
    let script = "echo run >> /data/runs; if [ \"$(wc -l < /data/runs)\" -ge 2 ]; then exec sleep 3600; fi; exit 1";
    let with_volume = |name: &str, script: &str, pod: serde_json::Value| {
        let mut pod_json = json!({ "spec": {
            "securityContext": { "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999 },
            "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "data" } }],
        } });
        merge_values(&mut pod_json, pod);
        let mount = json!({ "volumeMounts": [{ "name": "data", "mountPath": "/data" }] });
        shell_pod(name, script, mount, pod_json)
    };
    create_pod(&pods, &with_volume("writer", script, json!({}))).await;
    let last = wait_for_one_restart(&pods, "writer").await;
    assert_eq!(last.exit_code, 1);
    pods.delete("writer", &DeleteParams::default().grace_period(1))
        .await
        .expect("writer deleted");
    wait_until("writer gone", POD_TIMEOUT, || async {
        Ok(pods.get_opt("writer").await?.is_none().then_some(()))
    })
    .await
    .expect("writer removed");

    create_pod(
        &pods,
        &with_volume(
            "reader",
            "cat /data/runs; ls -ld /data | cut -d' ' -f1",
            json!({ "spec": { "restartPolicy": "Never" } }),
        ),
    )
    .await;
    let reader = wait_pod(&pods, "reader", "finished", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await;
    let output = logs(&pods, "reader").await;
    assert_eq!(phase(&reader), "Succeeded", "reader output: {output}");
    assert_eq!(
        output, "run\nrun\ndrwxrwsr-x\n",
        "the data and the fsGroup's setgid directory"
    );
    namespace.cleanup().await;
}

#[tokio::test]
async fn an_image_that_is_not_mapped_waits_with_a_clear_reason() {
    let Some((client, namespace)) = setup("node-image").await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    let pod = shell_pod(
        "future",
        "true",
        json!({ "image": "postgres:99" }),
        json!({}),
    );
    create_pod(&pods, &pod).await;
    let waiting = wait_pod(&pods, "future", "waiting on its image", |p| {
        first_container(p)
            .and_then(|c| c.state)
            .and_then(|s| s.waiting)
            .is_some_and(|w| w.reason.as_deref() == Some("ErrImagePull"))
    })
    .await;
    let message = container(&waiting)
        .state
        .and_then(|s| s.waiting)
        .and_then(|w| w.message)
        .unwrap_or_default();
    assert!(
        message.contains("PostgreSQL 99, which is not installed"),
        "{message}"
    );
    assert_eq!(phase(&waiting), "Pending");
    let labels: BTreeMap<String, String> = waiting.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("app").map(String::as_str), Some("future"));
    namespace.cleanup().await;
}

#[tokio::test]
async fn init_containers_run_in_order_and_pgkube_s_image_runs_the_checkout_s_binary() {
    let Some((client, namespace)) = setup("node-init").await else {
        return;
    };
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace.name());
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "settings" },
                "data": { "greeting": "hello", "COLOR": "blue" },
            }))
            .expect("configmap JSON"),
        )
        .await
        .expect("configmap created");
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    let work = json!([{ "name": "work", "mountPath": "/work" }]);
    let pod = shell_pod(
        "ordered",
        "cat /work/order; echo \"$GREETING $COLOR\"",
        json!({
            "volumeMounts": work,
            "env": [{ "name": "GREETING", "valueFrom": { "configMapKeyRef": { "name": "settings", "key": "greeting" } } }],
            "envFrom": [{ "configMapRef": { "name": "settings" } }],
        }),
        json!({ "spec": {
            "restartPolicy": "Never",
            "volumes": [{ "name": "work", "emptyDir": {} }],
            "initContainers": [
                { "name": "first", "image": "busybox:1.36", "command": ["sh", "-c", "echo first > /work/order"],
                  "volumeMounts": work },
                // pgkube's image: its entrypoint is the binary built from this checkout, and it
                // runs as the image's user, 65532.
                { "name": "second", "image": "ghcr.io/pgkube/pgkube:latest", "args": ["--version"],
                  "volumeMounts": work },
                { "name": "third", "image": "busybox:1.36",
                  "command": ["sh", "-c", "echo third >> /work/order"], "volumeMounts": work },
            ],
        } }),
    );
    create_pod(&pods, &pod).await;
    let done = wait_pod(&pods, "ordered", "finished", |p| {
        matches!(phase(p), "Succeeded" | "Failed")
    })
    .await;
    assert_eq!(phase(&done), "Succeeded", "{:#?}", done.status);
    assert_eq!(logs(&pods, "ordered").await, "first\nthird\nhello blue\n");
    let version = pods
        .logs(
            "ordered",
            &LogParams {
                container: Some("second".to_owned()),
                ..LogParams::default()
            },
        )
        .await
        .expect("logs of the pgkube init container");
    assert_eq!(
        version.trim(),
        format!("pgkube {}", env!("CARGO_PKG_VERSION"))
    );
    namespace.cleanup().await;
}

#[tokio::test]
async fn a_failing_liveness_probe_restarts_the_container() {
    let Some((client, namespace)) = setup("node-liveness").await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    // Healthy for its first run only: the marker lives in the container's volume, so the second
    // run finds it and stays healthy.
    let script = "if [ -e /state/restarted ]; then touch /tmp/healthy; else touch /state/restarted; fi; exec sleep 3600";
    let pod = shell_pod(
        "sickly",
        script,
        json!({
            "volumeMounts": [{ "name": "state", "mountPath": "/state" }],
            "livenessProbe": {
                "exec": { "command": ["test", "-e", "/tmp/healthy"] },
                "periodSeconds": 1, "failureThreshold": 2,
            },
        }),
        json!({ "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{ "name": "state", "emptyDir": {} }],
        } }),
    );
    create_pod(&pods, &pod).await;
    let last = wait_for_one_restart(&pods, "sickly").await;
    // `sleep` as PID 1 does not handle SIGTERM: the kill comes at the end of the grace period.
    assert_eq!(last.exit_code, 137, "{last:?}");
    namespace.cleanup().await;
}

#[tokio::test]
async fn a_pod_made_again_after_a_forced_deletion_starts_once_the_old_processes_are_gone() {
    let Some((client, namespace)) = setup("node-force").await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client, namespace.name());
    // Ignores SIGTERM. A forced deletion (grace 0) still leaves it the kubelet's minimum grace
    // period of 2 s before SIGKILL.
    let twin = || {
        shell_pod(
            "twin",
            "trap '' TERM; sleep 3600 & wait; sleep 3600",
            json!({}),
            json!({ "spec": { "terminationGracePeriodSeconds": 3 } }),
        )
    };
    create_pod(&pods, &twin()).await;
    let old = wait_pod(&pods, "twin", "Running", |p| phase(p) == "Running").await;
    let old_ip = pod_ip(&old);
    wait_until("the old pod's processes", POD_TIMEOUT, || async {
        Ok((!processes_of_pod(&old_ip).is_empty()).then_some(()))
    })
    .await
    .expect("the old pod runs");
    pods.delete("twin", &DeleteParams::default().grace_period(0))
        .await
        .expect("forced deletion");
    let deleted = Instant::now();
    // The object is gone at once; the agent still has to stop the processes. Give it the
    // deletion first (a deletion and a new pod of the same name in the same instant reach it
    // as one pod, see tests/testbed/README.md).
    tokio::time::sleep(Duration::from_millis(500)).await;
    create_pod(&pods, &twin()).await;
    let new = wait_pod(&pods, "twin", "Running again", |p| {
        p.metadata.uid != old.metadata.uid && phase(p) == "Running"
    })
    .await;
    assert!(
        processes_of_pod(&old_ip).is_empty(),
        "the old pod's processes outlived its successor's start"
    );
    assert!(
        deleted.elapsed() >= Duration::from_millis(1800),
        "the new pod ran after {:?}, before the old one's 2 s were over",
        deleted.elapsed()
    );
    assert_ne!(pod_ip(&new), old_ip);
    namespace.cleanup().await;
}

/// Runs `command` in the pod's (only) container with `kubectl exec`; its standard output.
async fn exec(env: &TestEnv, namespace: &str, pod: &str, command: &[&str]) -> String {
    let mut kubectl = env.kubectl();
    kubectl
        .args(["--namespace", namespace, "exec", pod, "--"])
        .args(command);
    let output = tokio::task::spawn_blocking(move || kubectl.output())
        .await
        .expect("kubectl's thread")
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl exec {pod} -- {command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A merge patch of an object's `data`.
async fn patch_data<K>(api: &Api<K>, name: &str, data: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": data })),
    )
    .await
    .unwrap_or_else(|e| panic!("patching {name}: {e}"));
}

#[tokio::test]
async fn mounted_secrets_and_config_maps_follow_their_changes_without_a_restart() {
    let Some(env) = testbed() else {
        return;
    };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "node-refresh").await;
    let ns = namespace.name();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "credentials" }, "stringData": { "password": "first" },
            }))
            .expect("secret JSON"),
        )
        .await
        .expect("secret created");
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "settings" },
                "data": { "postgresql.conf": "work_mem = 4MB\n", "pg_hba.conf": "local all all trust\n" },
            }))
            .expect("configmap JSON"),
        )
        .await
        .expect("configmap created");
    let pods: Api<Pod> = Api::namespaced(client, ns);
    // The same ConfigMap mounted whole and, with subPath, as one file: as with a kubelet, the
    // subPath file keeps the content it had when the container started.
    let pod = shell_pod(
        "watcher",
        "exec sleep 3600",
        json!({ "volumeMounts": [
            { "name": "credentials", "mountPath": "/credentials", "readOnly": true },
            { "name": "settings", "mountPath": "/settings", "readOnly": true },
            { "name": "settings", "mountPath": "/pinned.conf", "subPath": "postgresql.conf", "readOnly": true },
        ] }),
        json!({ "spec": { "volumes": [
            { "name": "credentials", "secret": { "secretName": "credentials", "defaultMode": 0o400 } },
            { "name": "settings", "configMap": { "name": "settings" } },
        ] } }),
    );
    create_pod(&pods, &pod).await;
    let running = wait_pod(&pods, "watcher", "Running", |p| phase(p) == "Running").await;
    let started = container(&running).state.and_then(|s| s.running);
    let read = || {
        exec(
            &env,
            ns,
            "watcher",
            &[
                "cat",
                "/credentials/password",
                "/settings/postgresql.conf",
                "/pinned.conf",
            ],
        )
    };
    assert_eq!(read().await, "firstwork_mem = 4MB\nwork_mem = 4MB\n");
    // The kubelet's layout: each key a link into ..data, which a change swaps atomically.
    assert_eq!(
        exec(
            &env,
            ns,
            "watcher",
            &[
                "sh",
                "-c",
                "readlink /credentials/password; stat -L -c %a /credentials/password"
            ],
        )
        .await,
        "..data/password\n400\n"
    );

    patch_data(&secrets, "credentials", json!({ "password": "c2Vjb25k" })).await; // "second"
    patch_data(
        &config_maps,
        "settings",
        json!({ "postgresql.conf": "work_mem = 8MB\n" }),
    )
    .await;
    let updated = wait_until(
        "the watcher sees the new password and settings",
        Duration::from_secs(20),
        || async {
            let seen = read().await;
            Ok((seen == "secondwork_mem = 8MB\nwork_mem = 4MB\n").then_some(()))
        },
    )
    .await;
    if let Err(error) = updated {
        panic!("{error:#}; it reads {:?}", read().await);
    }
    assert_eq!(
        exec(&env, ns, "watcher", &["cat", "/settings/pg_hba.conf"]).await,
        "local all all trust\n",
        "an unchanged key"
    );

    // A deleted Secret leaves the volume as it was (the node looks again at once, and then
    // every 2 s).
    secrets
        .delete("credentials", &DeleteParams::default())
        .await
        .expect("secret deleted");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        exec(&env, ns, "watcher", &["cat", "/credentials/password"]).await,
        "second"
    );
    // All along, the same container: no restart.
    let now = pods.get("watcher").await.expect("the watcher");
    assert_eq!(container(&now).restart_count, 0);
    assert_eq!(container(&now).state.and_then(|s| s.running), started);
    namespace.cleanup().await;
}

#[tokio::test]
async fn a_label_set_on_a_running_pod_moves_a_service_name_to_it_and_away() {
    let Some(env) = testbed() else {
        return;
    };
    let client = env.kube_client().await;
    let namespace = TestNamespace::create(&client, "node-relabel").await;
    let ns = namespace.name();
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    // As the operator's `<cluster>-rw`: it selects the pod that is labelled primary.
    services
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "db-rw" },
            "spec": { "selector": { "app": "db", "role": "primary" }, "ports": [{ "port": 5432 }] },
        })).expect("service JSON"))
        .await
        .expect("service created");
    let pods: Api<Pod> = Api::namespaced(client, ns);
    create_pod(
        &pods,
        &shell_pod("db", "exec sleep 3600", json!({}), json!({})),
    )
    .await;
    create_pod(
        &pods,
        &shell_pod("client", "exec sleep 3600", json!({}), json!({})),
    )
    .await;
    let db = wait_pod(&pods, "db", "Ready", is_ready).await;
    let db_ip = pod_ip(&db);
    wait_pod(&pods, "client", "Ready", is_ready).await;
    // What the client's /etc/hosts says of the Service's names (nothing: no error, no output).
    let resolve = || {
        exec(
            &env,
            ns,
            "client",
            &["sh", "-c", "getent hosts db-rw | cut -d' ' -f1; true"],
        )
    };
    assert_eq!(resolve().await, "", "no pod is primary yet");

    let label = |role: &'static str| {
        let pods = pods.clone();
        async move {
            pods.patch(
                "db",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "role": role } } })),
            )
            .await
            .expect("pod labelled");
        }
    };
    label("primary").await;
    wait_until(
        "db-rw resolves to the db pod in the client",
        Duration::from_secs(20),
        || async { Ok((resolve().await == format!("{db_ip}\n")).then_some(())) },
    )
    .await
    .expect("the name follows the label");
    // The label stays: the node's status updates do not write the pod's old labels back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let labels = pods
        .get("db")
        .await
        .expect("db")
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(labels.get("role").map(String::as_str), Some("primary"));

    label("replica").await;
    wait_until(
        "db-rw no longer resolves in the client",
        Duration::from_secs(20),
        || async { Ok(resolve().await.is_empty().then_some(())) },
    )
    .await
    .expect("the name leaves with the label");
    namespace.cleanup().await;
}
