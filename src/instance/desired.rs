//! What the operator decided for this instance, read from the files Kubernetes mounts: the
//! cluster's ConfigMap (`postgresql.conf`, `pg_hba.conf`, `instance.json`), the superuser and
//! replication Secrets (`username`, `password`), and the application role's (with `dbname`).
//!
//! Kubernetes refreshes these files in place when their sources change, so reading them again
//! is how the instance manager learns of a new setting or a rotated password.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use pgkube_controllers::storage::recovery::RecoveryOrder;
use pgkube_controllers::storage::recovery::in_place::InPlaceOrder;
use pgkube_controllers::storage::wal::WalArchiveTarget;
use serde::Deserialize;

/// Files of the ConfigMap.
pub const POSTGRESQL_CONF: &str = "postgresql.conf";
pub const PG_HBA_CONF: &str = "pg_hba.conf";
pub const INSTANCE_JSON: &str = "instance.json";
/// Keys of a basic-auth Secret.
const USERNAME: &str = "username";
const PASSWORD: &str = "password";
/// The application Secret's database.
const DBNAME: &str = "dbname";
/// PostgreSQL limits identifiers (and so slot names) to 63 bytes.
const NAME_MAX: usize = 63;
const SLOT_PREFIX: &str = "pgkube_";

/// A problem with the mounted files.
#[derive(Debug, thiserror::Error)]
pub enum DesiredError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} is empty")]
    Empty { path: PathBuf },
    #[error("{path}: replicas is {replicas}; a cluster has at least one instance, the primary")]
    NoInstances { path: PathBuf, replicas: u32 },
}

/// Where the mounted files are.
#[derive(Clone, Debug)]
pub struct Sources {
    pub config_dir: PathBuf,
    pub superuser_dir: PathBuf,
    pub replication_dir: PathBuf,
    pub application_dir: PathBuf,
}

/// Everything the operator decided, as read at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// The server settings, without this instance's own (see `datadir::server_config`).
    pub postgresql_conf: String,
    pub pg_hba_conf: String,
    pub topology: Topology,
    pub superuser: Credentials,
    pub replication: Credentials,
    /// The application role, once its Secret is mounted.
    pub application: Option<Application>,
}

impl Desired {
    pub fn load(sources: &Sources) -> Result<Self, DesiredError> {
        let config = |name| read(&sources.config_dir.join(name));
        let topology_path = sources.config_dir.join(INSTANCE_JSON);
        Ok(Self {
            postgresql_conf: config(POSTGRESQL_CONF)?,
            pg_hba_conf: config(PG_HBA_CONF)?,
            topology: Topology::parse(&read(&topology_path)?, &topology_path)?,
            superuser: Credentials::load(&sources.superuser_dir)?,
            replication: Credentials::load(&sources.replication_dir)?,
            application: Application::load(&sources.application_dir),
        })
    }
}

/// `instance.json`: which instance is the primary, and how many instances there are.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// Pod name of the primary.
    pub primary: String,
    /// Host name under which the primary's pod is reached (its stable DNS name).
    pub primary_host: String,
    pub port: u16,
    /// Number of instances, the primary included.
    pub replicas: u32,
    /// Instances are the pods `<statefulset>-0` up to `<statefulset>-(replicas - 1)`.
    pub statefulset: String,
    /// Host names of instances that are not `<pod>.<what follows the primary's name in
    /// primaryHost>` (the operator leaves it out; tests on one machine give addresses).
    #[serde(default)]
    pub hosts: BTreeMap<String, String>,
    /// The uid of the PostgreSQLCluster: recorded in the marker of a database made by initdb.
    #[serde(default)]
    pub cluster_uid: Option<String>,
    /// The system identifier of the cluster's database, once the operator recorded it from
    /// the first primary: an instance with an empty volume then never runs initdb, and data
    /// is only ever copied from an instance that holds this database.
    #[serde(default)]
    pub system_identifier: Option<String>,
    /// How long the primary may be cut off from the API server and every replica before it
    /// fences itself ([`super::isolation`]); absent for a single instance.
    #[serde(default)]
    pub isolation_timeout_seconds: Option<u64>,
    /// The operator moves the primary to a replica (a switchover) when the primary's changed
    /// settings need a restart, so the primary does not restart for them itself
    /// ([`super::planned`]). Absent (an older operator, or one instance): it restarts in place.
    #[serde(default)]
    pub restart_by_switchover: bool,
    /// Where the primary archives its WAL ([`super::archive`]); absent: it does not.
    #[serde(default)]
    pub wal_archive: Option<WalArchiveTarget>,
    /// Every instance of the cluster has its certificates: connections to another instance
    /// verify its certificate (`verify-full`); absent or false, they use TLS when offered.
    #[serde(default)]
    pub tls_only: bool,
    /// What the first instance recovers ([`super::recover`]); absent: it runs initdb.
    #[serde(default)]
    pub recovery: Option<RecoveryOrder>,
    /// An in-place point-in-time recovery of the whole cluster ([`super::recover::in_place`]),
    /// with `recovery` as what the primary recovers.
    #[serde(default)]
    pub in_place: Option<InPlaceOrder>,
}

