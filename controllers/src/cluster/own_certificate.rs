//! A server certificate of one's own (`spec.certificates`, for example from cert-manager).
//!
//! Before the pods mount it, the operator checks each reconcile that its Secrets hold a
//! certificate and its key, that the certificate chains to the CA that clients, replicas and
//! the operator verify it with, is valid now, and names every host clients reach the cluster
//! by. Otherwise the reconcile stops with the reason, so that no pod is made or replaced to
//! mount a certificate its peers would refuse. The applications' client CA, if given, must hold
//! at least one CA certificate.
//!
//! Added to a running cluster, the CA is also added to the `ca.crt` of the server certificate
//! pgkube issued, which the pods made before mount ([`trust_in_issued_secret`]).

use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

use super::Error;
use super::build::ChildNames;
use super::certificates::{CA_CERT_KEY, CERT_KEY, KEY_KEY, TRUSTED_CA_ANNOTATION};
use super::read::LiveChildren;

/// The host names the certificate must be valid for: the three Services, qualified with the
/// namespace as libpq's clients reach them, and each pod by its stable name.
pub fn required_hosts(names: &ChildNames, namespace: &str, replicas: i32) -> Vec<String> {
    let mut hosts: Vec<String> = [&names.rw_service, &names.ro_service, &names.r_service]
        .into_iter()
        .map(|service| format!("{service}.{namespace}.svc"))
        .collect();
    hosts.extend((0..replicas.max(1)).map(|ordinal| {
        format!(
            "{}-{ordinal}.{}.{namespace}.svc",
            names.statefulset, names.headless_service
        )
    }));
    hosts
}

/// Reads the user's Secrets and checks the certificate (see the module documentation);
/// returns the CA (PEM).
pub async fn check(
    client: &kube::Client,
    namespace: &str,
    own: &pgkube_crds::ServerCertificates,
    hosts: &[String],
) -> Result<Vec<u8>, Error> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let server = read(&secrets, &own.server_tls_secret).await?;
    let ca_secret = own
        .server_ca_secret
        .as_ref()
        .unwrap_or(&own.server_tls_secret);
    let ca = read(&secrets, ca_secret).await?;
    let server_name = &own.server_tls_secret;
    let cert = value(&server, CERT_KEY).map_err(|why| unusable(server_name, why))?;
    let key = value(&server, KEY_KEY).map_err(|why| unusable(server_name, why))?;
    let ca_pem = value(&ca, CA_CERT_KEY).map_err(|why| unusable(ca_secret, why))?;
    verify(&cert, &key, &ca_pem, hosts, UnixTime::now())
        .map_err(|why| unusable(&own.server_tls_secret, why))?;
    if let Some(client_ca) = &own.client_ca_secret {
        let secret = read(&secrets, client_ca).await?;
        let pem = value(&secret, CA_CERT_KEY).map_err(|why| unusable(client_ca, why))?;
        crate::pki::root_store(&pem).map_err(|why| unusable(client_ca, why))?;
    }
    Ok(ca_pem)
}

/// Adds the CA of one's own (`ca_pem`) to the `ca.crt` of the server certificate pgkube issued
/// before, if the cluster has one: the pods made before `spec.certificates` was added mount it,
/// and their kubelets refresh it, so that they verify the pods made after, which serve the
/// user's certificate, while the pods are replaced. Written once per CA (an annotation keeps
/// its digest): the watch cache keeps no Secret's data.
pub async fn trust_in_issued_secret(
    client: &kube::Client,
    namespace: &str,
    names: &ChildNames,
    live: &LiveChildren,
    ca_pem: &[u8],
) -> Result<(), Error> {
    let Some(state) = live.certificates.get(&names.server_tls_secret) else {
        return Ok(());
    };
    let digest = hex::encode(Sha256::digest(ca_pem));
    if state.trusted_ca.as_deref() == Some(digest.as_str()) {
        return Ok(());
    }
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let issued = read(&secrets, &names.ca_secret).await?;
    let issued_pem = value(&issued, CA_CERT_KEY).map_err(|why| unusable(&names.ca_secret, why))?;
    let patch = trust_patch(&digest, ca_bundle(&issued_pem, ca_pem));
    tracing::info!(secret = %names.server_tls_secret, "adding the CA of one's own to the issued server certificate's");
    secrets
        .patch(
            &names.server_tls_secret,
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .map(drop)
        .map_err(|source| Error::Kube {
            action: "patch",
            kind: "Secret".to_owned(),
            name: names.server_tls_secret.clone(),
            source,
        })
}

/// The merge patch that puts `bundle` in a Secret's `ca.crt`, and `digest` in its annotation.
fn trust_patch(digest: &str, bundle: Vec<u8>) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"annotations": {TRUSTED_CA_ANNOTATION: digest}},
        "data": {CA_CERT_KEY: ByteString(bundle)},
    })
}

/// `first` then `second`, two PEM bundles as one.
fn ca_bundle(first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut bundle = first.to_vec();
    if !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(second);
    bundle
}

/// The value of `key` in `secret`.
fn value(secret: &Secret, key: &str) -> Result<Vec<u8>, String> {
    secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|value| value.0.clone())
        .ok_or_else(|| format!("it holds no {key}"))
}

fn unusable(secret: &str, why: String) -> Error {
    Error::OwnCertificate {
        secret: secret.to_owned(),
        why,
    }
}

async fn read(secrets: &Api<Secret>, name: &str) -> Result<Secret, Error> {
    secrets
        .get_opt(name)
        .await
        .map_err(|source| Error::Kube {
            action: "get",
            kind: "Secret".to_owned(),
            name: name.to_owned(),
            source,
        })?
        .ok_or_else(|| unusable(name, "the Secret does not exist".to_owned()))
}

/// Whether `cert_pem` (the leaf, then any intermediates) with `key_pem` is a server
/// certificate that `ca_pem` verifies for each of `hosts` at `now`.
pub fn verify(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
    hosts: &[String],
    now: UnixTime,
) -> Result<(), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|error| format!("tls.crt is not PEM: {error}"))?;
    let (leaf, intermediates) = chain.split_first().ok_or("tls.crt holds no certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|error| format!("tls.key holds no private key: {error}"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|error| format!("tls.key is unusable: {error}"))?;
    CertifiedKey::new(chain.clone(), signing_key)
        .keys_match()
        .map_err(|error| format!("tls.key is not the key of tls.crt: {error}"))?;
    let roots = crate::pki::root_store(ca_pem)?;
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|error| format!("ca.crt: {error}"))?;
    for host in hosts {
        let name =
            ServerName::try_from(host.clone()).map_err(|error| format!("{host}: {error}"))?;
        verifier
            .verify_server_cert(leaf, intermediates, &name, &[], now)
            .map_err(|error| format!("not valid for {host}: {error}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
