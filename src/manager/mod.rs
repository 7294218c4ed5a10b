//! `pgkube run`: the manager process.
//!
//! Start-up: telemetry, Kubernetes clients (the controllers' one rate limited, leader election's
//! one not), a check that the CRDs are installed, the health and metrics endpoints. Then, with
//! `--leader-elect`, wait for the Lease (standing by as a ready follower) and run the
//! controllers only while leading; without it, run them at once. SIGTERM/SIGINT stops taking
//! work, lets in-flight reconciles finish within the grace period (while still renewing),
//! releases the Lease and exits 0. Leadership lost (not renewed within the renew deadline, or
//! taken) stops the controllers at once, even during the grace period, logs "stepped down" and
//! exits non-zero so the pod restarts as a follower.

mod args;
mod client_metrics;
mod endpoints;
mod kube_client;
mod leader;
mod rate_limit;
mod telemetry;
pub mod webhook;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use args::BindAddress;
pub use args::RunArgs;
use endpoints::Readiness;
use leader::{LeaderElection, Leadership};

/// Runs the manager until a signal or a fatal error.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let telemetry = {
        // The gRPC trace exporter spawns its connection onto the current runtime.
        let _entered = runtime.enter();
        telemetry::init(args.log_format, &args.log_filter)?
    };
    let result = runtime.block_on(run_manager(args));
    // Flush spans while the runtime (and with it the exporter's connection) still runs.
    telemetry.shutdown();
    result
}

async fn run_manager(args: RunArgs) -> anyhow::Result<()> {
    let lease_timings = args.lease_timings()?;
    let burst = NonZeroU32::new(args.kube_api_burst).unwrap_or(NonZeroU32::MIN);
    let config = kube_client::infer_config().await?;
    let mut registry = Registry::default();
    let client_metrics = client_metrics::ClientMetricsLayer::register(&mut registry);
    let client =
        kube_client::rate_limited(config.clone(), args.kube_api_qps, burst, &client_metrics)?;
    // Events on a client of their own, with the same limits (as client-go's event broadcaster).
    let events =
        kube_client::rate_limited(config.clone(), args.kube_api_qps, burst, &client_metrics)?;
    let mut settings = args.settings()?;
    settings.instance_manager_binary = args
        .instance_manager_binary()
        .context("cannot read the instance manager binary")?
        .map(Arc::new);
    settings.manager_namespace = pod_namespace();
    // Before leader election, so that a follower fails as fast as a leader would.
    pgkube_controllers::ensure_crds_installed(&client, &settings.watch_namespaces).await?;

    let metrics = Arc::new(pgkube_controllers::Metrics::register(&mut registry));
    let election = if args.leader_elect {
        Some(leader_election(
            &args,
            config,
            lease_timings,
            &mut registry,
        )?)
    } else {
        None
    };

    let shutdown = CancellationToken::new();
    let endpoints_stop = CancellationToken::new();
    let readiness = Readiness::default();
    start_endpoints(&args, registry, readiness.clone(), &endpoints_stop).await?;
    if let BindAddress::Listen(address) = args.webhook_bind_address {
        start_webhook(&args, &client, address, &endpoints_stop).await?;
    }
    spawn_signal_handler(shutdown.clone())?;

    let context = pgkube_controllers::Context {
        client,
        events,
        settings: Arc::new(settings),
        metrics,
    };
    let outcome = match election {
        Some(election) => {
            run_as_candidate(
                election,
                context,
                &readiness,
                &shutdown,
                args.shutdown_grace_period,
            )
            .await
        }
        None => {
            let mut controllers = spawn_controllers(context, readiness.clone(), shutdown.clone());
            tokio::select! {
                () = shutdown.cancelled() => finish_in_flight(&mut controllers, args.shutdown_grace_period).await,
                stopped = &mut controllers => controllers_outcome(stopped),
            }
        }
    };
    endpoints_stop.cancel();
    outcome
}

/// The candidate for the Lease, on a client of its own (see `kube_client`).
fn leader_election(
    args: &RunArgs,
    config: kube::Config,
    timings: args::LeaseTimings,
    registry: &mut Registry,
) -> anyhow::Result<LeaderElection> {
    let namespace = manager_namespace(args.leader_elect_namespace.as_deref());
    Ok(LeaderElection::new(
        kube_client::unlimited(config)?,
        namespace,
        args.leader_elect_id.clone(),
        leader::identity(std::env::var("HOSTNAME").ok()),
        timings,
        registry,
    ))
}

/// Starts `/healthz`+`/readyz` and `/metrics` unless disabled.
async fn start_endpoints(
    args: &RunArgs,
    registry: Registry,
    readiness: Readiness,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    if let BindAddress::Listen(address) = args.health_probe_bind_address {
        endpoints::serve(
            "health probes",
            address,
            endpoints::probe_router(readiness),
            stop.clone(),
        )
        .await?;
    }
    if let BindAddress::Listen(address) = args.metrics_bind_address {
        let router = endpoints::metrics_router(Arc::new(registry));
        endpoints::serve("metrics", address, router, stop.clone()).await?;
    }
    Ok(())
}