impl Topology {
    pub fn parse(text: &str, path: &Path) -> Result<Self, DesiredError> {
        let topology: Self = serde_json::from_str(text).map_err(|source| DesiredError::Parse {
            path: path.to_owned(),
            source,
        })?;
        if topology.replicas == 0 {
            return Err(DesiredError::NoInstances {
                path: path.to_owned(),
                replicas: topology.replicas,
            });
        }
        Ok(topology)
    }

    /// The instances' pod names.
    pub fn instances(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.replicas).map(|ordinal| format!("{}-{ordinal}", self.statefulset))
    }

    /// Whether `pod` is named as this cluster's instances are (`<statefulset>-<ordinal>`, of any
    /// ordinal: the instance count read here may lag a scale-up) and `host` is its host name.
    pub fn is_instance_host(&self, pod: &str, host: &str) -> bool {
        let sibling = pod
            .strip_prefix(self.statefulset.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|ordinal| {
                !ordinal.is_empty() && ordinal.bytes().all(|byte| byte.is_ascii_digit())
            });
        sibling && self.host_of(pod).as_deref() == Some(host)
    }

    /// The host name of instance `pod`: from [`Self::hosts`], else derived from the primary's
    /// (`<primary>.<headless service>.<namespace>.svc` becomes `<pod>.<...>`).
    pub fn host_of(&self, pod: &str) -> Option<String> {
        if let Some(host) = self.hosts.get(pod) {
            return Some(host.clone());
        }
        if pod == self.primary {
            return Some(self.primary_host.clone());
        }
        let domain = self
            .primary_host
            .strip_prefix(self.primary.as_str())?
            .strip_prefix('.')?;
        Some(format!("{pod}.{domain}"))
    }

    /// The replication slots `primary` keeps: one per instance other than itself.
    pub fn slots_kept_by(&self, primary: &str) -> Vec<String> {
        self.instances()
            .filter(|pod| pod != primary)
            .map(|pod| slot_name(&pod))
            .collect()
    }
}

/// The replication slot of the instance `pod`: `pgkube_` and the pod name with `_` for `-`.
/// A name too long for PostgreSQL keeps its end, where the ordinal is.
pub fn slot_name(pod: &str) -> String {
    let name = format!("{SLOT_PREFIX}{}", pod.replace(['-', '.'], "_"));
    if name.len() <= NAME_MAX {
        return name;
    }
    let tail = &name[name.len() - (NAME_MAX - SLOT_PREFIX.len())..];
    format!("{SLOT_PREFIX}{tail}")
}

/// Whether a slot is one pgkube manages (others, made by users, are left alone).
pub fn is_managed_slot(name: &str) -> bool {
    name.starts_with(SLOT_PREFIX)
}

/// A user name and password from a basic-auth Secret. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// The file the password was read from (initdb reads it directly).
    pub password_file: PathBuf,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    fn load(dir: &Path) -> Result<Self, DesiredError> {
        let password_file = dir.join(PASSWORD);
        let username = read_value(&dir.join(USERNAME))?;
        let password = read_value(&password_file)?;
        Ok(Self {
            username,
            password,
            password_file,
        })
    }
}

/// The application role and the database it owns (the database only when the Secret names it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Application {
    pub credentials: Credentials,
    pub database: Option<String>,
}

impl Application {
    /// The application Secret in `dir`; none while its volume is empty (the Secret is made
    /// after the pods, or was deleted) or when it cannot be used, which is logged.
    fn load(dir: &Path) -> Option<Self> {
        if !dir.join(USERNAME).exists() {
            return None;
        }
        let credentials = match Credentials::load(dir) {
            Ok(credentials) => credentials,
            Err(error) => {
                tracing::warn!(%error, "the application Secret cannot be used");
                return None;
            }
        };
        let database = read_value(&dir.join(DBNAME)).ok();
        Some(Self {
            credentials,
            database,
        })
    }
}

fn read(path: &Path) -> Result<String, DesiredError> {
    std::fs::read_to_string(path).map_err(|source| DesiredError::Read {
        path: path.to_owned(),
        source,
    })
}

