//! Progress of a running backup or restore, shown in its status while its Job runs.
//!
//! The agent prints where it stands on its log; the controller copies the last such line here at
//! most every [`PROGRESS_WRITE_INTERVAL_SECONDS`], so that a long backup costs a few status
//! writes a minute, not one per chunk.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The least time between two writes of a progress to the status.
pub const PROGRESS_WRITE_INTERVAL_SECONDS: i64 = 10;

/// Where a running backup or restore stands, as its agent last reported it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferProgress {
    /// What the agent does now: `Dumping` (a logical backup), `Streaming` (a base backup),
    /// `WaitingForWal` (a base backup waiting for its WAL in the archive), `Verifying` (a
    /// restore checking every object before it changes anything) or `Restoring`.
    pub step: String,
    /// Bytes done in this step: read from PostgreSQL's tools before pgkube compresses them (a
    /// backup), or read from storage (a restore).
    pub bytes: i64,
    /// Bytes the step will read in all: exact for a restore; for a backup an estimate from the
    /// databases' sizes on disk, which a dump is usually smaller than.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<i64>,
    /// Whether `totalBytes` is an estimate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub total_is_estimate: bool,
    /// Average rate of this step so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<i64>,
    /// Databases finished (logical backups and restores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub databases_done: Option<i32>,
    /// Databases in all (logical backups and restores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_count: Option<i32>,
    /// The database being read or restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_database: Option<String>,
    /// The same in a few words, for `kubectl get` (for example `Dumping 2/5 shop, 1.2 GiB at
    /// 40 MiB/s`).
    pub summary: String,
    /// When the agent reported this.
    pub updated_at: Time,
}
