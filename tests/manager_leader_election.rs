//! Leader election of real `pgkube run` processes on the test bed's API server: exactly one of
//! two managers leads and runs the controllers; after kill -9 of the leader the other takes over
//! once the Lease expires; a graceful stop (SIGTERM) releases the Lease at once and exits 0; a
//! leader cut off from the API server (a partitioned proxy in front of it) steps down before
//! the other takes over; a leader whose controllers' client is throttled to a standstill keeps
//! renewing the Lease (leader election has a client of its own).

mod manager_common;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use manager_common::{
    KubeconfigFile, Manager, SHORT_LEASE_DURATION, SHORT_LEASE_FLAGS, api_server_address,
    lease_holder,
};
use pgkube_testkit::http_get;
use pgkube_testkit::proxy::Proxy;
use pgkube_testkit::{TestNamespace, install_crds, testbed, wait_until};

/// Short timings so the test runs in seconds: a dead leader's Lease expires 5 s after its last
/// renewal, followers look every 500 ms.
const LEASE_DURATION: Duration = SHORT_LEASE_DURATION;
const LEASE_FLAGS: &[&str] = SHORT_LEASE_FLAGS;
/// Time on top of the lease duration for a follower to notice (retry period, the lease
/// manager's up-to-1 s jitter after an expired lock) on a loaded machine.
const TAKEOVER_SLACK: Duration = Duration::from_secs(5);
const LEASE_NAME: &str = "pgkube-leader-test";

fn candidate(env: &pgkube_testkit::TestEnv, name: &str, namespace: &str) -> Manager {
    candidate_with(env, name, namespace, &[], &[])
}

fn candidate_with(
    env: &pgkube_testkit::TestEnv,
    name: &str,
    namespace: &str,
    extra_flags: &[&str],
    vars: &[(&str, &str)],
) -> Manager {
    let mut flags = vec![
        "--leader-elect",
        "--leader-elect-id",
        LEASE_NAME,
        "--leader-elect-namespace",
        namespace,
    ];
    flags.extend_from_slice(LEASE_FLAGS);
    flags.extend_from_slice(extra_flags);
    Manager::start_with_env(env, name, &flags, vars)
}

/// The host name part of the Lease's holder identity (`<host>_<random>`), if held.
async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    lease_holder(leases, LEASE_NAME).await
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

/// The leader reaches the API server through a proxy, which is then partitioned: its renewals
/// hang. It must stop its controllers ("stepped down", after they stopped) by its own clock,
/// within the renew deadline, before the other candidate, which sees the Lease unchanged for
/// the lease duration, becomes the leader. Both times come from the managers' logs on the same
/// machine.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_another_takes_over() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "manager-partition").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace.name());
    let proxy = Proxy::tcp(api_server_address(&env)).await;
    let kubeconfig = KubeconfigFile::via(&env, proxy.address);
    let kubeconfig_path = kubeconfig.path.to_string_lossy().into_owned();

    // The proxied candidate starts alone, so that it leads.
    let vars = [("KUBECONFIG", kubeconfig_path.as_str())];
    let mut cut_off = candidate_with(&env, "manager-cut-off", namespace.name(), &[], &vars);
    wait_for_holder(&leases, &["manager-cut-off"], Duration::from_secs(60)).await;
    wait_for_log(&cut_off, "starting controllers").await;
    let other = candidate(&env, "manager-other", namespace.name());
    wait_until(
        "manager-other to stand by",
        Duration::from_secs(30),
        || async { Ok((leader_status(&other).await? == Some(0)).then_some(())) },
    )
    .await
    .expect("manager-other follows");

    proxy.partition();
    let took_over = wait_for_holder(
        &leases,
        &["manager-other"],
        LEASE_DURATION + TAKEOVER_SLACK + Duration::from_secs(5),
    )
    .await;
    assert_eq!(took_over, "manager-other");
    wait_for_log(&other, "became the leader").await;
    wait_for_log(&other, "starting controllers").await;
    let stepped_down = cut_off.logged_at("stepped down").unwrap_or_else(|| {
        panic!(
            "the cut-off leader never stepped down:\n{}",
            cut_off.output().join("\n")
        )
    });
    let became_leader = other.logged_at("became the leader").expect("logged");
    eprintln!("stepped down at {stepped_down}, the other became the leader at {became_leader}");
    assert!(
        stepped_down < became_leader,
        "the new leader led from {became_leader}, the old one until {stepped_down}"
    );
    let reason = cut_off.log_line("stepped down").expect("logged")["fields"]["error"].clone();
    assert!(
        reason
            .as_str()
            .is_some_and(|r| r.contains("renew deadline")),
        "stepped down for another reason: {reason}"
    );
    let code = cut_off.exit_code(Duration::from_secs(30)).await;
    assert_ne!(
        code,
        Some(0),
        "a leader that lost the Lease must not exit 0"
    );

    drop(other);
    namespace.cleanup().await;
}

/// The controllers' client may send 3 requests (the start-up check of the 3 CRDs in one
/// namespace), then one every 1000 s: the controllers' watches queue behind the rate limit for
/// the whole test. Renewals, on leader election's own client, must not: the leader keeps the
/// Lease for several lease durations while a follower waits for it.
#[tokio::test]
async fn a_leader_whose_controllers_are_throttled_keeps_renewing_its_lease() {
    let Some(env) = testbed() else { return };
    let client = env.kube_client().await;
    install_crds(&client).await;
    let namespace = TestNamespace::create(&client, "manager-throttled").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace.name());
    let throttled = [
        "--kube-api-qps",
        "0.001",
        "--kube-api-burst",
        "3",
        "--watch-namespaces",
        namespace.name(),
    ];
    let leader = candidate_with(&env, "manager-throttled", namespace.name(), &throttled, &[]);
    wait_for_holder(&leases, &["manager-throttled"], Duration::from_secs(60)).await;
    wait_for_log(&leader, "starting controllers").await;
    let follower = candidate(&env, "manager-waiting", namespace.name());
    wait_until(
        "manager-waiting to stand by",
        Duration::from_secs(30),
        || async { Ok((leader_status(&follower).await? == Some(0)).then_some(())) },
    )
    .await
    .expect("manager-waiting follows");

    let first_renewal = renew_time(&leases).await;
    tokio::time::sleep(3 * LEASE_DURATION).await;
    assert_eq!(
        holder(&leases).await.expect("lease").as_deref(),
        Some("manager-throttled"),
        "the throttled leader lost the Lease:\n{}",
        leader.output().join("\n")
    );
    assert!(renew_time(&leases).await > first_renewal, "no renewal");
    assert!(
        !leader.logged("stepped down"),
        "{}",
        leader.output().join("\n")
    );
    assert!(
        !leader.logged("controller caches synced"),
        "the controllers were not throttled; the test proves nothing"
    );
    assert_eq!(leader_status(&leader).await.expect("metrics"), Some(1));

    drop(follower);
    drop(leader);
    namespace.cleanup().await;
}

async fn renew_time(leases: &Api<Lease>) -> k8s_openapi::jiff::Timestamp {
    let lease = leases.get(LEASE_NAME).await.expect("the Lease");
    lease
        .spec
        .and_then(|spec| spec.renew_time)
        .expect("renewed")
        .0
}

async fn wait_for_log(manager: &Manager, message: &str) {
    wait_until(
        &format!("{} to log {message:?}", manager.name),
        Duration::from_secs(30),
        || async { Ok(manager.logged(message).then_some(())) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\noutput:\n{}", manager.output().join("\n")));
}
