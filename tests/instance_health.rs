//! The instance manager's health tells the truth, with `pgkube instance run` as real processes on
//! this machine and PostgreSQL 15, no Kubernetes (the beds of `instance_manager.rs`):
//!
//! - a primary whose postmaster is frozen (`SIGSTOP`, not killed: its backends, the manager's
//!   own connection's among them, go on answering) is reported not ready within a few seconds,
//!   and ready again once it runs (`SIGCONT`);
//! - such a primary, told to follow the replica that is to be promoted, is killed at once rather
//!   than shut down (it would handle no signal), reports itself a primary until its server is
//!   down and its clients' connections with it, and rejoins as the new primary's replica;
//! - when the supervisor loop itself is stuck (a tick blocked reading a mounted file, as on a
//!   hung volume), `/status` still says ready but its age grows, `/readyz` fails once it is
//!   stale, and `/healthz` fails once the loop has not turned for a watch period plus 30 s;
//!   both pass again when the loop turns again.

mod instance_common;

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use instance_common::*;
use pgkube_testkit::{Frozen, http_get};
use serde_json::Value;

/// How soon a primary whose postmaster hangs is reported not ready: a new connection is given
/// 3 s, at a tick every 500 ms here (`PGKUBE_WATCH_PERIOD` of the beds), and some slack.
const NOT_READY_WITHIN: Duration = Duration::from_secs(8);
/// How soon such a primary, told to follow, is down: killed and its backends gone, well before
/// the fast shutdown's 20 s (`PGKUBE_SHUTDOWN_TIMEOUT` of the beds) would have run out.
const KILLED_WITHIN: Duration = Duration::from_secs(15);
/// A status older than this is stale (the manager's and the operator's bound).
const STALE_AFTER_SECONDS: f64 = 10.0;
/// How long the supervisor loop may go without turning, beyond a watch period, before
/// `/healthz` fails.
const LIVENESS_MARGIN: Duration = Duration::from_secs(30);

/// The PID of instance `index`'s postmaster, from its `postmaster.pid`.
fn postmaster_pid(bed: &Bed, index: usize) -> u32 {
    let file = bed.instances[index].dir.join("data/pgdata/postmaster.pid");
    let text = std::fs::read_to_string(&file).expect("postmaster.pid");
    text.lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .unwrap_or_else(|| panic!("a PID in {text:?}"))
}

/// The HTTP status code of `GET path` on instance `index`'s endpoint.
async fn code(bed: &Bed, index: usize, path: &str) -> u16 {
    let asked = http_get(bed.instances[index].status, path);
    tokio::time::timeout(Duration::from_secs(5), asked)
        .await
        .unwrap_or_else(|_| panic!("{path} answers within 5 s"))
        .unwrap_or_else(|error| panic!("{path}: {error:#}"))
        .0
}

async fn current_status(bed: &Bed, index: usize) -> Value {
    status(&bed.instances[index])
        .await
        .expect("the endpoint serves a status")
}

