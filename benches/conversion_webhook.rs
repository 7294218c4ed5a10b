//! Benchmark of the CRD conversion webhook with the API server in the loop.
//!
//! Not a test: it prints figures, and checks only that the API server did convert. Needs the test
//! bed (`tests/testbed/up`):
//!
//! ```text
//! cargo bench --bench conversion_webhook
//! PGKUBE_BENCH_OBJECTS=200 cargo bench --bench conversion_webhook   # fewer objects, quicker
//! ```
//!
//! It starts `pgkube run` (the binary `cargo bench` builds, so with the bench profile, which is
//! the release one) serving the webhook over TLS on 127.0.0.1 with a certificate from a test CA,
//! installs the CRDs as `pgkube crd` makes them (v1beta1 stored, v1alpha1 served through the
//! webhook), and creates 1,000 PostgreSQLClusters in v1beta1 in a namespace of its own. Then it
//! measures each request in v1alpha1, what an old client pays, against the same request in
//! v1beta1, the stored version, which the API server answers without the webhook, the two
//! interleaved so that both see the same load on the machine:
//! - a GET of each object, one at a time, then 16 at a time (throughput): the API server reads
//!   it from etcd and sends the webhook a ConversionReview of that one object;
//! - a LIST of all the objects, 20 times each way, served from the API server's watch cache of
//!   the version asked for, which holds objects already converted: no webhook call;
//! - a LIST of all the objects from etcd (at a resourceVersion older than the watch caches, made
//!   anew by a change of the CRD): the API server decodes the objects one by one and sends the
//!   webhook one review per object, never one for the list;
//! - in each phase, the ConversionReviews the API server sent and their mean duration (its own
//!   metric `apiserver_crd_conversion_webhook_duration_seconds`), and the manager's CPU time
//!   (user + system, from /proc) per review: the webhook's own work. The creation has some too:
//!   the API server's v1alpha1 watch cache converts every object written. Each phase starts and
//!   ends once the API server has sent no review for a second, so that the reviews its watch
//!   cache makes for writes, which lag behind them, count where they belong.
//!
//! The manager watches another, empty namespace, so that no controller reconciles the 1,000
//! objects: their StatefulSets, Services, ConfigMaps and Secrets would load the API server and
//! the manager's CPU while it is measured, and finalizers would then hold the namespace.
//!
//! It cleans up after itself, after a panic too: the namespaces are deleted, then the
//! v1beta1-only CRDs are put back, then the manager stops. A CRD left converting through a dead
//! webhook would break every later test, so a guard puts the CRDs back (with kubectl) if the
//! bench panics before it has.

#[path = "../tests/manager_common/mod.rs"]
mod manager_common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, GetParams, ListParams, Patch, PatchParams, PostParams, VersionMatch};
use kube::core::Request;
use kube::{Client, ResourceExt};
use manager_common::Manager;
use pgkube_testkit::{
    CRD_FIELD_MANAGER, TestCa, TestEnv, TestNamespace, converting_crds, install_crds, testbed,
    wait_until,
};

const GROUP: &str = "db.example.com";
/// The version the CRDs store, which the API server answers without the webhook.
const STORED: &str = "v1beta1";
/// The version served beside it, whose every request goes through the webhook.
const CONVERTED: &str = "v1alpha1";
/// Objects measured, unless `PGKUBE_BENCH_OBJECTS` says otherwise.
const DEFAULT_OBJECTS: usize = 1_000;
/// LISTs of all the objects, in each version.
const LISTS: usize = 20;
/// Requests in flight in the concurrent phase (and while creating the objects).
const CONCURRENCY: usize = 16;
/// GETs in each version before anything is timed (connections, TLS sessions, caches).
const WARM_UP: usize = 20;
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the namespace controller may take to delete the objects and the namespaces.
const NAMESPACE_GONE_TIMEOUT: Duration = Duration::from_secs(180);
/// Merge patch that takes the webhook conversion out of a CRD.
const NO_CONVERSION: &str = r#"{"spec":{"conversion":{"strategy":"None","webhook":null}}}"#;

fn main() {
    let Some(env) = testbed() else {
        println!("conversion_webhook: test bed not running, nothing measured");
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench(env));
}