/// A one-value file; a trailing newline (as `echo` writes) is not part of the value.
fn read_value(path: &Path) -> Result<String, DesiredError> {
    let value = read(path)?.trim_end_matches(['\n', '\r']).to_owned();
    if value.is_empty() {
        return Err(DesiredError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(json: &str) -> Result<Topology, DesiredError> {
        Topology::parse(json, Path::new("instance.json"))
    }

    #[test]
    fn the_primary_keeps_a_slot_for_every_other_instance() {
        let topology = topology(
            r#"{"primary":"db-postgresql-1","primaryHost":"db-postgresql-1.db-postgresql-headless.ns.svc",
                "port":5432,"replicas":3,"statefulset":"db-postgresql"}"#,
        )
        .expect("valid");
        assert_eq!(
            topology.slots_kept_by(&topology.primary),
            ["pgkube_db_postgresql_0", "pgkube_db_postgresql_2"]
        );
    }

    #[test]
    fn only_the_clusters_own_instances_at_their_hosts_are_instance_hosts() {
        let topology = topology(
            r#"{"primary":"db-postgresql-1","primaryHost":"db-postgresql-1.db-postgresql-headless.ns.svc",
                "port":5432,"replicas":2,"statefulset":"db-postgresql"}"#,
        )
        .expect("valid");
        let host = |pod: &str| format!("{pod}.db-postgresql-headless.ns.svc");
        assert!(topology.is_instance_host("db-postgresql-0", &host("db-postgresql-0")));
        // Beyond the instance count read here: a scale-up the ConfigMap does not show yet.
        assert!(topology.is_instance_host("db-postgresql-7", &host("db-postgresql-7")));
        assert!(!topology.is_instance_host("db-postgresql-0", "evil.example.com"));
        assert!(!topology.is_instance_host("db-postgresql-0", &host("db-postgresql-1")));
        assert!(!topology.is_instance_host("other-0", &host("other-0")));
        assert!(!topology.is_instance_host("db-postgresql-", &host("db-postgresql-")));
        assert!(!topology.is_instance_host("db-postgresql-x", &host("db-postgresql-x")));
    }

    #[test]
    fn instance_hosts_are_derived_from_the_primarys_unless_given() {
        let mut topology = topology(
            r#"{"primary":"db-postgresql-1","primaryHost":"db-postgresql-1.db-postgresql-headless.ns.svc",
                "port":5432,"replicas":3,"statefulset":"db-postgresql"}"#,
        )
        .expect("valid");
        assert_eq!(
            topology.host_of("db-postgresql-2").as_deref(),
            Some("db-postgresql-2.db-postgresql-headless.ns.svc")
        );
        topology.primary_host = "10.0.0.7".to_owned();
        assert_eq!(topology.host_of("db-postgresql-2"), None);
        assert_eq!(
            topology.host_of("db-postgresql-1").as_deref(),
            Some("10.0.0.7")
        );
        let given = Topology::parse(
            r#"{"primary":"a-0","primaryHost":"127.0.0.1","port":5432,"replicas":2,
                "statefulset":"a","hosts":{"a-1":"127.0.0.2"}}"#,
            Path::new("instance.json"),
        )
        .expect("valid");
        assert_eq!(given.host_of("a-1").as_deref(), Some("127.0.0.2"));
        assert_eq!(given.instances().collect::<Vec<_>>(), ["a-0", "a-1"]);
    }

    #[test]
    fn zero_instances_and_missing_fields_are_refused_with_the_file_named() {
        let none = topology(
            r#"{"primary":"a-0","primaryHost":"a","port":5432,"replicas":0,"statefulset":"a"}"#,
        )
        .expect_err("no instance");
        assert!(none.to_string().contains("instance.json: replicas is 0"));
        let missing = topology(r#"{"primary":"a-0"}"#).expect_err("fields missing");
        assert!(
            missing
                .to_string()
                .starts_with("instance.json is not valid")
        );
    }

    #[test]
    fn long_slot_names_keep_the_ordinal() {
        let pod = format!("{}-12", "a".repeat(60));
        let slot = slot_name(&pod);
        assert_eq!(slot.len(), NAME_MAX);
        assert!(slot.starts_with(SLOT_PREFIX) && slot.ends_with("_12"));
        assert!(is_managed_slot(&slot));
        assert!(!is_managed_slot("users_own_slot"));
    }

    #[test]
    fn credentials_are_read_without_the_trailing_newline_and_never_printed() {
        let dir = std::env::temp_dir().join(format!("pgkube-desired-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join(USERNAME), "postgres\n").expect("write");
        std::fs::write(dir.join(PASSWORD), "s3cret\n").expect("write");
        let credentials = Credentials::load(&dir).expect("loads");
        assert_eq!(credentials.username, "postgres");
        assert_eq!(credentials.password, "s3cret");
        assert!(!format!("{credentials:?}").contains("s3cret"));
        std::fs::write(dir.join(PASSWORD), "\n").expect("write");
        let empty = Credentials::load(&dir).expect_err("empty password");
        assert!(empty.to_string().ends_with("password is empty"));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