fn age(status: &Value) -> f64 {
    status["ageSeconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("ageSeconds in {status}"))
}

/// Waits until `condition` holds of instance `index`'s status; how long that took.
async fn time_until(
    bed: &Bed,
    index: usize,
    what: &str,
    condition: impl Fn(&Value) -> bool,
) -> Duration {
    let started = Instant::now();
    wait_status(bed, index, what, condition).await;
    started.elapsed()
}

fn is_ready_primary(status: &Value) -> bool {
    status["role"] == "primary" && status["ready"] == true
}

#[tokio::test]
async fn a_primary_whose_postmaster_hangs_is_not_ready_until_it_answers_again() {
    let mut bed = Bed::new();
    let primary = bed.start(0, 1);
    wait_status(&bed, primary, "a ready primary", is_ready_primary).await;
    assert_eq!(code(&bed, primary, "/readyz").await, 200);

    let frozen = Frozen::stop(postmaster_pid(&bed, primary)).expect("SIGSTOP of the postmaster");
    let took = time_until(&bed, primary, "a primary not ready", |s| {
        s["role"] == "primary" && s["ready"] == false
    })
    .await;
    assert!(
        took < NOT_READY_WITHIN,
        "not ready only {took:?} after the freeze"
    );
    // It stays so, tick after tick, with a current status: the loop goes on turning.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(4) {
        let status = current_status(&bed, primary).await;
        assert_eq!(status["ready"], false, "{status}");
        assert_eq!(status["role"], "primary", "{status}");
        assert_eq!(
            status["message"], "the server accepts no new connection",
            "{status}"
        );
        // Set at each tick, which waits for the new connection 3 s.
        assert!(age(&status) < 5.0, "{status}");
        assert_eq!(code(&bed, primary, "/readyz").await, 503);
        assert_eq!(code(&bed, primary, "/healthz").await, 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    drop(frozen);
    let took = time_until(&bed, primary, "a ready primary again", is_ready_primary).await;
    assert!(took < NOT_READY_WITHIN, "ready again only after {took:?}");
    let status = current_status(&bed, primary).await;
    assert!(status["message"].is_null(), "{status}");
    assert_eq!(code(&bed, primary, "/readyz").await, 200);
}

#[tokio::test]
async fn a_hung_primary_told_to_follow_is_killed_at_once_and_rejoins_as_a_replica() {
    let mut bed = Bed::new();
    let (old, writer) = primary_with_kept_rows(&mut bed, 2).await;
    let new = bed.start(1, 2);
    wait_replica_of(&bed, new, old, 100).await;
    let old_postmaster = postmaster_pid(&bed, old);

    // A client connected before the freeze: its backend still runs.
    let frozen = Frozen::stop(old_postmaster).expect("SIGSTOP of the postmaster");
    wait_status(&bed, old, "a primary not ready", |s| {
        s["role"] == "primary" && s["ready"] == false
    })
    .await;
    writer
        .execute("SELECT 1", &[])
        .await
        .expect("the old backend answers while its postmaster is frozen");

    // The operator's failover: the old primary is told to follow the replica, which is
    // promoted once the old one no longer reports a primary.
    order_follow(&bed, old, new).await;
    let took = time_until(&bed, old, "no longer a primary", |s| s["role"] != "primary").await;
    assert!(took < KILLED_WITHIN, "down only {took:?} after the order");
    assert!(
        !Path::new(&format!("/proc/{old_postmaster}")).exists(),
        "the frozen postmaster is gone once its instance no longer reports a primary"
    );
    let refused = writer.execute("INSERT INTO kept VALUES (1000)", &[]).await;
    assert!(refused.is_err(), "the old primary's client can still write");
    drop(frozen);

    let (code, status) = post(&bed.instances[new], "/control/promote", Some(TOKEN), "{}").await;
    assert_eq!(code, 200, "{status}");
    let writer = bed
        .sql(new, "first")
        .await
        .expect("the new primary answers");
    assert_eq!(
        count(&writer).await.expect("rows"),
        100,
        "every committed row"
    );
    writer
        .execute("INSERT INTO kept VALUES (101)", &[])
        .await
        .expect("the new primary takes writes");
    wait_replica_of(&bed, old, new, 101).await;
}

/// Makes `config` a FIFO with no writer: the manager's next read of it blocks its supervisor
/// loop in `open`, as a read of a hung volume would. Returns another name of the FIFO.
fn block_reads_of(bed: &Bed, config: &Path) -> std::path::PathBuf {
    let dir = config
        .parent()
        .and_then(Path::parent)
        .expect("instance dir");
    let fifo = dir.join("blocking-fifo");
    let made = std::process::Command::new("mkfifo")
        .args(["-m", "0644"])
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    bed.give_to_os_user(&fifo);
    let link = config.with_extension("fifo");
    std::fs::hard_link(&fifo, &link).expect("a second name");
    std::fs::rename(&link, config).expect("the FIFO in place of the file");
    fifo
}

/// Puts `content` back in a regular file at `config`, then gives the blocked read its end.
async fn unblock(config: &Path, fifo: std::path::PathBuf, content: String) {
    let fresh = config.with_extension("fresh");
    std::fs::write(&fresh, &content).expect("the file again");
    std::fs::rename(&fresh, config).expect("in place");
    let written = tokio::task::spawn_blocking(move || {
        let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo)?;
        writer.write_all(content.as_bytes())
    });
    tokio::time::timeout(Duration::from_secs(10), written)
        .await
        .expect("the blocked reader takes the content")
        .expect("the writer task")
        .expect("written");
}

#[tokio::test]
async fn healthz_fails_when_the_supervisor_loop_is_stuck_and_passes_once_it_turns_again() {
    let mut bed = Bed::new();
    let primary = bed.start(0, 1);
    wait_status(&bed, primary, "a ready primary", is_ready_primary).await;
    assert_eq!(code(&bed, primary, "/healthz").await, 200);
    let config = bed.instances[primary].dir.join("config/postgresql.conf");
    let content = std::fs::read_to_string(&config).expect("the config");

    let fifo = block_reads_of(&bed, &config);
    let stuck = Instant::now();
    // The status stays what it was, ready, but its age grows: /readyz fails once it is stale.
    let mut stale_after = None;
    let failed_after = loop {
        let status = current_status(&bed, primary).await;
        if stale_after.is_none() && age(&status) > STALE_AFTER_SECONDS {
            assert_eq!(status["ready"], true, "{status}");
            assert_eq!(code(&bed, primary, "/readyz").await, 503, "{status}");
            stale_after = Some(stuck.elapsed());
        }
        if code(&bed, primary, "/healthz").await == 503 {
            break stuck.elapsed();
        }
        assert!(
            stuck.elapsed() < LIVENESS_MARGIN + Duration::from_secs(15),
            "/healthz still passes; last status {status}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let stale_after = stale_after.expect("the status went stale before /healthz failed");
    eprintln!("stale after {stale_after:?}, /healthz failing after {failed_after:?}");
    assert!(
        failed_after >= LIVENESS_MARGIN - Duration::from_secs(1),
        "/healthz failed after {failed_after:?}, before the bound"
    );
    assert!(age(&current_status(&bed, primary).await) > STALE_AFTER_SECONDS);

    unblock(&config, fifo, content).await;
    eventually("/healthz passes again", || async {
        Ok((code(&bed, primary, "/healthz").await == 200).then_some(()))
    })
    .await;
    wait_status(
        &bed,
        primary,
        "a ready primary with a current status",
        |s| is_ready_primary(s) && age(s) < 2.0,
    )
    .await;
    assert_eq!(code(&bed, primary, "/readyz").await, 200);
}
