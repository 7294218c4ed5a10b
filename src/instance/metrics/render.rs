//! A sample of the server's statistics as OpenMetrics text (pure).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What one scrape read from the server.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub in_recovery: bool,
    /// On a primary: each replica streaming from it.
    pub replicas: Vec<ReplicaLag>,
    /// On a replica: how far behind its replay is (0 when it replayed all it received).
    pub replay_delay_seconds: Option<f64>,
    /// Each replication slot and the WAL it retains, in bytes (none for a slot never used).
    pub slots: Vec<(String, Option<i64>)>,
    /// Client connections by state.
    pub connections: Vec<(String, i64)>,
    pub databases: Vec<DatabaseStats>,
    pub checkpoints_timed: i64,
    pub checkpoints_requested: i64,
    /// The age of the oldest unfrozen transaction ID of any database.
    pub oldest_xid_age: i64,
}

/// A replica as its primary sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaLag {
    /// Its `application_name`: the replica's pod.
    pub name: String,
    /// WAL written on the primary and not replayed on the replica yet.
    pub bytes: i64,
    /// How long the last replayed WAL took to be replayed there.
    pub seconds: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatabaseStats {
    pub name: String,
    pub size_bytes: i64,
    pub commits: i64,
    pub rollbacks: i64,
    pub deadlocks: i64,
}

type Labels = Vec<(String, String)>;

/// The metrics of `sample`; only `pgkube_postgres_up 0` without one.
pub fn render(sample: Option<&Sample>) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("pgkube_postgres");
    let up = Gauge::<i64>::default();
    up.set(i64::from(sample.is_some()));
    registry.register("up", "whether the last scrape read the server", up);
    if let Some(sample) = sample {
        register(&mut registry, sample);
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

fn register(registry: &mut Registry, sample: &Sample) {
    gauge(
        registry,
        "in_recovery",
        "1 on a replica (the server is in recovery), 0 on a primary",
        i64::from(sample.in_recovery),
    );
    let label = |name: &str, value: &str| vec![(name.to_owned(), value.to_owned())];
    let lag_bytes = Family::<Labels, Gauge>::default();
    let lag_seconds = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for replica in &sample.replicas {
        lag_bytes
            .get_or_create(&label("replica", &replica.name))
            .set(replica.bytes);
        lag_seconds
            .get_or_create(&label("replica", &replica.name))
            .set(replica.seconds);
    }
    registry.register(
        "replication_lag_bytes",
        "on the primary: WAL not yet replayed by each streaming replica",
        lag_bytes,
    );
    registry.register(
        "replication_lag_seconds",
        "on the primary: the replay lag each streaming replica reports",
        lag_seconds,
    );
    if let Some(delay) = sample.replay_delay_seconds {
        let gauge = Gauge::<f64, AtomicU64>::default();
        gauge.set(delay);
        registry.register(
            "replay_delay_seconds",
            "on a replica: the age of the last replayed transaction, 0 when all received WAL is replayed",
            gauge,
        );
    }
    let retained = Family::<Labels, Gauge>::default();
    for (slot, bytes) in &sample.slots {
        if let Some(bytes) = bytes {
            retained.get_or_create(&label("slot", slot)).set(*bytes);
        }
    }
    registry.register(
        "slot_retained_wal_bytes",
        "WAL each replication slot keeps on this server",
        retained,
    );
    let connections = Family::<Labels, Gauge>::default();
    for (state, count) in &sample.connections {
        connections
            .get_or_create(&label("state", state))
            .set(*count);
    }
    registry.register("connections", "client connections by state", connections);
    register_databases(registry, &sample.databases);
    counter(
        registry,
        "checkpoints_timed",
        "checkpoints started by checkpoint_timeout",
        sample.checkpoints_timed,
    );
    counter(
        registry,
        "checkpoints_requested",
        "checkpoints asked for (by WAL volume, a backup, a command)",
        sample.checkpoints_requested,
    );
    gauge(
        registry,
        "oldest_xid_age",
        "age of the oldest unfrozen transaction ID of any database (wraparound comes at 2^31)",
        sample.oldest_xid_age,
    );
}

fn register_databases(registry: &mut Registry, databases: &[DatabaseStats]) {
    let size = Family::<Labels, Gauge>::default();
    let commits = Family::<Labels, Counter>::default();
    let rollbacks = Family::<Labels, Counter>::default();
    let deadlocks = Family::<Labels, Counter>::default();
    for database in databases {
        let labels = vec![("database".to_owned(), database.name.clone())];
        size.get_or_create(&labels).set(database.size_bytes);
        commits
            .get_or_create(&labels)
            .inc_by(non_negative(database.commits));
        rollbacks
            .get_or_create(&labels)
            .inc_by(non_negative(database.rollbacks));
        deadlocks
            .get_or_create(&labels)
            .inc_by(non_negative(database.deadlocks));
    }
    registry.register("database_size_bytes", "size of each database", size);
    registry.register(
        "transactions_committed",
        "transactions committed in each database",
        commits,
    );
    registry.register(
        "transactions_rolled_back",
        "transactions rolled back in each database",
        rollbacks,
    );
    registry.register(
        "deadlocks",
        "deadlocks detected in each database",
        deadlocks,
    );
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let gauge = Gauge::<i64>::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let counter = Counter::<u64>::default();
    counter.inc_by(non_negative(value));
    registry.register(name, help, counter);
}

fn non_negative(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_sample_only_up_is_zero() {
        let text = render(None).expect("renders");
        assert!(text.contains("pgkube_postgres_up 0\n"), "{text}");
        assert!(!text.contains("pgkube_postgres_in_recovery"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn a_primarys_sample_names_each_replica_slot_state_and_database() {
        let sample = Sample {
            in_recovery: false,
            replicas: vec![ReplicaLag {
                name: "db-postgresql-1".to_owned(),
                bytes: 8192,
                seconds: 0.25,
            }],
            replay_delay_seconds: None,
            slots: vec![
                ("pgkube_db_postgresql_1".to_owned(), Some(16384)),
                ("unused".to_owned(), None),
            ],
            connections: vec![("active".to_owned(), 2), ("idle".to_owned(), 3)],
            databases: vec![DatabaseStats {
                name: "app".to_owned(),
                size_bytes: 7_000_000,
                commits: 42,
                rollbacks: 1,
                deadlocks: 0,
            }],
            checkpoints_timed: 5,
            checkpoints_requested: 2,
            oldest_xid_age: 731,
        };
        let text = render(Some(&sample)).expect("renders");
        for line in [
            "pgkube_postgres_up 1",
            "pgkube_postgres_in_recovery 0",
            "pgkube_postgres_replication_lag_bytes{replica=\"db-postgresql-1\"} 8192",
            "pgkube_postgres_replication_lag_seconds{replica=\"db-postgresql-1\"} 0.25",
            "pgkube_postgres_slot_retained_wal_bytes{slot=\"pgkube_db_postgresql_1\"} 16384",
            "pgkube_postgres_connections{state=\"idle\"} 3",
            "pgkube_postgres_database_size_bytes{database=\"app\"} 7000000",
            "pgkube_postgres_transactions_committed_total{database=\"app\"} 42",
            "pgkube_postgres_deadlocks_total{database=\"app\"} 0",
            "pgkube_postgres_checkpoints_requested_total 2",
            "pgkube_postgres_oldest_xid_age 731",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} in:\n{text}");
        }
        assert!(
            !text.contains("unused"),
            "a slot never used retains nothing"
        );
        assert!(!text.contains("replay_delay"), "a primary replays nothing");
    }
}
