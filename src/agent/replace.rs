//! Replacing an existing database with its restore (`--drop-existing`) without ever being left
//! with less than before: the existing database is set aside under another name, the restore
//! runs, and only once it completed is the old database dropped. When the restore fails, the
//! old database is put back under its name, unchanged, and what the failed restore created is
//! kept aside (never dropped: nothing proves no one else created a database of that name).
//!
//! Setting aside: new connections are refused (`ALLOW_CONNECTIONS false`), the open ones ended,
//! then the database is renamed to `<name>_pgkube_old_<id>`. Putting back reverses it. A crash
//! in between leaves the database under the aside name, whole: the error and the logs name it.

use std::time::Duration;

use tracing::{info, warn};

use super::error::AgentError;
use super::postgres::{Postgres, quote_identifier};

/// PostgreSQL's longest identifier, in bytes.
const MAX_IDENTIFIER: usize = 63;
/// How long to wait for the ended sessions to go before renaming.
const SESSIONS_GONE_WITHIN: Duration = Duration::from_secs(30);

/// The names a replacement uses for one database, with one id for the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub database: String,
    /// Where the existing database waits while the restore runs.
    pub aside: String,
    /// Where a failed restore's database is kept.
    pub failed: String,
}

impl Replacement {
    pub fn new(database: &str, run_id: &str) -> Self {
        Self {
            database: database.to_owned(),
            aside: suffixed(database, &format!("_pgkube_old_{run_id}")),
            failed: suffixed(database, &format!("_pgkube_failed_{run_id}")),
        }
    }
}

/// `name` with `suffix`, `name` cut (at a character boundary) so that both fit in an identifier.
fn suffixed(name: &str, suffix: &str) -> String {
    let room = MAX_IDENTIFIER.saturating_sub(suffix.len());
    let mut end = name.len().min(room);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &name[..end])
}

/// An id for this run's aside names: eight hex digits of the clock.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos() ^ (elapsed.as_secs() as u32))
        .unwrap_or_default();
    format!("{nanos:08x}")
}

/// Sets the existing database aside.
pub async fn set_aside(postgres: &Postgres, names: &Replacement) -> Result<(), AgentError> {
    info!(database = %names.database, aside = %names.aside, "setting the existing database aside");
    rename_closed(postgres, &names.database, &names.aside).await
}

/// After a completed restore: the old database goes. Failing to drop it loses nothing, so it
/// is a warning, not a failed restore.
pub async fn drop_aside(postgres: &Postgres, names: &Replacement) {
    if let Err(error) = postgres.drop_database(&names.aside).await {
        warn!(aside = %names.aside, %error, "the restore completed; the old database stays aside");
    }
}

/// After a failed restore: what it created goes aside as failed, and the old database comes
/// back under its name, open again. Returns the restore's error, saying where everything is.
pub async fn put_back(postgres: &Postgres, names: &Replacement, error: AgentError) -> AgentError {
    let outcome = put_back_steps(postgres, names).await;
    let note = match outcome {
        Ok(false) => format!(
            "the existing database {} was put back unchanged",
            names.database
        ),
        Ok(true) => format!(
            "the existing database {} was put back unchanged; what the failed restore created \
             is kept as {} (drop it to free its space)",
            names.database, names.failed
        ),
        Err(put_back) => format!(
            "the existing database is kept whole as {}, but putting it back failed: {put_back}",
            names.aside
        ),
    };
    AgentError::Replaced {
        error: Box::new(error),
        note,
    }
}

/// Whether a database the restore created had to be moved aside.
async fn put_back_steps(postgres: &Postgres, names: &Replacement) -> Result<bool, AgentError> {
    // From template1 when the maintenance database is the one replaced: it may not exist now.
    let exists = format!(
        "SELECT count(*) FROM pg_database WHERE datname = {}",
        quote_literal(&names.database)
    );
    let from = via(postgres, &[&names.database, &names.aside]);
    let created = postgres.query(from, &exists).await?.trim() != "0";
    if created {
        rename_closed(postgres, &names.database, &names.failed).await?;
    }
    rename(postgres, &names.aside, &names.database).await?;
    let reopen = format!(
        "ALTER DATABASE {} ALLOW_CONNECTIONS true",
        quote_identifier(&names.database)
    );
    postgres
        .query(via(postgres, &[&names.database]), &reopen)
        .await?;
    Ok(created)
}

/// Refuses new connections to `from`, ends the open ones, waits for them to go, renames it.
async fn rename_closed(postgres: &Postgres, from: &str, to: &str) -> Result<(), AgentError> {
    let via = via(postgres, &[from, to]);
    let close = format!(
        "ALTER DATABASE {} ALLOW_CONNECTIONS false",
        quote_identifier(from)
    );
    postgres.query(via, &close).await?;
    let sessions = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = {} AND pid <> pg_backend_pid()",
        quote_literal(from)
    );
    let deadline = tokio::time::Instant::now() + SESSIONS_GONE_WITHIN;
    while postgres.query(via, &sessions).await?.trim() != "0" {
        if tokio::time::Instant::now() > deadline {
            return Err(AgentError::Tool {
                program: "psql".into(),
                reason: format!("the sessions of database {from} did not end"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rename(postgres, from, to).await
}

async fn rename(postgres: &Postgres, from: &str, to: &str) -> Result<(), AgentError> {
    let sql = format!(
        "ALTER DATABASE {} RENAME TO {}",
        quote_identifier(from),
        quote_identifier(to)
    );
    postgres
        .query(via(postgres, &[from, to]), &sql)
        .await
        .map(|_| ())
}

/// The database to run a statement on `databases` from: the maintenance database, or
/// `template1` when it is one of them.
fn via<'a>(postgres: &'a Postgres, databases: &[&str]) -> &'a str {
    if databases.contains(&postgres.maintenance_database()) {
        "template1"
    } else {
        postgres.maintenance_database()
    }
}

/// A string literal for SQL.
fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aside_names_fit_an_identifier_and_keep_the_start_of_the_name() {
        let short = Replacement::new("app", "0a1b2c3d");
        assert_eq!(short.aside, "app_pgkube_old_0a1b2c3d");
        assert_eq!(short.failed, "app_pgkube_failed_0a1b2c3d");
        let long = "é".repeat(31) + "x";
        let names = Replacement::new(&long, "0a1b2c3d");
        for name in [&names.aside, &names.failed] {
            assert!(name.len() <= MAX_IDENTIFIER, "{name}");
            assert!(name.starts_with("éé"), "{name}");
        }
        assert_ne!(names.aside, names.failed);
    }

    #[test]
    fn a_literal_doubles_its_quotes() {
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
