//! A fresh PostgreSQL database per test.

use anyhow::Context as _;
use tokio_postgres::{Client, NoTls};

use crate::TestEnv;
use crate::names::unique_name;

/// A database with a unique name on the test bed's server, dropped by
/// [`TestDatabase::cleanup`] or on drop.
pub struct TestDatabase {
    admin_url: String,
    name: String,
    url: String,
    cleaned_up: bool,
}

impl TestDatabase {
    /// Creates `<prefix>_<random>` (dashes become underscores).
    pub async fn create(env: &TestEnv, prefix: &str) -> TestDatabase {
        let name = unique_name(prefix).replace('-', "_");
        let admin = connect(&env.pg_url)
            .await
            .expect("connecting to the test bed's PostgreSQL");
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
        TestDatabase {
            url: with_database(&env.pg_url, &name),
            admin_url: env.pg_url.clone(),
            name,
            cleaned_up: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Superuser URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connection to this database.
    pub async fn connect(&self) -> Client {
        connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connecting to test database {}: {e:#}", self.name))
    }

    pub async fn cleanup(mut self) {
        self.cleaned_up = true;
        if let Err(error) = drop_database(&self.admin_url, &self.name).await {
            eprintln!("warning: dropping test database {}: {error:#}", self.name);
        }
    }
}

impl Drop for TestDatabase {
    /// Best effort: a runtime of its own on a thread of its own, since drop cannot await.
    fn drop(&mut self) {
        if self.cleaned_up {
            return;
        }
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(drop_database(&url, &name))
        })
        .join();
        if let Ok(Err(error)) = outcome {
            eprintln!("warning: dropping test database {}: {error:#}", self.name);
        }
    }
}

/// Connects without TLS (the test bed listens on loopback only) and drives the connection on
/// the current runtime.
async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .context("connecting to PostgreSQL")?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("PostgreSQL connection error: {error}");
        }
    });
    Ok(client)
}

async fn drop_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let admin = connect(admin_url).await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await
        .context("DROP DATABASE")
}

/// `postgres://u:p@host:port/postgres?x` -> same URL with `database` as the path.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let authority_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// When the server behind `sql` started (`pg_postmaster_start_time()`, as text): a new value
/// means a new postmaster, as after a restart.
pub async fn server_started_at(sql: &Client) -> anyhow::Result<String> {
    let row = sql
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .context("reading the server's start time")?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_in_a_url() {
        assert_eq!(
            with_database("postgres://u:p@127.0.0.1:5/postgres", "t_1"),
            "postgres://u:p@127.0.0.1:5/t_1"
        );
        assert_eq!(
            with_database("postgres://u:p@127.0.0.1:5?sslmode=disable", "t_1"),
            "postgres://u:p@127.0.0.1:5/t_1?sslmode=disable"
        );
    }
}
