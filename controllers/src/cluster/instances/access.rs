//! What the operator needs to reach a cluster's instance managers over TLS: the cluster's CA
//! (and the user's, with a server certificate of one's own), against which it verifies each
//! pod's certificate under the pod's host name, and the control token, which `/status` and the
//! control endpoints ask for.
//!
//! Both are read from their Secrets once and kept per cluster ([`AccessCache`]), until an
//! instance refuses them (a Secret replaced by hand): the reads of a reconcile come from the
//! watch caches, which keep no Secret's data. What this operator made itself (a new cluster's
//! CA and token) is kept as it makes it, and not read back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use rustls::pki_types::ServerName;

use super::{FetchError, ObservedInstance, Unavailable};
use crate::cluster::Error;
use crate::cluster::build::{self, ChildNames};
use crate::cluster::cache::{ChildStores, cached_text};
use crate::cluster::certificates::CA_CERT_KEY;

/// How to reach one cluster's instance managers over TLS.
pub struct ClusterAccess {
    tls: Arc<rustls::ClientConfig>,
    token: String,
    /// `.<headless Service>.<namespace>.svc`: a pod's host name is its name and this.
    host_suffix: String,
}

impl std::fmt::Debug for ClusterAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        f.debug_struct("ClusterAccess")
            .field("host_suffix", &self.host_suffix)
            .finish_non_exhaustive()
    }
}

impl ClusterAccess {
    /// Access that trusts the CA certificates in `ca_pem` and presents `token`, to pods named
    /// `<pod><host_suffix>`.
    pub fn new(ca_pem: &[u8], token: String, host_suffix: String) -> Result<Self, String> {
        let roots = crate::pki::root_store(ca_pem)?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // One connection per request: no session to resume, and no cache to keep per cluster.
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            tls: Arc::new(config),
            token,
            host_suffix,
        })
    }

    /// The cluster's control token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The name `pod`'s certificate must carry.
    pub(super) fn server_name(&self, pod: &str) -> Result<ServerName<'static>, FetchError> {
        ServerName::try_from(format!("{pod}{}", self.host_suffix))
            .map_err(|error| FetchError::BadAnswer(format!("pod {pod}: {error}")))
    }

    pub(super) fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
    }
}

/// Each cluster's [`ClusterAccess`], by namespace, CA Secret and server CA Secret.
#[derive(Debug, Default)]
pub struct AccessCache {
    entries: Mutex<HashMap<String, Arc<ClusterAccess>>>,
    /// What this operator wrote in the Secrets of clusters not reached yet.
    seeds: Mutex<HashMap<String, Seed>>,
}

#[derive(Clone, Debug, Default)]
struct Seed {
    ca_pem: Option<Vec<u8>>,
    token: Option<String>,
}

fn key(namespace: &str, names: &ChildNames) -> String {
    format!("{namespace}/{}", names.ca_secret)
}

/// What an access is kept under: the cluster and its server CA, so that adding a certificate
/// of one's own is followed at once, not after an instance refuses the access kept before.
fn entry_key(cluster_key: &str, server_ca: ServerCa<'_>, names: &ChildNames) -> String {
    format!("{cluster_key}/{}", server_ca.secret(names))
}

/// The Secret with the `ca.crt` the pods' certificates are verified with: the cluster's own
/// CA's, or the user's (`spec.certificates`), which the watch cache does not keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerCa<'a> {
    Issued,
    Own(&'a str),
}

impl<'a> ServerCa<'a> {
    /// The server CA of a cluster with `certificates` in its spec.
    pub fn of(certificates: Option<&'a pgkube_crds::ServerCertificates>) -> Self {
        match certificates {
            Some(own) => ServerCa::Own(
                own.server_ca_secret
                    .as_deref()
                    .unwrap_or(&own.server_tls_secret),
            ),
            None => ServerCa::Issued,
        }
    }

    fn secret(self, names: &'a ChildNames) -> &'a str {
        match self {
            ServerCa::Issued => &names.ca_secret,
            ServerCa::Own(secret) => secret,
        }
    }
}

impl AccessCache {
    /// The cluster's access once its CA and control Secrets exist (the watch cache says so, and
    /// only then are they read).
    pub async fn for_cluster(
        &self,
        client: &kube::Client,
        stores: &ChildStores,
        namespace: &str,
        names: &ChildNames,
        server_ca: ServerCa<'_>,
    ) -> Result<Option<Arc<ClusterAccess>>, Error> {
        let exists = |name| cached_text(&stores.secrets, namespace, name).is_some();
        let ca_known = server_ca != ServerCa::Issued || exists(&names.ca_secret);
        if !(ca_known && exists(&names.control_secret)) {
            return Ok(None);
        }
        self.get(client, namespace, names, server_ca)
            .await
            .map_err(|source| Error::Kube {
                action: "read",
                kind: "Secret".to_owned(),
                name: server_ca.secret(names).to_owned(),
                source,
            })
    }

