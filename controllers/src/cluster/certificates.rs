//! The cluster's TLS certificates, kept in Secrets that outlive the cluster as its credentials
//! do: a CA (`<cluster>-ca`, ten years), the server certificate it signs for the cluster's
//! Services and pods (`<cluster>-server-tls`), and the client certificates of the replication
//! role (`<cluster>-replication-tls`) and of the superuser (`<cluster>-superuser-tls`), with
//! which replicas stream, `pg_rewind` and clones connect, and backup and restore Jobs dump.
//!
//! Each leaf carries its expiry, the time it is due for renewal (two thirds into its validity)
//! and, for the server, its host names, as annotations: the decision to renew reads the
//! Secrets' metadata from the cache, and only a renewal reads the CA's key. A renewed Secret
//! reaches the pods through their volumes, and each instance manager reloads its server
//! without a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use time::OffsetDateTime;

use super::build::{ChildNames, REPLICATION_USER, SUPERUSER, TLS_ANNOTATION};
use super::read::LiveChildren;
use super::{Error, FIELD_MANAGER};
use crate::pki::{self, Issued};

/// Annotation: when the certificate expires, in Unix seconds.
pub const NOT_AFTER_ANNOTATION: &str = "db.example.com/tls-not-after";
/// Annotation: when the operator renews the certificate, in Unix seconds.
pub const RENEW_AT_ANNOTATION: &str = "db.example.com/tls-renew-at";
/// Annotation: the server certificate's host names, comma-separated.
pub const HOSTS_ANNOTATION: &str = "db.example.com/tls-hosts";
/// On the issued server certificate's Secret: the SHA-256 of the CA of one's own its `ca.crt`
/// holds besides pgkube's (see `own_certificate::trust_in_issued_secret`).
pub const TRUSTED_CA_ANNOTATION: &str = "db.example.com/tls-trusted-ca";
/// Keys of the certificate Secrets (`kubernetes.io/tls`, plus the CA that clients trust).
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";
pub const CA_CERT_KEY: &str = "ca.crt";
/// The file of the pods' TLS volume with pgkube's CA, which signs the client certificates
/// (`ca.crt` there is the CA of the server's certificate, which may be the user's).
pub const CLIENT_CA_FILE: &str = "client-ca.crt";
/// The file of the instance pods' TLS volume with the applications' client CA
/// (`spec.certificates.clientCASecret`), which the server accepts besides pgkube's.
pub const USER_CLIENT_CA_FILE: &str = "user-client-ca.crt";
const CA_KEY_KEY: &str = "ca.key";
const CA_VALIDITY: time::Duration = time::Duration::days(3650);
/// Server and client certificates last this long unless the manager is told otherwise.
pub const DEFAULT_LEAF_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// A leaf certificate the cluster needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub secret: String,
    pub kind: LeafKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeafKind {
    Server { hosts: Vec<String> },
    Client { user: &'static str },
}

/// The leaves of a cluster: its server certificate (unless the cluster brings its own, not
/// `issue_server`) and the two client certificates.
pub fn leaves(names: &ChildNames, namespace: &str, issue_server: bool) -> Vec<Leaf> {
    let server = Leaf {
        secret: names.server_tls_secret.clone(),
        kind: LeafKind::Server {
            hosts: server_hosts(names, namespace),
        },
    };
    let clients = [
        Leaf {
            secret: names.replication_tls_secret.clone(),
            kind: LeafKind::Client {
                user: REPLICATION_USER,
            },
        },
        Leaf {
            secret: names.superuser_tls_secret.clone(),
            kind: LeafKind::Client { user: SUPERUSER },
        },
    ];
    issue_server
        .then_some(server)
        .into_iter()
        .chain(clients)
        .collect()
}

/// The names clients reach the cluster by: its three Services and, through the headless
/// Service, each pod, in their short and qualified forms.
pub fn server_hosts(names: &ChildNames, namespace: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    for service in [&names.rw_service, &names.ro_service, &names.r_service] {
        hosts.push(service.clone());
        hosts.push(format!("{service}.{namespace}"));
        hosts.push(format!("{service}.{namespace}.svc"));
        hosts.push(format!("{service}.{namespace}.svc.cluster.local"));
    }
    let headless = &names.headless_service;
    hosts.push(format!("*.{headless}.{namespace}.svc"));
    hosts.push(format!("*.{headless}.{namespace}.svc.cluster.local"));
    hosts
}

/// What a certificate Secret's metadata says about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeafState {
    pub renew_at: Option<i64>,
    pub hosts: Option<String>,
    pub trusted_ca: Option<String>,
}

