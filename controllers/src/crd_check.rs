//! Start-up check that the pgkube CustomResourceDefinitions are installed, so that a missing CRD
//! is one clear error naming it and the install command, not a watch that fails forever.
//!
//! The check lists each kind (`limit=1`) where the controllers will watch it: in every watched
//! namespace, or in all namespaces when watching all. It needs no right on
//! `customresourcedefinitions` (a manager with only namespaced rights cannot read those), only
//! the `list` the controllers need anyway. A kind the API server does not serve answers 404
//! Not Found: its CRD is not installed. A 403 means the manager lacks the rights to watch it,
//! which gets its own message.

use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client};
use pgkube_crds::{PostgreSQLBackup, PostgreSQLCluster, PostgreSQLRestore};

/// The command that installs (or updates) every pgkube CRD.
pub const INSTALL_COMMAND: &str = "pgkube crd | kubectl apply --server-side -f -";

/// Why the CRDs are not usable.
///
/// Inner errors are part of the message, not `#[source]`: kube's errors already repeat their
/// causes, and `{:#}` would print each one several times.
#[derive(Debug, thiserror::Error)]
pub enum CrdCheckError {
    #[error(
        "CustomResourceDefinition{plural} {names} not installed in the cluster: install with `{INSTALL_COMMAND}`",
        plural = if names.contains(',') { "s" } else { "" },
    )]
    Missing { names: String },
    #[error(
        "the manager may not list {resource} {scope}: it needs get, list and watch on it \
         (see deploy/rbac.yaml, or deploy/namespaced/ for a namespaced install): {message}"
    )]
    Forbidden {
        resource: String,
        scope: String,
        message: String,
    },
    #[error("cannot check that CustomResourceDefinition {name} is installed: {error}")]
    Unreadable { name: String, error: kube::Error },
}

/// The kinds of every pgkube CRD.
pub fn pgkube_kinds() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<PostgreSQLCluster>(&()),
        ApiResource::erase::<PostgreSQLBackup>(&()),
        ApiResource::erase::<PostgreSQLRestore>(&()),
    ]
}

/// Fails unless every pgkube CRD is installed and listable where the controllers watch:
/// `watch_namespaces`, or all namespaces when it is empty.
pub async fn ensure_crds_installed(
    client: &Client,
    watch_namespaces: &[String],
) -> Result<(), CrdCheckError> {
    ensure_installed(client, watch_namespaces, &pgkube_kinds()).await
}

/// Fails unless every kind in `kinds` is served and listable in `watch_namespaces` (all
/// namespaces when empty); the error names all kinds whose CRD is missing.
pub async fn ensure_installed(
    client: &Client,
    watch_namespaces: &[String],
    kinds: &[ApiResource],
) -> Result<(), CrdCheckError> {
    let scopes: Vec<Option<&str>> = if watch_namespaces.is_empty() {
        vec![None]
    } else {
        watch_namespaces
            .iter()
            .map(|ns| Some(ns.as_str()))
            .collect()
    };
    let mut missing = Vec::new();
    for kind in kinds {
        for scope in &scopes {
            let api: Api<DynamicObject> = match scope {
                Some(namespace) => Api::namespaced_with(client.clone(), namespace, kind),
                None => Api::all_with(client.clone(), kind),
            };
            match api.list_metadata(&ListParams::default().limit(1)).await {
                Ok(_) => {}
                // By code: for a group it does not serve at all, the API server answers with a
                // plain-text "404 page not found", not a Status with reason NotFound.
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    missing.push(crd_name(kind));
                    // Not served anywhere: no need to look in the other namespaces.
                    break;
                }
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    return Err(CrdCheckError::Forbidden {
                        resource: crd_name(kind),
                        scope: scope_text(*scope),
                        message: status.message.clone(),
                    });
                }
                Err(error) => {
                    return Err(CrdCheckError::Unreadable {
                        name: crd_name(kind),
                        error,
                    });
                }
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CrdCheckError::Missing {
            names: missing.join(", "),
        })
    }
}

/// `plural.group`, the name of the kind's CRD.
fn crd_name(kind: &ApiResource) -> String {
    format!("{}.{}", kind.plural, kind.group)
}

fn scope_text(namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => format!("in namespace {namespace}"),
        None => "in all namespaces (no --watch-namespaces given)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_pgkube_crds_are_checked() {
        let names: Vec<_> = pgkube_kinds().iter().map(crd_name).collect();
        assert_eq!(
            names,
            [
                "postgresqlclusters.db.example.com",
                "postgresqlbackups.db.example.com",
                "postgresqlrestores.db.example.com"
            ]
        );
        let crds: Vec<_> = pgkube_crds::crds()
            .into_iter()
            .filter_map(|crd| crd.metadata.name)
            .collect();
        assert_eq!(names, crds, "every CRD pgkube installs is checked");
    }

    #[test]
    fn the_missing_crd_error_names_the_crd_and_the_install_command() {
        let one = CrdCheckError::Missing {
            names: "postgresqlbackups.db.example.com".into(),
        }
        .to_string();
        assert_eq!(
            one,
            "CustomResourceDefinition postgresqlbackups.db.example.com not installed in the cluster: \
             install with `pgkube crd | kubectl apply --server-side -f -`"
        );
        let two = CrdCheckError::Missing {
            names: "a.db.example.com, b.db.example.com".into(),
        }
        .to_string();
        assert!(
            two.starts_with(
                "CustomResourceDefinitions a.db.example.com, b.db.example.com not installed"
            ),
            "{two}"
        );
    }

    #[test]
    fn the_forbidden_error_names_the_resource_the_scope_and_the_rights() {
        let message = CrdCheckError::Forbidden {
            resource: "postgresqlclusters.db.example.com".into(),
            scope: scope_text(Some("team-a")),
            message: "postgresqlclusters.db.example.com is forbidden: User \"x\" cannot list"
                .into(),
        }
        .to_string();
        assert!(
            message.starts_with(
                "the manager may not list postgresqlclusters.db.example.com in namespace team-a: \
                 it needs get, list and watch on it"
            ),
            "{message}"
        );
        assert!(message.contains("User \"x\" cannot list"), "{message}");
        assert!(scope_text(None).contains("all namespaces"));
    }
}