    /// Forgets the cluster's access when an instance refused it (a CA or token replaced since
    /// it was read), to read it again next time.
    pub fn after_read(&self, namespace: &str, names: &ChildNames, instances: &[ObservedInstance]) {
        let refused = |instance: &ObservedInstance| instance.report == Err(Unavailable::Refused);
        if instances.iter().any(refused) {
            self.forget(namespace, names);
        }
    }

    /// The cluster's access, read from its CA and control Secrets when not kept; none while
    /// either is missing or unusable (the instance managers are then asked in plain HTTP).
    pub async fn get(
        &self,
        client: &kube::Client,
        namespace: &str,
        names: &ChildNames,
        server_ca: ServerCa<'_>,
    ) -> Result<Option<Arc<ClusterAccess>>, kube::Error> {
        let key = key(namespace, names);
        let entry = entry_key(&key, server_ca, names);
        if let Some(access) = self.kept(&entry) {
            return Ok(Some(access));
        }
        // Taken only once the access is made: a failed read keeps what was seeded.
        let seed = self
            .seeds
            .lock()
            .ok()
            .and_then(|seeds| seeds.get(&key).cloned())
            .unwrap_or_default();
        let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
        let ca_pem = server_ca_bundle(&secrets, names, server_ca, seed.ca_pem).await?;
        let token = match seed.token {
            Some(token) => Some(token.into_bytes()),
            None => read(&secrets, &names.control_secret, build::CONTROL_TOKEN_KEY).await?,
        };
        let (Some(ca_pem), Some(token)) = (ca_pem, token) else {
            return Ok(None);
        };
        let host_suffix = format!(".{}.{namespace}.svc", names.headless_service);
        let token = String::from_utf8_lossy(&token).trim().to_owned();
        match ClusterAccess::new(&ca_pem, token, host_suffix) {
            Ok(access) => {
                let access = Arc::new(access);
                if let Ok(mut seeds) = self.seeds.lock() {
                    seeds.remove(&key);
                }
                if let Ok(mut entries) = self.entries.lock() {
                    entries.insert(entry, Arc::clone(&access));
                }
                Ok(Some(access))
            }
            Err(why) => {
                let secret = server_ca.secret(names);
                tracing::warn!(%secret, %why, "the cluster's server CA is unusable");
                Ok(None)
            }
        }
    }

    /// Keeps the CA this operator just made for the cluster.
    pub fn seed_ca(&self, namespace: &str, names: &ChildNames, ca_pem: &str) {
        self.seed(namespace, names, |seed| {
            seed.ca_pem = Some(ca_pem.as_bytes().to_vec());
        });
    }

    /// Keeps the control token this operator just wrote for the cluster.
    pub fn seed_token(&self, namespace: &str, names: &ChildNames, token: &str) {
        self.seed(namespace, names, |seed| seed.token = Some(token.to_owned()));
    }

    /// A seed replaces what is kept: a cluster made again under the same name has a new token.
    fn seed(&self, namespace: &str, names: &ChildNames, set: impl FnOnce(&mut Seed)) {
        self.forget(namespace, names);
        if let Ok(mut seeds) = self.seeds.lock() {
            set(seeds.entry(key(namespace, names)).or_default());
        }
    }

    /// Forgets everything about a deleted cluster.
    pub fn forget_cluster(&self, namespace: &str, names: &ChildNames) {
        self.forget(namespace, names);
        if let Ok(mut seeds) = self.seeds.lock() {
            seeds.remove(&key(namespace, names));
        }
    }

    fn kept(&self, key: &str) -> Option<Arc<ClusterAccess>> {
        self.entries.lock().ok()?.get(key).cloned()
    }

    /// Forgets the cluster's access (under any server CA), to read its Secrets again next time.
    fn forget(&self, namespace: &str, names: &ChildNames) {
        let prefix = format!("{}/", key(namespace, names));
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|entry, _| !entry.starts_with(&prefix));
        }
    }
}

