//! Unit tests of the planned restart: who restarts in place and who waits for a switchover.

use std::path::Path;

use super::*;
use crate::instance::desired::Topology;
use crate::instance::endpoint::ReportedRole;

const MAX_CONNECTIONS: &str = "max_connections";

fn pending() -> Vec<String> {
    vec![MAX_CONNECTIONS.to_owned()]
}

fn topology(json: &str) -> Topology {
    Topology::parse(json, Path::new("instance.json")).expect("valid instance.json")
}

#[test]
fn the_primary_of_a_cluster_with_replicas_leaves_its_restart_to_a_switchover() {
    let with_peers = topology(
        r#"{"primary":"db-0","primaryHost":"h","port":5432,"replicas":2,"statefulset":"db",
            "restartBySwitchover":true}"#,
    );
    let asked = with_peers.restart_by_switchover;
    assert!(asked);
    assert_eq!(
        decide(&pending(), true, true, asked, false),
        PendingRestart::BySwitchover,
        "the primary does not restart itself"
    );
    // Its replicas restart as before: no write depends on them.
    assert_eq!(
        decide(&pending(), true, false, asked, false),
        PendingRestart::InPlace
    );
}

#[test]
fn a_single_instance_or_an_operator_that_does_not_ask_restarts_in_place() {
    // The operator leaves the field out for one instance (nothing could take over), and an
    // older operator does not know it.
    let single = topology(
        r#"{"primary":"db-0","primaryHost":"h","port":5432,"replicas":1,"statefulset":"db"}"#,
    );
    assert!(!single.restart_by_switchover);
    assert_eq!(
        decide(&pending(), true, true, single.restart_by_switchover, false),
        PendingRestart::InPlace
    );
}

#[test]
fn a_lowered_standby_minimum_restarts_the_primary_in_place() {
    // Replicas keep 100 until they replay the primary's change, which only its restart writes.
    let recorded = [(MAX_CONNECTIONS.to_owned(), 100)];
    let lowered = "max_connections = 50\n";
    let raised = "max_connections = 200\n";
    assert!(lowers_standby_minimum(lowered, &recorded));
    assert!(!lowers_standby_minimum(raised, &recorded));
    assert_eq!(
        decide(&pending(), true, true, true, true),
        PendingRestart::InPlace
    );
}

#[test]
fn nothing_pending_or_a_users_own_change_restarts_nothing() {
    assert_eq!(decide(&[], true, true, true, false), PendingRestart::None);
    // Pending since a user's ALTER SYSTEM: the files did not change since the server started.
    assert_eq!(
        decide(&pending(), false, true, true, false),
        PendingRestart::None
    );
    assert_eq!(
        decide(&pending(), false, false, false, false),
        PendingRestart::None
    );
}

fn ready_primary_pending() -> InstanceStatus {
    let state = ServerState {
        pending_restart: pending(),
        ..ServerState::default()
    };
    InstanceStatus::observed("db-0", state, None)
}

#[test]
fn a_waiting_primary_says_so_with_the_digest_of_its_settings() {
    let digest = settings_digest("max_connections = 200\n");
    let status = marked(
        ready_primary_pending(),
        PendingRestart::BySwitchover,
        Some(digest.clone()),
    );
    assert_eq!(status.role, ReportedRole::Primary);
    assert!(status.restart_by_switchover);
    assert_eq!(status.settings_digest.as_deref(), Some(digest.as_str()));
    let message = status.message.expect("why it does not restart");
    assert!(message.contains(MAX_CONNECTIONS), "{message}");
    let json = serde_json::to_value(marked(
        ready_primary_pending(),
        PendingRestart::BySwitchover,
        Some(digest),
    ))
    .expect("serializes");
    assert_eq!(json["restartBySwitchover"], true);
    assert_eq!(json["settingsDigest"].as_str().map(str::len), Some(16));

    // A primary that restarts in place says nothing of the kind.
    let in_place = marked(ready_primary_pending(), PendingRestart::InPlace, None);
    assert!(!in_place.restart_by_switchover);
    assert_eq!((in_place.message, in_place.settings_digest), (None, None));
    // Not ready: the reason it is not ready stays.
    let not_ready = marked(
        ready_primary_pending().not_ready("the server accepts no new connection"),
        PendingRestart::BySwitchover,
        None,
    );
    assert_eq!(
        not_ready.message.as_deref(),
        Some("the server accepts no new connection")
    );
}

#[test]
fn the_digest_changes_with_the_settings() {
    let before = "max_connections = 100\n";
    let after = "max_connections = 200\n";
    assert_eq!(settings_digest(before), settings_digest(before));
    assert_ne!(settings_digest(before), settings_digest(after));
}
