//! `kubectl_complete-pgkube`: completion of `kubectl pgkube <TAB>`. kubectl (1.26 and later)
//! runs this executable, found on the `PATH`, with the words after `pgkube`, the last one being
//! the word to complete, and expects cobra's answer: one candidate per line (a tab, then its
//! description), then `:<directive>`.
//!
//! What is wanted is worked out from the words alone ([`wanted`], pure); clusters, backups,
//! replicas and namespaces are then listed from the API server of the same kubeconfig, context
//! and namespace the command would use. Whatever fails gives no candidates, never an error.

use std::path::PathBuf;

use clap::CommandFactory as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::config::Kubeconfig;
use kube::{Api, ResourceExt as _};
use pgkube_crds::{InstanceRole, PostgreSQLBackup, PostgreSQLCluster};

use super::{Connection, PluginCli};

/// The executable name under which the binary completes the plugin's words.
pub const COMPLETE_NAME: &str = "kubectl_complete-pgkube";

/// cobra's directive: do not fall back to file names.
const NO_FILE_COMPLETION: u8 = 4;
/// cobra's directive: the shell's own completion (file names).
const DEFAULT_COMPLETION: u8 = 0;

/// What the word being completed should be.
#[derive(Debug, PartialEq, Eq)]
pub enum Wanted {
    Subcommands,
    /// The flags of the subcommand (or the global ones).
    Flags(Option<String>),
    Clusters,
    Backups,
    /// The replicas of a cluster.
    Replicas(String),
    Namespaces,
    Contexts,
    /// File names, left to the shell.
    Files,
    Values(Vec<String>),
    Nothing,
}

/// What the words say: what is wanted, and where to look.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Words {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: Option<String>,
}

/// What the last of `words` should be, and the connection flags among the others (pure).
pub fn wanted(words: &[String]) -> (Wanted, Words) {
    let command = PluginCli::command();
    let (current, before) = match words.split_last() {
        Some((current, before)) => (current.as_str(), before),
        None => ("", &[][..]),
    };
    let mut found = Words::default();
    let mut subcommand: Option<String> = None;
    let mut positionals = Vec::new();
    let mut pending_flag: Option<String> = None;
    for word in before {
        if let Some(flag) = pending_flag.take() {
            record(&mut found, &flag, word);
            continue;
        }
        if word == "--" {
            return (Wanted::Nothing, found);
        }
        if let Some(flag) = word.strip_prefix('-') {
            let (name, value) = split_flag(flag);
            match value {
                Some(value) => record(&mut found, &name, value),
                None if takes_value(&command, subcommand.as_deref(), &name) => {
                    pending_flag = Some(name);
                }
                None => {}
            }
        } else if subcommand.is_none() {
            subcommand = Some(word.clone());
        } else {
            positionals.push(word.clone());
        }
    }
    let wanted = match pending_flag {
        Some(flag) => flag_value(&flag),
        None if current.starts_with('-') => Wanted::Flags(subcommand),
        None => argument(subcommand.as_deref(), &positionals),
    };
    (wanted, found)
}

/// `-n` → `n`, `--namespace=x` → (`namespace`, `x`).
fn split_flag(flag: &str) -> (String, Option<&str>) {
    let flag = flag.strip_prefix('-').unwrap_or(flag);
    match flag.split_once('=') {
        Some((name, value)) => (name.to_owned(), Some(value)),
        None => (flag.to_owned(), None),
    }
}

fn canonical(flag: &str) -> &str {
    match flag {
        "n" => "namespace",
        "o" => "output",
        "f" => "follow",
        other => other,
    }
}

fn record(found: &mut Words, flag: &str, value: &str) {
    match canonical(flag) {
        "namespace" => found.namespace = Some(value.to_owned()),
        "context" => found.context = Some(value.to_owned()),
        "kubeconfig" => found.kubeconfig = Some(PathBuf::from(value)),
        _ => {}
    }
}

/// Whether `--flag` of `subcommand` (or a global one) takes a value.
fn takes_value(command: &clap::Command, subcommand: Option<&str>, flag: &str) -> bool {
    let flag = canonical(flag);
    let scope = subcommand
        .and_then(|name| command.find_subcommand(name))
        .unwrap_or(command);
    scope
        .get_arguments()
        .chain(command.get_arguments())
        .find(|arg| arg.get_long() == Some(flag))
        .is_some_and(|arg| arg.get_action().takes_values())
}