impl LeafState {
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        Self {
            renew_at: annotations
                .get(RENEW_AT_ANNOTATION)
                .and_then(|text| text.parse().ok()),
            hosts: annotations.get(HOSTS_ANNOTATION).cloned(),
            trusted_ca: annotations.get(TRUSTED_CA_ANNOTATION).cloned(),
        }
    }
}

/// Whether `leaf` must be issued now: it does not exist, its renewal time came, or (for the
/// server) its host names changed.
pub fn is_due(leaf: &Leaf, state: Option<&LeafState>, now: i64) -> bool {
    let Some(state) = state else {
        return true;
    };
    let hosts_changed = match &leaf.kind {
        LeafKind::Server { hosts } => state.hosts.as_deref() != Some(hosts.join(",").as_str()),
        LeafKind::Client { .. } => false,
    };
    hosts_changed || state.renew_at.is_none_or(|at| at <= now)
}

/// How long until the first of `states` is due (none if no leaf exists yet).
pub fn next_renewal<'a>(
    states: impl IntoIterator<Item = &'a LeafState>,
    now: i64,
) -> Option<Duration> {
    states
        .into_iter()
        .filter_map(|state| state.renew_at)
        .min()
        .map(|at| Duration::from_secs(u64::try_from(at - now).unwrap_or(0)))
}

/// What an issued leaf's Secret holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedSecret {
    pub data: BTreeMap<String, ByteString>,
    pub annotations: BTreeMap<String, String>,
}

