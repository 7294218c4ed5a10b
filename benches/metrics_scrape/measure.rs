//! One exporter's scrapes, one after the other: their wall time, size and series; the CPU time
//! of the exporter's process and of the server, and the sessions opened, over the whole run,
//! less what the same processes use while nobody scrapes; then, with every statement logged,
//! the SQL statements, round trips and backends of a few more scrapes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pgkube_testkit::{cpu_time, http_get};
use serde_json::Value;

use super::server::Primary;

/// Scrapes before anything is measured: connections made, caches warm.
const WARM_UP: usize = 20;
/// How long the idle rates are measured over.
const IDLE: Duration = Duration::from_secs(5);
/// Scrapes whose statements are counted in the log.
const COUNTED: usize = 20;

/// An exporter under measurement.
pub struct Scraper {
    pub name: String,
    pub address: SocketAddr,
    /// Its process, for its CPU time.
    pub process: u32,
    pub backends: Backends,
}

/// How the exporter's backends are told apart from the others'.
pub enum Backends {
    /// The one connection it keeps: this backend (its application name is the instance
    /// manager's, shared with the manager's other connections).
    Kept(i32),
    /// Every backend with this `application_name`.
    Named(String),
}

/// One scrape.
pub struct Scrape {
    pub took: Duration,
    pub body: String,
}

/// `GET /metrics` on a new connection; a scrape that fails is not one to measure.
pub async fn scrape(address: SocketAddr) -> Scrape {
    let started = Instant::now();
    let (code, body) = http_get(address, "/metrics").await.expect("a scrape");
    let took = started.elapsed();
    assert_eq!(code, 200, "{body}");
    Scrape { took, body }
}

/// The value of the sample `series` (its name and labels as written), if any.
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(name, _)| *name == series)
        .and_then(|(_, value)| value.parse().ok())
}

/// What the scrapes of one exporter cost.
pub struct Figures {
    pub name: String,
    /// Wall time of each timed scrape, sorted.
    pub wall: Vec<Duration>,
    pub bytes: usize,
    pub series: usize,
    /// The series about the exporter's own process (`go_`, `process_`, `promhttp_`).
    pub own_series: usize,
    /// CPU milliseconds per scrape: the exporter's process, then all of the server's.
    pub process_cpu: Cpu,
    pub server_cpu: Cpu,
    /// Sessions opened per scrape, less the idle rate.
    pub sessions: f64,
    pub counted: Counted,
    /// For a kept connection: whether the same backend served every scrape.
    pub same_backend: Option<bool>,
}

/// CPU time per scrape: as measured, and less what the process uses idle in as long.
pub struct Cpu {
    pub raw_ms: f64,
    pub net_ms: f64,
}

/// From the log, per scrape.
#[derive(Default)]
pub struct Counted {
    pub statements: f64,
    pub round_trips: f64,
    pub connections: f64,
    /// Backends that ran the counted scrapes' statements.
    pub backends: usize,
}

/// The counters a run is measured by.
struct Reading {
    at: Instant,
    process_cpu: Duration,
    server_cpu: Duration,
    sessions: i64,
}

impl Reading {
    async fn take(primary: &Primary, process: u32) -> Self {
        Self {
            sessions: primary.sessions().await,
            at: Instant::now(),
            process_cpu: cpu_time(process),
            server_cpu: primary.cpu(),
        }
    }

    /// Seconds, CPU seconds of the process and of the server, and sessions since `self`.
    fn until(&self, end: &Reading) -> [f64; 4] {
        [
            (end.at - self.at).as_secs_f64(),
            (end.process_cpu.saturating_sub(self.process_cpu)).as_secs_f64(),
            (end.server_cpu.saturating_sub(self.server_cpu)).as_secs_f64(),
            (end.sessions - self.sessions) as f64,
        ]
    }
}

