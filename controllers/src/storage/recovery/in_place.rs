//! What the operator and the instance managers tell each other during an in-place
//! point-in-time recovery: the order in `instance.json` ([`InPlaceOrder`]) and what each
//! instance reports in its `/status` ([`InPlaceReport`]), from a record it keeps on its volume
//! so that a restarted manager never does a step twice.

use serde::{Deserialize, Serialize};

/// The operator's order: recover in place for the restore `id` (its uid).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceOrder {
    pub id: String,
    pub stage: InPlaceStage,
}

/// What the instances do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InPlaceStage {
    /// The primary recovers (its old data kept aside); the replicas stop and wait.
    Recover,
    /// The primary recovered: the replicas replace their data with a clone of it.
    Reclone,
}

/// Where an instance is with the recovery `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceReport {
    pub id: String,
    pub state: InPlaceState,
    /// Why it failed; on a primary that recovered, where its old data directory is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// An instance's state in an in-place recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InPlaceState {
    /// The primary restores and replays.
    Recovering,
    /// The primary promoted on the recovered data.
    Recovered,
    /// The primary's recovery failed; it runs on its old data again.
    Failed,
    /// A replica stopped while the primary recovers.
    Waiting,
    /// A replica cloned the recovered primary.
    Recloned,
}

impl InPlaceReport {
    pub fn new(id: &str, state: InPlaceState, message: Option<String>) -> Self {
        Self {
            id: id.to_owned(),
            state,
            message,
        }
    }
}