/// Issues `leaf` with `ca`, valid for `validity` from `now`, as the data and annotations of its
/// Secret.
pub fn issue(
    leaf: &Leaf,
    ca: &Issued,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<IssuedSecret, pki::PkiError> {
    let validity = time::Duration::try_from(validity).unwrap_or(time::Duration::days(90));
    let issued = match &leaf.kind {
        LeafKind::Server { hosts } => pki::issue_server(ca, hosts, now, validity)?,
        LeafKind::Client { user } => pki::issue_client(ca, user, now, validity)?,
    };
    let lifetime = issued.not_after - now.unix_timestamp();
    let renew_at = now.unix_timestamp() + lifetime * 2 / 3;
    let mut annotations = BTreeMap::from([
        (
            NOT_AFTER_ANNOTATION.to_owned(),
            issued.not_after.to_string(),
        ),
        (RENEW_AT_ANNOTATION.to_owned(), renew_at.to_string()),
    ]);
    if let LeafKind::Server { hosts } = &leaf.kind {
        annotations.insert(HOSTS_ANNOTATION.to_owned(), hosts.join(","));
    }
    let data = BTreeMap::from([
        (CERT_KEY.to_owned(), bytes(&issued.cert_pem)),
        (KEY_KEY.to_owned(), bytes(&issued.key_pem)),
        (CA_CERT_KEY.to_owned(), bytes(&ca.cert_pem)),
    ]);
    Ok(IssuedSecret { data, annotations })
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

/// Where a cluster's certificates are kept, and how long a new one is valid.
#[derive(Clone, Copy, Debug)]
pub struct Keeping<'a> {
    pub namespace: &'a str,
    /// The metadata every certificate Secret gets (labels; no owner: they outlive the cluster).
    pub metadata: &'a ObjectMeta,
    pub ca_secret: &'a str,
    pub validity: Duration,
}

/// What [`ensure`] did.
#[derive(Debug, Default)]
pub struct Ensured {
    /// How long until the next renewal.
    pub next_renewal: Option<Duration>,
    /// The certificate (PEM) of a CA made now.
    pub new_ca: Option<String>,
}

/// Makes the cluster's certificates that are due: the CA if it is missing, then each due leaf
/// of `leaves`, judged from the `live` Secrets' metadata.
pub async fn ensure(
    client: &kube::Client,
    keeping: &Keeping<'_>,
    leaves: &[Leaf],
    live: &LiveChildren,
) -> Result<Ensured, Error> {
    let Keeping {
        namespace,
        metadata,
        ca_secret,
        validity,
    } = *keeping;
    let live_states = &live.certificates;
    let now = OffsetDateTime::now_utc();
    let due: Vec<&Leaf> = leaves
        .iter()
        .filter(|leaf| is_due(leaf, live_states.get(&leaf.secret), now.unix_timestamp()))
        .collect();
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let mut states: Vec<LeafState> = leaves
        .iter()
        .filter(|leaf| !due.contains(leaf))
        .filter_map(|leaf| live_states.get(&leaf.secret).cloned())
        .collect();
    if due.is_empty() {
        return Ok(Ensured {
            next_renewal: next_renewal(&states, now.unix_timestamp()),
            new_ca: None,
        });
    }
    let (ca, made) = cluster_ca(&api, metadata, ca_secret, live.ca_exists, now).await?;
    for leaf in due {
        let IssuedSecret { data, annotations } =
            issue(leaf, &ca, now, validity).map_err(|source| Error::Certificate {
                secret: leaf.secret.clone(),
                source,
            })?;
        tracing::info!(secret = %leaf.secret, "issuing a TLS certificate");
        let secret = tls_secret(metadata, &leaf.secret, data, annotations.clone());
        apply_secret(&api, &secret).await?;
        states.push(LeafState::from_annotations(&annotations));
    }
    Ok(Ensured {
        next_renewal: next_renewal(&states, now.unix_timestamp()),
        new_ca: made.then_some(ca.cert_pem),
    })
}

/// The cluster's CA, read from its Secret, or made and stored if the cache knows none (one the
/// cache has not seen yet makes the create fail, and that one is read instead); and whether it
/// was made now.
async fn cluster_ca(
    api: &Api<Secret>,
    metadata: &ObjectMeta,
    name: &str,
    exists: bool,
    now: OffsetDateTime,
) -> Result<(Issued, bool), Error> {
    let kube_error = |action, source| Error::Kube {
        action,
        kind: "Secret".to_owned(),
        name: name.to_owned(),
        source,
    };
    let unreadable = || Error::CertificateAuthority {
        secret: name.to_owned(),
    };
    if exists {
        let secret = api.get(name).await.map_err(|e| kube_error("get", e))?;
        let ca = ca_from_secret(&secret).ok_or_else(unreadable)?;
        return Ok((ca, false));
    }
    let common_name = format!(
        "pgkube CA {}/{}",
        metadata.namespace.as_deref().unwrap_or_default(),
        name
    );
    let ca = pki::new_ca(&common_name, now, CA_VALIDITY).map_err(|source| Error::Certificate {
        secret: name.to_owned(),
        source,
    })?;
    let data = BTreeMap::from([
        (CA_CERT_KEY.to_owned(), bytes(&ca.cert_pem)),
        (CA_KEY_KEY.to_owned(), bytes(&ca.key_pem)),
    ]);
    let annotations = BTreeMap::from([(NOT_AFTER_ANNOTATION.to_owned(), ca.not_after.to_string())]);
    let mut secret = tls_secret(metadata, name, data, annotations);
    secret.type_ = Some("Opaque".to_owned());
    tracing::info!(secret = %name, "creating the cluster's certificate authority");
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    match api.create(&params, &secret).await {
        Ok(_) => Ok((ca, true)),
        // Made by a reconcile that raced with ours: sign with that one.
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let secret = api.get(name).await.map_err(|e| kube_error("get", e))?;
            let ca = ca_from_secret(&secret).ok_or_else(unreadable)?;
            Ok((ca, false))
        }
        Err(source) => Err(kube_error("create", source)),
    }
}

/// The CA a Secret holds (`ca.crt`, `ca.key`), if it holds one.
fn ca_from_secret(secret: &Secret) -> Option<Issued> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    let not_after = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NOT_AFTER_ANNOTATION)?.parse().ok())
        .unwrap_or(i64::MAX);
    Some(Issued {
        cert_pem: text(CA_CERT_KEY)?,
        key_pem: text(CA_KEY_KEY)?,
        not_after,
    })
}

