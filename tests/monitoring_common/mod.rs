//! Shared by the monitoring tests: the files of `deploy/monitoring/` (the PrometheusRule, the
//! plain rule file generated from it, the Grafana dashboard), the queries and metric names
//! they hold, the metrics that `docs/operations.md` documents, and the test bed's promtool.

#![allow(dead_code)] // each test file uses a different part

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::{Context, bail};

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn prometheus_rule_path() -> PathBuf {
    root().join("deploy/monitoring/prometheus-rule.yaml")
}

pub fn plain_rules_path() -> PathBuf {
    root().join("deploy/monitoring/pgkube-rules.yaml")
}

pub fn dashboard_path() -> PathBuf {
    root().join("deploy/monitoring/pgkube-dashboard.json")
}

pub fn alert_tests_path() -> PathBuf {
    root().join("tests/monitoring/alerts-test.yaml")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// What heads the plain rule file.
const PLAIN_HEADER: &str = "\
# pgkube's alerts as a plain Prometheus rule file (`rule_files:` in prometheus.yml).
# Generated from the spec of prometheus-rule.yaml: edit that file, then run
# `PGKUBE_WRITE_MONITORING=1 cargo test --test monitoring` to write this one again.
# What each alert means and what to do: docs/operations.md, \"Alerts\".
";

/// The plain rule file: the PrometheusRule's `spec` (its groups), comments and all, one level
/// less indented, under [`PLAIN_HEADER`].
pub fn plain_rules(prometheus_rule: &str) -> anyhow::Result<String> {
    let mut lines = prometheus_rule.lines();
    lines
        .by_ref()
        .find(|line| *line == "spec:")
        .context("no top-level `spec:` line")?;
    let mut out = PLAIN_HEADER.to_owned();
    for line in lines {
        if line.is_empty() {
            out.push('\n');
            continue;
        }
        let Some(inner) = line.strip_prefix("  ") else {
            bail!("a line after `spec:` that is not inside it: {line:?}");
        };
        out.push_str(inner);
        out.push('\n');
    }
    Ok(out)
}

/// An alerting rule: its name and expression.
#[derive(Clone, Debug)]
pub struct Alert {
    pub name: String,
    pub expr: String,
}

/// The alerting rules of a rule file's `groups`.
pub fn alerts(rule_file: &str) -> anyhow::Result<Vec<Alert>> {
    let file: serde_yaml::Value = serde_yaml::from_str(rule_file)?;
    let groups = file["groups"].as_sequence().context("no groups")?;
    let mut alerts = Vec::new();
    for group in groups {
        for rule in group["rules"]
            .as_sequence()
            .context("a group without rules")?
        {
            let name = rule["alert"].as_str().context("a rule that is no alert")?;
            let expr = rule["expr"].as_str().context("an alert without expr")?;
            alerts.push(Alert {
                name: name.to_owned(),
                expr: expr.to_owned(),
            });
        }
    }
    Ok(alerts)
}

/// A query of the dashboard: a panel's target or a template variable's.
#[derive(Clone, Debug)]
pub struct Query {
    /// The panel's title, or `variable <name>`.
    pub source: String,
    pub expr: String,
}

/// Every query of the dashboard: its panels' targets (rows included) and its query variables.
pub fn dashboard_queries(dashboard: &serde_json::Value) -> anyhow::Result<Vec<Query>> {
    let mut queries = Vec::new();
    let panels = dashboard["panels"].as_array().context("no panels")?;
    let nested = panels
        .iter()
        .filter_map(|panel| panel["panels"].as_array())
        .flatten();
    for panel in panels.iter().chain(nested) {
        let title = panel["title"].as_str().unwrap_or("untitled");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .with_context(|| format!("a target of {title} without expr"))?;
            queries.push(Query {
                source: title.to_owned(),
                expr: expr.to_owned(),
            });
        }
    }
    let variables = dashboard["templating"]["list"]
        .as_array()
        .context("no template variables")?;
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let name = variable["name"].as_str().unwrap_or("unnamed");
        let expr = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .with_context(|| format!("variable {name} without a query"))?;
        queries.push(Query {
            source: format!("variable {name}"),
            expr: expr.to_owned(),
        });
    }
    Ok(queries)
}

/// `label_values(<selector>, <label>)` (Grafana's variable query) as its selector and label.
pub fn label_values(expr: &str) -> Option<(&str, &str)> {
    let inner = expr
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim(), label.trim()))
}

