//! What a test cluster's Secrets hold: the roles' passwords, the application's connection
//! details, the CA and the superuser's client certificate, and the TLS connectors made of them.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::replication_secret_name;
use super::{PASSWORD_KEY, TestCluster, USERNAME_KEY, credentials_secret_name};
use crate::tls::{server_tls_secret_name, verify_full, verify_full_with_certificate};

/// The application Secret (`<cluster>-app`), as applications read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplicationSecret {
    pub username: String,
    pub password: String,
    pub host: String,
    pub port: String,
    pub dbname: String,
    pub uri: String,
    pub jdbc_uri: String,
}

impl TestCluster {
    /// The superuser's name and password, from the cluster's credentials Secret.
    pub async fn credentials(&self) -> anyhow::Result<(String, String)> {
        self.basic_auth(&credentials_secret_name(&self.name)).await
    }

    /// The replication role's name and password, from the cluster's replication Secret.
    pub async fn replication_credentials(&self) -> anyhow::Result<(String, String)> {
        self.basic_auth(&replication_secret_name(&self.name)).await
    }

    /// The application Secret, every key of it.
    pub async fn application_secret(&self) -> anyhow::Result<ApplicationSecret> {
        let secret = self.secret(&format!("{}-app", self.name)).await?;
        Ok(ApplicationSecret {
            username: secret.value(USERNAME_KEY)?,
            password: secret.value(PASSWORD_KEY)?,
            host: secret.value("host")?,
            port: secret.value("port")?,
            dbname: secret.value("dbname")?,
            uri: secret.value("uri")?,
            jdbc_uri: secret.value("jdbc-uri")?,
        })
    }

    /// The CA the cluster's server certificate verifies against: `ca.crt` of its
    /// `<cluster>-server-tls` Secret, or of the Secrets its `spec.certificates` names.
    pub async fn server_ca(&self) -> anyhow::Result<String> {
        let own = self.get().await?.spec.certificates;
        let secret = match own {
            Some(own) => own.server_ca_secret.unwrap_or(own.server_tls_secret),
            None => server_tls_secret_name(&self.name),
        };
        self.secret(&secret).await?.value("ca.crt")
    }

    /// How a connection checks the cluster's server certificate, as libpq's `verify-full`.
    pub async fn tls(&self) -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
        verify_full(&self.server_ca().await?)
    }

    /// As [`Self::tls`], presenting the superuser's client certificate (`<cluster>-superuser-tls`).
    pub async fn superuser_tls(&self) -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
        let client = self.secret(&format!("{}-superuser-tls", self.name)).await?;
        verify_full_with_certificate(
            &self.server_ca().await?,
            &client.value("tls.crt")?,
            &client.value("tls.key")?,
        )
    }

    /// The control token, with which the operator asks the instance managers
    /// (`<cluster>-postgresql-control`).
    pub async fn control_token(&self) -> anyhow::Result<String> {
        self.secret(&format!("{}-postgresql-control", self.name))
            .await?
            .value("token")
    }

    /// The `/status` of the instance manager of `pod` at `address`, asked as the operator asks:
    /// over TLS, its certificate checked for the pod's name, with the control token.
    pub async fn instance_status(
        &self,
        pod: &str,
        address: std::net::IpAddr,
    ) -> anyhow::Result<serde_json::Value> {
        let host = format!(
            "{pod}.{}-postgresql-headless.{}.svc",
            self.name, self.namespace
        );
        let (ca, token) = (self.server_ca().await?, self.control_token().await?);
        let status_port = std::net::SocketAddr::new(address, 8000);
        let (code, body) =
            crate::tls::status_port_answer(status_port, Some((&host, &ca)), Some(&token)).await?;
        anyhow::ensure!(code == 200, "HTTP {code} from {pod}: {body}");
        Ok(serde_json::from_str(&body)?)
    }

    async fn basic_auth(&self, name: &str) -> anyhow::Result<(String, String)> {
        let secret = self.secret(name).await?;
        Ok((secret.value(USERNAME_KEY)?, secret.value(PASSWORD_KEY)?))
    }

    async fn secret(&self, name: &str) -> anyhow::Result<ReadSecret> {
        let secret = Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .get(name)
            .await
            .with_context(|| format!("reading Secret {name}"))?;
        Ok(ReadSecret {
            name: name.to_owned(),
            secret,
        })
    }
}

/// A Secret as read, to take its text values from.
struct ReadSecret {
    name: String,
    secret: Secret,
}

impl ReadSecret {
    fn value(&self, key: &str) -> anyhow::Result<String> {
        let name = &self.name;
        let bytes = self
            .secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .with_context(|| format!("Secret {name} has no {key}"))?;
        String::from_utf8(bytes.0.clone()).with_context(|| format!("{key} in {name}"))
    }
}
