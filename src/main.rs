//! The `pgkube` binary.
//!
//! - `pgkube run`: the manager (controllers, leader election, health and metrics endpoints).
//! - `pgkube crd`: prints the CRD YAML of every pgkube kind.
//! - `pgkube agent backup|restore`: the data path that runs inside backup and restore Jobs.
//! - `pgkube instance install|run`: the instance manager, PID 1 of each PostgreSQL container.

mod manager;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pgkube::{agent, instance};

#[derive(Parser)]
#[command(name = "pgkube", version, about = "Kubernetes operator for PostgreSQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the manager: the PostgreSQLCluster, PostgreSQLBackup and PostgreSQLRestore controllers.
    Run(Box<manager::RunArgs>),
    /// Print the CustomResourceDefinitions of all pgkube kinds as YAML.
    Crd,
    /// Back up or restore PostgreSQL to or from S3-compatible storage (runs inside Jobs).
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Run a PostgreSQL instance of a cluster (inside the cluster's pods).
    #[command(subcommand)]
    Instance(instance::InstanceCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => manager::run(*args),
        Command::Crd => print_crds(),
        Command::Agent(command) => agent::run(command),
        Command::Instance(command) => instance::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the whole context chain on one line, without a backtrace.
            eprintln!("pgkube: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn print_crds() -> anyhow::Result<()> {
    print!("{}", pgkube_crds::crd_yaml()?);
    Ok(())
}