/// PromQL's functions, aggregations and keywords: every other name in an expression is a
/// metric's.
const PROMQL_WORDS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "and",
    "atan2",
    "avg",
    "avg_over_time",
    "bool",
    "bottomk",
    "by",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count",
    "count_over_time",
    "count_values",
    "day_of_month",
    "day_of_week",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "group",
    "group_left",
    "group_right",
    "histogram_quantile",
    "hour",
    "idelta",
    "ignoring",
    "increase",
    "inf",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "log10",
    "log2",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "minute",
    "month",
    "nan",
    "offset",
    "on",
    "or",
    "predict_linear",
    "present_over_time",
    "quantile",
    "quantile_over_time",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "stddev",
    "stddev_over_time",
    "stdvar",
    "stdvar_over_time",
    "sum",
    "sum_over_time",
    "time",
    "timestamp",
    "topk",
    "unless",
    "vector",
    "without",
    "year",
];

/// Keywords followed by a list of label names in parentheses.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names an expression (PromQL with Grafana's `$variables`, or a `label_values`
/// variable query) reads. A name followed by `(` that is no PromQL function is an error.
pub fn metric_names(expr: &str) -> anyhow::Result<BTreeSet<String>> {
    let expr = label_values(expr).map_or(expr, |(selector, _)| selector);
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i)?,
            '{' => i = skip_group(&chars, i, '{', '}')?,
            '[' => i = skip_group(&chars, i, '[', ']')?,
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    i = skip_group(&chars, i, '{', '}')?;
                } else {
                    while i < chars.len() && is_name_char(chars[i]) {
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if is_name_start(c) => {
                let start = i;
                while i < chars.len() && is_name_char(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let before_paren = chars.get(next) == Some(&'(');
                if LABEL_LISTS.contains(&word.as_str()) && before_paren {
                    i = skip_group(&chars, next, '(', ')')?;
                } else if PROMQL_WORDS.contains(&word.to_lowercase().as_str()) {
                } else if before_paren {
                    bail!("{word}( is no PromQL function, in: {expr}");
                } else {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    Ok(names)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The index just past the string literal that starts at `start`.
fn skip_string(chars: &[char], start: usize) -> anyhow::Result<usize> {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return Ok(i + 1),
            _ => i += 1,
        }
    }
    bail!("an unclosed string literal")
}

/// The index just past the `close` that ends the group opened at `start` (strings inside
/// skipped).
fn skip_group(chars: &[char], start: usize, open: char, close: char) -> anyhow::Result<usize> {
    let mut depth = 0;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                i = skip_string(chars, i)?;
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    bail!("an unclosed {open}")
}

/// Series Prometheus makes itself for every target (not in any pgkube scrape).
pub const PROMETHEUS_MADE: &[&str] = &["up"];

/// Every metric name the dashboard's queries and the alerts' expressions read, with where.
pub fn used_metrics() -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    let dashboard: serde_json::Value = serde_json::from_str(&read(&dashboard_path()))?;
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for query in dashboard_queries(&dashboard)? {
        for name in metric_names(&query.expr)? {
            used.entry(name)
                .or_default()
                .insert(format!("dashboard: {}", query.source));
        }
    }
    for alert in alerts(&read(&plain_rules_path()))? {
        for name in metric_names(&alert.expr)? {
            used.entry(name)
                .or_default()
                .insert(format!("alert {}", alert.name));
        }
    }
    Ok(used)
}

/// The series names `docs/operations.md` documents: each metric-like name in backquotes in
/// the first cell of its tables' rows; for a histogram (a row whose description starts with
/// "histogram"), its `_bucket`, `_sum` and `_count`.
pub fn documented_metrics() -> BTreeSet<String> {
    let text = read(&root().join("docs/operations.md"));
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(metrics), Some(what)) = (cells.get(1), cells.get(3)) else {
            continue;
        };
        let histogram = what.starts_with("histogram");
        for (index, piece) in metrics.split('`').enumerate() {
            let quoted = index % 2 == 1;
            let metric_like = ["pgkube_", "operator_", "leader_election_"]
                .iter()
                .any(|prefix| piece.starts_with(prefix))
                && piece.chars().all(is_name_char);
            if !(quoted && metric_like) {
                continue;
            }
            if histogram {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{piece}{suffix}"));
                }
            } else {
                names.insert(piece.to_owned());
            }
        }
    }
    names
}

/// Runs the test bed's promtool with `args`.
pub fn promtool(env: &pgkube_testkit::TestEnv, args: &[&str]) -> Output {
    let program = env.bin_dir.join("promtool");
    std::process::Command::new(&program)
        .args(args)
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "{}: {error} (tests/testbed/up builds it; run it again)",
                program.display()
            )
        })
}

/// Its stdout and stderr together.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `expr` with Grafana's variables replaced by `values` (name without `$`), as Grafana sends
/// it to Prometheus.
pub fn substitute(expr: &str, values: &[(&str, &str)]) -> String {
    let mut out = expr.to_owned();
    // Longest names first, so that `$__range` does not cut `$__rate_interval`.
    let mut values = values.to_vec();
    values.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    for (name, value) in values {
        out = out.replace(&format!("${{{name}}}"), value);
        out = out.replace(&format!("${name}"), value);
    }
    out
}
