//! A fresh namespace per test.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::TestEnv;
use crate::names::unique_name;

/// A namespace with a unique name, deleted by [`TestNamespace::cleanup`] or, if the test ends
/// without calling it (a panic), on drop.
pub struct TestNamespace {
    client: Client,
    name: String,
    cleaned_up: bool,
}

impl TestNamespace {
    /// Creates `<prefix>-<random>`.
    pub async fn create(client: &Client, prefix: &str) -> TestNamespace {
        let name = unique_name(prefix);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("pgkube.dev/test".to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("creating test namespace {name}: {e}"));
        TestNamespace {
            client: client.clone(),
            name,
            cleaned_up: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The admin client the namespace was created with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Deletes the namespace after dropping the finalizers of its pgkube objects, for a test
    /// whose controllers are stopped already (nobody would finalize them).
    pub async fn cleanup_without_controllers(self) {
        if let Ok(Some(env)) = TestEnv::load() {
            release_pgkube_finalizers(&env, &self.name);
        }
        self.cleanup().await;
    }

    /// Starts deleting the namespace (the namespace controller removes its contents).
    pub async fn cleanup(mut self) {
        self.cleaned_up = true;
        let api = Api::<Namespace>::all(self.client.clone());
        if let Err(error) = api.delete(&self.name, &DeleteParams::default()).await {
            eprintln!("warning: deleting test namespace {}: {error}", self.name);
        }
    }
}

impl Drop for TestNamespace {
    /// Best effort, without async: the kube client belongs to the test's runtime, which may be
    /// shutting down, so this asks kubectl instead.
    fn drop(&mut self) {
        if self.cleaned_up {
            return;
        }
        let Ok(Some(env)) = TestEnv::load() else {
            return;
        };
        release_pgkube_finalizers(&env, &self.name);
        let result = env
            .kubectl()
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .args(["--ignore-not-found", "--request-timeout=10s"])
            .output();
        if let Err(error) = result {
            eprintln!("warning: deleting test namespace {}: {error}", self.name);
        }
    }
}

/// After a test that panicked, no controller is left to finalize its pgkube objects, and their
/// finalizers would keep the namespace Terminating forever: drop them.
fn release_pgkube_finalizers(env: &TestEnv, namespace: &str) {
    let listed = env
        .kubectl()
        // Version-qualified: kubectl's discovery cache may still know a version that a test
        // served for a while (the conversion tests serve v1alpha1), which is gone.
        .args([
            "get",
            "postgresqlclusters.v1beta1.db.example.com,postgresqlbackups.v1beta1.db.example.com,\
             postgresqlrestores.v1beta1.db.example.com",
        ])
        .args(["-n", namespace, "-o", "name", "--request-timeout=10s"])
        .output();
    let Ok(listed) = listed else {
        return;
    };
    for object in String::from_utf8_lossy(&listed.stdout).lines() {
        let _ = env
            .kubectl()
            .args(["patch", object, "-n", namespace, "--type=merge"])
            .args([
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
                "--request-timeout=10s",
            ])
            .output();
    }
}
