//! `pgkube run`: the manager process.

use clap::Args;

#[derive(Args)]
pub struct RunArgs {}

pub fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("pgkube run is not implemented yet")
}