fn flag_value(flag: &str) -> Wanted {
    let values = |values: &[&str]| Wanted::Values(values.iter().map(|v| (*v).to_owned()).collect());
    match canonical(flag) {
        "namespace" => Wanted::Namespaces,
        "context" => Wanted::Contexts,
        "kubeconfig" => Wanted::Files,
        "backup" => Wanted::Backups,
        "method" => values(&["logical", "physical"]),
        "output" => values(&["json", "yaml"]),
        _ => Wanted::Nothing,
    }
}

fn argument(subcommand: Option<&str>, positionals: &[String]) -> Wanted {
    match (subcommand, positionals) {
        (None, _) => Wanted::Subcommands,
        (Some("completion"), []) => Wanted::Values(
            ["bash", "elvish", "fish", "powershell", "zsh"]
                .map(str::to_owned)
                .to_vec(),
        ),
        (Some("status" | "switchover" | "backup" | "restore" | "psql" | "logs"), []) => {
            Wanted::Clusters
        }
        (Some("switchover"), [cluster]) => Wanted::Replicas(cluster.clone()),
        _ => Wanted::Nothing,
    }
}

/// The subcommands, or a subcommand's flags with the global ones, with their help as
/// descriptions.
fn from_the_command(wanted: &Wanted) -> Vec<(String, String)> {
    let command = PluginCli::command();
    let about = |text: Option<&clap::builder::StyledStr>| {
        text.map(|text| {
            text.to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default()
    };
    match wanted {
        Wanted::Subcommands => command
            .get_subcommands()
            .map(|sub| (sub.get_name().to_owned(), about(sub.get_about())))
            .collect(),
        Wanted::Flags(subcommand) => {
            let scope = subcommand
                .as_deref()
                .and_then(|name| command.find_subcommand(name));
            scope
                .into_iter()
                .flat_map(|sub| sub.get_arguments())
                .chain(command.get_arguments())
                .filter_map(|arg| Some((format!("--{}", arg.get_long()?), about(arg.get_help()))))
                .collect()
        }
        Wanted::Values(values) => values.iter().map(|v| (v.clone(), String::new())).collect(),
        _ => Vec::new(),
    }
}

/// Names from the API server, or none when it cannot be asked.
async fn from_the_cluster(wanted: &Wanted, words: &Words) -> Vec<(String, String)> {
    let connection = Connection {
        kubeconfig: words.kubeconfig.clone(),
        context: words.context.clone(),
        namespace: words.namespace.clone(),
    };
    if *wanted == Wanted::Contexts {
        return contexts(words)
            .into_iter()
            .map(|c| (c, String::new()))
            .collect();
    }
    let Ok((client, namespace)) = super::connect(&connection).await else {
        return Vec::new();
    };
    let names = |list: Vec<String>| list.into_iter().map(|n| (n, String::new())).collect();
    match wanted {
        Wanted::Clusters => {
            let api = Api::<PostgreSQLCluster>::namespaced(client, &namespace);
            let list = api.list(&ListParams::default()).await.map(|l| l.items);
            names(
                list.unwrap_or_default()
                    .iter()
                    .map(|c| c.name_any())
                    .collect(),
            )
        }
        Wanted::Backups => {
            let api = Api::<PostgreSQLBackup>::namespaced(client, &namespace);
            let list = api.list(&ListParams::default()).await.map(|l| l.items);
            names(
                list.unwrap_or_default()
                    .iter()
                    .map(|b| b.name_any())
                    .collect(),
            )
        }
        Wanted::Namespaces => {
            let list = Api::<Namespace>::all(client)
                .list(&ListParams::default())
                .await;
            names(
                list.map(|l| l.items)
                    .unwrap_or_default()
                    .iter()
                    .map(|n| n.name_any())
                    .collect(),
            )
        }
        Wanted::Replicas(cluster) => {
            let api = Api::<PostgreSQLCluster>::namespaced(client, &namespace);
            let found = api.get_opt(cluster).await.ok().flatten();
            let instances = found.and_then(|c| c.status).map(|s| s.instances);
            names(
                instances
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|i| i.role == InstanceRole::Replica)
                    .map(|i| i.name)
                    .collect(),
            )
        }
        _ => Vec::new(),
    }
}

fn contexts(words: &Words) -> Vec<String> {
    let kubeconfig = match &words.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    };
    kubeconfig
        .map(|config| config.contexts.into_iter().map(|c| c.name).collect())
        .unwrap_or_default()
}

