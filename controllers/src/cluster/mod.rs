//! The PostgreSQLCluster controller.
//!
//! Each reconcile is a pipeline (`pipeline`), one span per step under the root span
//! `reconcile`: `read` the live children from the watch caches (no request: see `cache`) and
//! ask each pod's instance manager for its status -> high availability, before and apart from
//! the children (`ha`): a switchover or failover is decided and recorded in the status in a
//! reconcile of its own (span `designate`), or the recorded state is carried through with the
//! pods' role `labels` and the `commands` to the instance managers -> `validate` the spec
//! against the live children (pure) -> `build` the desired children (pure) -> `apply` what
//! differs with server-side apply (building and comparing are skipped while nothing they
//! depend on changed since the children were last found up to date: see `settled`) -> the
//! `bootstrap` restore, only over a database this cluster made ([`identity`]) -> write the
//! `status` when it changed (`report`; a change of details alone, shortly after a
//! transition, waits a few seconds: see `status::details_hold`), with an Event for each
//! change. An unchanged, ready cluster makes no write at all. Status writes carry the
//! resourceVersion they were computed from: one computed from a cache that lags is refused,
//! and the reconcile looks again, so a lagging cache never undoes a recorded decision.
//!
//! Wiring (the watches, the finalizer, the error policy) is in `controller`; what reconciles
//! share in `context`.
//!
//! Roles: one instance is the designated primary (`status.currentPrimary`, else the first
//! instance of a new cluster); the others stream from it. The `-rw` Service routes to the pod
//! labelled primary, `-ro` to the replicas, `-r` to any ready instance (see `roles`). While the
//! cluster has pods, it is looked at again every [`INSTANCE_REFRESH`] to refresh what the
//! instances report (reads only; a write only when something changed), or every
//! [`SOLE_INSTANCE_REFRESH`] when it is one running instance that matches its spec.
//!
//! A change Kubernetes cannot make in place (shrinking volumes, a new major version) is held
//! back: validation keeps the running value for it, the rest of the spec is applied as usual
//! and the refusal shows in the Progressing condition. An invalid spec applies nothing.
//!
//! Errors go to [`error_policy`], which retries each object with its own exponential backoff,
//! never longer than the failover pace for a cluster with standbys; waiting for pods is a plain
//! timed requeue. The finalizer [`CLEANUP_FINALIZER`](pgkube_crds::CLEANUP_FINALIZER) gives deletion
//! a hook that does not depend on the spec being valid; children are removed by the garbage
//! collector through their owner references, and backup data is never touched. The manager's
//! admission webhook normally puts the finalizer on a cluster as it is created; when it did not
//! (not installed, or not reachable then), the first reconcile adds it and does nothing else,
//! and the next, on that write's echo, goes on.

mod apply;
pub mod backups;
mod bootstrap;
pub mod build;
mod cache;
pub mod certificates;
mod context;
mod controller;
mod drift;
mod echoes;
pub mod failover;
mod ha;
pub mod identity;
mod in_place;
pub mod instances;
pub mod manager_upgrade;
mod memory;
pub mod own_certificate;
mod pipeline;
mod read;
mod recovery;
mod report;
pub mod restores;
pub mod roles;
pub mod rollout;
mod settled;
pub mod status;
pub mod validate;

use std::time::Duration;

use kube::ResourceExt;
use pgkube_crds::PostgreSQLCluster;

pub use context::ClusterContext;
pub use controller::{ClusterController, error_policy, reconcile};

