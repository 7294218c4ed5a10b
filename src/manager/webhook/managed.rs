//! The webhook's certificate when the manager manages it: every replica reads the Secret (the
//! first to find none creates it; a create that loses the race reads the winner's), renews the
//! serving certificate with the same CA when needed, writes `tls.crt` and `tls.key` into the
//! certificate directory the server reads, and keeps the `caBundle` of pgkube's CRDs that
//! convert through a webhook, and of the admission webhook's MutatingWebhookConfiguration,
//! equal to the CAs to trust (the CA, and the previous one after a rotation). It looks again
//! every ten minutes, so a certificate another replica renewed is served here too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::certificates::{Bundle, CertificateError};

/// How often the Secret and the CRDs are looked at again.
const REFRESH: Duration = Duration::from_secs(600);

/// Why the certificate could not be managed.
#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    #[error("cannot {action} Secret {namespace}/{name}: {source}")]
    Secret {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot {action} CRD {name}: {source}")]
    Crd {
        action: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot {action} MutatingWebhookConfiguration {name}: {source}")]
    Admission {
        action: &'static str,
        name: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    #[error("cannot write the webhook certificate into {}: {source}", directory.display())]
    Write {
        directory: PathBuf,
        source: std::io::Error,
    },
}

/// Where the managed certificate lives and whom it is for.
pub struct ManagedCertificate {
    pub client: Client,
    pub namespace: String,
    pub secret: String,
    /// Host names and IP addresses the serving certificate is for.
    pub hosts: Vec<String>,
    /// Where the server reads `tls.crt` and `tls.key`.
    pub directory: PathBuf,
}

impl ManagedCertificate {
    /// Makes sure the Secret holds a valid bundle, the files are written, and the CRDs and the
    /// admission webhook trust it.
    ///
    /// The trust first: after a CA rotation, the API server must trust the new CA (beside the
    /// old) before this replica serves a certificate the new CA signed.
    pub async fn reconcile(&self) -> Result<(), ManageError> {
        let bundle = self.ensure_secret().await?;
        let cas = bundle.trusted_cas();
        self.trust_in_crds(&cas).await?;
        self.trust_in_admission(&cas).await?;
        write_files(&self.directory, &bundle)
    }

    /// Looks again every ten minutes until `stop`; a failure is logged and tried again then.
    pub async fn keep_current(self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(REFRESH) => {}
            }
            if let Err(error) = self.reconcile().await {
                tracing::warn!(%error, "cannot refresh the webhook certificate");
            }
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn secret_error(&self, action: &'static str) -> impl FnOnce(kube::Error) -> ManageError {
        let (namespace, name) = (self.namespace.clone(), self.secret.clone());
        move |source| ManageError::Secret {
            action,
            namespace,
            name,
            source: Box::new(source),
        }
    }

    /// The bundle in the Secret, made or renewed first if needed. Another replica's write
    /// between our read and ours makes ours fail (AlreadyExists, or a resourceVersion
    /// conflict): then its bundle is the one.
    async fn ensure_secret(&self) -> Result<Bundle, ManageError> {
        for _ in 0..3 {
            let now = OffsetDateTime::now_utc();
            let found = self
                .secrets()
                .get_opt(&self.secret)
                .await
                .map_err(self.secret_error("read"))?;
            let written = match found {
                None => self.create(Bundle::new(&self.hosts, now)?).await?,
                Some(secret) => {
                    let data = secret.data.clone().unwrap_or_default();
                    let current = Bundle::from_secret(&data, secret.annotations());
                    match current {
                        Ok(bundle) if !bundle.needs_renewal(&self.hosts, now) => Some(bundle),
                        Ok(bundle) => {
                            self.replace(&secret, bundle.renewed(&self.hosts, now)?)
                                .await?
                        }
                        // Not ours to repair by guessing: a CA we would replace is trusted somewhere.
                        Err(error) => return Err(error.into()),
                    }
                }
            };
            if let Some(bundle) = written {
                return Ok(bundle);
            }
        }
        Err(self.secret_error("write")(kube::Error::Service(
            "three writes in a row lost to another writer".into(),
        )))
    }

    /// Creates the Secret with `bundle`; `None` when another replica created it first.
    async fn create(&self, bundle: Bundle) -> Result<Option<Bundle>, ManageError> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.secret.clone()),
                namespace: Some(self.namespace.clone()),
                annotations: Some(bundle.annotations()),
                labels: Some([("app.kubernetes.io/name".to_owned(), "pgkube".to_owned())].into()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(bundle.data()),
            ..Secret::default()
        };
        match self.secrets().create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = %self.secret, "made the webhook CA and certificate");
                Ok(Some(bundle))
            }
            Err(kube::Error::Api(response)) if response.code == 409 => Ok(None),
            Err(source) => Err(self.secret_error("create")(source)),
        }
    }

    /// Replaces the Secret's certificate with `bundle`, conditional on the version read;
    /// `None` when another replica wrote it in between.
    async fn replace(
        &self,
        secret: &Secret,
        bundle: Bundle,
    ) -> Result<Option<Bundle>, ManageError> {
        let mut updated = secret.clone();
        updated.data = Some(bundle.data());
        updated.annotations_mut().extend(bundle.annotations());
        match self
            .secrets()
            .replace(&self.secret, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {
                tracing::info!(secret = %self.secret, "renewed the webhook certificate");
                Ok(Some(bundle))
            }
            Err(kube::Error::Api(response)) if response.code == 409 => Ok(None),
            Err(source) => Err(self.secret_error("update")(source)),
        }
    }

    /// Sets `caBundle` to `ca` (PEM, one or more certificates) in each pgkube CRD that converts through a webhook and does not
    /// trust it yet. CRDs without a webhook conversion are left alone.
    async fn trust_in_crds(&self, ca: &str) -> Result<(), ManageError> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for name in pgkube_crds::crds().iter().map(ResourceExt::name_any) {
            let error = |action| {
                let name = name.clone();
                move |source| ManageError::Crd {
                    action,
                    name,
                    source: Box::new(source),
                }
            };
            let Some(crd) = crds.get_opt(&name).await.map_err(error("read"))? else {
                continue;
            };
            let webhook = crd
                .spec
                .conversion
                .as_ref()
                .and_then(|c| c.webhook.as_ref());
            let Some(config) = webhook.and_then(|w| w.client_config.as_ref()) else {
                continue;
            };
            if config.ca_bundle.as_ref().map(|b| b.0.as_slice()) == Some(ca.as_bytes()) {
                continue;
            }
            let patch = serde_json::json!({"spec": {"conversion": {"webhook": {"clientConfig": {
                "caBundle": ByteString(ca.as_bytes().to_vec()),
            }}}}});
            crds.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(error("patch"))?;
            tracing::info!(crd = %name, "the CRD now trusts the webhook CA");
        }
        Ok(())
    }

    /// Sets `caBundle` to `ca` in each webhook of the MutatingWebhookConfiguration
    /// [`ADMISSION_WEBHOOK`](pgkube_crds::ADMISSION_WEBHOOK) that does not trust it yet. Without
    /// that configuration (not installed), nothing is done.
    async fn trust_in_admission(&self, ca: &str) -> Result<(), ManageError> {
        let name = pgkube_crds::ADMISSION_WEBHOOK;
        let error = |action| {
            move |source| ManageError::Admission {
                action,
                name,
                source: Box::new(source),
            }
        };
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let Some(configuration) = api.get_opt(name).await.map_err(error("read"))? else {
            return Ok(());
        };
        let untrusting: Vec<serde_json::Value> = (configuration.webhooks.iter().flatten())
            .filter(|webhook| {
                let bundle = webhook.client_config.ca_bundle.as_ref();
                bundle.map(|b| b.0.as_slice()) != Some(ca.as_bytes())
            })
            .map(|webhook| {
                serde_json::json!({"name": webhook.name, "clientConfig": {
                    "caBundle": ByteString(ca.as_bytes().to_vec()),
                }})
            })
            .collect();
        if untrusting.is_empty() {
            return Ok(());
        }
        // A strategic merge patch: `webhooks` merges by name, so only `caBundle` changes.
        let patch = serde_json::json!({ "webhooks": untrusting });
        api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map_err(error("patch"))?;
        tracing::info!(
            configuration = name,
            "the admission webhook now trusts the webhook CA"
        );
        Ok(())
    }
}

/// Writes `tls.crt` and `tls.key` into `directory` (each through a temporary file renamed in
/// place, so the server never reads half a file), if they differ.
fn write_files(directory: &Path, bundle: &Bundle) -> Result<(), ManageError> {
    let error = |source| ManageError::Write {
        directory: directory.to_owned(),
        source,
    };
    std::fs::create_dir_all(directory).map_err(error)?;
    // The key first: the server reloads when either file changes, and reads both.
    for (file, pem) in [("tls.key", &bundle.tls_key), ("tls.crt", &bundle.tls_cert)] {
        let path = directory.join(file);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(pem.as_str()) {
            continue;
        }
        let temporary = directory.join(format!(".{file}.new"));
        std::fs::write(&temporary, pem).map_err(error)?;
        std::fs::rename(&temporary, &path).map_err(error)?;
    }
    Ok(())
}
