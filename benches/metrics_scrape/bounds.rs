//! Whether a scrape of the instance manager's metrics ends in bounded time when the server does
//! not answer: its built-in queries held up (the backend of its kept connection stopped with
//! `SIGSTOP`), a custom query that sleeps, and both, the built-in queries answered only shortly
//! before their time runs out.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use pgkube_testkit::Frozen;

use super::measure::{Scrape, sample, scrape};
use super::server::Primary;

/// The `application_name` of all the instance manager's connections.
pub const MANAGER_APPLICATION: &str = "pgkube-instance-manager";
const GONE_WAIT: Duration = Duration::from_secs(60);
const SLOW_QUERIES: &str = r#"slow:
  query: "SELECT 1 AS one FROM pg_sleep(60)"
  metrics:
    - one: {usage: GAUGE, description: "Never answers in time"}
"#;
const UP: &str = "pgkube_postgres_up";
const SLOW_UP: &str = "pgkube_postgres_custom_query_up{query=\"slow\"}";

/// A scrape that makes the metrics' connection (the first, or the one after a failure), and
/// that connection's backend.
pub async fn connecting_scrape(primary: &Primary, address: SocketAddr) -> (Scrape, i32) {
    let since = primary.now().await;
    let scraped = scrape(address).await;
    let backends = primary.backends_since(MANAGER_APPLICATION, since).await;
    let mut pids = backends.into_iter();
    match (pids.next(), pids.next()) {
        (Some(pid), None) => (scraped, pid),
        _ => panic!("not one new backend of the manager ran the scrape's queries"),
    }
}

/// A scrape's wall time and what it said.
pub struct Bounded {
    pub took: Duration,
    pub up: Option<f64>,
    pub slow_up: Option<f64>,
}

impl From<Scrape> for Bounded {
    fn from(scraped: Scrape) -> Self {
        Self {
            took: scraped.took,
            up: sample(&scraped.body, UP),
            slow_up: sample(&scraped.body, SLOW_UP),
        }
    }
}

pub struct Bounds {
    /// The backend stopped.
    pub held: Bounded,
    /// The next scrape, which connects again.
    pub reconnected: Bounded,
    /// The custom query sleeps.
    pub slow_custom: Bounded,
    /// How long the slow query's backend ran on after that scrape started.
    pub abandoned_for: Duration,
    /// The built-in queries answered shortly before their time ran out, then the custom query
    /// slept; and when the backend was let go, from the scrape's start.
    pub both: Bounded,
    pub released_after: Duration,
}

/// The scrapes of `address` (whose connection's backend is `backend`) in each case; the custom
/// queries go to `queries` (absent before and after).
pub async fn check(primary: &Primary, address: SocketAddr, backend: i32, queries: &Path) -> Bounds {
    let frozen = Frozen::stop(backend as u32).expect("SIGSTOP");
    let held = Bounded::from(scrape(address).await);
    drop(frozen);
    wait_gone(primary, backend).await;
    let (scraped, backend) = connecting_scrape(primary, address).await;
    let reconnected = Bounded::from(scraped);

    std::fs::write(queries, SLOW_QUERIES).expect("the queries file");
    let started = Instant::now();
    let slow_custom = Bounded::from(scrape(address).await);
    wait_gone(primary, backend).await;
    let abandoned_for = started.elapsed();

    std::fs::remove_file(queries).expect("no queries file");
    let (_, backend) = connecting_scrape(primary, address).await;
    let frozen = Frozen::stop(backend as u32).expect("SIGSTOP");
    std::fs::write(queries, SLOW_QUERIES).expect("the queries file");
    // Let go once most of the built-in queries' time (as the first case measured it) is gone.
    let released_after = held.took.mul_f64(0.8);
    let release = tokio::spawn(async move {
        tokio::time::sleep(released_after).await;
        drop(frozen);
    });
    let both = Bounded::from(scrape(address).await);
    release.await.expect("the backend let go");
    std::fs::remove_file(queries).expect("no queries file");
    wait_gone(primary, backend).await;
    Bounds {
        held,
        reconnected,
        slow_custom,
        abandoned_for,
        both,
        released_after,
    }
}

/// Waits until backend `pid` has ended.
async fn wait_gone(primary: &Primary, pid: i32) {
    let deadline = Instant::now() + GONE_WAIT;
    while primary.has_backend(pid).await {
        assert!(Instant::now() < deadline, "backend {pid} still there");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
