//! The globals script of a logical backup (`pg_dumpall --globals-only`: roles, tablespaces):
//! downloaded into memory (up to [`GLOBALS_LIMIT`]) and verified with the databases before
//! anything changes, refused if it holds a `psql` meta-command, then fed to `psql` without the
//! statements that would reset the connecting role, the replication role or the application
//! role, so restoring another cluster's backup does not change the passwords the operator
//! manages for them. As
//! `pg_dumpall` intends, errors such as "role already exists" do not stop the script.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tracing::{info, instrument, warn};

use super::error::AgentError;
use super::postgres::{Postgres, conninfo_for};
use super::restore::stream_object;
use super::storage::Store;
use pgkube_controllers::cluster::build::REPLICATION_USER;
use pgkube_controllers::storage::manifest::StoredObject;

/// Largest globals script restore accepts; real ones are a few kilobytes.
const GLOBALS_LIMIT: u64 = 16 * 1024 * 1024;

/// Downloads the globals script, verified (size and checksum) and checked for meta-commands.
pub(super) async fn download(store: &Store, globals: &StoredObject) -> Result<Vec<u8>, AgentError> {
    if globals.size > GLOBALS_LIMIT {
        return Err(AgentError::Verification {
            key: globals.key.clone(),
            reason: format!(
                "{} bytes of globals is more than the {GLOBALS_LIMIT} accepted",
                globals.size
            ),
        });
    }
    let mut script = Vec::new();
    stream_object(store, globals, &mut script, None).await?;
    only_sql(&script).map_err(|reason| AgentError::Verification {
        key: globals.key.clone(),
        reason,
    })?;
    Ok(script)
}

/// Refuses a script with a `psql` meta-command: any line with a backslash, except the
/// `\restrict`/`\unrestrict` lines `pg_dumpall` writes around its output. `psql` would run
/// `\!` as a shell command in the restore's pod, which holds the superuser's password and the
/// storage keys; a backslash in a string is refused too, since whether psql takes it for a
/// meta-command depends on settings the script itself can change.
fn only_sql(script: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(script);
    let refused = text
        .lines()
        .enumerate()
        .find(|(_, line)| line.contains('\\') && !is_restrict_line(line));
    match refused {
        None => Ok(()),
        Some((index, line)) => Err(format!(
            "line {} of the globals script has a backslash, which psql could run as a meta-command ({}): nothing was restored",
            index + 1,
            shown(line)
        )),
    }
}

/// `\restrict <key>` or `\unrestrict <key>`, as `pg_dumpall` writes them.
fn is_restrict_line(line: &str) -> bool {
    let mut words = line.trim_end().split(' ');
    let command = words.next();
    let key = words.next();
    matches!(command, Some("\\restrict" | "\\unrestrict"))
        && key.is_some_and(|key| !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric()))
        && words.next().is_none()
}

