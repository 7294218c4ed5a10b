//! Running the PostgreSQL client tools (`pg_dump`, `pg_dumpall`, `pg_restore`, `psql`).
//!
//! Connection settings reach the tools through libpq's own environment variables (`PGHOST`,
//! `PGPORT`, `PGUSER`, `PGSSLMODE`, ...), which they inherit. The password comes from
//! `PGPASSWORD` or from the file named by `PGKUBE_PGPASSWORD_FILE` and is handed to each child as
//! `PGPASSWORD` in its environment, never on its command line. Database names are passed as
//! quoted `dbname='...'` connection strings, so a name that looks like a URI or contains `=` is
//! still only a name.
//!
//! With `PGKUBE_TLS_DIR` (the Job's volume of the cluster's CA and client certificates), every
//! tool connects with `sslmode=verify-full` and the superuser's client certificate (a physical
//! backup's replication connection with the replication role's), copied first where libpq
//! accepts a key.

use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, Command};
use tokio::task::JoinHandle;

use super::error::AgentError;
use super::storage::{one_line, secret_from_env_or_file};
use crate::tls::{ClientRole, ClientTls};

/// The certificates of `PGKUBE_TLS_DIR` copied into a private directory, if it is set.
fn install_tls() -> Result<Option<std::path::PathBuf>, AgentError> {
    let Some(source) = std::env::var_os("PGKUBE_TLS_DIR").filter(|dir| !dir.is_empty()) else {
        return Ok(None);
    };
    let source = std::path::PathBuf::from(source);
    let target = std::env::temp_dir().join(format!("pgkube-tls-{}", std::process::id()));
    match crate::tls::copy_private(&source, &target) {
        Ok(Some(_)) => Ok(Some(target)),
        Ok(None) => Err(AgentError::Settings(format!(
            "{} holds no ca.crt",
            source.display()
        ))),
        Err(error) => Err(AgentError::Settings(format!(
            "cannot copy the certificates of {}: {error}",
            source.display()
        ))),
    }
}

/// How long [`Postgres::query`] waits out a server it could not reach.
const CONNECT_RETRY: Duration = Duration::from_secs(60);

/// Whether `psql` failed before it reached the server: libpq's words for a host name that does
/// not resolve and for a connection that could not be made. A refused login (a wrong password)
/// reached it, and is not one of them.
fn never_connected(error: &AgentError) -> bool {
    let AgentError::Tool { program, reason } = error else {
        return false;
    };
    program == "psql"
        && reason.starts_with("exit status 2:")
        && [
            "could not translate host name",
            "Connection refused",
            "No route to host",
        ]
        .iter()
        .any(|words| reason.contains(words))
}

/// How many bytes of a tool's stderr are kept for the error message.
const STDERR_TAIL_BYTES: usize = 2048;

/// What every tool invocation needs: the password (if any) and the maintenance database.
#[derive(Clone)]
pub struct Postgres {
    password: Option<String>,
    maintenance_database: String,
    /// Where the certificates were copied, if the Job has them.
    tls_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Postgres")
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("maintenance_database", &self.maintenance_database)
            .field("tls_dir", &self.tls_dir)
            .finish()
    }
}

/// A started tool whose stderr is collected in the background.
pub struct RunningTool {
    program: String,
    pub child: Child,
    stderr_tail: JoinHandle<String>,
}

impl Postgres {
    pub fn from_env(maintenance_database: &str) -> Result<Self, AgentError> {
        Ok(Self {
            password: secret_from_env_or_file("PGPASSWORD", "PGKUBE_PGPASSWORD_FILE")?,
            maintenance_database: maintenance_database.to_string(),
            tls_dir: install_tls()?,
        })
    }

    /// How a connection as `role` uses TLS: verified, with the role's client certificate.
    pub fn client_tls(&self, role: ClientRole) -> Option<ClientTls> {
        Some(ClientTls::new(self.tls_dir.as_deref()?, role, true))
    }

    pub fn maintenance_database(&self) -> &str {
        &self.maintenance_database
    }