async fn bench(env: TestEnv) {
    let objects = std::env::var("PGKUBE_BENCH_OBJECTS")
        .ok()
        .and_then(|n| n.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_OBJECTS);
    let client = env.kube_client().await;
    install_crds(&client).await;
    let objects_namespace = TestNamespace::create(&client, "conversion-bench").await;
    let idle_namespace = TestNamespace::create(&client, "conversion-bench-idle").await;
    let ca = TestCa::new();
    let cert_dir = ca.serving_certificate_dir("conversion-bench");
    let cert_dir_arg = cert_dir.to_string_lossy().into_owned();
    let mut manager = Manager::start(
        &env,
        "manager-conversion-bench",
        &[
            "--watch-namespaces",
            idle_namespace.name(),
            "--webhook-bind-address",
            "127.0.0.1:0",
            "--webhook-cert-dir",
            &cert_dir_arg,
        ],
    );
    let address = manager.endpoint("webhook").await;

    // From here on the CRDs may convert through this manager: they go back whatever happens.
    let mut guard = RestoreCrdsOnDrop {
        env: env.clone(),
        armed: true,
    };
    let run = Run {
        client: client.clone(),
        namespace: objects_namespace.name().to_owned(),
        names: (0..objects).map(|i| format!("bench-{i:05}")).collect(),
        manager_pid: manager.pid(),
    };
    let mut measuring = tokio::spawn(run.measure(converting_crds(address, &ca.pem())));
    // Ctrl-C stops the measurement, not the cleanup.
    let measured = tokio::select! {
        measured = &mut measuring => measured,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("conversion_webhook: interrupted, cleaning up");
            measuring.abort();
            measuring.await
        }
    };
    if measured.is_err() {
        let output = manager.output();
        let tail = &output[output.len().saturating_sub(40)..];
        eprintln!("the manager's last lines:\n{}", tail.join("\n"));
    }

    // While the webhook serves, the namespaces go first; if it is gone (a Ctrl-C in a terminal
    // reaches the manager too), the CRDs do, so that nothing calls it.
    if manager.is_running() {
        delete_namespaces(&client, [objects_namespace, idle_namespace]).await;
        restore_crds(&client).await;
    } else {
        restore_crds(&client).await;
        delete_namespaces(&client, [objects_namespace, idle_namespace]).await;
    }
    guard.armed = false;
    if manager.is_running() {
        manager.terminate();
        let _ = manager.exit_code(Duration::from_secs(30)).await;
    }
    let _ = std::fs::remove_dir_all(&cert_dir);
    if let Err(error) = measured {
        if error.is_panic() {
            std::panic::resume_unwind(error.into_panic());
        }
        eprintln!("conversion_webhook: the measurement did not finish: {error}");
        std::process::exit(130);
    }
}

/// The measurement, in a task of its own so that a panic in it still leads to the cleanup.
struct Run {
    client: Client,
    namespace: String,
    names: Vec<String>,
    manager_pid: u32,
}

/// One line of the table.
struct Row {
    what: String,
    version: String,
    /// One latency per request.
    latencies: Vec<Duration>,
    /// Objects in each request or response.
    objects_each: usize,
    /// Time the requests took together: their sum when one at a time, else the wall time.
    elapsed: Duration,
    /// The webhook's work during the phase, when it can be told apart from other rows'.
    webhook: Option<WebhookWork>,
}

impl Row {
    fn new(what: &str, version: &str, latencies: Vec<Duration>, objects_each: usize) -> Row {
        Row {
            what: what.to_owned(),
            version: version.to_owned(),
            elapsed: latencies.iter().sum(),
            latencies,
            objects_each,
            webhook: None,
        }
    }

    fn wall(mut self, elapsed: Duration) -> Row {
        self.elapsed = elapsed;
        self
    }

    fn webhook(mut self, work: WebhookWork) -> Row {
        self.webhook = Some(work);
        self
    }

    fn p(&self, percent: f64) -> f64 {
        millis(percentile(&self.latencies, percent))
    }
}