fn tls_secret(
    metadata: &ObjectMeta,
    name: &str,
    data: BTreeMap<String, ByteString>,
    annotations: BTreeMap<String, String>,
) -> Secret {
    let mut metadata = metadata.clone();
    metadata.name = Some(name.to_owned());
    metadata.owner_references = None;
    metadata.annotations = Some(annotations);
    Secret {
        metadata,
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

async fn apply_secret(api: &Api<Secret>, secret: &Secret) -> Result<(), Error> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(secret))
        .await
        .map(|_| ())
        .map_err(|source| Error::Kube {
            action: "apply",
            kind: "Secret".to_owned(),
            name,
            source,
        })
}

/// Whether the cluster may refuse connections without TLS: every instance runs with the
/// certificates mounted. True before the StatefulSet exists (its pods will have them); false
/// while pods made before pgkube managed certificates remain, so that they keep replicating.
/// A pod says so by its TLS annotation, or by its revision being the current template's: a
/// roll between two templates with certificates (new resources, a certificate of one's own)
/// never opens plain logins.
pub fn tls_only(live: &LiveChildren) -> bool {
    let Some(statefulset) = live.statefulset.as_deref() else {
        return true;
    };
    // The cache keeps no pod template (see `cache`): the StatefulSet says it instead.
    let template_has_tls = statefulset
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|annotations| annotations.contains_key(TLS_ANNOTATION));
    let revision = super::ha::update_revision(live);
    template_has_tls
        && revision.is_some()
        && live
            .pods
            .values()
            .all(|pod| pod.tls || pod.revision.as_deref() == revision)
}

