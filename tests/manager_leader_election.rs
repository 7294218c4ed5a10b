//! Leader election of real `pgkube run` processes on the test bed's API server: exactly one of
//! two managers leads and runs the controllers; after kill -9 of the leader the other takes over
//! once the Lease expires; a graceful stop (SIGTERM) releases the Lease at once and exits 0.

mod manager_common;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use manager_common::Manager;
use pgkube_testkit::http_get;
use pgkube_testkit::{TestNamespace, install_crds, testbed, wait_until};

/// Short timings so the test runs in seconds: a dead leader's Lease expires 5 s after its last
/// renewal, followers look every 500 ms.
const LEASE_DURATION: Duration = Duration::from_secs(5);
const LEASE_FLAGS: &[&str] = &[
    "--leader-elect-lease-duration",
    "5s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
];
/// Time on top of the lease duration for a follower to notice (retry period, the lease
/// manager's up-to-1 s jitter after an expired lock) on a loaded machine.
const TAKEOVER_SLACK: Duration = Duration::from_secs(5);
const LEASE_NAME: &str = "pgkube-leader-test";

fn candidate(env: &pgkube_testkit::TestEnv, name: &str, namespace: &str) -> Manager {
    let mut flags = vec![
        "--leader-elect",
        "--leader-elect-id",
        LEASE_NAME,
        "--leader-elect-namespace",
        namespace,
    ];
    flags.extend_from_slice(LEASE_FLAGS);
    Manager::start(env, name, &flags)
}

/// The host name part of the Lease's holder identity (`<host>_<random>`), if held.
async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    let lease = leases.get_opt(LEASE_NAME).await?;
    Ok(lease
        .and_then(|lease| lease.spec?.holder_identity)
        .and_then(|identity| Some(identity.rsplit_once('_')?.0.to_owned())))
}

async fn wait_for_holder(leases: &Api<Lease>, among: &[&str], timeout: Duration) -> String {
    wait_until(
        &format!("one of {among:?} to hold the Lease"),
        timeout,
        || async {
            Ok(holder(leases)
                .await?
                .filter(|name| among.contains(&name.as_str())))
        },
    )
    .await
    .expect("a leader")
}

/// `leader_election_master_status` of a manager: 1 leader, 0 follower.
async fn leader_status(manager: &Manager) -> anyhow::Result<Option<u8>> {
    let (_, body) = http_get(manager.endpoint("metrics").await, "/metrics").await?;
    let sample = format!("leader_election_master_status{{name=\"{LEASE_NAME}\"}} ");
    Ok(body
        .lines()
        .find_map(|line| line.strip_prefix(&sample))
        .and_then(|value| value.trim().parse().ok()))
}

#[tokio::test]
async fn one_leader_takes_over_after_kill_and_hands_over_on_sigterm() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "manager-lease").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace.name());

    // Two candidates: exactly one leads and starts the controllers.
    let mut managers = vec![
        candidate(&env, "manager-a", namespace.name()),
        candidate(&env, "manager-b", namespace.name()),
    ];
    let first = wait_for_holder(
        &leases,
        &["manager-a", "manager-b"],
        Duration::from_secs(60),
    )
    .await;
    let leader_index = managers
        .iter()
        .position(|m| m.name == first)
        .expect("known leader");
    let follower_index = 1 - leader_index;
    wait_until(
        "the leader to start its controllers",
        Duration::from_secs(30),
        || async {
            Ok(managers[leader_index]
                .logged("starting controllers")
                .then_some(()))
        },
    )
    .await
    .expect("leader runs controllers");
    wait_until(
        "the leader metric of both managers",
        Duration::from_secs(30),
        || async {
            let leader = leader_status(&managers[leader_index]).await?;
            let follower = leader_status(&managers[follower_index]).await?;
            Ok((leader == Some(1) && follower == Some(0)).then_some(()))
        },
    )
    .await
    .expect("exactly one leader by metrics");
    for manager in &managers {
        let probes = manager.endpoint("health probes").await;
        assert_eq!(http_get(probes, "/healthz").await.expect("healthz").0, 200);
        // Followers are ready too, so rolling updates can proceed.
        assert_eq!(
            http_get(probes, "/readyz").await.expect("readyz").0,
            200,
            "{}",
            manager.name
        );
    }
    assert!(
        !managers[follower_index].logged("starting controllers"),
        "the follower ran controllers:\n{}",
        managers[follower_index].output().join("\n")
    );

    // kill -9 the leader: the Lease keeps its name until it expires, then the follower leads.
    managers[leader_index].kill_hard().await;
    let killed_at = Instant::now();
    assert_eq!(holder(&leases).await.expect("lease"), Some(first.clone()));
    let second_name = managers[follower_index].name.clone();
    let second = wait_for_holder(&leases, &[&second_name], LEASE_DURATION + TAKEOVER_SLACK).await;
    let takeover = killed_at.elapsed();
    assert_eq!(second, second_name);
    eprintln!("takeover after kill -9: {takeover:?} (lease duration {LEASE_DURATION:?})");
    wait_until(
        "the new leader to start its controllers",
        Duration::from_secs(30),
        || async {
            Ok(managers[follower_index]
                .logged("starting controllers")
                .then_some(()))
        },
    )
    .await
    .expect("new leader runs controllers");

    // A third candidate stands by; SIGTERM of the leader releases the Lease before it exits 0.
    let third = candidate(&env, "manager-c", namespace.name());
    wait_until("manager-c to stand by", Duration::from_secs(30), || async {
        Ok((leader_status(&third).await? == Some(0)).then_some(()))
    })
    .await
    .expect("manager-c follows");
    let mut leader = managers.swap_remove(follower_index);
    leader.terminate();
    let terminated_at = Instant::now();
    let code = leader.exit_code(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "output:\n{}", leader.output().join("\n"));
    assert!(
        leader.logged("released the Lease"),
        "{}",
        leader.output().join("\n")
    );
    let after_exit = holder(&leases).await.expect("lease");
    assert_ne!(
        after_exit,
        Some(second_name),
        "the Lease still names the stopped leader"
    );
    let handed_to = wait_for_holder(&leases, &["manager-c"], LEASE_DURATION).await;
    let handover = terminated_at.elapsed();
    assert_eq!(handed_to, "manager-c");
    eprintln!("handover after SIGTERM: {handover:?} (lease duration {LEASE_DURATION:?})");

    drop(third);
    namespace.cleanup().await;
}
