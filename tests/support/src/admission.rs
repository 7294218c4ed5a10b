//! The manager's admission webhook on the test bed: `pgkube admission-webhook`'s configuration,
//! calling a manager at a loopback address, for one test namespace's clusters only (the test bed
//! is shared: other tests' clusters must not reach this manager). A test whose manager manages
//! its certificate names it [`pgkube_crds::ADMISSION_WEBHOOK`], the one that manager trusts in.
//!
//! The API server reads webhook configurations through an informer of its own, so a
//! registration (or a new `caBundle`) takes effect a moment after the write that made it: a test
//! that needs the webhook called waits with [`TestAdmission::wait_answering`] first.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use pgkube_crds::{CLEANUP_FINALIZER, ConversionWebhook, PostgreSQLCluster};

use crate::{TestCluster, TestEnv, wait_until};

/// How long a registration may take to reach the API server's admission chain.
const ANSWERING_TIMEOUT: Duration = Duration::from_secs(60);

/// pgkube's MutatingWebhookConfiguration under a name of the test's, deleted by
/// [`TestAdmission::delete`] or, if the test ends without calling it (a panic), on drop.
pub struct TestAdmission {
    client: Client,
    name: String,
    /// The namespace whose clusters it admits.
    namespace: String,
    deleted: bool,
}

impl TestAdmission {
    /// Registers the webhook as `name` at `https://<address>/mutate`, trusting `ca_pem` (none
    /// until a managed certificate's manager sets it), for the clusters created in `namespace`.
    pub async fn register(
        client: &Client,
        name: &str,
        address: SocketAddr,
        ca_pem: Option<&str>,
        namespace: &str,
    ) -> TestAdmission {
        let name = name.to_owned();
        let url = format!("https://{address}{}", pgkube_crds::ADMISSION_PATH);
        let configuration = pgkube_crds::admission_through(&ConversionWebhook::Url(url));
        let mut configuration =
            pgkube_crds::admission_in_namespaces(configuration, &[namespace.to_owned()]);
        if let Some(pem) = ca_pem {
            configuration = pgkube_crds::admission_trusting(configuration, pem.as_bytes());
        }
        configuration.metadata.name = Some(name);
        TestAdmission::create(client, configuration, namespace).await
    }

    /// Creates `configuration` as it is (a configuration `pgkube admission-webhook` printed, say),
    /// for a test whose clusters are created in `namespace`.
    pub async fn create(
        client: &Client,
        configuration: MutatingWebhookConfiguration,
        namespace: &str,
    ) -> TestAdmission {
        let name = configuration.metadata.name.clone().unwrap_or_default();
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &configuration)
            .await
            .unwrap_or_else(|error| panic!("registering the admission webhook {name}: {error}"));
        TestAdmission {
            client: client.clone(),
            name,
            namespace: namespace.to_owned(),
            deleted: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until the API server calls the webhook and applies its answer: a cluster created
    /// in the namespace with `dryRun` (nothing is stored) comes back with the cleanup finalizer.
    pub async fn wait_answering(&self) -> anyhow::Result<()> {
        let clusters: Api<PostgreSQLCluster> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let probe = TestCluster::builder("admission-probe").cluster().clone();
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let description = format!("the admission webhook {} to answer", self.name);
        wait_until(&description, ANSWERING_TIMEOUT, || async {
            let admitted = clusters.create(&dry_run, &probe).await?;
            let finalizers = admitted.metadata.finalizers.unwrap_or_default();
            Ok(finalizers
                .iter()
                .any(|f| f == CLEANUP_FINALIZER)
                .then_some(()))
        })
        .await
    }

    pub async fn delete(mut self) {
        self.deleted = true;
        let api = Api::<MutatingWebhookConfiguration>::all(self.client.clone());
        if let Err(error) = api.delete(&self.name, &DeleteParams::default()).await {
            eprintln!(
                "warning: deleting the admission webhook {}: {error}",
                self.name
            );
        }
    }
}

impl Drop for TestAdmission {
    /// Best effort, with kubectl: the test's runtime may be shutting down.
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        let Ok(Some(env)) = TestEnv::load() else {
            return;
        };
        let result = env
            .kubectl()
            .args(["delete", "mutatingwebhookconfiguration", &self.name])
            .args(["--ignore-not-found", "--request-timeout=10s"])
            .output();
        if let Err(error) = result {
            eprintln!(
                "warning: deleting the admission webhook {}: {error}",
                self.name
            );
        }
    }
}
