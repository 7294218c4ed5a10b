//! The server's configuration files in the cluster's ConfigMap: `postgresql.conf` (pgkube's
//! settings, then the user's) and `pg_hba.conf`.

use std::collections::BTreeMap;

use pgkube_crds::DEFAULT_ARCHIVE_TIMEOUT;

use super::super::validate::ValidatedCluster;
use super::{ChildNames, MemorySettings, POSTGRES_PORT, SUPERUSER};

pub(super) fn postgresql_conf(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    synchronous: u32,
) -> String {
    let memory = MemorySettings::for_resources(cluster.resources.as_ref()).config_lines();
    let synchronous = synchronous_standby_names(cluster, names, synchronous);
    format!(
        "# Managed by pgkube; edits are overwritten.\n\
         listen_addresses = '*'\n\
         port = {POSTGRES_PORT}\n\
         unix_socket_directories = '/var/run/postgresql'\n\
         max_connections = 100\n\
         {memory}\
         password_encryption = scram-sha-256\n\
         log_destination = 'stderr'\n\
         logging_collector = off\n\
         # Streaming replication (wal_log_hints: so that pg_rewind can bring back a former primary)\n\
         wal_level = replica\n\
         hot_standby = on\n\
         max_wal_senders = 10\n\
         max_replication_slots = 10\n\
         wal_log_hints = on\n\
         # A standby answers at least every second: its primary counts it as contact (fencing)\n\
         wal_receiver_status_interval = 1s\n\
         {synchronous}\
         {archiving}\
         {parameters}",
        archiving = archiving(cluster),
        parameters = user_parameters(&cluster.parameters),
    )
}

/// WAL archiving: on when the cluster archives, with `archive_timeout` bounding how much an
/// idle cluster's archive lags (the user's parameters may change it). The instance manager
/// adds its own `archive_command`. Off otherwise: `archive_mode = on` without a command would
/// keep every WAL file until the disk is full.
fn archiving(cluster: &ValidatedCluster) -> String {
    match cluster.wal_archive {
        Some(_) => format!(
            "# WAL archiving to the backup storage (spec.backup.walArchiving)\n\
             archive_mode = on\n\
             archive_timeout = {DEFAULT_ARCHIVE_TIMEOUT}\n"
        ),
        None => "archive_mode = off\n".to_owned(),
    }
}

/// `synchronous_standby_names` asking `count` standbys to confirm each commit, or nothing when
/// `count` is 0. Every instance is named, the primary too: a server is never its own standby,
/// so the same line holds whichever instance is the primary, and a failover needs no change.
/// Standbys connect with their pod name as `application_name`.
fn synchronous_standby_names(cluster: &ValidatedCluster, names: &ChildNames, count: u32) -> String {
    if count == 0 {
        return String::new();
    }
    let standbys: Vec<String> = (0..cluster.replicas)
        .map(|ordinal| {
            format!(
                "\"{}\"",
                crate::cluster::roles::pod_name(&names.statefulset, ordinal)
            )
        })
        .collect();
    format!(
        "# Synchronous replication (spec.highAvailability.synchronous)\n\
         synchronous_standby_names = 'ANY {count} ({})'\n",
        standbys.join(", ")
    )
}

/// Local connections as the matching system user (the instance manager runs as `postgres`);
/// remote ones over TLS only: replication as `streaming_replica` with its client certificate,
/// the superuser with its client certificate unless `superuser_access` lets it use its password,
/// everything else with a SCRAM password, and with `client_certificates` also a client
/// certificate naming the role. Connections without TLS match no line and are
/// refused, except while some instances still run without certificates (`tls_only` false):
/// they then keep their SCRAM logins without TLS, as before, the superuser's included.
pub(super) fn pg_hba(tls_only: bool, superuser_access: bool, client_certificates: bool) -> String {
    let mut hba = String::from(
        "# Managed by pgkube; edits are overwritten.\n\
         local      all          all                                peer\n\
         hostssl    replication  streaming_replica  all             cert\n",
    );
    if tls_only && !superuser_access {
        hba.push_str(&format!(
            "# Remote superuser logins only with the operator's certificate (spec.enableSuperuserAccess)\n\
             hostssl    all          {SUPERUSER:<18} all             cert\n"
        ));
    }
    match client_certificates && tls_only {
        true => hba.push_str(
            "# Applications present a client certificate too (spec.certificates.clientCASecret)\n\
             hostssl    all          all                all             scram-sha-256 clientcert=verify-full\n",
        ),
        false => hba
            .push_str("hostssl    all          all                all             scram-sha-256\n"),
    }
    if !tls_only {
        hba.push_str(
            "# Until every instance has its certificates\n\
             hostnossl  replication  streaming_replica  all             scram-sha-256\n\
             hostnossl  all          all                all             scram-sha-256\n",
        );
    }
    hba
}

/// The user's parameters, last, so that they take precedence over pgkube's defaults (the server
/// takes the last setting of a name). Values are quoted, with backslashes and quotes escaped:
/// in a quoted `postgresql.conf` value a backslash escapes the next character, so a value
/// ending in one would otherwise swallow its closing quote.
fn user_parameters(parameters: &BTreeMap<String, String>) -> String {
    if parameters.is_empty() {
        return String::new();
    }
    let mut lines = String::from("# spec.postgresql.parameters\n");
    for (name, value) in parameters {
        let quoted = value.replace('\\', "\\\\").replace('\'', "''");
        lines.push_str(&format!("{name} = '{quoted}'\n"));
    }
    lines
}