/// The CAs the pods' certificates are verified with: pgkube's (`seeded`, as this operator made
/// it, or read) and, with a certificate of one's own, the user's as well, as the pods trust
/// both while they are replaced after `spec.certificates` is added
/// (`pgkube::tls::servers_ca`). None while the server CA is missing.
async fn server_ca_bundle(
    secrets: &Api<Secret>,
    names: &ChildNames,
    server_ca: ServerCa<'_>,
    seeded: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, kube::Error> {
    let issued = match seeded {
        Some(pem) => Some(pem),
        None => read(secrets, &names.ca_secret, CA_CERT_KEY).await?,
    };
    let ServerCa::Own(secret) = server_ca else {
        return Ok(issued);
    };
    let Some(mut bundle) = read(secrets, secret, CA_CERT_KEY).await? else {
        return Ok(None);
    };
    if let Some(issued) = issued {
        bundle.push(b'\n');
        bundle.extend_from_slice(&issued);
    }
    Ok(Some(bundle))
}

/// The value of `key` in Secret `name`, if both exist.
async fn read(
    secrets: &Api<Secret>,
    name: &str,
    key: &str,
) -> Result<Option<Vec<u8>>, kube::Error> {
    let secret = secrets.get_opt(name).await?;
    Ok(secret
        .and_then(|secret| secret.data)
        .and_then(|mut data| data.remove(key))
        .map(|value| value.0))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A client whose every request fails, counting them.
    fn failing_client(requests: Arc<AtomicUsize>) -> kube::Client {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            requests.fetch_add(1, Ordering::SeqCst);
            async {
                Err::<http::Response<kube::client::Body>, _>(std::io::Error::other(
                    "no API server in a unit test",
                ))
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn what_the_operator_made_is_kept_without_reading_it_back_until_the_cluster_goes() {
        let requests = Arc::new(AtomicUsize::new(0));
        let client = failing_client(Arc::clone(&requests));
        let names = ChildNames::for_cluster("db");
        let now = time::OffsetDateTime::now_utc();
        let ca = crate::pki::new_ca("test CA", now, time::Duration::days(1)).expect("CA");
        let cache = AccessCache::default();
        cache.seed_ca("ns", &names, &ca.cert_pem);
        cache.seed_token("ns", &names, "t0ken");
        let access = cache
            .get(&client, "ns", &names, ServerCa::Issued)
            .await
            .expect("no read");
        assert_eq!(access.expect("access").token(), "t0ken");
        assert!(
            cache
                .get(&client, "ns", &names, ServerCa::Issued)
                .await
                .is_ok(),
            "kept"
        );
        assert_eq!(requests.load(Ordering::SeqCst), 0, "nothing read");
        // A cluster made again under the same name: its new token replaces the kept one.
        cache.seed_token("ns", &names, "n3w");
        assert!(
            cache
                .get(&client, "ns", &names, ServerCa::Issued)
                .await
                .is_err(),
            "the CA is read"
        );
        cache.seed_ca("ns", &names, &ca.cert_pem);
        let access = cache
            .get(&client, "ns", &names, ServerCa::Issued)
            .await
            .expect("seeded");
        assert_eq!(access.expect("access").token(), "n3w");
        cache.forget_cluster("ns", &names);
        assert!(
            cache
                .get(&client, "ns", &names, ServerCa::Issued)
                .await
                .is_err(),
            "read again"
        );
        assert!(requests.load(Ordering::SeqCst) > 0);
    }

    #[tokio::test]
    async fn a_cluster_with_its_own_server_certificate_is_verified_with_its_own_ca() {
        let requests = Arc::new(AtomicUsize::new(0));
        let client = failing_client(Arc::clone(&requests));
        let names = ChildNames::for_cluster("db");
        let now = time::OffsetDateTime::now_utc();
        let ca = crate::pki::new_ca("test CA", now, time::Duration::days(1)).expect("CA");
        let cache = AccessCache::default();
        cache.seed_ca("ns", &names, &ca.cert_pem);
        cache.seed_token("ns", &names, "t0ken");
        let own = pgkube_crds::ServerCertificates {
            server_tls_secret: "db-cert".to_owned(),
            server_ca_secret: None,
            client_ca_secret: None,
        };
        assert_eq!(ServerCa::of(Some(&own)), ServerCa::Own("db-cert"));
        let issued = cache.get(&client, "ns", &names, ServerCa::Issued).await;
        assert!(issued.expect("seeded").is_some());
        // The access kept for pgkube's certificates is not the one for the user's: the
        // user's CA Secret is read, to be trusted beside pgkube's.
        let read = cache
            .get(&client, "ns", &names, ServerCa::of(Some(&own)))
            .await;
        assert!(read.is_err(), "the user's CA Secret is read");
        assert_eq!(requests.load(Ordering::SeqCst), 1);
    }
}
