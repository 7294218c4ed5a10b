//! A cluster's status and its namespace's pods, in one paragraph for a failure message.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::ListParams;
use kube::{Api, Client};
use pgkube_crds::PostgreSQLCluster;

/// The cluster's status and its namespace's pods, in one paragraph for a failure message.
pub async fn describe_cluster(client: &Client, namespace: &str, name: &str) -> String {
    let cluster = Api::<PostgreSQLCluster>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|error| error.to_string());
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(|error| error.to_string());
    describe(name, cluster, pods)
}

pub(crate) fn describe(
    name: &str,
    cluster: Result<PostgreSQLCluster, String>,
    pods: Result<Vec<Pod>, String>,
) -> String {
    let cluster = match cluster {
        Ok(cluster) => format!(
            "cluster {name} status {}",
            serde_json::to_string(&cluster.status).unwrap_or_default()
        ),
        Err(error) => format!("cluster {name} unreadable: {error}"),
    };
    let pods = match pods {
        Ok(pods) if pods.is_empty() => "none".to_owned(),
        Ok(pods) => pods
            .iter()
            .map(describe_pod)
            .collect::<Vec<_>>()
            .join(" | "),
        Err(error) => format!("unreadable: {error}"),
    };
    format!("{cluster}; pods: {pods}")
}

/// `name phase node ip [conditions] containers: ...`.
fn describe_pod(pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let node = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.as_deref())
        .unwrap_or("unscheduled");
    let status = pod.status.clone().unwrap_or_default();
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            let message = c.message.as_deref().unwrap_or_default();
            format!("{}={} {message}", c.type_, c.status)
                .trim_end()
                .to_owned()
        })
        .collect();
    let containers: Vec<String> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .map(describe_container)
        .collect();
    format!(
        "{name} {} on {node} ip {} [{}] containers: {}",
        status.phase.as_deref().unwrap_or("?"),
        status.pod_ip.as_deref().unwrap_or("-"),
        conditions.join("; "),
        if containers.is_empty() {
            "none".to_owned()
        } else {
            containers.join(", ")
        }
    )
}

/// `name ready=B restarts=N <state>[, last: <state>]`.
fn describe_container(container: &ContainerStatus) -> String {
    let state = |state: &k8s_openapi::api::core::v1::ContainerState| {
        if let Some(waiting) = &state.waiting {
            format!(
                "waiting {} {}",
                waiting.reason.as_deref().unwrap_or_default(),
                waiting.message.as_deref().unwrap_or_default()
            )
        } else if let Some(terminated) = &state.terminated {
            format!(
                "terminated exit {} {} {}",
                terminated.exit_code,
                terminated.reason.as_deref().unwrap_or_default(),
                terminated.message.as_deref().unwrap_or_default()
            )
        } else if state.running.is_some() {
            "running".to_owned()
        } else {
            "unknown".to_owned()
        }
        .trim_end()
        .to_owned()
    };
    let mut text = format!(
        "{} ready={} restarts={} {}",
        container.name,
        container.ready,
        container.restart_count,
        container.state.as_ref().map(state).unwrap_or_default()
    );
    if let Some(last) = container
        .last_state
        .as_ref()
        .filter(|last| last.terminated.is_some())
    {
        text.push_str(&format!(" (last: {})", state(last)));
    }
    text
}
