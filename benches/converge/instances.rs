//! Stand-ins for the instance managers of pods on the bench's kwok nodes, which never run.
//!
//! The cluster controller calls a cluster Running only when its primary's instance manager
//! answers `GET http://<pod IP>:8000/status` as a ready primary. kwok gives each pod an address
//! from its node's loopback pod CIDR ([`super::nodes`]); for each pod that has one, this binds
//! `<pod IP>:8000` (that address alone, never 0.0.0.0) and answers every request with the report
//! of a healthy primary of that pod, as `pgkube instance` would. A deleted pod's listener goes
//! with it, so that kwok may hand its address to another pod. It speaks no TLS: it answers a
//! handshake as an instance manager without certificates does (in plain HTTP), so the
//! operator's TLS attempt and its plain retry are both in the figures.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// The instance manager's status port (`controllers/src/cluster/instances.rs`).
const STATUS_PORT: u16 = 8000;
/// Largest request head read; the controller's GETs are a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;
/// The first byte of a TLS connection.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Answers for the pods of one namespace on the given nodes, until dropped.
pub struct FakeInstances {
    task: JoinHandle<()>,
}

impl FakeInstances {
    /// Watches the pods of `namespace` and serves a status endpoint for each on `nodes`.
    pub fn start(client: &Client, namespace: &str, nodes: &[String]) -> FakeInstances {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let nodes: BTreeSet<String> = nodes.iter().cloned().collect();
        FakeInstances {
            task: tokio::spawn(serve_pods(pods, nodes)),
        }
    }
}

impl Drop for FakeInstances {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One listener per pod address, with the pod it answers for.
#[derive(Default)]
struct Listeners(HashMap<IpAddr, (String, AbortHandle)>);

impl Listeners {
    fn pod_seen(&mut self, pod: &Pod, nodes: &BTreeSet<String>) {
        let on_our_node = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.node_name.as_ref())
            .is_some_and(|node| nodes.contains(node));
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_ref());
        let Some(ip) = ip.and_then(|ip| ip.parse::<IpAddr>().ok()) else {
            return;
        };
        let name = pod.name_any();
        if !on_our_node || !ip.is_loopback() || pod.metadata.deletion_timestamp.is_some() {
            return self.pod_gone(&name);
        }
        if self.0.get(&ip).is_some_and(|(pod, _)| *pod == name) {
            return;
        }
        self.pod_gone(&name);
        if let Some((_, old)) = self.0.remove(&ip) {
            old.abort();
        }
        let task = tokio::spawn(serve_status(SocketAddr::new(ip, STATUS_PORT), name.clone()));
        self.0.insert(ip, (name, task.abort_handle()));
    }

    fn pod_gone(&mut self, name: &str) {
        self.0.retain(|_, (pod, task)| {
            let gone = pod == name;
            if gone {
                task.abort();
            }
            !gone
        });
    }

    fn clear(&mut self) {
        for (_, (_, task)) in self.0.drain() {
            task.abort();
        }
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        self.clear();
    }
}

async fn serve_pods(pods: Api<Pod>, nodes: BTreeSet<String>) {
    let mut listeners = Listeners::default();
    let mut events = watcher::watcher(pods, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => listeners.pod_seen(&pod, &nodes),
            Ok(Event::Delete(pod)) => listeners.pod_gone(&pod.name_any()),
            Ok(Event::Init | Event::InitDone) => {}
            Err(error) => eprintln!("converge: watching the bench's pods: {error}"),
        }
    }
}

/// Serves `pod`'s status on `address` until aborted.
async fn serve_status(address: SocketAddr, pod: String) {
    let listener = match TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("converge: cannot answer for pod {pod} on {address}: {error}");
            return;
        }
    };
    let body = healthy_primary(&pod).to_string();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(stream, body.clone()));
            }
            Err(error) => eprintln!("converge: accepting on {address}: {error}"),
        }
    }
}

/// Answers each request of a kept-alive connection with `body`; GETs carry no body to skip.
async fn answer(mut stream: TcpStream, body: String) {
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            // A TLS handshake: these pods have no certificates, and an instance manager without
            // them answers in plain HTTP, after which the operator asks in plain HTTP.
            Ok(_) if head.is_empty() && buffer[0] == TLS_HANDSHAKE_RECORD => {
                let refusal = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
                let _ = stream.write_all(refusal.as_bytes()).await;
                return;
            }
            Ok(read) => head.extend_from_slice(&buffer[..read]),
        }
        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.drain(..end + 4);
            if stream.write_all(response.as_bytes()).await.is_err() {
                return;
            }
        }
        if head.len() > MAX_HEAD {
            return;
        }
    }
}

/// What `pgkube instance`'s `GET /status` answers for a ready primary
/// (`controllers/src/cluster/instances.rs`, `InstanceReport`).
fn healthy_primary(pod: &str) -> serde_json::Value {
    serde_json::json!({
        "pod": pod,
        "role": "primary",
        "ready": true,
        "timeline": 1,
        "currentLsn": "0/3000148",
        "streaming": false,
        "pendingRestart": [],
    })
}