impl Run {
    async fn measure(self, crds: Vec<CustomResourceDefinition>) {
        let n = self.names.len();
        install(&self.client, &crds, &self.path(CONVERTED)).await;

        // Written in v1beta1: no conversion for the request, but the API server keeps a watch
        // cache for each served version, and the v1alpha1 one converts every new object.
        let phase = self.phase().await;
        let (creates, creates_wall) = self.create_objects().await;
        let create_work = phase.end().await;
        let created_at = self.resource_version().await;

        let kubernetes = self
            .client
            .apiserver_version()
            .await
            .map(|info| info.git_version)
            .unwrap_or_else(|error| format!("unknown ({error})"));
        let (_, one_stored) = self.get(STORED, &self.names[0]).await;
        let (_, one_converted) = self.get(CONVERTED, &self.names[0]).await;
        self.warm_up().await;

        // GETs (read from etcd) one at a time, the two versions interleaved object by object.
        let phase = self.phase().await;
        let (mut get_stored, mut get_converted) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for name in &self.names {
            get_stored.push(self.get(STORED, name).await.0);
            get_converted.push(self.get(CONVERTED, name).await.0);
        }
        let get_work = phase.end().await;

        // LISTs, served from the watch cache of their version, interleaved too.
        let phase = self.phase().await;
        let (mut cached_stored, mut cached_converted) = (Vec::new(), Vec::new());
        for _ in 0..LISTS {
            cached_stored.push(self.list(STORED, ListParams::default()).await);
            cached_converted.push(self.list(CONVERTED, ListParams::default()).await);
        }
        let cached_work = phase.end().await;

        // GETs CONCURRENCY at a time, one version after the other.
        let phase = self.phase().await;
        let (concurrent_stored, concurrent_stored_wall) = self.concurrent_gets(STORED).await;
        let concurrent_stored_work = phase.end().await;
        let phase = self.phase().await;
        let (concurrent_converted, concurrent_converted_wall) =
            self.concurrent_gets(CONVERTED).await;
        let concurrent_converted_work = phase.end().await;

        // LISTs read from etcd: at the resourceVersion right after the objects were created,
        // older than anything the watch caches hold once a CRD change has made them anew.
        self.renew_watch_caches(&crds[0]).await;
        self.warm_up().await;
        let at_creation = ListParams::default()
            .at(&created_at)
            .matching(VersionMatch::Exact);
        let phase = self.phase().await;
        let (mut etcd_stored, mut etcd_converted) = (Vec::new(), Vec::new());
        for _ in 0..LISTS {
            etcd_stored.push(self.list(STORED, at_creation.clone()).await);
            etcd_converted.push(self.list(CONVERTED, at_creation.clone()).await);
        }
        let etcd_work = phase.end().await;

        let concurrently = format!("GET one object, {CONCURRENCY} at a time");
        let cached = format!("LIST all {n}, from the watch cache");
        let from_etcd = format!("LIST all {n} at an older resourceVersion, from etcd");
        let stored = "v1beta1 (stored: no webhook)";
        let rows = [
            Row::new(
                &format!("CREATE one object, {CONCURRENCY} at a time"),
                "v1beta1 (the v1alpha1 watch cache converts it)",
                creates,
                1,
            )
            .wall(creates_wall)
            .webhook(create_work),
            Row::new("GET one object, one at a time", stored, get_stored, 1),
            Row::new("GET one object, one at a time", CONVERTED, get_converted, 1)
                .webhook(get_work),
            Row::new(&concurrently, stored, concurrent_stored, 1)
                .wall(concurrent_stored_wall)
                .webhook(concurrent_stored_work),
            Row::new(&concurrently, CONVERTED, concurrent_converted, 1)
                .wall(concurrent_converted_wall)
                .webhook(concurrent_converted_work),
            Row::new(&cached, stored, cached_stored, n),
            Row::new(
                &cached,
                "v1alpha1 (converted when cached)",
                cached_converted,
                n,
            )
            .webhook(cached_work),
            Row::new(&from_etcd, stored, etcd_stored, n),
            Row::new(&from_etcd, CONVERTED, etcd_converted, n).webhook(etcd_work),
        ];
        print_report(&rows, &kubernetes, one_stored.len(), one_converted.len());
    }

