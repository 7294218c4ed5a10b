//! The `pgkube` binary.
//!
//! - `pgkube run`: the manager (controllers, leader election, health and metrics endpoints).
//! - `pgkube crd`: prints the CRD YAML of every pgkube kind (both versions, converting through
//!   the manager's webhook).
//! - `pgkube admission-webhook`: prints the MutatingWebhookConfiguration through which the
//!   manager's webhook puts the cleanup finalizer on clusters as they are created.
//! - `pgkube migrate-storage`: rewrites every stored pgkube object in its CRD's storage version.
//! - `pgkube agent backup|restore`: the data path that runs inside backup and restore Jobs.
//! - `pgkube instance install|run`: the instance manager, PID 1 of each PostgreSQL container.

mod manager;
mod migrate_storage;

use std::process::ExitCode;

use anyhow::Context as _;
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
    /// Print the CustomResourceDefinitions of all pgkube kinds as YAML: v1beta1 (stored) and
    /// v1alpha1, converting through the manager's webhook.
    Crd(CrdArgs),
    /// Print the MutatingWebhookConfiguration as YAML through which the manager's webhook puts
    /// the cleanup finalizer on PostgreSQLClusters as they are created (failures ignored: the
    /// controller adds it then).
    AdmissionWebhook(AdmissionArgs),
    /// Print the API reference (Markdown) rendered from the CRD schemas, as docs/api.md holds it.
    ApiDocs,
    /// Rewrite every stored pgkube object in its CRD's storage version, then leave only that
    /// version in the CRD's status.storedVersions (needs the conversion webhook serving).
    MigrateStorage,
    /// Back up or restore PostgreSQL to or from S3-compatible storage (runs inside Jobs).
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Run a PostgreSQL instance of a cluster (inside the cluster's pods).
    #[command(subcommand)]
    Instance(instance::InstanceCommand),
}

fn main() -> ExitCode {
    // Linked as `kubectl-pgkube`, the binary is the kubectl plugin.
    if pgkube::plugin::invoked_as_plugin() {
        return pgkube::plugin::main();
    }
    // Linked as `kubectl_complete-pgkube`, it completes `kubectl pgkube <TAB>`.
    if pgkube::plugin::invoked_as_completion() {
        return pgkube::plugin::complete::main();
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => manager::run(*args),
        Command::Crd(args) => print_crds(&args),
        Command::AdmissionWebhook(args) => print_admission(&args),
        Command::ApiDocs => {
            print!("{}", pgkube_crds::api_markdown(&pgkube_crds::crds()));
            Ok(())
        }
        Command::MigrateStorage => migrate_storage::run(),
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

/// Where the printed CRDs send their ConversionReviews.
#[derive(clap::Args)]
struct CrdArgs {
    #[command(flatten)]
    webhook: WebhookArgs,
    /// The version objects are stored in: v1beta1, the version the controllers read. v1alpha1
    /// only to go back to a pgkube that read it (then run `pgkube migrate-storage`).
    #[arg(long, value_enum, default_value = "v1beta1")]
    storage_version: StorageVersionArg,
}

/// Where the printed MutatingWebhookConfiguration sends its AdmissionReviews, and for which
/// namespaces.
#[derive(clap::Args)]
struct AdmissionArgs {
    #[command(flatten)]
    webhook: WebhookArgs,
    /// Send only the clusters created in these namespaces, comma-separated (as the manager's
    /// `--watch-namespaces`). Default: every namespace.
    #[arg(
        long,
        visible_alias = "namespace",
        value_delimiter = ',',
        value_name = "NS,..."
    )]
    namespaces: Vec<String>,
    /// The configuration's name. A manager that manages its certificate (`run
    /// --webhook-cert-secret`) sets the `caBundle` of the one named `pgkube` only.
    #[arg(long, default_value = pgkube_crds::ADMISSION_WEBHOOK)]
    name: String,
}

