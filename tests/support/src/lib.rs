//! Test support for pgkube's integration tests.
//!
//! Integration tests run against the local test bed that `tests/testbed/up` starts: a real
//! Kubernetes control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes,
//! a real node whose pods run as local processes, and a storage provisioner), a PostgreSQL
//! server and a Garage S3 server, all on loopback. `up` writes what a test needs to reach them
//! into `target/testbed/env`; this crate reads it and hands out clients and throwaway resources:
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! let Some(env) = pgkube_testkit::testbed() else { return Ok(()) };
//! let client = env.kube_client().await;
//! let namespace = pgkube_testkit::TestNamespace::create(&client, "smoke").await;
//! // ... create objects in namespace.name() ...
//! namespace.cleanup().await;
//! # Ok(())
//! # }
//! ```
//!
//! Every test gets its own namespace, database and bucket, so tests run in parallel. Each of
//! them is removed by `cleanup()`, or on drop (best effort) when a test panics first.
//!
//! # What it offers
//!
//! - [`testbed`]: the [`TestEnv`], or a skip when `PGKUBE_SKIP_TESTBED_TESTS=1` and the test bed
//!   is not running. Kubernetes clients come from it only: [`TestEnv::kube_client`] (admin),
//!   [`TestEnv::kube_client_with_token`] (a bearer token, such as a ServiceAccount's),
//!   [`TestEnv::kube_config`] (to add layers), [`TestEnv::kubeconfig_with_token`] (for a process);
//!   [`TestEnv::kubectl`] and [`TestEnv::s3_client`] too.
//! - [`install_crds`]: installs pgkube's CRDs by server-side apply and waits until they are
//!   Established and served. Every test that needs the CRDs calls it; it is idempotent.
//! - [`TestNamespace`], [`TestDatabase`], [`TestBucket`]: fresh, uniquely named resources.
//! - [`wait_until`]: polling with a timeout and a message naming what was awaited.
//! - [`proxy::Proxy`]: a loopback proxy in front of a test bed server: HTTPS termination,
//!   request recording and transfers broken half way for the S3 server; plain TCP for any
//!   server, the API server included; and a network partition for all of them.
//! - [`cpu_time`] and [`peak_rss_bytes`]: a process's CPU time and peak resident memory, from
//!   `/proc` (benches measure the manager with them).
//! - [`otlp::OtlpReceiver`]: a loopback OTLP/HTTP trace receiver, plain or over TLS with a CA
//!   of its own, that keeps every export request's body for a test to search.
//! - End-to-end clusters on the test bed's real node [`LOCAL_NODE`]:
//!   - [`local_node_scheduling`]: the `nodeSelector` `pgkube.io/testbed-node: local` and the
//!     toleration of the taint `pgkube.io/testbed-node=local:NoSchedule` that put a pod there
//!     (apply it to any pod spec or cluster spec);
//!   - [`TestCluster::builder`]: a `PostgreSQLCluster` (PostgreSQL 15, 1 replica, 1Gi, on the
//!     real node unless changed); `.start(&namespace)` creates it and waits until it is Running
//!     (180 s by default; the error shows the cluster's status and its pods' containers);
//!     [`TestClusterBuilder::extra_spec`] merges JSON into the spec it sends, for fields the
//!     typed spec does not have;
//!   - [`TestCluster::sql`]: a `tokio_postgres` connection to the primary through the cluster's
//!     `-rw` Service, as the superuser from its credentials Secret; [`TestCluster::sql_via`]
//!     through any of its Services ([`ClusterService`]: `-rw`, `-ro`, `-r`), whose addresses
//!     [`TestCluster::addresses_of`] gives; [`TestCluster::pods`] lists its pods with their
//!     role label ([`ROLE_LABEL`]); [`TestCluster::current_primary`],
//!     [`TestCluster::replication_credentials`] and [`TestCluster::wait_condition`] (for example
//!     `ReplicasStreaming`) too; [`TestCluster::delete`] deletes the cluster while the manager
//!     still runs (its finalizer would otherwise hold the namespace);
//!   - [`pod_processes`], [`postmaster_of`] and [`instance_manager_of`]: an instance pod's
//!     processes on this machine, to crash or freeze them with [`send_signal`] ([`Frozen`]
//!     sends `SIGCONT` when dropped, so that a failing test leaves nothing stopped);
//!   - high availability: [`TestCluster::wait_healthy`] (one primary, the replicas streaming
//!     from it, caught up, every pod labelled with its role), [`TestCluster::wait_primary_change`]
//!     (a completed switchover or failover), [`TestCluster::wait_rejoined`] (an old primary
//!     streams from the new one), [`TestCluster::primary_timeline`]; [`RoleSampler`] looks at
//!     the pods every [`SAMPLE_PERIOD`] and checks that no two ever carried
//!     `db.example.com/role=primary` and `-rw` never resolved to two pods;
//!   - [`service_addresses`]: a Service's ready pods' `IP:port`, resolved as the node agent's DNS
//!     does (pods matching the selector), since EndpointSlices cannot hold loopback addresses;
//!   - [`wait_for_cluster_running`], [`wait_for_cluster`] (any status condition) and
//!     [`describe_cluster`] for clusters made otherwise;
//!   - [`TestCluster::sql_to`]: a connection to another database of the primary;
//!     [`TestCluster::sql_to_pod`]: to one instance, whatever its role;
//!     [`TestCluster::wait_writable`]: how long until a write through `-rw` succeeds.
//! - Backups and restores there: [`create_backup`] and [`wait_backup_ended`];
//!   [`restore_of_backup`] or [`restore_of_source`] then [`create_restore`], [`wait_restore`]
//!   and [`wait_restore_ended`] (the error shows the restore's status, as
//!   [`describe_restore`] does), [`restore_jobs`]; [`put_object`] to plant an object in a
//!   bucket; [`cluster_digest`]: every table's row count and content checksum in every
//!   database, to compare a cluster's data before and after a restore.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use pgkube_testkit::{TestCluster, TestNamespace, install_crds, testbed};
//! let Some(env) = testbed() else { return Ok(()) };
//! let client = env.kube_client().await;
//! install_crds(&client).await;
//! let namespace = TestNamespace::create(&client, "e2e").await;
//! // ... start a manager watching namespace.name() ...
//! let cluster = TestCluster::builder("db").start(&namespace).await?;
//! let row = cluster.sql().await?.query_one("SELECT 1", &[]).await?;
//! assert_eq!(row.get::<_, i32>(0), 1);
//! cluster.delete(std::time::Duration::from_secs(60)).await?;
//! // ... stop the manager ...
//! namespace.cleanup().await;
//! # Ok(())
//! # }
//! ```

