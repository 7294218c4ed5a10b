//! The test bed's connection details, as written by `tests/testbed/up`, and clients built
//! from them.

use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Setting this to `1` turns "test bed not running" from a test failure into a skip. Meant for
/// quick local runs only; CI never sets it.
pub const SKIP_ENV_VAR: &str = "PGKUBE_SKIP_TESTBED_TESTS";

/// Overrides where the env file is read from (default: `<workspace>/target/testbed/env`).
const ENV_FILE_VAR: &str = "PGKUBE_TESTBED_ENV";

/// How long a reachability probe of one test bed endpoint may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the running test bed's services are and how to log in to them.
#[derive(Debug, Clone)]
pub struct TestEnv {
    /// Admin kubeconfig of the test bed's API server.
    pub kubeconfig: PathBuf,
    /// PostgreSQL superuser URL (`postgres://user:password@127.0.0.1:port/postgres`).
    pub pg_url: String,
    /// S3 endpoint URL (path-style addressing).
    pub s3_endpoint: String,
    pub s3_access_key: String,
    pub s3_secret_key: String,
    /// A bucket shared by all tests; prefer [`crate::TestBucket`] for a fresh one.
    pub s3_bucket: String,
    pub s3_region: String,
    /// The test bed's binaries (kubectl, ...).
    pub bin_dir: PathBuf,
    /// The API server's audit log (JSON lines: requests by the ServiceAccounts of
    /// `pgkube-system`). `None` for a test bed started before `up` wrote one.
    pub audit_log: Option<PathBuf>,
}

impl TestEnv {
    /// Reads the env file. `Ok(None)` when there is none (the test bed was never started).
    pub fn load() -> anyhow::Result<Option<TestEnv>> {
        let path = env_file_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
        };
        let values = parse_env_file(&text);
        let get = |key: &str| {
            values
                .get(key)
                .cloned()
                .with_context(|| format!("{} has no {key}", path.display()))
        };
        Ok(Some(TestEnv {
            kubeconfig: get("KUBECONFIG")?.into(),
            pg_url: get("PGKUBE_TEST_PG_URL")?,
            s3_endpoint: get("PGKUBE_TEST_S3_ENDPOINT")?,
            s3_access_key: get("PGKUBE_TEST_S3_ACCESS_KEY")?,
            s3_secret_key: get("PGKUBE_TEST_S3_SECRET_KEY")?,
            s3_bucket: get("PGKUBE_TEST_S3_BUCKET")?,
            s3_region: get("PGKUBE_TEST_S3_REGION")?,
            bin_dir: get("PGKUBE_TESTBED_BIN")?.into(),
            audit_log: values.get("PGKUBE_TEST_AUDIT_LOG").map(PathBuf::from),
        }))
    }

    /// The client configuration of the test bed's API server, logged in as cluster admin: the
    /// one source of every test client. Add layers with
    /// `kube::client::ClientBuilder::try_from(config)` when a test needs them.
    pub async fn kube_config(&self) -> kube::Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.kubeconfig.display()));
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("test bed kubeconfig is valid")
    }

    /// A client for the test bed's API server, logged in as cluster admin.
    pub async fn kube_client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config().await)
            .expect("building a kube client for the test bed")
    }

    /// A client for the test bed's API server that authenticates with a bearer token only (for
    /// example a ServiceAccount token), trusting the test bed's CA.
    pub async fn kube_client_with_token(&self, token: &str) -> kube::Client {
        let kubeconfig = Kubeconfig::from_yaml(&self.kubeconfig_with_token(token))
            .expect("token kubeconfig parses");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("token kubeconfig is valid");
        kube::Client::try_from(config).expect("building a token kube client")
    }

    /// A kubeconfig (YAML) for the test bed's API server whose only credential is `token`, for
    /// [`TestEnv::kube_client_with_token`] or for a process started with it as `KUBECONFIG`.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let admin = Kubeconfig::read_from(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.kubeconfig.display()));
        let cluster = admin
            .clusters
            .iter()
            .find_map(|named| named.cluster.clone())
            .expect("test bed kubeconfig names a cluster");
        let server = cluster.server.expect("test bed kubeconfig names a server");
        let ca = cluster
            .certificate_authority_data
            .expect("test bed kubeconfig embeds its CA");
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    \
             server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: token\n  \
             user:\n    token: {token}\ncontexts:\n- name: token\n  context: {{cluster: testbed, \
             user: token}}\ncurrent-context: token\n"
        )
    }

    /// `kubectl` of the test bed's Kubernetes release, pointed at its API server.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.bin_dir.join("kubectl"));
        command.env("KUBECONFIG", &self.kubeconfig);
        command
    }

    /// `kubectl <args>` with `input` on its stdin (`-f -`), once it ended.
    pub fn kubectl_with_input(&self, args: &[&str], input: &str) -> std::process::Output {
        use std::io::Write as _;
        use std::process::Stdio;
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl starts");
        child
            .stdin
            .take()
            .expect("kubectl's stdin is piped")
            .write_all(input.as_bytes())
            .expect("input written to kubectl");
        child.wait_with_output().expect("kubectl finishes")
    }

    /// An S3 client for the test bed's object store: path-style, static credentials, and
    /// checksums only when an operation requires them (non-AWS stores reject some of the SDK's
    /// default checksum headers).
    pub fn s3_client(&self) -> aws_sdk_s3::Client {
        let credentials = Credentials::new(
            &self.s3_access_key,
            &self.s3_secret_key,
            None,
            None,
            "pgkube-testbed",
        );
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&self.s3_endpoint)
            .region(Region::new(self.s3_region.clone()))
            .credentials_provider(credentials)
            .force_path_style(true)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }

    /// Fails unless the API server, PostgreSQL and S3 all accept TCP connections.
    fn check_reachable(&self) -> anyhow::Result<()> {
        let server = kube_server_url(&self.kubeconfig)?;
        for (what, url) in [
            ("API server", server.as_str()),
            ("PostgreSQL", self.pg_url.as_str()),
            ("S3", self.s3_endpoint.as_str()),
        ] {
            probe_tcp(url).with_context(|| format!("{what} at {}", host_port(url)))?;
        }
        Ok(())
    }
}