pub async fn measure(primary: &mut Primary, scraper: &Scraper, scrapes: usize) -> Figures {
    for _ in 0..WARM_UP {
        scrape(scraper.address).await;
    }
    let start = Reading::take(primary, scraper.process).await;
    // Deliberately idle: what the processes use when nobody scrapes.
    tokio::time::sleep(IDLE).await;
    let idle = start.until(&Reading::take(primary, scraper.process).await);

    let start = Reading::take(primary, scraper.process).await;
    let mut wall = Vec::with_capacity(scrapes);
    let mut body = String::new();
    for _ in 0..scrapes {
        let scraped = scrape(scraper.address).await;
        wall.push(scraped.took);
        body = scraped.body;
    }
    let run = start.until(&Reading::take(primary, scraper.process).await);
    wall.sort();

    let per_scrape = |index: usize| {
        let raw = run[index] / scrapes as f64;
        let idle_share = idle[index] / idle[0] * run[0] / scrapes as f64;
        (raw, raw - idle_share)
    };
    let cpu = |index: usize| {
        let (raw, net) = per_scrape(index);
        Cpu {
            raw_ms: raw * 1000.0,
            net_ms: net * 1000.0,
        }
    };
    let same_backend = match &scraper.backends {
        Backends::Kept(pid) => Some(primary.has_backend(*pid).await),
        Backends::Named(_) => None,
    };
    let (series, own_series) = series(&body);
    Figures {
        name: scraper.name.clone(),
        wall,
        bytes: body.len(),
        series,
        own_series,
        process_cpu: cpu(1),
        server_cpu: cpu(2),
        sessions: per_scrape(3).1,
        counted: count(primary, scraper, COUNTED).await,
        same_backend,
    }
}

/// All samples, and those about the exporter's own process.
fn series(body: &str) -> (usize, usize) {
    let samples: Vec<&str> = body
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let own = samples
        .iter()
        .filter(|line| {
            ["go_", "process_", "promhttp_"]
                .iter()
                .any(|p| line.starts_with(p))
        })
        .count();
    (samples.len(), own)
}

/// Scrapes [`COUNTED`] times with every statement logged, and counts what the exporter's
/// backends did.
async fn count(primary: &mut Primary, scraper: &Scraper, scrapes: usize) -> Counted {
    primary.log_statements(true).await;
    let from = primary.mark().await;
    for _ in 0..scrapes {
        scrape(scraper.address).await;
    }
    let to = primary.mark().await;
    primary.log_statements(false).await;
    let messages = primary.messages_between(&from, &to);
    counted(&messages, &scraper.backends, scrapes)
}

/// What `messages` tell of `backends`, per scrape. A simple query or an execution of a
/// prepared statement is one statement and one round trip; a Parse (`debug2`) is a round trip
/// of its own (the statement is prepared, then executed).
fn counted(messages: &[Value], backends: &Backends, scrapes: usize) -> Counted {
    let ours = |message: &Value| match backends {
        Backends::Kept(pid) => message["pid"].as_i64() == Some(i64::from(*pid)),
        Backends::Named(name) => {
            message["application_name"].as_str() == Some(name.as_str())
                || message["message"]
                    .as_str()
                    .is_some_and(|text| text.contains(&format!("application_name={name}")))
        }
    };
    let mut counted = Counted::default();
    let mut pids = HashSet::new();
    for message in messages.iter().filter(|message| ours(message)) {
        let text = message["message"].as_str().unwrap_or_default();
        if text.starts_with("statement: ") || text.starts_with("execute ") {
            counted.statements += 1.0;
            counted.round_trips += 1.0;
            pids.insert(message["pid"].as_i64());
        } else if text.starts_with("parse ") {
            counted.round_trips += 1.0;
        } else if text.starts_with("connection authorized") {
            counted.connections += 1.0;
        }
    }
    let scrapes = scrapes as f64;
    counted.statements /= scrapes;
    counted.round_trips /= scrapes;
    counted.connections /= scrapes;
    counted.backends = pids.len();
    counted
}

/// The database sizes alone, which both exporters read at every scrape: `runs` times the sizes
/// of the databases one may connect to (as the instance manager reads them), on the bench's own connection. The median wall time and
/// the server's CPU time per run.
pub async fn database_sizes(primary: &Primary, runs: usize) -> (Duration, f64) {
    let cpu = primary.cpu();
    let mut wall = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        primary
            .sql
            .query_one(
                "SELECT sum(pg_database_size(oid))::bigint FROM pg_database \
                 WHERE datallowconn AND NOT datistemplate",
                &[],
            )
            .await
            .expect("the sizes");
        wall.push(started.elapsed());
    }
    let cpu_ms = primary.cpu().saturating_sub(cpu).as_secs_f64() * 1000.0 / runs as f64;
    wall.sort();
    (wall[runs / 2], cpu_ms)
}
