//! The pgkube library: the backup and restore agent's data path ([`agent`]), which the `pgkube`
//! binary runs as `pgkube agent ...`, and the instance manager ([`instance`]), PID 1 of every
//! PostgreSQL container, run as `pgkube instance ...`; [`telemetry`] sets up logs and traces for
//! them and for the manager. It is a library so that integration tests can drive its
//! parts (the multipart upload and its buffer pool, for one) against the test bed's real S3
//! server; the manager (`pgkube run`) lives in the binary.

// The agent's docs describe its private parts too, as they did when it was only in the binary.
#![allow(rustdoc::private_intra_doc_links)]

pub mod agent;
pub mod instance;
pub mod plugin;
pub mod telemetry;
pub mod tls;
