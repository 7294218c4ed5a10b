//! PostgreSQL's metrics for Prometheus, served by the instance manager on a port of their own
//! (9187, postgres_exporter's usual one) at `/metrics`: replication lag by replica and the
//! replica's own delay, replication slots and the WAL they retain, connections by state,
//! database sizes, transactions and deadlocks, checkpoints, the age of the oldest transaction
//! ID, and the WAL archiver's metrics (the same as the status port's); and the metrics of the
//! user's own queries ([`custom`]), from a file read again at each scrape.
//!
//! Each scrape reads the server through one kept connection over the local socket, all its
//! queries (the built-in ones, then the custom ones) within one [`SCRAPE_TIMEOUT`]; a scrape that
//! fails or times out says `pgkube_postgres_up 0` (or a custom query's `up 0`), cancels the
//! query still running and drops the connection, to make a new one next time. Scraping is cheap by design: a few
//! catalog and statistics views, no table is read.

mod custom;
mod render;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::Mutex;
use tokio_postgres::Client;

use super::archive::Archiver;
use super::sql;

use custom::CustomResults;
pub use render::{DatabaseStats, ReplicaLag, Sample, render};

/// How long one scrape's queries may take together, the custom ones included.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a scrape reads the server through.
pub struct PostgresMetrics {
    pub socket_dir: PathBuf,
    pub port: u16,
    pub superuser: String,
    pub archiver: Arc<Archiver>,
    /// The custom queries file, in postgres_exporter's format; none: no custom metrics.
    pub custom_queries: Option<PathBuf>,
    client: Mutex<Option<Client>>,
}

impl PostgresMetrics {
    pub fn new(socket_dir: PathBuf, port: u16, superuser: String, archiver: Arc<Archiver>) -> Self {
        Self {
            socket_dir,
            port,
            superuser,
            archiver,
            custom_queries: None,
            client: Mutex::new(None),
        }
    }

    /// With the custom queries of `file`, if any.
    pub fn with_custom_queries(self, file: Option<PathBuf>) -> Self {
        Self {
            custom_queries: file,
            ..self
        }
    }

    /// The metrics text: the server's sample (none when it could not be read in time) and the
    /// archiver's.
    pub async fn scrape(&self) -> Result<String, std::fmt::Error> {
        let mut kept = self.client.lock().await;
        let deadline = tokio::time::Instant::now() + SCRAPE_TIMEOUT;
        let sampled = tokio::time::timeout_at(deadline, self.sample_with(&mut kept)).await;
        let sample = match sampled {
            Ok(Ok(sample)) => Some(sample),
            Ok(Err(error)) => {
                tracing::debug!(%error, "no PostgreSQL metrics this scrape");
                *kept = None;
                None
            }
            Err(_) => {
                tracing::debug!("the PostgreSQL metrics' queries timed out");
                cancel_and_drop(&mut kept).await;
                None
            }
        };
        let custom = match (&self.custom_queries, sample.is_some()) {
            (Some(file), true) => Some(self.run_custom(file, &mut kept, deadline).await),
            _ => None,
        };
        drop(kept);
        let mut text = render(sample.as_ref())?;
        if let Some(custom) = custom {
            text = text.trim_end_matches("# EOF\n").to_owned() + &custom::render(&custom)?;
        }
        // Both are OpenMetrics text: one `# EOF` at the very end.
        let archiver = self.archiver.metrics()?;
        if !archiver.is_empty() {
            text = text.trim_end_matches("# EOF\n").to_owned() + &archiver;
        }
        Ok(text)
    }

    /// The custom queries of `file`, run in the time left before `deadline`; a timeout cancels
    /// the query still running and drops the connection.
    async fn run_custom(
        &self,
        file: &std::path::Path,
        kept: &mut Option<Client>,
        deadline: tokio::time::Instant,
    ) -> CustomResults {
        let queries = match std::fs::read_to_string(file)
            .map_err(|e| e.to_string())
            .and_then(|text| custom::parse(&text))
        {
            Ok(queries) => queries,
            Err(error) => {
                tracing::debug!(file = %file.display(), %error, "no custom metrics");
                return CustomResults::Invalid;
            }
        };
        let Some(client) = kept.as_ref() else {
            return CustomResults::Invalid;
        };
        let ran = tokio::time::timeout_at(deadline, run_queries(client, &queries)).await;
        match ran {
            Ok(ran) => CustomResults::Ran(ran),
            Err(_) => {
                cancel_and_drop(kept).await;
                CustomResults::Ran(queries.into_iter().map(|query| (query, None)).collect())
            }
        }
    }

    async fn sample_with(&self, kept: &mut Option<Client>) -> anyhow::Result<Sample> {
        if kept.as_ref().is_none_or(Client::is_closed) {
            let client = sql::connect_local(&self.socket_dir, self.port, &self.superuser).await?;
            *kept = Some(client);
        }
        let client = kept
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no connection"))?;
        sample(client).await
    }
}

