//! The figures as Markdown, for `docs/benchmarks.md`.

use std::time::Duration;

use super::bounds::Bounds;
use super::measure::Figures;
use super::server::Primary;
use super::shape;

pub async fn print_setup(server: &Primary, scrapes: usize) {
    let version: String = server
        .sql
        .query_one("SELECT version()", &[])
        .await
        .expect("version()")
        .get(0);
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "bench (release)"
    };
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "metrics_scrape: {version}; pgkube built with the {profile} profile; {cores} cores, \
         load average {}; {} databases of {} tables besides postgres, a streaming replica and \
         {} more slots, {} idle connections; {scrapes} timed scrapes per exporter",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        shape::DATABASES,
        shape::TABLES_PER_DATABASE,
        shape::EXTRA_SLOTS,
        shape::IDLE_CONNECTIONS,
    );
}

pub fn print_rows(rows: &[Figures]) {
    println!();
    println!(
        "| exporter | series (of which its process's) | bytes | median ms | p95 ms | max ms | \
         exporter CPU ms/scrape (raw) | server CPU ms/scrape (raw) | SQL statements | \
         round trips | backends | sessions opened/scrape |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let backend = match row.same_backend {
            Some(true) => " (kept)",
            Some(false) => " (not the first)",
            None => "",
        };
        println!(
            "| {} | {} ({}) | {} | {:.2} | {:.2} | {:.2} | {:.2} ({:.2}) | {:.2} ({:.2}) | {:.1} | {:.1} | {}{backend} | {:.2} |",
            row.name,
            row.series,
            row.own_series,
            row.bytes,
            millis(percentile(&row.wall, 0.5)),
            millis(percentile(&row.wall, 0.95)),
            millis(row.wall.last().copied().unwrap_or_default()),
            row.process_cpu.net_ms,
            row.process_cpu.raw_ms,
            row.server_cpu.net_ms,
            row.server_cpu.raw_ms,
            row.counted.statements,
            row.counted.round_trips,
            row.counted.backends,
            row.sessions,
        );
    }
    for row in rows.iter().filter(|row| row.counted.connections > 0.0) {
        println!(
            "{}: {:.2} connections authorized per scrape in the server's log",
            row.name, row.counted.connections
        );
    }
}

pub fn print_sizes((wall, cpu_ms): (Duration, f64)) {
    println!(
        "The database sizes alone (`pg_database_size` of the {} databases that are not templates, \
         on the bench's connection): {:.2} ms median wall, {cpu_ms:.2} ms of the server's CPU \
         per run.",
        shape::DATABASES + 1,
        millis(wall),
    );
}

pub fn print_bounds(bounds: &Bounds) {
    println!();
    println!(
        "| the instance manager's scrape | wall s | pgkube_postgres_up | the custom query's up |"
    );
    println!("|---|---:|---:|---:|");
    let lines = [
        ("its connection's backend stopped (SIGSTOP)", &bounds.held),
        ("the next scrape (connects again)", &bounds.reconnected),
        ("a custom query sleeps", &bounds.slow_custom),
        (
            "both: the backend let go after the first case's 80 %, then the custom query sleeps",
            &bounds.both,
        ),
    ];
    for (case, bounded) in lines {
        let value = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
        println!(
            "| {case} | {:.2} | {} | {} |",
            bounded.took.as_secs_f64(),
            value(bounded.up),
            value(bounded.slow_up),
        );
    }
    println!(
        "The sleeping query's backend ran on for {:.1} s from its scrape's start; in the last \
         case the backend was let go after {:.2} s.",
        bounds.abandoned_for.as_secs_f64(),
        bounds.released_after.as_secs_f64(),
    );
}

/// The `fraction` percentile of sorted `values` (nearest rank).
fn percentile(values: &[Duration], fraction: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let rank = (fraction * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