/// Whether remote logins need a client certificate: the spec gives the applications' client
/// CA (`spec.certificates.clientCASecret`) and every live pod accepts it. While pods made
/// before it remain (it was added with a certificate of one's own), passwords alone still
/// log in, as those pods could not verify the applications' certificates.
pub fn client_certificates_required(
    cluster: &super::validate::ValidatedCluster,
    live: &LiveChildren,
) -> bool {
    let wanted = cluster
        .server_certificates
        .as_ref()
        .is_some_and(|own| own.client_ca_secret.is_some());
    wanted && live.pods.values().all(|pod| pod.client_ca)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> ChildNames {
        ChildNames::for_cluster("db")
    }

    #[test]
    fn client_certificates_are_required_once_every_pod_accepts_the_client_ca() {
        let pod = |client_ca: bool| super::super::rollout::LivePod {
            client_ca,
            ..super::super::rollout::LivePod::default()
        };
        let live = |pods: &[bool]| LiveChildren {
            pods: pods
                .iter()
                .enumerate()
                .map(|(ordinal, client_ca)| (format!("db-postgresql-{ordinal}"), pod(*client_ca)))
                .collect(),
            ..LiveChildren::default()
        };
        let spec: pgkube_crds::PostgreSQLClusterSpec = serde_json::from_value(
            serde_json::json!({"storage": {"size": "1Gi"}, "postgresVersion": "15"}),
        )
        .expect("spec");
        let mut db = pgkube_crds::PostgreSQLCluster::new("db", spec);
        db.metadata.namespace = Some("team-a".to_owned());
        db.metadata.uid = Some("uid".to_owned());
        let mut cluster = crate::cluster::validate::validate(&db, &Default::default())
            .expect("valid")
            .effective;
        assert!(!client_certificates_required(
            &cluster,
            &live(&[true, true])
        ));
        cluster.server_certificates = Some(pgkube_crds::ServerCertificates {
            server_tls_secret: "own".to_owned(),
            server_ca_secret: None,
            client_ca_secret: Some("apps-ca".to_owned()),
        });
        assert!(
            client_certificates_required(&cluster, &live(&[])),
            "a new cluster"
        );
        assert!(!client_certificates_required(
            &cluster,
            &live(&[true, false])
        ));
        assert!(client_certificates_required(&cluster, &live(&[true, true])));
    }

    #[test]
    fn plain_logins_end_once_every_pod_was_made_from_a_template_with_the_certificates() {
        use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
        use std::sync::Arc;
        let pod = |revision: &str| super::super::rollout::LivePod {
            revision: Some(revision.to_owned()),
            ..super::super::rollout::LivePod::default()
        };
        let statefulset = |annotated: bool| StatefulSet {
            metadata: ObjectMeta {
                annotations: annotated
                    .then(|| BTreeMap::from([(TLS_ANNOTATION.to_owned(), "true".to_owned())])),
                ..ObjectMeta::default()
            },
            status: Some(StatefulSetStatus {
                update_revision: Some("new".to_owned()),
                ..StatefulSetStatus::default()
            }),
            ..StatefulSet::default()
        };
        // A new cluster: every pod it gets mounts them.
        assert!(tls_only(&LiveChildren::default()));
        let mut live = LiveChildren {
            statefulset: Some(Arc::new(statefulset(false))),
            pods: BTreeMap::from([("db-0".to_owned(), pod("new"))]),
            ..LiveChildren::default()
        };
        assert!(!tls_only(&live), "a StatefulSet of an earlier pgkube");
        live.statefulset = Some(Arc::new(statefulset(true)));
        assert!(tls_only(&live));
        live.pods.insert("db-1".to_owned(), pod("old"));
        assert!(
            !tls_only(&live),
            "a pod of an earlier template without them remains"
        );
        let with_tls = super::super::rollout::LivePod {
            tls: true,
            ..pod("old")
        };
        live.pods.insert("db-1".to_owned(), with_tls);
        assert!(
            tls_only(&live),
            "a pod of an earlier template with them: a roll stays TLS-only"
        );
    }

    #[test]
    fn the_server_certificate_covers_the_services_and_the_pods() {
        let hosts = server_hosts(&names(), "ns");
        for host in [
            "db-rw",
            "db-rw.ns.svc",
            "db-ro.ns.svc.cluster.local",
            "db-r.ns",
            "*.db-postgresql-headless.ns.svc",
        ] {
            assert!(hosts.contains(&host.to_owned()), "{host} in {hosts:?}");
        }
    }

    #[test]
    fn a_leaf_is_due_when_missing_renewable_or_its_hosts_changed() {
        let own_server = leaves(&names(), "ns", false);
        assert!(
            own_server
                .iter()
                .all(|leaf| matches!(leaf.kind, LeafKind::Client { .. })),
            "a server certificate of one's own is not issued"
        );
        let leaves = leaves(&names(), "ns", true);
        let server = &leaves[0];
        let client = &leaves[1];
        assert!(is_due(server, None, 100));
        let hosts = server_hosts(&names(), "ns").join(",");
        let fresh = LeafState {
            renew_at: Some(200),
            hosts: Some(hosts.clone()),
            trusted_ca: None,
        };
        assert!(!is_due(server, Some(&fresh), 100));
        assert!(is_due(server, Some(&fresh), 200));
        let moved = LeafState {
            hosts: Some("db-rw.other.svc".to_owned()),
            ..fresh.clone()
        };
        assert!(is_due(server, Some(&moved), 100));
        // A client certificate has no hosts.
        let client_state = LeafState {
            renew_at: Some(200),
            ..LeafState::default()
        };
        assert!(!is_due(client, Some(&client_state), 199));
        assert!(is_due(client, Some(&LeafState::default()), 0));
    }

    #[test]
    fn a_leaf_is_renewed_two_thirds_into_its_validity_and_the_next_look_is_then() {
        let now = OffsetDateTime::now_utc();
        let ca = pki::new_ca("test", now, time::Duration::days(10)).expect("CA");
        let leaf = &leaves(&names(), "ns", true)[1];
        let issued = issue(leaf, &ca, now, Duration::from_secs(90)).expect("leaf");
        assert!(issued.data.contains_key(CERT_KEY) && issued.data.contains_key(KEY_KEY));
        let state = LeafState::from_annotations(&issued.annotations);
        assert_eq!(state.renew_at, Some(now.unix_timestamp() + 60));
        assert_eq!(
            next_renewal([&state], now.unix_timestamp()),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            next_renewal([&state], now.unix_timestamp() + 100),
            Some(Duration::ZERO)
        );
    }
}
