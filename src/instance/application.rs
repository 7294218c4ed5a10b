//! The application role and its database, made on the primary from the `<cluster>-app`
//! Secret: the role logs in with the Secret's password and owns the database the Secret names.
//!
//! A role pgkube made carries [`ROLE_COMMENT`]; only such a role has its password set from the
//! Secret. A role of the same name without it was made by someone else (by hand, or restored
//! from another cluster's backup) and is left as it is: its users keep their password.

use tokio_postgres::Client;

use super::desired::Application;
use super::sql::{quote_ident, quote_literal, scram_verifier};

/// The comment on the application role pgkube made.
pub const ROLE_COMMENT: &str = "Application role, managed by pgkube";

/// What became of the application role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleOutcome {
    Created,
    PasswordSet,
    /// A role of that name exists without pgkube's comment: not touched.
    NotManaged,
}

/// On the primary: the application role exists with the Secret's password (unless it is not
/// pgkube's), and the database it names exists, owned by the role.
pub async fn apply(
    client: &Client,
    application: &Application,
) -> Result<RoleOutcome, tokio_postgres::Error> {
    let role = &application.credentials.username;
    let outcome = apply_role(client, role, &application.credentials.password).await?;
    if let Some(database) = &application.database {
        ensure_database(client, database, role).await?;
    }
    Ok(outcome)
}

async fn apply_role(
    client: &Client,
    role: &str,
    password: &str,
) -> Result<RoleOutcome, tokio_postgres::Error> {
    let found = client
        .query_opt(
            "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1",
            &[&role],
        )
        .await?;
    let verifier = quote_literal(&scram_verifier(password));
    let role_ident = quote_ident(role);
    match found {
        None => {
            // One simple query: one transaction, so the role never exists without its comment.
            client
                .batch_execute(&format!(
                    "CREATE ROLE {role_ident} WITH LOGIN PASSWORD {verifier}; \
                     COMMENT ON ROLE {role_ident} IS {}",
                    quote_literal(ROLE_COMMENT)
                ))
                .await?;
            Ok(RoleOutcome::Created)
        }
        Some(row) => {
            let comment: Option<String> = row.try_get(0)?;
            if comment.as_deref() != Some(ROLE_COMMENT) {
                return Ok(RoleOutcome::NotManaged);
            }
            client
                .batch_execute(&format!(
                    "ALTER ROLE {role_ident} WITH LOGIN PASSWORD {verifier}"
                ))
                .await?;
            Ok(RoleOutcome::PasswordSet)
        }
    }
}

/// Makes `database` owned by `owner` unless a database of that name exists (whoever owns it).
async fn ensure_database(
    client: &Client,
    database: &str,
    owner: &str,
) -> Result<(), tokio_postgres::Error> {
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&database])
        .await?
        .is_some();
    if !exists {
        client
            .batch_execute(&format!(
                "CREATE DATABASE {} OWNER {}",
                quote_ident(database),
                quote_ident(owner)
            ))
            .await?;
        tracing::info!(%database, %owner, "application database created");
    }
    Ok(())
}