mod admission;
mod backup;
mod bucket;
mod cluster;
mod conversion;
mod crds;
mod database;
mod describe;
mod env;
mod failover;
mod http;
mod names;
mod namespace;
mod node;
pub mod otlp;
mod partition;
mod process;
pub mod proxy;
mod restore;
pub mod scratch;
mod service;
mod tls;
mod volume;
mod wait;
pub mod wal;
mod writer;

pub use admission::TestAdmission;
pub use backup::{
    ACCESS_KEY_ID_KEY, SECRET_ACCESS_KEY_KEY, backup_config, create_backup, create_s3_secret,
    list_objects, test_storage, wait_backup_ended,
};
pub use bucket::TestBucket;
pub use cluster::{
    ApplicationSecret, CLUSTER_RUNNING_TIMEOUT, ClusterService, InstancePod, LOCAL_NODE,
    LOCAL_NODE_LABEL, LOCAL_NODE_LABEL_VALUE, MAX_CLUSTER_NAME, NodeScheduling, PASSWORD_KEY,
    POSTGRES_PORT, ROLE_LABEL, TestCluster, TestClusterBuilder, USERNAME_KEY,
    WRITE_ATTEMPT_TIMEOUT, condition, credentials_secret_name, local_node_scheduling,
    replication_secret_name, wait_for_cluster, wait_for_cluster_running,
};
pub use conversion::{TestCa, converting_crds, converting_crds_storing};
pub use crds::{CRD_FIELD_MANAGER, install_crds};
pub use database::{TestDatabase, server_started_at};
pub use describe::describe_cluster;
pub use env::{SKIP_ENV_VAR, TestEnv, node_pgkube_binary, testbed};
pub use failover::{RoleSampler, SAMPLE_PERIOD, Sample};
pub use http::{http_get, metric_samples};
pub use names::unique_name;
pub use namespace::TestNamespace;
pub use node::{FrozenNode, LostNode, SECOND_NODE, SECOND_NODE_TAINT, second_node_toleration};
pub use partition::Partition;
pub use process::{
    Frozen, children_of, cpu_time, install_package, instance_manager_of, mount_options,
    peak_rss_bytes, pod_processes, postmaster_of, processes_with_args, processes_with_env,
    send_signal, stat_fields,
};
pub use restore::{
    ClusterDigest, DatabaseDigest, RESTORE_CONDITION, RESTORE_LABEL, TableDigest, cluster_digest,
    create_restore, database_digest, describe_restore, put_object, restore_condition, restore_jobs,
    restore_of_backup, restore_of_source, restore_reason, wait_restore, wait_restore_ended,
};
pub use service::{pod_addresses, service_addresses};
pub use tls::{
    Login, connect, served_certificate, server_tls_secret_name, status_port_answer, verify_full,
    verify_full_with_certificate,
};
pub use wait::wait_until;
pub use writer::{RwWriter, WRITE_PERIOD, Written};

/// Re-exported so tests name S3 and PostgreSQL types without their own dependency on them.
pub use aws_sdk_s3;
pub use tokio_postgres;
