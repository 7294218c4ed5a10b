//! Flags that size the agent container of backup and restore Jobs: CPU and memory requests and
//! limits, each a Kubernetes quantity checked when the manager starts (a bad one would otherwise
//! surface only as a Job whose pods the API server refuses, at the first backup).
//!
//! Defaults: the requests reserve what a dump of a small database needs, so a node is not
//! overcommitted by a backup; the memory limit leaves room for the upload buffers of a dump of a
//! few hundred GB (`(parts-in-flight + 1) x` a part size that grows with the object) plus
//! `pg_dump` and zstd, so that an agent that leaks or a huge part is stopped before the node's
//! other pods suffer. The CPU limit only caps a backup's share of a busy node.

use std::collections::BTreeMap;

use clap::Args;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::ArgsError;

/// Requests and limits of the backup and restore agent's container. An empty value sets none.
#[derive(Args, Debug, Clone)]
pub struct AgentResourceArgs {
    /// CPU the backup and restore containers request (a Kubernetes quantity; empty: none).
    #[arg(long, env = "PGKUBE_AGENT_CPU_REQUEST", default_value = "100m",
        value_parser = parse_quantity, value_name = "QUANTITY")]
    pub agent_cpu_request: String,

    /// Memory the backup and restore containers request (a Kubernetes quantity; empty: none).
    #[arg(long, env = "PGKUBE_AGENT_MEMORY_REQUEST", default_value = "256Mi",
        value_parser = parse_quantity, value_name = "QUANTITY")]
    pub agent_memory_request: String,

    /// CPU limit of the backup and restore containers (a Kubernetes quantity; empty: none).
    #[arg(long, env = "PGKUBE_AGENT_CPU_LIMIT", default_value = "2",
        value_parser = parse_quantity, value_name = "QUANTITY")]
    pub agent_cpu_limit: String,

    /// Memory limit of the backup and restore containers (a Kubernetes quantity; empty: none).
    /// Raise it for dumps of more than a few hundred GB or high zstd levels.
    #[arg(long, env = "PGKUBE_AGENT_MEMORY_LIMIT", default_value = "2Gi",
        value_parser = parse_quantity, value_name = "QUANTITY")]
    pub agent_memory_limit: String,
}

impl AgentResourceArgs {
    /// The containers' requirements; a request above its limit is refused, as the API server
    /// would refuse the Job's pods.
    pub fn requirements(&self) -> Result<ResourceRequirements, ArgsError> {
        for (resource, request, limit) in [
            ("cpu", &self.agent_cpu_request, &self.agent_cpu_limit),
            (
                "memory",
                &self.agent_memory_request,
                &self.agent_memory_limit,
            ),
        ] {
            let value = |text: &str| pgkube_controllers::quantity::parse(text);
            if let (Some(request_value), Some(limit_value)) = (value(request), value(limit))
                && request_value > limit_value
            {
                return Err(ArgsError::AgentRequestAboveLimit {
                    resource,
                    request: request.clone(),
                    limit: limit.clone(),
                });
            }
        }
        let map = |pairs: [(&str, &String); 2]| {
            let map: BTreeMap<String, Quantity> = pairs
                .into_iter()
                .filter(|(_, value)| !value.is_empty())
                .map(|(name, value)| (name.to_owned(), Quantity(value.clone())))
                .collect();
            Some(map).filter(|map| !map.is_empty())
        };
        Ok(ResourceRequirements {
            requests: map([
                ("cpu", &self.agent_cpu_request),
                ("memory", &self.agent_memory_request),
            ]),
            limits: map([
                ("cpu", &self.agent_cpu_limit),
                ("memory", &self.agent_memory_limit),
            ]),
            ..ResourceRequirements::default()
        })
    }
}

/// A non-negative Kubernetes quantity (`500m`, `2`, `1.5Gi`, `2e3`), or empty for none.
fn parse_quantity(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(String::new());
    }
    match pgkube_controllers::quantity::parse(text) {
        Some(value) if value >= 0.0 && value.is_finite() => Ok(text.to_owned()),
        _ => Err(format!(
            "`{text}` is not a Kubernetes quantity (examples: 500m, 2, 256Mi, 1.5Gi; empty for none)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;
    use super::*;

    #[test]
    fn defaults_request_a_little_and_limit_memory_and_cpu() {
        let resources = parse(&[]).expect("no flags").agent.requirements();
        let resources = resources.expect("consistent defaults");
        let get = |map: &Option<BTreeMap<String, Quantity>>, name: &str| {
            map.as_ref().and_then(|m| m.get(name)).map(|q| q.0.clone())
        };
        assert_eq!(get(&resources.requests, "cpu").as_deref(), Some("100m"));
        assert_eq!(get(&resources.requests, "memory").as_deref(), Some("256Mi"));
        assert_eq!(get(&resources.limits, "cpu").as_deref(), Some("2"));
        assert_eq!(get(&resources.limits, "memory").as_deref(), Some("2Gi"));
    }

    #[test]
    fn quantities_are_checked_when_the_manager_starts() {
        let error = parse(&["--agent-memory-limit", "2 gigs"]).expect_err("not a quantity");
        let text = error.to_string();
        assert!(
            text.contains("--agent-memory-limit") && text.contains("not a Kubernetes quantity"),
            "{text}"
        );
        assert!(parse(&["--agent-cpu-request", "-1"]).is_err(), "negative");
        let args = parse(&["--agent-cpu-request", "1500m", "--agent-cpu-limit", "1"])
            .expect("each parses");
        assert_eq!(
            args.agent.requirements(),
            Err(ArgsError::AgentRequestAboveLimit {
                resource: "cpu",
                request: "1500m".to_owned(),
                limit: "1".to_owned(),
            })
        );
        let fine = parse(&[
            "--agent-memory-request",
            "1Gi",
            "--agent-memory-limit",
            "1024Mi",
        ]);
        assert!(fine.expect("parses").agent.requirements().is_ok(), "equal");
    }

    #[test]
    fn an_empty_value_sets_no_request_or_limit() {
        let args = parse(&["--agent-cpu-limit", "", "--agent-memory-limit", ""]).expect("parses");
        let resources = args.agent.requirements().expect("no limit to exceed");
        assert_eq!(resources.limits, None);
        assert_eq!(resources.requests.map(|r| r.len()), Some(2));
        let args = parse(&[
            "--agent-cpu-request",
            "",
            "--agent-memory-request",
            "",
            "--agent-cpu-limit",
            "",
            "--agent-memory-limit",
            "",
        ])
        .expect("parses");
        assert_eq!(
            args.agent.requirements(),
            Ok(ResourceRequirements::default())
        );
    }
}