/// The manager's webhook, as the API server reaches it.
#[derive(clap::Args)]
struct WebhookArgs {
    /// The manager's webhook Service, as NAMESPACE/NAME (port 443, path /convert or /mutate).
    #[arg(
        long,
        value_name = "NAMESPACE/NAME",
        default_value = "pgkube-system/pgkube-webhook",
        value_parser = parse_service
    )]
    webhook_service: (String, String),
    /// An HTTPS URL instead of a Service, for a manager outside the cluster (e.g.
    /// https://127.0.0.1:9443/convert for `crd`, https://127.0.0.1:9443/mutate for
    /// `admission-webhook`).
    #[arg(long, value_name = "URL", conflicts_with = "webhook_service", value_parser = parse_https_url)]
    webhook_url: Option<String>,
    /// A PEM file of the CA certificates the API server trusts the webhook with, printed as its
    /// `caBundle`: for a certificate of your own. Default: none, for the manager's managed
    /// certificate (`run --webhook-cert-secret`) or cert-manager's CA injector to set.
    #[arg(long, value_name = "FILE")]
    ca_bundle: Option<std::path::PathBuf>,
}

impl WebhookArgs {
    fn webhook(&self) -> pgkube_crds::ConversionWebhook {
        match &self.webhook_url {
            Some(url) => pgkube_crds::ConversionWebhook::Url(url.clone()),
            None => pgkube_crds::ConversionWebhook::Service {
                namespace: self.webhook_service.0.clone(),
                name: self.webhook_service.1.clone(),
            },
        }
    }

    /// The contents of `--ca-bundle`, if given.
    fn ca_pem(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let Some(path) = &self.ca_bundle else {
            return Ok(None);
        };
        let pem = std::fs::read(path)
            .with_context(|| format!("cannot read the CA bundle {}", path.display()))?;
        if !pem.starts_with(b"-----BEGIN CERTIFICATE-----") {
            anyhow::bail!("{} is not a PEM certificate", path.display());
        }
        Ok(Some(pem))
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum StorageVersionArg {
    V1alpha1,
    V1beta1,
}

impl From<StorageVersionArg> for pgkube_crds::StorageVersion {
    fn from(version: StorageVersionArg) -> Self {
        match version {
            StorageVersionArg::V1alpha1 => pgkube_crds::StorageVersion::V1alpha1,
            StorageVersionArg::V1beta1 => pgkube_crds::StorageVersion::V1beta1,
        }
    }
}

fn parse_service(value: &str) -> Result<(String, String), String> {
    match value.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(format!("expected NAMESPACE/NAME, got {value:?}")),
    }
}

fn parse_https_url(value: &str) -> Result<String, String> {
    // The API server calls conversion webhooks over HTTPS only.
    if value.starts_with("https://") && value.len() > "https://".len() {
        Ok(value.to_owned())
    } else {
        Err(format!("expected an https:// URL, got {value:?}"))
    }
}

fn print_crds(args: &CrdArgs) -> anyhow::Result<()> {
    let mut crds =
        pgkube_crds::crds_converting_through(&args.webhook.webhook(), args.storage_version.into());
    if let Some(pem) = args.webhook.ca_pem()? {
        crds = pgkube_crds::crds_trusting(crds, &pem);
    }
    print!("{}", pgkube_crds::crd_yaml(&crds)?);
    Ok(())
}

fn print_admission(args: &AdmissionArgs) -> anyhow::Result<()> {
    let mut configuration = pgkube_crds::admission_through(&args.webhook.webhook());
    configuration.metadata.name = Some(args.name.clone());
    if !args.namespaces.is_empty() {
        configuration = pgkube_crds::admission_in_namespaces(configuration, &args.namespaces);
    }
    if let Some(pem) = args.webhook.ca_pem()? {
        configuration = pgkube_crds::admission_trusting(configuration, &pem);
    }
    print!("{}", pgkube_crds::admission_yaml(&configuration)?);
    Ok(())
}
