//! Which database a data directory holds: its PostgreSQL system identifier (made by initdb,
//! kept by every copy of it: pg_basebackup, pg_rewind, a standby's replay) and the uid of the
//! PostgreSQLCluster whose instance ran that initdb (the marker file [`MARKER_FILE`], written
//! next to the data and copied with it).
//!
//! Every step that destroys or replaces data checks it first ([`check_replacement`]): a copy
//! is only ever replaced by a copy of the same database, and only from a source that is the
//! database the operator recorded for the cluster. A mismatch stops the step: the instance
//! waits and says why, it never guesses which side is right.
//!
//! Reading (`pg_controldata`, the marker) does I/O; the decisions are pure.

use std::path::Path;

use super::datadir::{DataDirError, controldata, write_file};
use serde::{Deserialize, Serialize};

/// The marker in the data directory: who initialised this database.
pub const MARKER_FILE: &str = "pgkube-identity.json";
/// `pg_controldata`'s label of the system identifier.
const SYSTEM_IDENTIFIER_LABEL: &str = "Database system identifier:";

/// What [`MARKER_FILE`] holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The uid of the PostgreSQLCluster whose instance made this database with initdb.
    pub cluster_uid: Option<String>,
    /// The database's system identifier, as initdb made it.
    pub system_identifier: String,
}

/// The marker of `pgdata`, if it has one that parses.
pub fn read_marker(pgdata: &Path) -> Option<Marker> {
    let text = std::fs::read_to_string(pgdata.join(MARKER_FILE)).ok()?;
    serde_json::from_str(&text)
        .inspect_err(|error| tracing::warn!(%error, "the identity marker does not parse"))
        .ok()
}

/// Writes the marker of a database this instance just made.
pub fn write_marker(pgdata: &Path, marker: &Marker) -> Result<(), DataDirError> {
    let text = serde_json::to_string(marker).unwrap_or_default();
    write_file(&pgdata.join(MARKER_FILE), &text, 0o600)
}

/// The system identifier in `pg_controldata`'s output.
pub fn parse_system_identifier(controldata: &str) -> Option<String> {
    controldata
        .lines()
        .find_map(|line| line.strip_prefix(SYSTEM_IDENTIFIER_LABEL))
        .map(str::trim)
        .filter(|value| !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_owned)
}

/// The system identifier of the (stopped or running) database in `pgdata`.
pub async fn system_identifier_of(pgdata: &Path) -> Result<String, DataDirError> {
    let output = controldata(pgdata).await?;
    parse_system_identifier(&output).ok_or_else(|| DataDirError::Unreadable {
        what: "the system identifier in pg_controldata's output",
        path: pgdata.to_owned(),
    })
}

/// Why a replacement of data was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error(
        "{source_pod} holds database {source_identifier}, but the cluster's database is {expected}: it is not copied"
    )]
    SourceNotTheCluster {
        source_pod: String,
        source_identifier: String,
        expected: String,
    },
    #[error(
        "this instance holds database {local}, and {source_pod} holds {source_identifier}: the local data is not replaced by another database"
    )]
    LocalNotTheSource {
        local: String,
        source_pod: String,
        source_identifier: String,
    },
}

/// Whether this instance's data (`local`, its system identifier; none when the directory is
/// empty) may be replaced by a copy of `source_pod`, whose database is `source_identifier`,
/// when the operator recorded `expected` for the cluster (none before the first primary
/// reported its database).
pub fn check_replacement(
    expected: Option<&str>,
    local: Option<&str>,
    source_pod: &str,
    source_identifier: &str,
) -> Result<(), Mismatch> {
    if let Some(expected) = expected
        && expected != source_identifier
    {
        return Err(Mismatch::SourceNotTheCluster {
            source_pod: source_pod.to_owned(),
            source_identifier: source_identifier.to_owned(),
            expected: expected.to_owned(),
        });
    }
    if let Some(local) = local
        && local != source_identifier
    {
        return Err(Mismatch::LocalNotTheSource {
            local: local.to_owned(),
            source_pod: source_pod.to_owned(),
            source_identifier: source_identifier.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_identifier_is_read_from_pg_controldata() {
        let output = "pg_control version number:            1300\n\
                      Catalog version number:               202209061\n\
                      Database system identifier:           7312345678901234567\n\
                      Database cluster state:               in production\n";
        assert_eq!(
            parse_system_identifier(output).as_deref(),
            Some("7312345678901234567")
        );
        assert_eq!(
            parse_system_identifier("Database system identifier: x1"),
            None
        );
        assert_eq!(parse_system_identifier(""), None);
    }

    #[test]
    fn data_is_replaced_only_by_a_copy_of_the_same_database() {
        // A new replica of a new cluster: nothing to compare with yet.
        assert_eq!(check_replacement(None, None, "a-0", "7"), Ok(()));
        // The cluster's database, into an empty directory or over a stale copy of it.
        assert_eq!(check_replacement(Some("7"), None, "a-0", "7"), Ok(()));
        assert_eq!(check_replacement(Some("7"), Some("7"), "a-0", "7"), Ok(()));
        // A primary that initdb made anew is not the cluster's database.
        let refused = check_replacement(Some("7"), None, "a-0", "9");
        assert!(
            matches!(refused, Err(Mismatch::SourceNotTheCluster { .. })),
            "{refused:?}"
        );
        // Before the operator recorded one, the local data still decides.
        let refused = check_replacement(None, Some("7"), "a-0", "9");
        assert!(
            matches!(refused, Err(Mismatch::LocalNotTheSource { .. })),
            "{refused:?}"
        );
        let message = refused.map_err(|m| m.to_string()).unwrap_err();
        assert!(message.contains("a-0 holds 9"), "{message}");
    }

    #[test]
    fn the_marker_round_trips_and_a_broken_one_reads_as_none() {
        let dir = std::env::temp_dir().join(format!("pgkube-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        assert_eq!(read_marker(&dir), None);
        let marker = Marker {
            cluster_uid: Some("uid-1".to_owned()),
            system_identifier: "7".to_owned(),
        };
        write_marker(&dir, &marker).expect("written");
        assert_eq!(read_marker(&dir), Some(marker));
        std::fs::write(dir.join(MARKER_FILE), "{").expect("broken");
        assert_eq!(read_marker(&dir), None);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