/// At most 80 characters of `line`, for a message.
fn shown(line: &str) -> String {
    const SHOWN: usize = 80;
    match line.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// Runs the script with `psql` against the maintenance database.
#[instrument(name = "globals", skip_all)]
pub(super) async fn restore(
    postgres: &Postgres,
    script: &[u8],
    application_role: Option<&str>,
) -> Result<(), AgentError> {
    let own_role = postgres.current_role_identifier().await?;
    // The target cluster's replication and application roles keep their own passwords: its
    // replicas and applications log in with the ones in the target's Secrets, not those of the
    // cluster the backup came from.
    let application_role = application_role.map(identifier_as_dumped);
    let kept: Vec<&str> = [Some(own_role.as_str()), Some(REPLICATION_USER)]
        .into_iter()
        .chain([application_role.as_deref()])
        .flatten()
        .collect();
    let script = without_roles(&String::from_utf8_lossy(script), &kept);
    let mut command = postgres.command("psql");
    command
        .args(["--no-psqlrc", "--quiet", "--no-password", "--dbname"])
        .arg(conninfo_for(postgres.maintenance_database()))
        .stdin(Stdio::piped())
        .stdout(Stdio::null());
    let mut tool = postgres.spawn("psql", command)?;
    let written = match tool.child.stdin.take() {
        Some(mut stdin) => stdin.write_all(script.as_bytes()).await,
        None => Ok(()),
    };
    let stderr = tool.finish().await?;
    written.map_err(|source| AgentError::Stream {
        key: "globals".into(),
        source,
    })?;
    let errors = stderr
        .lines()
        .filter(|line| line.contains("ERROR:"))
        .count();
    if errors > 0 {
        warn!(
            errors,
            "some global statements failed (usually roles that already exist): {}",
            super::storage::one_line(&stderr)
        );
    }
    info!("globals restored");
    Ok(())
}

/// `name` as `pg_dumpall` writes a role's name: bare when it is a lowercase identifier (the
/// only application role names the CRD accepts), quoted otherwise.
fn identifier_as_dumped(name: &str) -> String {
    let bare = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if bare {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// The globals script without `CREATE ROLE <role>;` and `ALTER ROLE <role> WITH ...;`, the two
/// statements `pg_dumpall` writes for a role, for each of `roles` (as `pg_dumpall` spells them,
/// quoted only when needed): the role the restore connects as and the roles pgkube manages.
fn without_roles(script: &str, roles: &[&str]) -> String {
    let skipped = |line: &str| {
        roles.iter().any(|role| {
            line == format!("CREATE ROLE {role};")
                || line.starts_with(&format!("ALTER ROLE {role} WITH "))
        })
    };
    script
        .lines()
        .filter(|line| !skipped(line))
        .flat_map(|line| [line, "\n"])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connecting_role_and_the_replication_role_are_left_alone_by_the_globals_script() {
        let script = "CREATE ROLE app;\nALTER ROLE app WITH LOGIN PASSWORD 'x';\n\
                      CREATE ROLE postgres;\nALTER ROLE postgres WITH SUPERUSER PASSWORD 'y';\n\
                      CREATE ROLE postgres_reader;\n";
        let filtered = without_roles(script, &["postgres"]);
        assert_eq!(
            filtered,
            "CREATE ROLE app;\nALTER ROLE app WITH LOGIN PASSWORD 'x';\nCREATE ROLE postgres_reader;\n"
        );
        let replication = "CREATE ROLE streaming_replica;\n\
                           ALTER ROLE streaming_replica WITH REPLICATION LOGIN PASSWORD 'z';\n\
                           CREATE ROLE app;\n";
        assert_eq!(
            without_roles(replication, &["postgres", REPLICATION_USER]),
            "CREATE ROLE app;\n"
        );
    }

    #[test]
    fn the_application_role_is_kept_by_its_dumped_name() {
        assert_eq!(identifier_as_dumped("app"), "app");
        assert_eq!(identifier_as_dumped("shop_owner2"), "shop_owner2");
        assert_eq!(identifier_as_dumped("Shop"), "\"Shop\"");
        assert_eq!(identifier_as_dumped("a\"b"), "\"a\"\"b\"");
        let script = "CREATE ROLE app;\nALTER ROLE app WITH LOGIN PASSWORD 'x';\n\
                      CREATE ROLE reporting;\n";
        let kept = identifier_as_dumped("app");
        assert_eq!(
            without_roles(script, &["postgres", &kept]),
            "CREATE ROLE reporting;\n"
        );
    }

    #[test]
    fn a_meta_command_is_refused_and_pg_dumpalls_restrict_lines_are_not() {
        let dumped = "\\restrict a1B2\nSET standard_conforming_strings = on;\nCREATE ROLE app;\n\\unrestrict a1B2\n";
        assert_eq!(only_sql(dumped.as_bytes()), Ok(()));
        let shell = "CREATE ROLE app;\n\\! touch /tmp/pwned\n";
        assert_eq!(
            only_sql(shell.as_bytes()),
            Err("line 2 of the globals script has a backslash, which psql could run as a meta-command (\\! touch /tmp/pwned): nothing was restored".to_owned())
        );
        for refused in [
            "SELECT 1 \\! id\n",
            "COMMENT ON ROLE app IS 'a\\'; \n",
            "\\restrict a1B2 \\! id\n",
            "\\restrict\n",
            "\\copy t from program 'id'\n",
        ] {
            assert!(only_sql(refused.as_bytes()).is_err(), "{refused:?}");
        }
    }
}
