//! Benchmark of a scrape of PostgreSQL's metrics: the instance manager's `/metrics` (port 9187
//! in a pod) side by side with postgres_exporter's, on the same PostgreSQL 15 server.
//!
//! Not a test: it prints figures and asserts nothing about them. Needs PostgreSQL 15 (Debian's
//! packages, as the instance tests); no test bed. It installs Debian's
//! `prometheus-postgres-exporter` with `apt-get` when it is missing (as root), and leaves the
//! peer out when it cannot.
//!
//! ```text
//! cargo bench --bench metrics_scrape
//! PGKUBE_BENCH_SCRAPES=500 cargo bench --bench metrics_scrape
//! ```
//!
//! The server is a primary run by `pgkube instance run` on this machine (the beds of
//! `tests/instance_common`) with a streaming replica, holding 20 databases of 20 tables (100
//! rows each, analyzed) besides `postgres`, the replica's slot and 3 more that retain WAL, and
//! 10 idle client connections. It logs as JSON, through the logging collector.
//!
//! For each exporter, one after the other: 20 scrapes to warm up; the CPU time of the
//! exporter's process and of all the server's processes, and the sessions opened, over 5 s
//! without scrapes (the idle rates); then `PGKUBE_BENCH_SCRAPES` (default 200) scrapes one
//! after the other, each on a new HTTP connection without compression, and the same counters
//! over them, less the idle rates; then 20 scrapes with every statement logged
//! (`log_statement = all`, `log_min_messages = debug2` for Parse messages), whose statements,
//! round trips and backends it counts. The exporters: the instance manager (no custom
//! queries), postgres_exporter with its defaults, and postgres_exporter without its
//! `pg_settings` metrics (`--disable-settings-metrics`), the closest to the manager's series.
//!
//! Then the database sizes alone (the query both exporters run at every scrape that costs the
//! server most), 50 times on the bench's connection: median wall time, server CPU per run.
//!
//! Then the instance manager's bounds: a scrape while the backend of its connection is stopped
//! (`SIGSTOP`), the next one, a scrape whose custom query sleeps, and one where both happen,
//! the backend let go after 80% of the first case's time.

#[path = "../../tests/instance_common/mod.rs"]
mod instance_common;

mod bounds;
mod exporter;
mod measure;
mod report;
mod server;
mod shape;

use instance_common::{
    Bed, CUSTOM_QUERIES_FILE, primary_with_kept_rows, terminate, wait_replica_of, wait_status,
};

use exporter::Exporter;
use measure::{Backends, Scraper, measure};
use server::Primary;

const DEFAULT_SCRAPES: usize = 200;
/// Runs of the database sizes' query alone.
const SIZE_RUNS: usize = 50;

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let postgres = format!(
        "/usr/lib/postgresql/{}/bin/postgres",
        instance_common::MAJOR
    );
    if !std::path::Path::new(&postgres).exists() {
        println!("metrics_scrape: no {postgres}, nothing measured");
        return;
    }
    let scrapes = std::env::var("PGKUBE_BENCH_SCRAPES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_SCRAPES);
    let mut bed = Bed::new();
    let (primary, writer) = primary_with_kept_rows(&mut bed, 2).await;
    server::log_as_json(&writer).await;
    drop(writer);
    // The logging collector starts with the server only.
    terminate(&mut bed, primary);
    bed.spawn(primary);
    wait_status(&bed, primary, "a ready primary", |s| {
        s["role"] == "primary" && s["ready"] == true
    })
    .await;
    let shape = shape::make(&bed, primary).await;
    let replica = bed.start(1, 2);
    wait_replica_of(&bed, replica, primary, 100).await;

    let pgdata = bed.instances[primary].dir.join("data/pgdata");
    let sql = bed.sql(primary, "first").await.expect("the primary");
    let mut server = Primary::new(sql, &pgdata);
    report::print_setup(&server, scrapes).await;

    let address = bed.instances[primary].metrics;
    let (_, backend) = bounds::connecting_scrape(&server, address).await;
    let manager = Scraper {
        name: "pgkube instance manager".to_owned(),
        address,
        process: bed.instances[primary].child.as_ref().expect("running").id(),
        backends: Backends::Kept(backend),
    };
    let mut rows = vec![measure(&mut server, &manager, scrapes).await];
    match exporter::install() {
        Ok(version) => {
            rows.extend(measure_peers(&bed, primary, &mut server, &version, scrapes).await)
        }
        Err(why) => println!("postgres_exporter: left out: {why}"),
    }
    report::print_rows(&rows);
    report::print_sizes(measure::database_sizes(&server, SIZE_RUNS).await);

    let queries = bed.instances[primary].dir.join(CUSTOM_QUERIES_FILE);
    let bounds = bounds::check(&server, address, backend, &queries).await;
    report::print_bounds(&bounds);
    drop(shape);
    terminate(&mut bed, replica);
    terminate(&mut bed, primary);
}

/// postgres_exporter with its defaults, then without its `pg_settings` metrics.
async fn measure_peers(
    bed: &Bed,
    primary: usize,
    server: &mut Primary,
    version: &str,
    scrapes: usize,
) -> Vec<measure::Figures> {
    let peers: [(&str, &[&str]); 2] = [
        ("defaults", &[]),
        (
            "--disable-settings-metrics",
            &["--disable-settings-metrics"],
        ),
    ];
    let mut rows = Vec::new();
    for (flags, args) in peers {
        let name = format!("postgres_exporter {version}, {flags}");
        match Exporter::start(bed, primary, args).await {
            Ok(exporter) => {
                let peer = Scraper {
                    name,
                    address: exporter.address,
                    process: exporter.pid(),
                    backends: Backends::Named(exporter::APPLICATION.to_owned()),
                };
                rows.push(measure(server, &peer, scrapes).await);
                drop(exporter);
                // Its backends end on their own; their CPU time is then the postmaster's.
                server.wait_no_backends(exporter::APPLICATION).await;
            }
            Err(why) => println!("{name}: left out: {why}"),
        }
    }
    rows
}
