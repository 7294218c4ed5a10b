//! S3-compatible object storage: the one S3 client of the project.
//!
//! The backup agent (`pgkube agent`) and the controllers that read or prune backups (retention,
//! verification) all build their client here, from the same [`S3Options`], so that every part of
//! pgkube talks to a store the same way:
//!
//! - **Compatibility**: checksums are computed and validated only when an operation requires
//!   them (newer SDK defaults send CRC headers that Garage, Ceph RGW and older MinIO reject), and
//!   path-style addressing is a switch.
//! - **TLS**: a [`CaBundle`] of private CAs can be trusted in addition to the system roots. Part
//!   uploads carry a SigV4 payload hash only over plain HTTP ([`S3Bucket::sign_payloads`]), where
//!   it is the only strong check that the store received the bytes sent; over HTTPS, TLS already
//!   authenticates every byte in transit.
//! - **Retries**: transient errors (throttling, 5xx, connection resets) are retried by the SDK's
//!   standard strategy with exponential backoff, [`S3Options::max_attempts`] attempts per request.
//! - **Credentials** ([`CredentialSource`]): static keys, with a session token for temporary
//!   credentials, or else the SDK's default chain (environment, shared profile files, web
//!   identity / IRSA, container credentials, EC2 instance metadata).
//! - **Errors** ([`StorageError`], [`s3_error`]): one line that names the operation and the key,
//!   never a credential or a signed request.
//!
//! This module makes no request by itself except those its callers ask for; building a client
//! only validates the settings.

mod client;
mod credentials;
mod error;
pub mod guarded;
pub mod keys;
pub mod lsn;
pub mod manifest;
pub mod recovery;
mod tls;
pub mod wal;

pub use client::{Encryption, NewObject, S3Bucket, S3Options, is_https};
pub use credentials::{
    ACCESS_KEY_ID_FILE_VARIABLE, CredentialSource, SECRET_ACCESS_KEY_FILE_VARIABLE,
    SESSION_TOKEN_FILE_VARIABLE, StaticKeys, secret_from_env_or_file,
};
pub use error::{StorageError, error_chain, one_line, s3_error};
pub use tls::CaBundle;
