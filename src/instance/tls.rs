//! The instance's certificates: the manager copies the mounted ones for its server and its
//! clients ([`crate::tls::copy_private`]) whenever it writes the configuration, so a renewed
//! certificate reaches the server with the next reload, and connections to other instances
//! present the client certificate of their role.

use super::Instance;
use super::datadir::InstanceTls;
use super::desired::Desired;
use crate::tls::{ClientRole, ClientTls};

impl Instance {
    /// Copies the mounted certificates, if the pod has any; returns whether they changed.
    pub(super) fn install_tls(&mut self) -> anyhow::Result<bool> {
        let digest = crate::tls::copy_private(&self.args.tls_dir, &self.args.tls_runtime_dir)
            .map_err(|error| {
                anyhow::anyhow!(
                    "cannot copy the certificates from {}: {error}",
                    self.args.tls_dir.display()
                )
            })?;
        let changed = digest != self.tls;
        if changed {
            match &digest {
                Some(digest) => tracing::info!(digest = %&digest[..16], "certificates installed"),
                None => tracing::warn!(
                    dir = %self.args.tls_dir.display(),
                    "no certificates mounted: the server runs without TLS"
                ),
            }
            self.tls = digest;
        }
        Ok(changed)
    }

    /// The server's and clients' TLS settings under `desired`, once certificates are installed.
    pub(super) fn server_tls<'a>(&'a self, desired: &Desired) -> Option<InstanceTls<'a>> {
        let dir = &self.args.tls_runtime_dir;
        let client_ca_file = [crate::tls::CLIENT_CAS_FILE, crate::tls::CLIENT_CA_FILE]
            .into_iter()
            .find(|file| dir.join(file).exists())
            .unwrap_or(crate::tls::CA_FILE);
        Some(InstanceTls {
            dir,
            digest: self.tls.as_deref()?,
            verify: desired.topology.tls_only,
            client_ca_file,
        })
    }

    /// How a connection to another instance as `role` uses TLS; none without certificates.
    pub(super) fn client_tls(&self, role: ClientRole) -> Option<ClientTls> {
        self.server_tls(&self.applied).map(|tls| tls.client(role))
    }
}
