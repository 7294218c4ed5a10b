//! The bench's tables, in Markdown so that they go to the README as printed.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::audit::Request;
use crate::{ByVerb, Converged, count};

const VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// What one N measured.
pub struct Row {
    pub n: usize,
    pub created_in: Duration,
    pub converged: Converged,
    /// The manager's CPU time from the first create to the last cluster Running.
    pub cpu: Duration,
    pub peak_rss: Option<u64>,
    /// The manager's requests over that time, from the audit log.
    pub requests: Vec<Request>,
    /// The same, as the manager counted them (None: it exposes no such metric).
    pub metric_requests: Option<ByVerb>,
    /// The cluster controller's reconciles over that time (None: not on its /metrics).
    pub reconciles: Option<f64>,
    pub idle: Duration,
    pub idle_requests: Vec<Request>,
    pub idle_metric: Option<ByVerb>,
    pub cleanup: Option<Duration>,
}

impl Row {
    fn per_minute_at_rest(&self, count: f64) -> f64 {
        count * 60.0 / self.idle.as_secs_f64()
    }
}

pub fn print(rows: &[Row], idle: Duration, load_before: &str, load_after: &str) {
    header(idle, load_before, load_after);
    summary(rows);
    by_verb(rows);
    by_resource(rows);
}

fn header(idle: Duration, load_before: &str, load_after: &str) {
    let profile = if cfg!(debug_assertions) {
        "dev (debug)"
    } else {
        "bench (= release: fat LTO, 1 codegen unit)"
    };
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!();
    println!(
        "Convergence: `pgkube run` built with the {profile} profile, --kube-api-qps {} \
         --kube-api-burst {}, one watched namespace; test bed on {cores} cores ({}), load average \
         {load_before} before, {load_after} after (shared machine: figures are noisy); at rest \
         over {} s, from {} s after the last cluster was Running.",
        crate::QPS,
        crate::BURST,
        cpu_model(),
        idle.as_secs(),
        crate::SETTLE.as_secs(),
    );
    println!();
}

fn summary(rows: &[Row]) {
    println!(
        "| clusters | created in | all Running after | manager CPU | CPU per Running cluster | peak RSS | \
         reconciles per cluster | writes/min at rest (API server) | writes/min at rest \
         (manager's count) | deleted in |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let converged = if row.converged.running == row.n {
            format!("{:.1} s", row.converged.elapsed.as_secs_f64())
        } else {
            format!(
                "not converged: {:.0} s, {} Running",
                row.converged.elapsed.as_secs_f64(),
                row.converged.running
            )
        };
        let idle_writes = count(&row.idle_requests).0;
        let metric_writes = row.idle_metric.as_ref().map_or("–".to_owned(), |by_verb| {
            format!("{:.1}", row.per_minute_at_rest(writes(by_verb)))
        });
        let reconciles = row.reconciles.map_or("–".to_owned(), |count| {
            format!("{:.2}", count / row.n.max(1) as f64)
        });
        println!(
            "| {} | {:.1} s | {converged} | {:.2} s | {:.1} ms | {} | {reconciles} | {:.1} | {metric_writes} | {} |",
            row.n,
            row.created_in.as_secs_f64(),
            row.cpu.as_secs_f64(),
            row.cpu.as_secs_f64() * 1e3 / row.converged.running.max(1) as f64,
            row.peak_rss.map_or("–".to_owned(), |b| format!(
                "{:.1} MiB",
                b as f64 / 1048576.0
            )),
            row.per_minute_at_rest(writes(&idle_writes)),
            row.cleanup.map_or("timed out".to_owned(), |d| format!(
                "{:.0} s",
                d.as_secs_f64()
            )),
        );
    }
    println!();
}

fn writes(by_verb: &ByVerb) -> f64 {
    // A float sum starts at -0.0, which would print as "-0.0".
    WRITES
        .iter()
        .filter_map(|verb| by_verb.get(*verb))
        .sum::<f64>()
        + 0.0
}

fn by_verb(rows: &[Row]) {
    println!(
        "API requests per cluster, from the first create until all are Running \
         (API server: its audit log of the manager's ServiceAccount; manager: \
         pgkube_kube_client_requests_total):"
    );
    println!();
    println!("| clusters | counted by | {} | total |", VERBS.join(" | "));
    println!("|---:|---|{}---:|", "---:|".repeat(VERBS.len()));
    for row in rows {
        let n = row.n as f64;
        verb_line(row.n, "API server", &count(&row.requests).0, n);
        match &row.metric_requests {
            Some(by_verb) => verb_line(row.n, "manager", by_verb, n),
            None => println!(
                "| {} | manager | {}not exposed by this build |",
                row.n,
                "| ".repeat(VERBS.len())
            ),
        }
    }
    println!();
}

fn verb_line(n: usize, source: &str, by_verb: &ByVerb, clusters: f64) {
    let cells: Vec<String> = VERBS
        .iter()
        .map(|verb| {
            format!(
                "{:.2}",
                by_verb.get(*verb).copied().unwrap_or(0.0) / clusters
            )
        })
        .collect();
    let total = by_verb.values().sum::<f64>() + 0.0;
    println!(
        "| {n} | {source} | {} | {:.2} |",
        cells.join(" | "),
        total / clusters
    );
}

/// Each (verb, resource) per cluster, then the requests at rest.
fn by_resource(rows: &[Row]) {
    for row in rows {
        let (_, resources) = count(&row.requests);
        let mut sorted: Vec<_> = resources.into_iter().collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
        let listed: Vec<String> = sorted
            .iter()
            .map(|((verb, resource), c)| format!("{verb} {resource} {:.2}", c / row.n as f64))
            .collect();
        println!(
            "- N = {}, per cluster (API server): {}",
            row.n,
            listed.join(", ")
        );
        let (_, idle) = count(&row.idle_requests);
        let idle: BTreeMap<_, _> = idle.into_iter().collect();
        let listed: Vec<String> = idle
            .iter()
            .map(|((verb, resource), c)| format!("{verb} {resource} {c:.0}"))
            .collect();
        println!(
            "- N = {}, at rest over {} s (API server): {}",
            row.n,
            row.idle.as_secs(),
            if listed.is_empty() {
                "none".to_owned()
            } else {
                listed.join(", ")
            }
        );
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}