/// The test bed for a test that needs it, or `None` when the test should be skipped.
///
/// Panics when the test bed is not running (telling how to start it), unless
/// `PGKUBE_SKIP_TESTBED_TESTS=1` is set: then it prints a skip line and returns `None`.
pub fn testbed() -> Option<TestEnv> {
    let problem = match TestEnv::load() {
        Ok(Some(env)) => match env.check_reachable() {
            Ok(()) => return Some(env),
            Err(error) => format!("test bed not reachable: {error:#}"),
        },
        Ok(None) => format!("test bed not running: no {}", env_file_path().display()),
        Err(error) => format!("test bed env unreadable: {error:#}"),
    };
    if std::env::var(SKIP_ENV_VAR).is_ok_and(|v| v == "1") {
        eprintln!("skipped: test bed not running ({problem})");
        return None;
    }
    panic!(
        "{problem}\nStart it with `tests/testbed/up` (or run the whole suite with `tests/run`). \
         Set {SKIP_ENV_VAR}=1 to skip test-bed tests locally."
    );
}

fn env_file_path() -> PathBuf {
    if let Some(path) = std::env::var_os(ENV_FILE_VAR) {
        return PathBuf::from(path);
    }
    workspace_root().join("target/testbed/env")
}

/// The workspace being tested. `cargo test` sets CARGO_MANIFEST_DIR for the test process to the
/// tested package's directory; the workspace root is its nearest ancestor with a Cargo.lock.
/// That beats this crate's compile-time directory, which may name another clone when several
/// clones share one CARGO_TARGET_DIR and cargo reused the compiled testkit.
fn workspace_root() -> PathBuf {
    let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Some(manifest_dir) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        return compiled_in;
    };
    Path::new(&manifest_dir)
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .map_or(compiled_in, Path::to_path_buf)
}

/// Parses `KEY=value` lines; values may be wrapped in single or double quotes.
fn parse_env_file(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| {
            let key = key.trim().trim_start_matches("export ").trim();
            (key.to_owned(), unquote(value.trim()).to_owned())
        })
        .collect()
}

fn unquote(value: &str) -> &str {
    for quote in ['\'', '"'] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

fn kube_server_url(kubeconfig: &Path) -> anyhow::Result<String> {
    let config = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    config
        .clusters
        .iter()
        .find_map(|named| named.cluster.as_ref()?.server.clone())
        .with_context(|| format!("{} names no server", kubeconfig.display()))
}

/// `scheme://user:pw@host:port/path` -> `host:port`.
fn host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.rsplit_once('@').map_or(authority, |(_, hp)| hp)
}

fn probe_tcp(url: &str) -> anyhow::Result<()> {
    let address = host_port(url)
        .to_socket_addrs()?
        .next()
        .context("address resolves to nothing")?;
    TcpStream::connect_timeout(&address, PROBE_TIMEOUT)?;
    Ok(())
}

/// The pgkube binary the real node runs for the pgkube image (what `tests/testbed/up` gives
/// its node agent): the debug build in `CARGO_TARGET_DIR`, else in the workspace's `target`.
pub fn node_pgkube_binary() -> PathBuf {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    target.join("debug/pgkube")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quoted_and_plain_values() {
        let values = parse_env_file("# comment\nA='x y'\nB=\"z\"\nexport C=plain\n\n");
        assert_eq!(values["A"], "x y");
        assert_eq!(values["B"], "z");
        assert_eq!(values["C"], "plain");
    }

    #[test]
    fn host_port_strips_scheme_credentials_and_path() {
        assert_eq!(
            host_port("postgres://u:p@127.0.0.1:5432/db"),
            "127.0.0.1:5432"
        );
        assert_eq!(host_port("https://127.0.0.1:6443"), "127.0.0.1:6443");
    }
}