/// Serves the webhook, conversion and admission (every replica, leader or not). With
/// `--webhook-cert-secret`, the certificate is managed first (see `webhook::managed`).
/// Otherwise it comes from `--webhook-cert-dir`; without one there is nothing to serve it with,
/// which is a warning (the API server then fails only the requests that need a conversion,
/// saying so, and creates clusters without the finalizer, which the controller adds), while a
/// certificate that cannot be used stops the start.
async fn start_webhook(
    args: &RunArgs,
    client: &kube::Client,
    address: std::net::SocketAddr,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let cert_dir = &args.webhook_cert_dir;
    if !args.webhook_cert_secret.is_empty() {
        let namespace = manager_namespace(None);
        let managed = webhook::managed::ManagedCertificate {
            client: client.clone(),
            hosts: args::webhook_hosts(&args.webhook_cert_hosts, &namespace),
            namespace,
            secret: args.webhook_cert_secret.clone(),
            directory: cert_dir.clone(),
        };
        managed.reconcile().await?;
        tokio::spawn(managed.keep_current(stop.clone()));
    } else if !cert_dir.join("tls.crt").exists() {
        tracing::warn!(
            directory = %cert_dir.display(),
            "the webhook is not served: no tls.crt in its certificate directory"
        );
        return Ok(());
    }
    let certificates =
        webhook::CertificateFiles::load(cert_dir).map_err(webhook::WebhookError::from)?;
    let router = webhook::router(args.webhook_max_body_bytes);
    webhook::serve_tls(address, router, certificates, stop.clone()).await?;
    Ok(())
}

/// The manager's own namespace: `flag`, else `POD_NAMESPACE`, else the service account's,
/// else `default`.
fn manager_namespace(flag: Option<&str>) -> String {
    args::lease_namespace(
        flag,
        std::env::var("POD_NAMESPACE").ok().as_deref(),
        std::fs::read_to_string(args::SERVICE_ACCOUNT_NAMESPACE_FILE)
            .ok()
            .as_deref(),
    )
}

/// The namespace of the manager's pod (`POD_NAMESPACE`, else the service account's); none
/// when it runs outside a pod.
fn pod_namespace() -> Option<String> {
    let from_file = std::fs::read_to_string(args::SERVICE_ACCOUNT_NAMESPACE_FILE).ok();
    [std::env::var("POD_NAMESPACE").ok(), from_file]
        .into_iter()
        .flatten()
        .map(|namespace| namespace.trim().to_owned())
        .find(|namespace| !namespace.is_empty())
}

/// Waits for the Lease, runs the controllers while leading, and hands the Lease over on a
/// graceful stop.
async fn run_as_candidate(
    election: LeaderElection,
    context: pgkube_controllers::Context,
    readiness: &Readiness,
    shutdown: &CancellationToken,
    grace_period: Duration,
) -> anyhow::Result<()> {
    // Followers report ready, as with controller-runtime, so a rolling update can bring up the
    // new pod while the old one still leads.
    readiness.set_ready();
    tracing::info!(identity = %election.identity(), "waiting for leadership");
    let Some(mut leadership) = election.acquire(shutdown).await? else {
        return Ok(());
    };
    let mut controllers = spawn_controllers(context, readiness.clone(), shutdown.clone());
    let stopped = tokio::select! {
        () = shutdown.cancelled() => None,
        stopped = &mut controllers => Some(stopped),
        lost = leadership.lost() => return step_down(controllers, lost, shutdown).await,
    };
    let finished = match stopped {
        Some(stopped) => controllers_outcome(stopped),
        // The grace period is no licence to reconcile without the Lease.
        None => tokio::select! {
            finished = finish_in_flight(&mut controllers, grace_period) => finished,
            lost = leadership.lost() => return step_down(controllers, lost, shutdown).await,
        },
    };
    release(leadership).await;
    finished
}

/// Stops the controllers at once, with no grace period: the renew deadline has passed, and
/// another manager may take over once the Lease expires (the lease duration minus the renew
/// deadline is all the time there is). Only then logs "stepped down".
async fn step_down(
    controllers: ControllersTask,
    lost: leader::LeaderError,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    shutdown.cancel();
    controllers.abort();
    // An aborted task ends at its next await point; its JoinError is the expected Cancelled.
    let _ = controllers.await;
    tracing::error!(error = %lost, "stepped down");
    Err(lost.into())
}

async fn release(leadership: Leadership) {
    if let Err(error) = leadership.release().await {
        tracing::warn!(%error, "could not release the Lease; a follower takes over when it expires");
    }
}

type ControllersTask = JoinHandle<()>;

fn spawn_controllers(
    context: pgkube_controllers::Context,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> ControllersTask {
    tracing::info!("starting controllers");
    let on_ready = move || {
        tracing::info!("controller caches synced");
        readiness.set_ready();
    };
    tokio::spawn(pgkube_controllers::run(
        context,
        on_ready,
        shutdown.cancelled_owned(),
    ))
}

/// Waits for the controllers to stop after shutdown was requested, at most `grace_period`.
async fn finish_in_flight(
    controllers: &mut ControllersTask,
    grace_period: Duration,
) -> anyhow::Result<()> {
    tracing::info!(grace_period = ?grace_period, "shutting down: waiting for in-flight reconciles");
    match tokio::time::timeout(grace_period, &mut *controllers).await {
        Ok(stopped) => controllers_outcome(stopped),
        Err(_elapsed) => {
            controllers.abort();
            tracing::warn!("grace period over: abandoning in-flight reconciles");
            Ok(())
        }
    }
}

fn controllers_outcome(stopped: Result<(), tokio::task::JoinError>) -> anyhow::Result<()> {
    stopped.map_err(|join_error| anyhow::anyhow!("controllers task failed: {join_error}"))
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
fn spawn_signal_handler(shutdown: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stop requested");
        shutdown.cancel();
    });
    Ok(())
}