    /// A command for `program` with the password in its environment. Killed if dropped, so an
    /// abandoned dump never keeps running behind the agent's back.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.kill_on_drop(true).stdin(Stdio::null());
        if let Some(password) = &self.password {
            command.env("PGPASSWORD", password);
        }
        if let Some(tls) = self.client_tls(ClientRole::Superuser) {
            command.envs(tls.env());
        }
        command
    }

    /// Starts a command with stderr collected; stdin and stdout are as the caller set them.
    pub fn spawn(&self, program: &str, mut command: Command) -> Result<RunningTool, AgentError> {
        command.stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|source| AgentError::Spawn {
            program: program.to_string(),
            source,
        })?;
        let stderr = child.stderr.take();
        Ok(RunningTool {
            program: program.to_string(),
            child,
            stderr_tail: tokio::spawn(collect_tail(stderr)),
        })
    }

    /// Runs one SQL statement with `psql` against `database` and returns its unaligned output.
    /// A `psql` that never reached the server (its name did not resolve, the connection was
    /// refused: a Service whose primary is not ready for a moment) ran nothing, so it runs
    /// again once the server accepts connections, for up to [`CONNECT_RETRY`].
    pub async fn query(&self, database: &str, sql: &str) -> Result<String, AgentError> {
        let deadline = Instant::now() + CONNECT_RETRY;
        loop {
            match self.query_once(database, sql).await {
                Err(error) if never_connected(&error) && Instant::now() < deadline => {
                    tracing::info!(%error, "psql did not reach the server; waiting for it");
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.wait_until_accepting(left).await?;
                }
                answer => return answer,
            }
        }
    }

    async fn query_once(&self, database: &str, sql: &str) -> Result<String, AgentError> {
        let mut command = self.command("psql");
        command
            .args(["--no-psqlrc", "--no-align", "--tuples-only", "--quiet"])
            .args(["--set", "ON_ERROR_STOP=1"])
            .arg("--dbname")
            .arg(conninfo_for(database))
            .arg("--command")
            .arg(sql)
            .stdout(Stdio::piped());
        let mut tool = self.spawn("psql", command)?;
        let mut output = String::new();
        if let Some(mut stdout) = tool.child.stdout.take() {
            stdout
                .read_to_string(&mut output)
                .await
                .map_err(|source| AgentError::Tool {
                    program: "psql".into(),
                    reason: format!("reading its output: {source}"),
                })?;
        }
        tool.finish().await?;
        Ok(output)
    }

    /// Names of the databases that can be dumped: not templates and accepting connections.
    pub async fn list_databases(&self) -> Result<Vec<String>, AgentError> {
        self.database_names("WHERE NOT datistemplate AND datallowconn")
            .await
    }

    /// Names of every database, templates included.
    pub async fn list_all_databases(&self) -> Result<Vec<String>, AgentError> {
        self.database_names("").await
    }

    async fn database_names(&self, condition: &str) -> Result<Vec<String>, AgentError> {
        // One name per line, as JSON strings, so names with newlines stay intact.
        let sql =
            format!("SELECT to_json(datname)::text FROM pg_database {condition} ORDER BY datname");
        let output = self.query(&self.maintenance_database, &sql).await?;
        output
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| {
                serde_json::from_str::<String>(line).map_err(|error| AgentError::Tool {
                    program: "psql".into(),
                    reason: format!("unexpected database list line: {error}"),
                })
            })
            .collect()
    }

    /// Waits until the server accepts connections (`pg_isready`), at most `timeout`: a backup
    /// Job can start while its primary restarts, or before the Service resolves to it.
    /// `pg_isready` does not log in: a wrong password is reported by the query that follows, at
    /// once.
    pub async fn wait_until_accepting(&self, timeout: Duration) -> Result<(), AgentError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(500);
        loop {
            let answer = self.is_ready().await?;
            let Some(reason) = answer else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(AgentError::Tool {
                    program: "pg_isready".into(),
                    reason: format!(
                        "the server did not accept connections within {}s: {reason}",
                        timeout.as_secs()
                    ),
                });
            }
            tracing::info!(%reason, "waiting for the server to accept connections");
            // The last attempt is at the deadline.
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    /// `None` when the server accepts connections, else why not. `pg_isready` exits 1 while
    /// the server rejects connections (starting, shutting down), 2 when it does not answer and
    /// 3 when it could not even try, which includes a host name that does not resolve (yet):
    /// all three are waited out.
    async fn is_ready(&self) -> Result<Option<String>, AgentError> {
        let mut command = self.command("pg_isready");
        command
            .arg("--dbname")
            .arg(conninfo_for(&self.maintenance_database))
            .args(["--timeout", "5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let output = command.output().await.map_err(|source| AgentError::Spawn {
            program: "pg_isready".into(),
            source,
        })?;
        Ok(match output.status.code() {
            Some(1..=3) => Some(one_line(&format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))),
            _ => None,
        })
    }

    pub async fn server_version(&self) -> Result<String, AgentError> {
        let output = self
            .query(&self.maintenance_database, "SHOW server_version")
            .await?;
        Ok(output.trim().to_string())
    }

    /// Bytes on disk of `databases` (every database when empty): what a backup reads, roughly.
    pub async fn databases_size(&self, databases: &[String]) -> Result<u64, AgentError> {
        let filter = if databases.is_empty() {
            String::new()
        } else {
            // The names as one JSON array literal: any name, no quoting of each.
            let names = serde_json::to_string(databases).unwrap_or_default();
            format!(
                " WHERE datname IN (SELECT json_array_elements_text('{}'::json))",
                names.replace('\'', "''")
            )
        };
        let sql =
            format!("SELECT coalesce(sum(pg_database_size(oid)), 0) FROM pg_database{filter}");
        let output = self.query(&self.maintenance_database, &sql).await?;
        output.trim().parse().map_err(|error| AgentError::Tool {
            program: "psql".into(),
            reason: format!("unexpected database size {:?}: {error}", output.trim()),
        })
    }

    /// The PostgreSQL system identifier of the database the server runs.
    pub async fn system_identifier(&self) -> Result<String, AgentError> {
        let output = self
            .query(
                &self.maintenance_database,
                "SELECT system_identifier::text FROM pg_control_system()",
            )
            .await?;
        Ok(output.trim().to_string())
    }

    /// The connecting role as `pg_dumpall` writes it (quoted only when needed).
    pub async fn current_role_identifier(&self) -> Result<String, AgentError> {
        let output = self
            .query(
                &self.maintenance_database,
                "SELECT quote_ident(current_user)",
            )
            .await?;
        Ok(output.trim().to_string())
    }

    /// `DROP DATABASE ... WITH (FORCE)`, from a database other than the one dropped.
    pub async fn drop_database(&self, database: &str) -> Result<(), AgentError> {
        let sql = format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_identifier(database)
        );
        self.query(self.database_to_connect_while_replacing(database), &sql)
            .await
            .map(|_| ())
    }

    /// The maintenance database, or `template1` when the maintenance database itself is the one
    /// being dropped and recreated (one cannot drop the database one is connected to).
    pub fn database_to_connect_while_replacing<'a>(&'a self, database: &str) -> &'a str {
        if database == self.maintenance_database {
            "template1"
        } else {
            &self.maintenance_database
        }
    }
}

