//! `kubectl pgkube status`: a cluster at a glance, from its status (pure): phase and version,
//! the primary, each instance with its role, readiness, lag and timeline, the last and next
//! backups, WAL archiving, the last change of primary, and the conditions. Coloured for a
//! terminal, plain through a pipe.

use std::fmt::Write as _;

use pgkube_crds::{InstanceRole, PostgreSQLCluster};

/// ANSI colours, or none.
#[derive(Clone, Copy)]
pub struct Paint {
    pub enabled: bool,
}

impl Paint {
    fn wrap(self, code: &str, text: &str) -> String {
        if self.enabled {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
    fn good(self, text: &str) -> String {
        self.wrap("32", text)
    }
    fn bad(self, text: &str) -> String {
        self.wrap("31", text)
    }
    fn bold(self, text: &str) -> String {
        self.wrap("1", text)
    }
}

/// The cluster's status as text.
pub fn render(cluster: &PostgreSQLCluster, paint: Paint) -> String {
    let mut out = String::new();
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    let status = cluster.status.clone().unwrap_or_default();
    let phase = status
        .phase
        .map(|phase| enum_text(&phase))
        .unwrap_or_else(|| "Unknown".to_owned());
    let phase = if phase == "Running" {
        paint.good(&phase)
    } else {
        paint.bad(&phase)
    };
    let version = status
        .current_version
        .clone()
        .unwrap_or_else(|| cluster.spec.postgres_version.to_string());
    let _ = writeln!(
        out,
        "{} {namespace}/{name}: {phase}, PostgreSQL {version}, {}/{} ready",
        paint.bold("Cluster"),
        status.ready_replicas,
        cluster.spec.replicas
    );
    let _ = writeln!(
        out,
        "{} {}",
        paint.bold("Primary"),
        status.current_primary.as_deref().unwrap_or("none yet")
    );
    render_instances(&mut out, &status.instances, paint);
    render_backups(&mut out, &status);
    if let Some(change) = &status.primary_change {
        let state = if change.completed_at.is_some() {
            "done"
        } else {
            "under way"
        };
        let _ = writeln!(
            out,
            "{} {} {} -> {} ({state}): {}",
            paint.bold("Last change"),
            enum_text(&change.kind),
            change.from,
            change.to,
            change.reason
        );
    }
    if !status.conditions.is_empty() {
        let _ = writeln!(out, "{}", paint.bold("Conditions"));
        for condition in &status.conditions {
            let state = match condition.status.as_str() {
                "True" => paint.good("True"),
                other => paint.bad(other),
            };
            let _ = writeln!(
                out,
                "  {:<22} {state:<5} {}: {}",
                condition.type_, condition.reason, condition.message
            );
        }
    }
    out
}

fn render_instances(out: &mut String, instances: &[pgkube_crds::InstanceStatus], paint: Paint) {
    let _ = writeln!(out, "{}", paint.bold("Instances"));
    if instances.is_empty() {
        out.push_str("  none reported yet\n");
        return;
    }
    let _ = writeln!(
        out,
        "  {:<28} {:<8} {:<6} {:>12} {:>9}",
        "NAME", "ROLE", "READY", "LAG", "TIMELINE"
    );
    for instance in instances {
        let ready = if instance.ready {
            paint.good("yes")
        } else {
            paint.bad("no")
        };
        // Padding counts the colour codes: pad the plain word, then colour it.
        let ready = format!(
            "{ready}{}",
            " ".repeat(6 - if instance.ready { 3 } else { 2 })
        );
        let lag = match (instance.role, instance.lag_bytes) {
            (InstanceRole::Replica, Some(bytes)) => bytes_text(bytes),
            _ => "-".to_owned(),
        };
        let timeline = instance
            .timeline
            .map_or_else(|| "-".to_owned(), |timeline| timeline.to_string());
        let _ = write!(
            out,
            "  {:<28} {:<8} {ready} {lag:>12} {timeline:>9}",
            instance.name,
            instance.role.as_str()
        );
        match &instance.message {
            Some(message) => {
                let _ = writeln!(out, "  {message}");
            }
            None => out.push('\n'),
        }
    }
}

fn render_backups(out: &mut String, status: &pgkube_crds::PostgreSQLClusterStatus) {
    let last = status
        .last_successful_backup
        .as_deref()
        .unwrap_or("none yet");
    let next = status
        .next_scheduled_backup
        .as_ref()
        .map_or_else(|| "not scheduled".to_owned(), |time| time.0.to_string());
    let _ = writeln!(out, "Backups: last {last}, next {next}");
    match &status.wal_archiving {
        Some(archiving) => {
            let last = archiving.last_archived.as_deref().unwrap_or("nothing yet");
            let _ = write!(out, "WAL archiving: last {last}");
            if let Some(time) = &archiving.last_archived_time {
                let _ = write!(out, " at {}", time.0);
            }
            if let Some(waiting) = archiving.waiting {
                let _ = write!(out, ", {waiting} waiting");
            }
            if let Some(error) = &archiving.last_error {
                let failed = archiving.last_failed.as_deref().unwrap_or("a file");
                let _ = write!(out, "; last failure {failed}: {error}");
            }
            out.push('\n');
        }
        None => out.push_str("WAL archiving: off\n"),
    }
}

/// A size in bytes as people read it.
pub fn bytes_text(bytes: i64) -> String {
    pgkube_controllers::agent_job::human_bytes(u64::try_from(bytes).unwrap_or(0))
}

/// A unit enum as its manifest spells it.
fn enum_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> PostgreSQLCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "db.example.com/v1beta1",
            "kind": "PostgreSQLCluster",
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"replicas": 2, "postgresVersion": "15", "storage": {"size": "1Gi"}},
            "status": {
                "phase": "Running", "readyReplicas": 2, "currentVersion": "15",
                "currentPrimary": "db-postgresql-0",
                "instances": [
                    {"name": "db-postgresql-0", "role": "primary", "ready": true, "timeline": 2},
                    {"name": "db-postgresql-1", "role": "replica", "ready": false,
                     "timeline": 2, "lagBytes": 3145728, "message": "catching up"}
                ],
                "lastSuccessfulBackup": "db-20261207",
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady",
                                "message": "2 of 2", "lastTransitionTime": "2026-12-07T01:00:00Z"}]
            }
        }))
        .expect("a cluster")
    }

    #[test]
    fn a_cluster_reads_at_a_glance_in_plain_text() {
        let text = render(&cluster(), Paint { enabled: false });
        let expected = "\
Cluster shop/db: Running, PostgreSQL 15, 2/2 ready
Primary db-postgresql-0
Instances
  NAME                         ROLE     READY           LAG  TIMELINE
  db-postgresql-0              primary  yes               -         2
  db-postgresql-1              replica  no          3.0 MiB         2  catching up
Backups: last db-20261207, next not scheduled
WAL archiving: off
Conditions
  Ready                  True  AllReady: 2 of 2
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_terminal_gets_colours_and_a_pipe_none() {
        let coloured = render(&cluster(), Paint { enabled: true });
        assert!(coloured.contains("\x1b[32mRunning\x1b[0m"), "{coloured}");
        assert!(coloured.contains("\x1b[31mno\x1b[0m"), "{coloured}");
        assert!(!render(&cluster(), Paint { enabled: false }).contains('\x1b'));
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
        assert_eq!(bytes_text(5 * 1024 * 1024 * 1024), "5.0 GiB");
    }
}