/// cobra's answer: the candidates that start with `current`, then the directive.
pub fn answer(candidates: &[(String, String)], current: &str, directive: u8) -> String {
    let mut out = String::new();
    for (candidate, description) in candidates {
        if !candidate.starts_with(current) {
            continue;
        }
        out.push_str(candidate);
        if !description.is_empty() {
            out.push('\t');
            out.push_str(description);
        }
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    out
}

/// Prints the completion of the process's arguments.
pub fn main() -> std::process::ExitCode {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let current = words.last().cloned().unwrap_or_default();
    let (wanted, found) = wanted(&words);
    let mut candidates = from_the_command(&wanted);
    if candidates.is_empty() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(runtime) = runtime {
            candidates = runtime.block_on(from_the_cluster(&wanted, &found));
        }
    }
    let directive = match wanted {
        Wanted::Files => DEFAULT_COMPLETION,
        _ => NO_FILE_COMPLETION,
    };
    print!("{}", answer(&candidates, &current, directive));
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &[&str]) -> Vec<String> {
        line.iter().map(|w| (*w).to_owned()).collect()
    }

    fn wanted_for(line: &[&str]) -> Wanted {
        wanted(&words(line)).0
    }

    #[test]
    fn the_first_word_is_a_subcommand_and_the_next_a_cluster() {
        assert_eq!(wanted_for(&[""]), Wanted::Subcommands);
        assert_eq!(wanted_for(&["-n", "shop", "sta"]), Wanted::Subcommands);
        assert_eq!(wanted_for(&["status", ""]), Wanted::Clusters);
        assert_eq!(
            wanted_for(&["backup", "--method", "logical", ""]),
            Wanted::Clusters
        );
        assert_eq!(
            wanted_for(&["switchover", "db", ""]),
            Wanted::Replicas("db".into())
        );
        assert_eq!(wanted_for(&["status", "db", ""]), Wanted::Nothing);
        assert_eq!(wanted_for(&["psql", "db", "--", ""]), Wanted::Nothing);
    }

    #[test]
    fn a_flag_value_is_completed_by_its_kind() {
        assert_eq!(wanted_for(&["-n", ""]), Wanted::Namespaces);
        assert_eq!(
            wanted_for(&["status", "--namespace", ""]),
            Wanted::Namespaces
        );
        assert_eq!(wanted_for(&["--context", ""]), Wanted::Contexts);
        assert_eq!(wanted_for(&["--kubeconfig", ""]), Wanted::Files);
        assert_eq!(
            wanted_for(&["restore", "db", "--backup", ""]),
            Wanted::Backups
        );
        assert_eq!(
            wanted_for(&["backup", "db", "--method", ""]),
            Wanted::Values(words(&["logical", "physical"]))
        );
        assert_eq!(
            wanted_for(&["backup", "db", "--timeout", ""]),
            Wanted::Nothing
        );
    }

    #[test]
    fn flags_are_offered_for_a_dash_and_connection_flags_are_kept() {
        assert_eq!(
            wanted_for(&["backup", "--"]),
            Wanted::Flags(Some("backup".into()))
        );
        let (_, found) = wanted(&words(&[
            "--context=test",
            "-n",
            "shop",
            "--kubeconfig",
            "/k",
            "status",
            "",
        ]));
        assert_eq!(found.context.as_deref(), Some("test"));
        assert_eq!(found.namespace.as_deref(), Some("shop"));
        assert_eq!(found.kubeconfig, Some(PathBuf::from("/k")));
    }

    #[test]
    fn the_answer_is_cobras_filtered_by_the_word() {
        let subcommands = from_the_command(&Wanted::Subcommands);
        let said = answer(&subcommands, "sw", NO_FILE_COMPLETION);
        assert!(said.starts_with("switchover\tMove the primary"), "{said}");
        assert!(said.ends_with("\n:4\n"), "{said}");
        assert_eq!(said.lines().count(), 2, "{said}");
        let flags = from_the_command(&Wanted::Flags(Some("backup".into())));
        let said = answer(&flags, "--w", NO_FILE_COMPLETION);
        assert!(said.starts_with("--wait\t"), "{said}");
    }
}
