//! A client that writes through a cluster's `-rw` Service the way an application with short
//! sessions does: every [`WRITE_PERIOD`], a new connection and one committed row. It keeps the
//! rows whose commit was acknowledged, and when, so that a test can check that none was lost
//! and print how long writes were unavailable.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::cluster::TestCluster;

/// The pause between two writes.
pub const WRITE_PERIOD: Duration = Duration::from_millis(100);
/// How long one write (its connection and its INSERT) may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The writer; see the module's documentation. Rows go to `items (id int PRIMARY KEY)`, which
/// the test creates.
pub struct RwWriter {
    acknowledged: Arc<Mutex<Vec<(i32, Instant)>>>,
    failures: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

/// What the writer saw.
#[derive(Debug)]
pub struct Written {
    /// The rows whose commit was acknowledged.
    pub acknowledged: Vec<i32>,
    /// Tries that failed (a connection or a commit).
    pub failures: usize,
    /// The longest time between two acknowledged commits: how long writes were unavailable.
    pub longest_gap: Duration,
}

impl RwWriter {
    pub fn start(cluster: TestCluster) -> RwWriter {
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (acknowledged, failures, stop) =
                (acknowledged.clone(), failures.clone(), stop.clone());
            async move {
                let mut id = 0;
                while !stop.load(Ordering::SeqCst) {
                    // Each try has its own row: a commit whose answer was lost may be there.
                    id += 1;
                    let write = async {
                        let sql = cluster.sql().await?;
                        sql.execute("INSERT INTO items VALUES ($1)", &[&id]).await?;
                        anyhow::Ok(())
                    };
                    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                        Ok(Ok(())) => lock(&acknowledged).push((id, Instant::now())),
                        Ok(Err(_)) | Err(_) => {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    tokio::time::sleep(WRITE_PERIOD).await;
                }
            }
        });
        RwWriter {
            acknowledged,
            failures,
            stop,
            task,
        }
    }

    /// Commits acknowledged so far.
    pub fn count(&self) -> usize {
        lock(&self.acknowledged).len()
    }

    /// When the first commit after `instant` was acknowledged, if one was.
    pub fn first_acknowledged_after(&self, instant: Instant) -> Option<Instant> {
        lock(&self.acknowledged)
            .iter()
            .map(|(_, at)| *at)
            .find(|at| *at > instant)
    }

    /// Waits until `more` commits beyond `since` are acknowledged.
    pub async fn wait_for(
        &self,
        since: usize,
        more: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        crate::wait_until(
            &format!("{more} more acknowledged commits"),
            timeout,
            || async { Ok((self.count() >= since + more).then_some(())) },
        )
        .await
    }

    /// Stops the writer and says what it saw.
    pub async fn stop(self) -> Written {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        let acknowledged = lock(&self.acknowledged).clone();
        let longest_gap = acknowledged
            .windows(2)
            .map(|pair| pair[1].1.duration_since(pair[0].1))
            .max()
            .unwrap_or_default();
        Written {
            acknowledged: acknowledged.into_iter().map(|(id, _)| id).collect(),
            failures: self.failures.load(Ordering::SeqCst),
            longest_gap,
        }
    }
}

impl Written {
    /// The acknowledged rows that `sql` (a connection to the primary) does not have.
    pub async fn missing_on(&self, sql: &tokio_postgres::Client) -> anyhow::Result<Vec<i32>> {
        let present: std::collections::HashSet<i32> = sql
            .query(
                "SELECT id FROM items WHERE id = ANY($1)",
                &[&self.acknowledged],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        Ok(self
            .acknowledged
            .iter()
            .copied()
            .filter(|id| !present.contains(id))
            .collect())
    }
}

/// A poisoned lock only means the writer's task panicked; what it recorded still holds.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