impl RunningTool {
    /// Waits for the tool and turns a non-zero exit or a signal into an error that carries the
    /// last lines it wrote to stderr. On success, returns that stderr tail.
    pub async fn finish(mut self) -> Result<String, AgentError> {
        let status = self.child.wait().await.map_err(|source| AgentError::Tool {
            program: self.program.clone(),
            reason: format!("waiting for it: {source}"),
        })?;
        let stderr = self.stderr_tail.await.unwrap_or_default();
        if status.success() {
            return Ok(stderr);
        }
        let mut reason = describe_exit(status);
        let stderr = one_line(&stderr);
        if !stderr.is_empty() {
            reason = format!("{reason}: {stderr}");
        }
        Err(AgentError::Tool {
            program: self.program,
            reason,
        })
    }
}

/// `dbname='...'` with libpq's quoting, so that only the name is taken from it.
pub fn conninfo_for(database: &str) -> String {
    format!(
        "dbname='{}'",
        database.replace('\\', "\\\\").replace('\'', "\\'")
    )
}

/// A PostgreSQL identifier in double quotes.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "ended abnormally".into(),
    }
}

/// Reads the whole stderr (so the tool never blocks on a full pipe), keeping only its tail.
async fn collect_tail(stderr: Option<ChildStderr>) -> String {
    let Some(mut stderr) = stderr else {
        return String::new();
    };
    let mut tail: Vec<u8> = Vec::new();
    let mut buffer = [0u8; 4096];
    while let Ok(read) = stderr.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        tail.extend_from_slice(&buffer[..read]);
        if tail.len() > STDERR_TAIL_BYTES {
            tail.drain(..tail.len() - STDERR_TAIL_BYTES);
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conninfo_quotes_names_that_look_like_connection_strings() {
        assert_eq!(conninfo_for("app"), "dbname='app'");
        assert_eq!(conninfo_for("host=evil' x"), "dbname='host=evil\\' x'");
        assert_eq!(conninfo_for("a\\b"), "dbname='a\\\\b'");
    }

    #[test]
    fn only_a_psql_that_never_reached_the_server_runs_again() {
        let failed = |program: &str, reason: &str| AgentError::Tool {
            program: program.to_owned(),
            reason: reason.to_owned(),
        };
        assert!(never_connected(&failed(
            "psql",
            "exit status 2: psql: error: could not translate host name \"pg-rw\" to address: Name or service not known"
        )));
        assert!(never_connected(&failed(
            "psql",
            "exit status 2: psql: error: connection to server at \"pg-rw\" (10.0.0.7), port 5432 failed: Connection refused"
        )));
        for (program, reason) in [
            (
                "psql",
                "exit status 2: psql: error: connection to server at \"pg-rw\" (10.0.0.7), port 5432 failed: FATAL:  password authentication failed for user \"postgres\"",
            ),
            (
                "psql",
                "exit status 3: ERROR:  relation \"t\" does not exist",
            ),
            ("pg_restore", "exit status 2: could not translate host name"),
        ] {
            assert!(!never_connected(&failed(program, reason)), "{reason}");
        }
    }

    #[test]
    fn identifiers_are_double_quoted() {
        assert_eq!(quote_identifier("App\"DB"), "\"App\"\"DB\"");
    }

    #[test]
    fn the_password_is_redacted_from_debug_output() {
        let postgres = Postgres {
            password: Some("s3cret-value".into()),
            maintenance_database: "postgres".into(),
            tls_dir: None,
        };
        assert!(!format!("{postgres:?}").contains("s3cret-value"));
    }

    #[tokio::test]
    async fn a_failing_tool_reports_its_exit_status_and_stderr() {
        let postgres = Postgres {
            password: None,
            maintenance_database: "postgres".into(),
            tls_dir: None,
        };
        let mut command = postgres.command("sh");
        command.args([
            "-c",
            "echo 'first line' >&2; echo 'no such database' >&2; exit 3",
        ]);
        let error = postgres
            .spawn("sh", command)
            .expect("sh starts")
            .finish()
            .await
            .expect_err("exit 3 is a failure");
        let message = error.to_string();
        assert!(message.contains("exit status 3"), "{message}");
        assert!(message.contains("no such database"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }

    #[tokio::test]
    async fn a_killed_tool_reports_the_signal() {
        let postgres = Postgres {
            password: None,
            maintenance_database: "postgres".into(),
            tls_dir: None,
        };
        let mut command = postgres.command("sh");
        command.args(["-c", "kill -9 $$"]);
        let error = postgres
            .spawn("sh", command)
            .expect("sh starts")
            .finish()
            .await
            .expect_err("a killed tool is a failure");
        assert!(error.to_string().contains("killed by signal 9"), "{error}");
    }
}
