//! The bench's own kwok nodes: tainted so that only the bench's pods land on them, with room for
//! 250 pods each, and a pod CIDR on loopback (`127.<m>.<i>.0/24`) from which kwok hands out the
//! pods' addresses, so that the bench can answer for each pod's instance manager there.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Toleration};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use pgkube_testkit::{NodeScheduling, TestEnv, wait_until};

/// Pods a bench node takes; one /24 of addresses each.
pub const PODS_PER_NODE: usize = 250;
/// Label and taint key of the bench's nodes.
const NODE_KEY: &str = "pgkube.io/bench-node";
/// The second byte of the bench's pod addresses: above the 100..250 that the test bed's real
/// node picks its pod network from (tests/testbed/up).
const NETWORK_SECOND_BYTE: u8 = 251;

/// The kwok nodes; deleted with kubectl on drop if [`BenchNodes::delete`] was not called.
pub struct BenchNodes {
    client: Client,
    env: TestEnv,
    names: Vec<String>,
    value: String,
    deleted: bool,
}

impl BenchNodes {
    /// Creates enough nodes for `pods` pods and waits until kwok has made them Ready.
    pub async fn create(env: &TestEnv, client: &Client, value: &str, pods: usize) -> BenchNodes {
        let count = pods.div_ceil(PODS_PER_NODE).max(1);
        let api: Api<Node> = Api::all(client.clone());
        let nodes = BenchNodes {
            client: client.clone(),
            env: env.clone(),
            names: (0..count).map(|i| format!("{value}-{i}")).collect(),
            value: value.to_owned(),
            deleted: false,
        };
        for (index, name) in nodes.names.iter().enumerate() {
            let node = node(name, value, index);
            api.create(&PostParams::default(), &node)
                .await
                .unwrap_or_else(|error| panic!("creating node {name}: {error}"));
        }
        nodes.wait_ready(&api).await;
        nodes
    }

    async fn wait_ready(&self, api: &Api<Node>) {
        wait_until(
            "the bench's kwok nodes to be Ready",
            super::STEP_TIMEOUT,
            || async {
                for name in &self.names {
                    if !is_ready(&api.get(name).await?) {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The node selector and toleration that put a pod on these nodes.
    pub fn scheduling(&self) -> NodeScheduling {
        NodeScheduling {
            node_selector: BTreeMap::from([(NODE_KEY.to_owned(), self.value.clone())]),
            tolerations: vec![Toleration {
                key: Some(NODE_KEY.to_owned()),
                operator: Some("Equal".to_owned()),
                value: Some(self.value.clone()),
                effect: Some("NoSchedule".to_owned()),
                ..Toleration::default()
            }],
        }
    }

    /// Deletes the nodes (their pods should be gone first).
    pub async fn delete(mut self) {
        self.deleted = true;
        let api: Api<Node> = Api::all(self.client.clone());
        for name in &self.names {
            if let Err(error) = api.delete(name, &DeleteParams::default()).await {
                eprintln!("warning: deleting node {name}: {error}");
            }
        }
    }
}

impl Drop for BenchNodes {
    /// After a panic the async client's runtime may be gone: kubectl instead.
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let result = self
            .env
            .kubectl()
            .args(["delete", "node", "--ignore-not-found", "--wait=false"])
            .args(&self.names)
            .output();
        if let Err(error) = result {
            eprintln!("warning: deleting the bench's nodes: {error}");
        }
    }
}

fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// A node that kwok manages (its annotation), with the bench's label and taint.
fn node(name: &str, value: &str, index: usize) -> Node {
    let capacity = serde_json::json!({
        "cpu": "1000", "memory": "4000Gi", "pods": PODS_PER_NODE.to_string(),
    });
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
                NODE_KEY: value,
            },
        },
        "spec": {
            "podCIDR": format!("127.{NETWORK_SECOND_BYTE}.{index}.0/24"),
            "taints": [{"key": NODE_KEY, "value": value, "effect": "NoSchedule"}],
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }))
    .expect("a valid node")
}
