//! Start-up check that the pgkube CustomResourceDefinitions are installed, so a missing CRD is
//! one clear error naming it and the install command, not a watch that fails forever.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

/// The command that installs (or updates) every pgkube CRD.
pub const INSTALL_COMMAND: &str = "pgkube crd | kubectl apply --server-side -f -";

/// Why the CRDs are not usable.
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
        "cannot read CustomResourceDefinition {name} (the manager needs get on customresourcedefinitions): {error}"
    )]
    Unreadable { name: String, error: kube::Error },
}

/// The names (`plural.group`) of every pgkube CRD.
pub fn pgkube_crd_names() -> Vec<String> {
    pgkube_crds::crds()
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect()
}

/// Fails unless every CRD in `names` exists; the error names all missing ones.
pub async fn ensure_installed(
    client: &kube::Client,
    names: &[String],
) -> Result<(), CrdCheckError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = Vec::new();
    for name in names {
        let found = api
            .get_opt(name)
            .await
            .map_err(|error| CrdCheckError::Unreadable {
                name: name.clone(),
                error,
            })?;
        if found.is_none() {
            missing.push(name.as_str());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_pgkube_crds_are_checked() {
        assert_eq!(
            pgkube_crd_names(),
            [
                "postgresqlclusters.db.example.com",
                "postgresqlbackups.db.example.com",
                "postgresqlrestores.db.example.com"
            ]
        );
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
}

/// Against the test bed's real API server.
#[cfg(test)]
mod testbed_tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_crd_is_named_and_installed_ones_pass() {
        let Some(env) = pgkube_testkit::testbed() else {
            return;
        };
        let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/crds.yaml");
        let applied = env
            .kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(crds)
            .status()
            .expect("running kubectl");
        assert!(applied.success(), "installing the CRDs failed");
        let client = env.kube_client().await;
        let installed = pgkube_crd_names();
        ensure_installed(&client, &installed)
            .await
            .expect("installed CRDs pass");

        let absent = "widgets.missing.pgkube.dev".to_owned();
        let mut names = installed.clone();
        names.insert(1, absent.clone());
        let message = ensure_installed(&client, &names)
            .await
            .expect_err("the absent CRD is reported")
            .to_string();
        assert!(message.contains(&absent), "{message}");
        assert!(!message.contains(&installed[0]), "{message}");
        assert!(message.contains(INSTALL_COMMAND), "{message}");
    }
}
