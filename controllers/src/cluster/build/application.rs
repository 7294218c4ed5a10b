//! The application role's Secret (`<cluster>-app`): what an application needs to connect to the
//! cluster's application database through the `-rw` Service, in the keys CloudNativePG's
//! applications already read.

use super::*;

/// Keys of the application Secret besides [`USERNAME_KEY`] and [`PASSWORD_KEY`].
pub const HOST_KEY: &str = "host";
pub const PORT_KEY: &str = "port";
pub const DBNAME_KEY: &str = "dbname";
pub const URI_KEY: &str = "uri";
pub const JDBC_URI_KEY: &str = "jdbc-uri";

/// The Secret for `cluster`'s application role with `password`. Created once if missing and
/// never updated, like the superuser's; kept when the cluster is deleted.
///
/// The URIs need no escaping: the owner and database names are lowercase identifiers (the
/// CRD's pattern) and a generated password is alphanumeric.
pub(super) fn application_secret(
    cluster: &ValidatedCluster,
    names: &ChildNames,
    password: &str,
) -> Secret {
    let owner = &cluster.application.owner;
    let database = &cluster.application.database;
    let host = format!("{}.{}.svc", names.rw_service, cluster.namespace);
    let port = POSTGRES_PORT;
    Secret {
        metadata: kept_metadata(cluster, names, &names.application_secret),
        type_: Some("kubernetes.io/basic-auth".to_owned()),
        string_data: Some(BTreeMap::from([
            (USERNAME_KEY.to_owned(), owner.clone()),
            (PASSWORD_KEY.to_owned(), password.to_owned()),
            (HOST_KEY.to_owned(), host.clone()),
            (PORT_KEY.to_owned(), port.to_string()),
            (DBNAME_KEY.to_owned(), database.clone()),
            (
                URI_KEY.to_owned(),
                format!("postgresql://{owner}:{password}@{host}:{port}/{database}"),
            ),
            (
                JDBC_URI_KEY.to_owned(),
                format!(
                    "jdbc:postgresql://{host}:{port}/{database}?password={password}&user={owner}"
                ),
            ),
        ])),
        ..Secret::default()
    }
}
