//! Certificates of one's own for the TLS tests on the real node: the hosts a cluster `own`
//! must be named by, a `kubernetes.io/tls` Secret as cert-manager writes it, and whether the
//! replica streams over TLS with pgkube's client certificate.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use pgkube_testkit::TestCa;
use pgkube_testkit::tokio_postgres;

/// The names of cluster `own` in `namespace`: its Services and its pods.
pub fn own_hosts(namespace: &str) -> Vec<String> {
    let mut hosts: Vec<String> = ["rw", "ro", "r"]
        .iter()
        .map(|service| format!("own-{service}.{namespace}.svc"))
        .collect();
    hosts.push(format!("*.own-postgresql-headless.{namespace}.svc"));
    hosts
}

/// Creates or replaces the `kubernetes.io/tls` Secret `name` with a new certificate of `ca`
/// for `hosts`, and the CA.
pub async fn put_tls_secret(
    secrets: &kube::Api<Secret>,
    name: &str,
    ca: &TestCa,
    hosts: &[String],
) {
    let (certificate, key) = ca.server_certificate(hosts);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": certificate, "tls.key": key, "ca.crt": ca.pem()},
    }))
    .expect("a Secret");
    let params = PatchParams::apply("tls-on-real-node").force();
    secrets
        .patch(name, &params, &Patch::Apply(&secret))
        .await
        .expect("the Secret is written");
}

/// Whether the primary's replication connection is TLS, authenticated as `streaming_replica`.
pub async fn streaming_over_tls(sql: &tokio_postgres::Client) -> anyhow::Result<bool> {
    let rows = sql
        .query(
            "SELECT s.ssl, s.client_dn FROM pg_stat_replication r \
             JOIN pg_stat_ssl s USING (pid) WHERE r.state = 'streaming'",
            &[],
        )
        .await?;
    Ok(rows.len() == 1
        && rows[0].get::<_, bool>(0)
        && rows[0].get::<_, Option<String>>(1).as_deref() == Some("/CN=streaming_replica"))
}
