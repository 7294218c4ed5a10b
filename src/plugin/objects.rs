//! The plugin's commands that make an object and may wait for its end: `backup` (a
//! PostgreSQLBackup) and `restore` (a PostgreSQLRestore), each printing its phases as they
//! change, its transfer's progress while it runs ([`super::progress`]) and how it ended.

use std::fmt::Debug;
use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::PostParams;
use pgkube_crds::{
    BackupPhase, PostgreSQLBackup, PostgreSQLBackupStatus, PostgreSQLRestore,
    PostgreSQLRestoreStatus, RestorePhase, TransferProgress,
};

use super::progress;
use super::status::bytes_text;

/// How often `--wait` reads the object again.
const POLL: Duration = Duration::from_secs(2);

/// Where an object is, as `--wait` shows it.
struct Look {
    /// Its phase, as printed.
    phase: String,
    /// While it runs: how far its transfer got.
    transfer: Option<TransferProgress>,
    /// `Some` once it ended: what to print, or why it failed.
    ended: Option<Result<String, String>>,
}

/// Reads `name` every [`POLL`], printing each new phase and the transfer's progress, until it
/// ends or `timeout` passed.
async fn wait_for_end<K, F>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    look: F,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + Debug + serde::de::DeserializeOwned,
    F: Fn(K) -> Look,
{
    let started = Instant::now();
    let mut screen = Screen {
        terminal: std::io::stdout().is_terminal(),
        ..Screen::default()
    };
    loop {
        let now = look(api.get(name).await?);
        screen.show(started.elapsed(), &now);
        match now.ended {
            Some(Ok(summary)) => {
                println!("{summary}");
                return Ok(());
            }
            Some(Err(why)) => anyhow::bail!("{name} failed: {why}"),
            None => {}
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "{name} has not ended after {timeout:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// What `--wait` printed so far.
#[derive(Default)]
struct Screen {
    terminal: bool,
    phase: Option<String>,
    /// When the progress last shown was reported.
    reported: Option<Time>,
    /// Whether a bar is drawn on the current line (a terminal only).
    bar_drawn: bool,
}

impl Screen {
    /// Prints a new phase on a line of its own; then, on a terminal, redraws the bar in place,
    /// and through a pipe prints each new report once.
    fn show(&mut self, elapsed: Duration, look: &Look) {
        let elapsed = elapsed.as_secs_f64();
        let mut out = std::io::stdout().lock();
        if self.phase.as_ref() != Some(&look.phase) {
            if std::mem::take(&mut self.bar_drawn) {
                let _ = writeln!(out);
            }
            let _ = writeln!(out, "{elapsed:>6.0}s  {}", look.phase);
            self.phase = Some(look.phase.clone());
        }
        if let Some(transfer) = look.transfer.as_ref().filter(|_| look.ended.is_none()) {
            if self.terminal {
                let _ = write!(out, "\r\x1b[2K{elapsed:>6.0}s  {}", progress::bar(transfer));
                self.bar_drawn = true;
            } else if self.reported.as_ref() != Some(&transfer.updated_at) {
                let _ = writeln!(out, "{elapsed:>6.0}s  {}", progress::figures(transfer));
                self.reported = Some(transfer.updated_at.clone());
            }
        }
        if look.ended.is_some() && std::mem::take(&mut self.bar_drawn) {
            let _ = writeln!(out);
        }
        let _ = out.flush();
    }
}

fn phase_text(phase: Option<impl Debug>) -> String {
    phase.map_or_else(|| "Pending".to_owned(), |phase| format!("{phase:?}"))
}

fn messages(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> String {
    conditions
        .iter()
        .map(|condition| condition.message.clone())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Makes a backup of `cluster` by `method` (`Logical` or `Physical`), and waits for its end if
/// `wait` says how long.
pub async fn backup(
    backups: &Api<PostgreSQLBackup>,
    cluster: &str,
    method: &str,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let backup: PostgreSQLBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLBackup",
        "metadata": {"generateName": format!("{cluster}-")},
        "spec": {"cluster": {"name": cluster}, "method": method},
    }))?;
    let made = backups.create(&PostParams::default(), &backup).await?;
    let name = made.metadata.name.unwrap_or_default();
    println!("backup {name} of {cluster} ({method}) created");
    match wait {
        Some(timeout) => wait_for_end(backups, &name, timeout, backup_look).await,
        None => Ok(()),
    }
}

fn backup_look(backup: PostgreSQLBackup) -> Look {
    let status: PostgreSQLBackupStatus = backup.status.unwrap_or_default();
    let ended = match status.phase {
        Some(BackupPhase::Completed) => {
            let size = status
                .size_bytes
                .map_or_else(String::new, |bytes| format!(", {}", bytes_text(bytes)));
            let key = status.object_key.unwrap_or_default();
            Some(Ok(format!("completed{size}: {key}")))
        }
        Some(BackupPhase::Failed) => Some(Err(messages(&status.conditions))),
        _ => None,
    };
    Look {
        phase: phase_text(status.phase),
        transfer: status.progress,
        ended,
    }
}

/// What `restore` restores.
pub struct RestoreRequest<'a> {
    pub cluster: &'a str,
    /// The PostgreSQLBackup; for a point-in-time restore, optional (the latest before the
    /// target).
    pub backup: Option<&'a str>,
    /// A point-in-time restore of the whole cluster, to `target_time` or the archive's end.
    pub point_in_time: bool,
    pub target_time: Option<&'a str>,
    /// A logical restore's databases (all when empty), and whether existing ones are replaced.
    pub databases: &'a [String],
    pub drop_existing: bool,
}

/// The PostgreSQLRestore that `request` asks for; refuses what admission would refuse, with the
/// plugin's flags named.
pub fn restore_object(request: &RestoreRequest<'_>) -> anyhow::Result<serde_json::Value> {
    let point_in_time = request.point_in_time || request.target_time.is_some();
    let mut spec = serde_json::json!({"cluster": {"name": request.cluster}});
    if let Some(backup) = request.backup {
        spec["backup"] = serde_json::json!({"name": backup});
    }
    if point_in_time {
        anyhow::ensure!(
            request.databases.is_empty() && !request.drop_existing,
            "--databases and --drop-existing apply to a logical restore only: a point-in-time \
             restore recovers the whole cluster"
        );
        spec["method"] = "PointInTime".into();
        if let Some(time) = request.target_time {
            chrono::DateTime::parse_from_rfc3339(time).map_err(|error| {
                anyhow::anyhow!(
                    "--target-time {time} is not RFC 3339 (2026-12-05T14:03:27Z): {error}"
                )
            })?;
            spec["target"] = serde_json::json!({"time": time});
        }
    } else {
        anyhow::ensure!(
            request.backup.is_some(),
            "a logical restore needs --backup (or ask for --point-in-time)"
        );
        if !request.databases.is_empty() {
            spec["databases"] = serde_json::json!(request.databases);
        }
        spec["dropExisting"] = request.drop_existing.into();
    }
    Ok(serde_json::json!({
        "apiVersion": "db.example.com/v1beta1",
        "kind": "PostgreSQLRestore",
        "metadata": {"generateName": format!("{}-restore-", request.cluster)},
        "spec": spec,
    }))
}

/// Makes the restore `request` asks for, and waits for its end if `wait` says how long.
pub async fn restore(
    restores: &Api<PostgreSQLRestore>,
    request: &RestoreRequest<'_>,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let restore: PostgreSQLRestore = serde_json::from_value(restore_object(request)?)?;
    let made = restores.create(&PostParams::default(), &restore).await?;
    let name = made.metadata.name.unwrap_or_default();
    println!("restore {name} into {} created", request.cluster);
    match wait {
        Some(timeout) => wait_for_end(restores, &name, timeout, restore_look).await,
        None => Ok(()),
    }
}

fn restore_look(restore: PostgreSQLRestore) -> Look {
    let status: PostgreSQLRestoreStatus = restore.status.unwrap_or_default();
    let ended = match status.phase {
        Some(RestorePhase::Completed) => {
            let databases = match status.restored_databases.is_empty() {
                true => String::new(),
                false => format!(": {}", status.restored_databases.join(", ")),
            };
            Some(Ok(format!("completed{databases}")))
        }
        Some(RestorePhase::Failed) => Some(Err(status
            .message
            .unwrap_or_else(|| messages(&status.conditions)))),
        _ => None,
    };
    Look {
        phase: phase_text(status.phase),
        transfer: status.progress,
        ended,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(databases: &'a [String]) -> RestoreRequest<'a> {
        RestoreRequest {
            cluster: "db",
            backup: Some("db-nightly"),
            point_in_time: false,
            target_time: None,
            databases,
            drop_existing: true,
        }
    }

    #[test]
    fn a_logical_restore_names_its_backup_databases_and_whether_to_replace() {
        let databases = ["shop".to_owned()];
        let object = restore_object(&request(&databases)).expect("an object");
        assert_eq!(
            object["spec"],
            serde_json::json!({"cluster": {"name": "db"}, "backup": {"name": "db-nightly"},
                "databases": ["shop"], "dropExisting": true})
        );
        let without_backup = RestoreRequest {
            backup: None,
            ..request(&[])
        };
        let refused = restore_object(&without_backup).expect_err("no backup");
        assert!(refused.to_string().contains("--backup"), "{refused}");
    }

    #[test]
    fn a_target_time_asks_for_a_point_in_time_restore_and_must_be_rfc_3339() {
        let to_time = RestoreRequest {
            backup: None,
            target_time: Some("2026-12-05T14:03:27Z"),
            drop_existing: false,
            ..request(&[])
        };
        let object = restore_object(&to_time).expect("an object");
        assert_eq!(object["spec"]["method"], "PointInTime");
        assert_eq!(object["spec"]["target"]["time"], "2026-12-05T14:03:27Z");
        assert!(object["spec"].get("backup").is_none());
        let malformed = RestoreRequest {
            target_time: Some("yesterday"),
            ..to_time
        };
        let refused = restore_object(&malformed).expect_err("not a time");
        assert!(refused.to_string().contains("RFC 3339"), "{refused}");
        let databases = ["shop".to_owned()];
        let with_databases = RestoreRequest {
            point_in_time: true,
            ..request(&databases)
        };
        assert!(restore_object(&with_databases).is_err());
    }
}
