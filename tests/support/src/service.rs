//! Resolving a Service to the addresses of its ready pods, as the test bed's node agent does for
//! DNS.
//!
//! Pods on the test bed's real node each get their own loopback address (`127.x.y.z`) as
//! `status.podIP`. EndpointSlices cannot hold loopback addresses (the API server refuses them),
//! so a test resolves a Service itself: the pods matching its selector that are ready (or all
//! of them, for a Service that publishes not-ready addresses), at the Service's target port.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ListParams;
use kube::{Api, Client};

/// The addresses of the pods behind Service `service` in `namespace`, for its first port, in
/// a stable order. Empty when no pod is ready yet.
pub async fn service_addresses(
    client: &Client,
    namespace: &str,
    service: &str,
) -> anyhow::Result<Vec<SocketAddr>> {
    let found = Api::<Service>::namespaced(client.clone(), namespace)
        .get(service)
        .await
        .with_context(|| format!("reading Service {namespace}/{service}"))?;
    let selector = selector_of(&found)?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&label_selector(selector)))
        .await
        .with_context(|| format!("listing the pods of Service {namespace}/{service}"))?;
    pod_addresses(&found, &pods.items)
}

/// The addresses, at the Service's first port, of those of `pods` that the Service routes to.
pub fn pod_addresses(service: &Service, pods: &[Pod]) -> anyhow::Result<Vec<SocketAddr>> {
    let selector = selector_of(service)?;
    let spec = service.spec.as_ref().context("the Service has no spec")?;
    let port = spec
        .ports
        .as_ref()
        .and_then(|ports| ports.first())
        .context("the Service has no port")?;
    let include_not_ready = spec.publish_not_ready_addresses == Some(true);
    let mut addresses: Vec<SocketAddr> = pods
        .iter()
        .filter(|pod| matches_selector(pod, selector))
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && !has_finished(pod))
        .filter(|pod| include_not_ready || is_ready(pod))
        .filter_map(|pod| {
            let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
            Some(SocketAddr::new(ip, target_port(port, pod)?))
        })
        .collect();
    addresses.sort();
    Ok(addresses)
}

fn selector_of(service: &Service) -> anyhow::Result<&BTreeMap<String, String>> {
    service
        .spec
        .as_ref()
        .and_then(|spec| spec.selector.as_ref())
        .filter(|selector| !selector.is_empty())
        .context("the Service has no selector (its endpoints are managed by hand)")
}

/// `k1=v1,k2=v2`.
fn label_selector(selector: &BTreeMap<String, String>) -> String {
    selector
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn matches_selector(pod: &Pod, selector: &BTreeMap<String, String>) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(key, value)| labels.and_then(|l| l.get(key)) == Some(value))
}

/// Whether the pod's `Ready` condition is `True`.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|condition| condition.type_ == "Ready" && condition.status == "True")
}

/// Whether the pod ran to completion or failed for good: no Service routes to it any more.
fn has_finished(pod: &Pod) -> bool {
    let phase = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The pod's port for a Service port: the target port as a number, a named container port of
/// the pod, or the Service's own port when no target is given. `None` when the pod has no
/// container port of that name (the Service does not route to it).
fn target_port(port: &ServicePort, pod: &Pod) -> Option<u16> {
    let number = match &port.target_port {
        None => port.port,
        Some(IntOrString::Int(number)) => *number,
        Some(IntOrString::String(name)) => match name.parse::<i32>() {
            Ok(number) => number,
            Err(_) => {
                pod.spec
                    .as_ref()?
                    .containers
                    .iter()
                    .flat_map(|container| container.ports.iter().flatten())
                    .find(|container_port| container_port.name.as_deref() == Some(name.as_str()))?
                    .container_port
            }
        },
    };
    u16::try_from(number).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, PodCondition, PodSpec, PodStatus, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn service(target: Option<IntOrString>, publish_not_ready: bool) -> Service {
        Service {
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([("app".to_owned(), "pg".to_owned())])),
                ports: Some(vec![ServicePort {
                    port: 5432,
                    target_port: target,
                    ..ServicePort::default()
                }]),
                publish_not_ready_addresses: publish_not_ready.then_some(true),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    fn pod(app: &str, ip: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "postgresql".to_owned(),
                    ports: Some(vec![ContainerPort {
                        name: Some("postgresql".to_owned()),
                        container_port: 15432,
                        ..ContainerPort::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".to_owned()),
                pod_ip: Some(ip.to_owned()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".to_owned(),
                    status: if ready { "True" } else { "False" }.to_owned(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn addresses(service: &Service, pods: &[Pod]) -> Vec<String> {
        pod_addresses(service, pods)
            .expect("resolves")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn ready_matching_pods_at_the_named_target_port_in_order() {
        let pods = [
            pod("pg", "127.0.10.3", true),
            pod("pg", "127.0.10.2", true),
            pod("pg", "127.0.10.4", false),
            pod("other", "127.0.10.5", true),
        ];
        let named = service(Some(IntOrString::String("postgresql".to_owned())), false);
        assert_eq!(
            addresses(&named, &pods),
            ["127.0.10.2:15432", "127.0.10.3:15432"]
        );
    }

    #[test]
    fn numeric_absent_and_unknown_target_ports() {
        let pods = [pod("pg", "127.0.10.2", true)];
        let numeric = service(Some(IntOrString::Int(6000)), false);
        assert_eq!(addresses(&numeric, &pods), ["127.0.10.2:6000"]);
        let numeric_string = service(Some(IntOrString::String("6001".to_owned())), false);
        assert_eq!(addresses(&numeric_string, &pods), ["127.0.10.2:6001"]);
        assert_eq!(addresses(&service(None, false), &pods), ["127.0.10.2:5432"]);
        let unknown = service(Some(IntOrString::String("metrics".to_owned())), false);
        assert!(addresses(&unknown, &pods).is_empty());
    }

    #[test]
    fn not_ready_terminating_finished_and_unaddressed_pods_are_left_out() {
        let mut terminating = pod("pg", "127.0.10.2", true);
        terminating.metadata.deletion_timestamp = Some(Time(Default::default()));
        let mut finished = pod("pg", "127.0.10.3", true);
        if let Some(status) = finished.status.as_mut() {
            status.phase = Some("Succeeded".to_owned());
        }
        let mut pending = pod("pg", "127.0.10.4", true);
        if let Some(status) = pending.status.as_mut() {
            status.pod_ip = None;
        }
        let not_ready = pod("pg", "127.0.10.5", false);
        let pods = [terminating, finished, pending, not_ready];
        assert!(addresses(&service(None, false), &pods).is_empty());
        // A Service that publishes not-ready addresses (a headless one) still skips the
        // terminating, finished and unaddressed pods.
        assert_eq!(addresses(&service(None, true), &pods), ["127.0.10.5:5432"]);
    }

    #[test]
    fn a_service_without_selector_is_an_error() {
        let mut manual = service(None, false);
        if let Some(spec) = manual.spec.as_mut() {
            spec.selector = None;
        }
        let error = pod_addresses(&manual, &[]).expect_err("no selector");
        assert!(error.to_string().contains("no selector"), "{error}");
        assert_eq!(
            label_selector(&BTreeMap::from([
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "2".to_owned())
            ])),
            "a=1,b=2"
        );
    }
}