/// How long a cancel request may take: the connection is dropped after it anyway.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(1);

/// Asks the server to cancel the query still running on the kept connection, then drops the
/// connection: without the cancel, the query would run on until its statement timeout and the
/// next scrape's new connection would be a second one meanwhile.
async fn cancel_and_drop(kept: &mut Option<Client>) {
    let Some(client) = kept.take() else {
        return;
    };
    let token = client.cancel_token();
    match tokio::time::timeout(CANCEL_TIMEOUT, token.cancel_query(tokio_postgres::NoTls)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%error, "cannot cancel the metrics query"),
        Err(_) => tracing::debug!("cancelling the metrics query timed out"),
    }
}

/// Each query with its rows, or `None` when it failed. The queries run in a read-only
/// transaction, each as one subquery (so one statement that cannot end the transaction), their
/// rows read as JSON whatever the columns' types.
async fn run_queries(
    client: &Client,
    queries: &[custom::CustomQuery],
) -> Vec<(custom::CustomQuery, Option<Vec<custom::Row>>)> {
    let mut ran = Vec::new();
    for query in queries {
        let rows = match read_only_rows(client, &query.query).await {
            Ok(rows) => Some(rows),
            Err(error) => {
                tracing::debug!(query = %query.name, %error, "a custom query failed");
                None
            }
        };
        ran.push((query.clone(), rows));
    }
    ran
}

async fn read_only_rows(client: &Client, query: &str) -> anyhow::Result<Vec<custom::Row>> {
    let statement = format!(
        "SELECT row_to_json(q)::text FROM ({}) q",
        query.trim().trim_end_matches(';')
    );
    client.batch_execute("BEGIN READ ONLY").await?;
    let rows = client.query(&statement, &[]).await;
    client.batch_execute("ROLLBACK").await?;
    rows?
        .iter()
        .map(|row| custom::json_row(row.get(0)))
        .collect()
}

/// Reads the sample from the server.
async fn sample(client: &Client) -> anyhow::Result<Sample> {
    let in_recovery: bool = client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await?
        .get(0);
    let replicas = if in_recovery {
        Vec::new()
    } else {
        client
            .query(
                "SELECT application_name, \
                 COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0)::bigint, \
                 COALESCE(EXTRACT(EPOCH FROM replay_lag), 0)::float8 \
                 FROM pg_stat_replication",
                &[],
            )
            .await?
            .iter()
            .map(|row| ReplicaLag {
                name: row.get(0),
                bytes: row.get(1),
                seconds: row.get(2),
            })
            .collect()
    };
    let replay_delay_seconds: Option<f64> = if in_recovery {
        client
            .query_one(
                "SELECT CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 \
                 ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END::float8",
                &[],
            )
            .await?
            .get(0)
    } else {
        None
    };
    let slots = client
        .query(
            "SELECT slot_name::text, pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() \
             THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END, restart_lsn)::bigint \
             FROM pg_replication_slots",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let connections = client
        .query(
            "SELECT COALESCE(state, 'unknown'), count(*) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' GROUP BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let databases = client
        .query(
            "SELECT d.datname::text, pg_database_size(d.oid), s.xact_commit, s.xact_rollback, \
             s.deadlocks FROM pg_database d JOIN pg_stat_database s ON s.datid = d.oid \
             WHERE d.datallowconn AND NOT d.datistemplate",
            &[],
        )
        .await?
        .iter()
        .map(|row| DatabaseStats {
            name: row.get(0),
            size_bytes: row.get(1),
            commits: row.get(2),
            rollbacks: row.get(3),
            deadlocks: row.get(4),
        })
        .collect();
    let checkpoints = client
        .query_one(
            "SELECT checkpoints_timed, checkpoints_req FROM pg_stat_bgwriter",
            &[],
        )
        .await?;
    let oldest_xid_age: i64 = client
        .query_one(
            "SELECT max(age(datfrozenxid))::bigint FROM pg_database",
            &[],
        )
        .await?
        .get(0);
    Ok(Sample {
        in_recovery,
        replicas,
        replay_delay_seconds,
        slots,
        connections,
        databases,
        checkpoints_timed: checkpoints.get(0),
        checkpoints_requested: checkpoints.get(1),
        oldest_xid_age,
    })
}

/// Serves `/metrics` on `address` until the task is dropped.
pub async fn serve(address: SocketAddr, metrics: Arc<PostgresMetrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(%address, "PostgreSQL metrics listening");
    let router = Router::new()
        .route("/metrics", get(metrics_text))
        .with_state(metrics);
    axum::serve(listener, router).await
}

async fn metrics_text(State(metrics): State<Arc<PostgresMetrics>>) -> impl IntoResponse {
    super::endpoint::openmetrics(metrics.scrape().await)
}
