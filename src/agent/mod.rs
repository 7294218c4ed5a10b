//! `pgkube agent`: the backup and restore data path that runs inside Jobs.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum AgentCommand {
    /// Back up every database of a PostgreSQL instance to S3-compatible storage.
    Backup,
    /// Restore databases from a backup in S3-compatible storage.
    Restore,
}

pub fn run(_command: AgentCommand) -> anyhow::Result<()> {
    anyhow::bail!("pgkube agent is not implemented yet")
}