/// Name of this controller in metrics, spans and logs.
pub const CONTROLLER: &str = "cluster";
/// Field manager of every child this controller applies.
pub const FIELD_MANAGER: &str = "pgkube";
/// Field manager of the status fields this controller writes. Distinct from the one of other
/// writers of the cluster's status (the backup scheduler): server-side apply removes fields a
/// manager stops sending, so two writers sharing a manager would erase each other's fields.
pub const STATUS_FIELD_MANAGER: &str = "pgkube-cluster";
/// How soon to look again while pods are starting or a change is rolling out.
const WAIT_REQUEUE: Duration = Duration::from_secs(10);
/// How often the instances of a cluster that has pods are asked for their status.
pub const INSTANCE_REFRESH: Duration = Duration::from_secs(15);
/// The same for a running cluster of one instance that matches its spec. It has no standby to
/// fail over to, and a change of its readiness comes at once through its StatefulSet's status
/// (the pod's readiness probe asks the same instance manager every 2 s); asking it every 15 s
/// would mostly find the same report, at a cost that grows with the number of clusters.
pub const SOLE_INSTANCE_REFRESH: Duration = Duration::from_secs(60);

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {kind} {name}: {source}")]
    Kube {
        action: &'static str,
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot encode a child as JSON: {0}")]
    Serialize(#[source] serde_json::Error),
    #[error("the cluster has no namespace")]
    MissingNamespace,
    /// The storage a point-in-time recovery reads from cannot be read now.
    #[error("cannot read the recovery source: {0}")]
    RecoverySource(String),
    #[error("internal error: {0}")]
    Invariant(&'static str),
    #[error("cannot issue the TLS certificate of Secret {secret}: {source}")]
    Certificate {
        secret: String,
        #[source]
        source: crate::pki::PkiError,
    },
    #[error("Secret {secret} holds no CA certificate and key (ca.crt, ca.key)")]
    CertificateAuthority { secret: String },
    /// The server certificate of `spec.certificates` cannot serve the cluster.
    #[error("the server certificate of Secret {secret} (spec.certificates) cannot be used: {why}")]
    OwnCertificate { secret: String, why: String },
    /// A status write computed from a cluster older than the API server's: the cache lags.
    #[error("the cache of cluster {name} lags behind the API server")]
    Stale { name: String },
    #[error(transparent)]
    Cache(#[from] cache::CacheError),
    #[error(transparent)]
    Finalizer(#[from] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// A write refused because it was computed from a cluster the cache had not caught up
    /// with: not a failure, the reconcile looks again at once.
    pub(super) fn is_stale(&self) -> bool {
        matches!(self, Error::Stale { .. })
    }

    /// The API server refused a write because the namespace is being deleted: it creates
    /// nothing new in such a namespace (its admission names the cause `NamespaceTerminating`).
    pub(super) fn is_namespace_terminating(&self) -> bool {
        let Error::Kube {
            source: kube::Error::Api(status),
            ..
        } = self
        else {
            return false;
        };
        status.details.as_ref().is_some_and(|details| {
            details
                .causes
                .iter()
                .any(|cause| cause.reason == "NamespaceTerminating")
        })
    }
}

/// `namespace/name` of `cluster`: its key in the controller's per-cluster records.
fn cluster_key(cluster: &PostgreSQLCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A failed apply of a StatefulSet with `status`, the API server's answer.
    fn refused_apply(status: serde_json::Value) -> Error {
        Error::Kube {
            action: "apply",
            kind: "StatefulSet".to_owned(),
            name: "pg-postgresql".to_owned(),
            source: kube::Error::Api(Box::new(serde_json::from_value(status).expect("a Status"))),
        }
    }

    /// The API server's answer to a server-side apply that would create an object in a
    /// namespace being deleted (as the test bed's API server sent it).
    fn namespace_terminating() -> serde_json::Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "statefulsets.apps \"pg-postgresql\" is forbidden: unable to create new content in namespace team-a because it is being terminated",
            "reason": "Forbidden",
            "details": {
                "name": "pg-postgresql",
                "group": "apps",
                "kind": "statefulsets",
                "causes": [{
                    "reason": "NamespaceTerminating",
                    "message": "namespace team-a is being terminated",
                    "field": "metadata.namespace"
                }]
            },
            "code": 403
        })
    }

    #[test]
    fn a_write_refused_because_the_namespace_is_being_deleted_is_told_apart() {
        assert!(refused_apply(namespace_terminating()).is_namespace_terminating());
    }

    #[test]
    fn other_refusals_are_not_taken_for_a_namespace_deletion() {
        let forbidden_by_rbac = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "statefulsets.apps \"pg-postgresql\" is forbidden: User \"system:serviceaccount:pgkube:pgkube\" cannot patch resource \"statefulsets\"",
            "reason": "Forbidden",
            "details": {"name": "pg-postgresql", "group": "apps", "kind": "statefulsets"},
            "code": 403
        });
        assert!(!refused_apply(forbidden_by_rbac).is_namespace_terminating());
        assert!(!Error::MissingNamespace.is_namespace_terminating());
    }
}
