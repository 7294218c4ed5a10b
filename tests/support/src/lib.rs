//! Test support for pgkube's integration tests.
//!
//! Integration tests run against the local test bed that `tests/testbed/up` starts: a real
//! Kubernetes control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes and
//! a storage provisioner), a PostgreSQL server and a Garage S3 server, all on 127.0.0.1. `up`
//! writes what a test needs to reach them into `target/testbed/env`; this crate reads it and
//! hands out clients and throwaway resources:
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
//! Kubernetes clients come from [`TestEnv`] only ([`TestEnv::kube_client`],
//! [`TestEnv::kube_client_with_token`], [`TestEnv::kube_config`] to add layers), and every test
//! that needs pgkube's CRDs installs them with [`install_crds`].

mod bucket;
mod crds;
mod database;
mod env;
mod names;
mod namespace;
mod wait;

pub use bucket::TestBucket;
pub use crds::{CRD_FIELD_MANAGER, install_crds};
pub use database::TestDatabase;
pub use env::{SKIP_ENV_VAR, TestEnv, testbed};
pub use namespace::TestNamespace;
pub use wait::wait_until;

/// Re-exported so tests name S3 and PostgreSQL types without their own dependency on them.
pub use aws_sdk_s3;
pub use tokio_postgres;