    /// Starts measuring the webhook's work, once the API server has finished converting.
    async fn phase(&self) -> Phase {
        settle(&self.client).await;
        Phase {
            client: self.client.clone(),
            manager_pid: self.manager_pid,
            cpu: cpu_time(self.manager_pid),
            conversions: conversions(&self.client).await,
        }
    }

    fn path(&self, version: &str) -> String {
        format!(
            "/apis/{GROUP}/{version}/namespaces/{}/postgresqlclusters",
            self.namespace
        )
    }

    /// GETs in both versions before anything is timed (connections, TLS sessions).
    async fn warm_up(&self) {
        for name in self.names.iter().cycle().take(WARM_UP) {
            self.get(STORED, name).await;
            self.get(CONVERTED, name).await;
        }
    }

    /// Creates the objects in v1beta1, CONCURRENCY at a time: the latencies, and the wall time.
    async fn create_objects(&self) -> (Vec<Duration>, Duration) {
        let api =
            Api::<pgkube_crds::PostgreSQLCluster>::namespaced(self.client.clone(), &self.namespace);
        // Owned names: a closure over borrowed ones would make the task's future not Send.
        let names = self.names.clone();
        let started = Instant::now();
        let latencies = stream::iter(names)
            .map(|name| {
                let api = &api;
                async move {
                    let cluster = sample_cluster(&name);
                    let started = Instant::now();
                    api.create(&PostParams::default(), &cluster)
                        .await
                        .unwrap_or_else(|error| panic!("creating {name}: {error}"));
                    started.elapsed()
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        (latencies, started.elapsed())
    }

    /// The resourceVersion of the collection now (a consistent LIST of one object).
    async fn resource_version(&self) -> String {
        let request = Request::new(self.path(STORED))
            .list(&ListParams::default().limit(1))
            .expect("LIST request");
        let body = self
            .client
            .request_text(request)
            .await
            .unwrap_or_else(|error| panic!("LIST in {STORED}: {error}"));
        let list: serde_json::Value = serde_json::from_str(&body).expect("a JSON list");
        list.pointer("/metadata/resourceVersion")
            .and_then(|rv| rv.as_str())
            .unwrap_or_else(|| panic!("no resourceVersion in {body}"))
            .to_owned()
    }

    /// Makes the API server build the kind's storage and watch caches anew (any change of a
    /// CRD's spec does: here the ConversionReview versions it accepts, v1 still first), and
    /// waits until both versions are served from the new caches.
    async fn renew_watch_caches(&self, crd: &CustomResourceDefinition) {
        let mut changed = crd.clone();
        if let Some(webhook) = changed
            .spec
            .conversion
            .as_mut()
            .and_then(|conversion| conversion.webhook.as_mut())
        {
            webhook.conversion_review_versions = vec!["v1".to_owned(), "v1beta1".to_owned()];
        }
        Api::<CustomResourceDefinition>::all(self.client.clone())
            .patch(
                &changed.name_any(),
                &PatchParams::apply(CRD_FIELD_MANAGER).force(),
                &Patch::Apply(&changed),
            )
            .await
            .unwrap_or_else(|error| panic!("changing {}: {error}", changed.name_any()));
        // The API server's CRD informer sees the change within milliseconds on loopback.
        tokio::time::sleep(Duration::from_secs(2)).await;
        wait_until("the new watch caches", STEP_TIMEOUT, || async {
            for version in [STORED, CONVERTED] {
                let request = Request::new(self.path(version)).list(&ListParams::default())?;
                self.client.request_text(request).await?;
            }
            Ok(Some(()))
        })
        .await
        .unwrap_or_else(|error| panic!("{error:#}"));
    }

    /// GET `name` in `version`: the time to the whole body, and the body (checked to be in
    /// `version`).
    async fn get(&self, version: &str, name: &str) -> (Duration, String) {
        let request = Request::new(self.path(version))
            .get(name, &GetParams::default())
            .expect("GET request");
        let started = Instant::now();
        let body = self
            .client
            .request_text(request)
            .await
            .unwrap_or_else(|error| panic!("GET {name} in {version}: {error}"));
        let elapsed = started.elapsed();
        let api_version = format!(r#""apiVersion":"{GROUP}/{version}""#);
        assert!(
            body.starts_with(&format!("{{{api_version}")),
            "GET {name} in {version}: {body}"
        );
        (elapsed, body)
    }

    /// LIST every object in `version`: the time to the whole body (checked to hold every object,
    /// in `version`).
    async fn list(&self, version: &str, params: ListParams) -> Duration {
        let request = Request::new(self.path(version))
            .list(&params)
            .expect("LIST request");
        let started = Instant::now();
        let body = self
            .client
            .request_text(request)
            .await
            .unwrap_or_else(|error| panic!("LIST in {version} ({params:?}): {error}"));
        let elapsed = started.elapsed();
        let n = self.names.len();
        let items = body.matches(r#""kind":"PostgreSQLCluster""#).count();
        let in_beta = body.matches(r#""postgresVersion""#).count();
        let expected_in_beta = if version == "v1beta1" { n } else { 0 };
        assert!(
            items == n && in_beta == expected_in_beta,
            "LIST in {version}: {items} objects, {in_beta} in v1beta1; expected {n} and {expected_in_beta}"
        );
        elapsed
    }

    /// GETs every object in `version`, CONCURRENCY at a time: the latencies, and the wall time.
    async fn concurrent_gets(&self, version: &str) -> (Vec<Duration>, Duration) {
        let names = self.names.clone();
        let started = Instant::now();
        let latencies = stream::iter(names)
            .map(|name| async move { self.get(version, &name).await.0 })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        (latencies, started.elapsed())
    }
}

fn print_report(rows: &[Row], kubernetes: &str, stored_bytes: usize, converted_bytes: usize) {
    let profile = if cfg!(debug_assertions) {
        "dev (debug)"
    } else {
        "bench (= release: fat LTO, 1 codegen unit)"
    };
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!();
    println!(
        "Conversion webhook, API server in the loop: Kubernetes {kubernetes} (test bed), {cores} \
         cores ({}); manager {} built with the {profile} profile, webhook over TLS on 127.0.0.1; \
         one object is {stored_bytes} bytes of JSON in v1beta1, {converted_bytes} in v1alpha1.",
        cpu_model(),
        env!("CARGO_BIN_EXE_pgkube"),
    );
    println!();
    println!(
        "| request | version | requests | p50 ms | p99 ms | objects/s | reviews sent | review ms (API server's mean) | manager CPU µs/review |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let requests = row.latencies.len();
        let objects = (requests * row.objects_each) as f64;
        let dash = || "–".to_owned();
        let (reviews, review_ms, cpu_per_review) = match &row.webhook {
            Some(work) if work.reviews > 0.0 => (
                format!("{:.0}", work.reviews),
                format!("{:.2}", work.review_seconds * 1e3 / work.reviews),
                format!("{:.0}", work.manager_cpu.as_secs_f64() * 1e6 / work.reviews),
            ),
            Some(_) => ("0".to_owned(), dash(), dash()),
            None => (dash(), dash(), dash()),
        };
        println!(
            "| {} | {} | {requests} | {:.2} | {:.2} | {:.0} | {reviews} | {review_ms} | {cpu_per_review} |",
            row.what,
            row.version,
            row.p(50.0),
            row.p(99.0),
            objects / row.elapsed.as_secs_f64(),
        );
    }
    println!();
    let (get_stored, get_converted) = (&rows[1], &rows[2]);
    println!(
        "- a GET's conversion (v1alpha1 - v1beta1): p50 {:+.2} ms, p99 {:+.2} ms",
        get_converted.p(50.0) - get_stored.p(50.0),
        get_converted.p(99.0) - get_stored.p(99.0),
    );
    let (alpha, beta) = (&rows[3], &rows[4]);
    println!(
        "- {CONCURRENCY} GETs at a time: {:.0} conversions/s (v1beta1, no conversion: {:.0} GETs/s)",
        beta.latencies.len() as f64 / beta.elapsed.as_secs_f64(),
        alpha.latencies.len() as f64 / alpha.elapsed.as_secs_f64(),
    );
    let (alpha, beta) = (&rows[7], &rows[8]);
    let extra = beta.p(50.0) - alpha.p(50.0);
    let reviews_per_list = beta
        .webhook
        .as_ref()
        .map_or(0.0, |work| work.reviews / beta.latencies.len() as f64);
    println!(
        "- a LIST of {} from etcd: p50 {extra:+.0} ms, {:.0} µs per object, {reviews_per_list:.0} \
         reviews per LIST",
        beta.objects_each,
        extra * 1e3 / beta.objects_each as f64,
    );
    println!(
        "- requests one at a time unless said, the two versions interleaved (– in a v1beta1 row: \
         the phase's reviews are all in the v1alpha1 row); p99 of {LISTS} LISTs is their slowest; \
         objects/s = objects / time spent in those requests (wall time when concurrent); reviews \
         sent and their mean duration from the API server's \
         apiserver_crd_conversion_webhook_duration_seconds, counted until it has sent none for a \
         second (its watch cache converts writes behind them); manager CPU = user + system time of \
         `pgkube run` during the phase (10 ms ticks), per review"
    );
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// The nearest-rank percentile.
fn percentile(latencies: &[Duration], p: f64) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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

/// The webhook's work from [`Run::phase`] on.
struct Phase {
    client: Client,
    manager_pid: u32,
    cpu: Duration,
    conversions: Conversions,
}

impl Phase {
    /// The work of the phase, once the API server has finished converting (its watch caches
    /// convert what was written in the background, and may lag behind the writes).
    async fn end(self) -> WebhookWork {
        let now = settle(&self.client).await;
        WebhookWork {
            manager_cpu: cpu_time(self.manager_pid).saturating_sub(self.cpu),
            reviews: now.count - self.conversions.count,
            review_seconds: now.seconds - self.conversions.seconds,
        }
    }
}

/// What the webhook did in a phase.
struct WebhookWork {
    /// CPU time (user + system) of the manager process.
    manager_cpu: Duration,
    /// ConversionReviews the API server sent it.
    reviews: f64,
    /// Their total duration, as the API server measured it.
    review_seconds: f64,
}

/// The API server's own count of its calls to pgkube's conversion webhook, and their total time.
#[derive(Clone, Copy)]
struct Conversions {
    count: f64,
    seconds: f64,
}

/// Waits until the API server has sent no ConversionReview for a second (at most a minute);
/// its counts then.
async fn settle(client: &Client) -> Conversions {
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut last = conversions(client).await;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = conversions(client).await;
        if now.count == last.count || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Reads `apiserver_crd_conversion_webhook_duration_seconds` (every call that converts a
/// PostgreSQLCluster to another version) from the API server's metrics.
async fn conversions(client: &Client) -> Conversions {
    let request = axum::http::Request::get("/metrics")
        .body(Vec::new())
        .expect("metrics request");
    let text = client
        .request_text(request)
        .await
        .unwrap_or_else(|error| panic!("the API server's metrics: {error}"));
    let crd = format!(r#"crd_name="postgresqlclusters.{GROUP}""#);
    let total = |series: &str| -> f64 {
        text.lines()
            .filter(|line| line.starts_with(series) && line.contains(&crd))
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    Conversions {
        count: total("apiserver_crd_conversion_webhook_duration_seconds_count{"),
        seconds: total("apiserver_crd_conversion_webhook_duration_seconds_sum{"),
    }
}

/// `USER_HZ`: the unit of the CPU times in /proc, 100 on every Linux architecture we run on.
const CLOCK_TICKS_PER_SECOND: u64 = 100;

/// utime + stime of a process (fields 14 and 15 of /proc/<pid>/stat).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it are plain numbers.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&index| fields.get(index)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 1000 / CLOCK_TICKS_PER_SECOND)
}

/// The sample cluster (`deploy/samples/postgresqlcluster.yaml`, the design document's), plus a
/// few PostgreSQL settings and a label: every part of the spec that v1beta1 reshapes.
fn sample_cluster(name: &str) -> pgkube_crds::PostgreSQLCluster {
    let mut cluster: pgkube_crds::PostgreSQLCluster =
        serde_yaml::from_str(include_str!("../deploy/samples/postgresqlcluster.yaml"))
            .expect("the sample parses");
    cluster.metadata.name = Some(name.to_owned());
    cluster.metadata.labels = Some([("team".to_owned(), "payments".to_owned())].into());
    let parameters = [("work_mem", "16MB"), ("max_connections", "200")];
    cluster.spec.postgresql = Some(pgkube_crds::PostgreSQLSettings {
        parameters: parameters.map(|(k, v)| (k.to_owned(), v.to_owned())).into(),
    });
    cluster
}

/// Applies `crds` as the test kit's field manager (so that [`install_crds`] takes out what they
/// add) and waits until `converted_path` lists through the webhook.
async fn install(client: &Client, crds: &[CustomResourceDefinition], converted_path: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    for crd in crds {
        api.patch(&crd.name_any(), &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|error| panic!("installing {}: {error}", crd.name_any()));
    }
    wait_until("v1alpha1 to be served", STEP_TIMEOUT, || async {
        let request = Request::new(converted_path).list(&ListParams::default().limit(1))?;
        client.request_text(request).await?;
        Ok(Some(()))
    })
    .await
    .unwrap_or_else(|error| panic!("{error:#}"));
}

/// Deletes the namespaces and waits until they are gone (a warning, not a panic, when they are
/// not: the CRDs must be put back anyway).
async fn delete_namespaces<const N: usize>(client: &Client, namespaces: [TestNamespace; N]) {
    let names: Vec<String> = namespaces.iter().map(|ns| ns.name().to_owned()).collect();
    for namespace in namespaces {
        namespace.cleanup().await;
    }
    let api = Api::<Namespace>::all(client.clone());
    let started = Instant::now();
    let gone = wait_until(
        "the bench's namespaces to be deleted",
        NAMESPACE_GONE_TIMEOUT,
        || async {
            for name in &names {
                if api.get_opt(name).await?.is_some() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await;
    match gone {
        Ok(()) => eprintln!(
            "conversion_webhook: namespaces deleted in {:.1} s",
            started.elapsed().as_secs_f64()
        ),
        Err(error) => eprintln!("warning: {error:#}"),
    }
}

/// Takes the webhook conversion out of pgkube's CRDs (its fields may belong to another field
/// manager too, which the test kit's apply alone would leave), then puts the v1beta1-only CRDs
/// back.
async fn restore_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch: serde_json::Value = serde_json::from_str(NO_CONVERSION).expect("patch");
    for crd in pgkube_crds::crds() {
        api.patch(
            &crd.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|error| panic!("taking the conversion out of {}: {error}", crd.name_any()));
    }
    install_crds(client).await;
}

/// Puts the v1beta1-only CRDs back with kubectl when dropped: on a panic, when the runtime of
/// the async client may be gone. Disarmed once [`restore_crds`] has done it.
struct RestoreCrdsOnDrop {
    env: TestEnv,
    armed: bool,
}

impl Drop for RestoreCrdsOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        eprintln!("conversion_webhook: putting the v1beta1-only CRDs back with kubectl");
        let crds = pgkube_crds::v1beta1::crds();
        let run = |args: &[&str]| match self.env.kubectl().args(args).output() {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "warning: kubectl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => eprintln!("warning: kubectl {args:?}: {error}"),
        };
        for crd in &crds {
            let name = crd.name_any();
            run(&["patch", "crd", &name, "--type=merge", "-p", NO_CONVERSION]);
        }
        let manifest: Vec<String> = crds
            .iter()
            .map(|crd| serde_yaml::to_string(crd).expect("CRD as YAML"))
            .collect();
        let file: PathBuf = std::env::temp_dir().join(format!(
            "pgkube-conversion-bench-crds-{}.yaml",
            std::process::id()
        ));
        if let Err(error) = std::fs::write(&file, manifest.join("---\n")) {
            eprintln!("warning: writing {}: {error}", file.display());
            return;
        }
        let file_arg = file.to_string_lossy().into_owned();
        let field_manager = format!("--field-manager={CRD_FIELD_MANAGER}");
        run(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            &field_manager,
            "-f",
            &file_arg,
        ]);
        let _ = std::fs::remove_file(&file);
    }
}
