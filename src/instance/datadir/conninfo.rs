//! The instance's connection settings: libpq connection strings to another instance (the
//! replica's `primary_conninfo`, `pg_rewind`'s source), with the client certificate of their
//! role, and the server's own TLS settings.

use std::path::Path;

use super::super::desired::Credentials;
use super::quote;
use crate::tls::{ClientRole, ClientTls};

/// This instance's certificates, as copied for its server and its clients.
#[derive(Clone, Copy, Debug)]
pub struct InstanceTls<'a> {
    /// Where the copies are (see [`crate::tls::copy_private`]).
    pub dir: &'a Path,
    /// Their digest: a renewed certificate changes the configuration, so the server reloads.
    pub digest: &'a str,
    /// Connections to other instances verify their certificate (`verify-full`).
    pub verify: bool,
    /// The file of the CA the server verifies client certificates with.
    pub client_ca_file: &'static str,
}

impl InstanceTls<'_> {
    pub fn client(&self, role: ClientRole) -> ClientTls {
        ClientTls::new(self.dir, role, self.verify)
    }
}

/// The server's TLS settings, which a reload applies (a renewed certificate too).
pub(super) fn server_tls(tls: &InstanceTls<'_>) -> String {
    let file = |name: &str| quote(&tls.dir.join(name).to_string_lossy());
    format!(
        "# TLS (certificates {})\n\
         ssl = on\n\
         ssl_cert_file = '{}'\n\
         ssl_key_file = '{}'\n\
         ssl_ca_file = '{}'\n",
        tls.digest.get(..16).unwrap_or(tls.digest),
        file(crate::tls::SERVER_CERT_FILE),
        file(crate::tls::SERVER_KEY_FILE),
        file(tls.client_ca_file),
    )
}

/// libpq's TLS parameters: the client certificate, or no TLS for an instance without one
/// (a server that requires TLS would ask it for a certificate it does not have).
fn tls_conninfo(tls: Option<&ClientTls>) -> String {
    match tls {
        Some(tls) => tls.conninfo(conninfo_value),
        None => "sslmode=disable".to_owned(),
    }
}

/// libpq connection string to the primary, as the replica's WAL receiver uses it.
pub(super) fn primary_conninfo(
    host: &str,
    port: u16,
    replication: &Credentials,
    pod: &str,
    pgpass_file: &Path,
    tls: Option<&ClientTls>,
) -> String {
    format!(
        "host={} port={} user={} passfile={} application_name={} {}",
        conninfo_value(host),
        port,
        conninfo_value(&replication.username),
        conninfo_value(&pgpass_file.to_string_lossy()),
        conninfo_value(pod),
        tls_conninfo(tls),
    )
}

/// A value in a libpq connection string, quoted.
fn conninfo_value(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// libpq connection string to `host` as the superuser, for pg_rewind's `--source-server` (the
/// password is in `passfile`).
pub fn superuser_conninfo(
    host: &str,
    port: u16,
    superuser: &Credentials,
    pod: &str,
    passfile: &Path,
    tls: Option<&ClientTls>,
) -> String {
    format!(
        "host={} port={} user={} dbname=postgres passfile={} application_name={} \
         connect_timeout=10 {}",
        conninfo_value(host),
        port,
        conninfo_value(&superuser.username),
        conninfo_value(&passfile.to_string_lossy()),
        conninfo_value(&format!("{pod}-rewind")),
        tls_conninfo(tls),
    )
}
