//! A cluster instance's data volume on the test bed's real node, where a PersistentVolume is a
//! directory of this machine (`hostPath`, made by the test bed's provisioner): tests find an
//! instance's data directory and lose it, as a disk that fails or is replaced empty would.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;

use crate::cluster::TestCluster;
use crate::process::{Frozen, instance_manager_of, postmaster_of, send_signal};
use crate::wait::wait_until;

/// The StatefulSet's claim template, whose claims are `data-<pod>`.
const DATA_CLAIM_PREFIX: &str = "data-";
/// `PGDATA` inside the volume (the instance containers' `PGDATA` is `<mount>/pgdata`).
const PGDATA_IN_VOLUME: &str = "pgdata";

impl TestCluster {
    /// The data directory (`PGDATA`) of instance `pod` on this machine.
    pub async fn data_directory(&self, pod: &str) -> anyhow::Result<PathBuf> {
        let claim_name = format!("{DATA_CLAIM_PREFIX}{pod}");
        let claim = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &self.namespace)
            .get(&claim_name)
            .await
            .with_context(|| format!("reading claim {claim_name}"))?;
        let volume_name = claim
            .spec
            .and_then(|spec| spec.volume_name)
            .with_context(|| format!("claim {claim_name} is not bound"))?;
        let volume = Api::<PersistentVolume>::all(self.client.clone())
            .get(&volume_name)
            .await
            .with_context(|| format!("reading volume {volume_name}"))?;
        let path = volume
            .spec
            .and_then(|spec| spec.host_path)
            .map(|host_path| host_path.path)
            .with_context(|| format!("volume {volume_name} is not a hostPath volume"))?;
        Ok(PathBuf::from(path).join(PGDATA_IN_VOLUME))
    }

    /// Loses the data of instance `pod` under its running pod: its instance manager is frozen
    /// (so that it restarts nothing meanwhile), its postmaster killed, its data directory
    /// removed; then the instance manager runs on, finds its server gone and exits, and the
    /// container restarts on an empty volume.
    pub async fn wipe_data(&self, pod: &str) -> anyhow::Result<()> {
        let data = self.data_directory(pod).await?;
        let manager = instance_manager_of(&self.namespace, pod)
            .with_context(|| format!("the instance manager of {pod}"))?;
        let frozen = Frozen::stop(manager)?;
        let postmaster = postmaster_of(&self.namespace, pod)
            .with_context(|| format!("the postmaster of {pod}"))?;
        send_signal(postmaster, "KILL")?;
        wait_until(
            "the killed postmaster to be gone",
            Duration::from_secs(30),
            || async {
                Ok((postmaster_of(&self.namespace, pod) != Some(postmaster)).then_some(()))
            },
        )
        .await?;
        std::fs::remove_dir_all(&data).with_context(|| format!("removing {}", data.display()))?;
        drop(frozen);
        Ok(())
    }

    /// The PostgreSQL system identifier of the database instance `pod` runs.
    pub async fn system_identifier_of(&self, pod: &str) -> anyhow::Result<String> {
        let sql = self.sql_to_pod(pod).await?;
        let row = sql
            .query_one(
                "SELECT system_identifier::text FROM pg_control_system()",
                &[],
            )
            .await
            .with_context(|| format!("the system identifier of {pod}"))?;
        Ok(row.get(0))
    }
}
