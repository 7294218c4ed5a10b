//! Metrics of the user's own queries, in postgres_exporter's queries format (pure): a YAML map
//! from a query's name to its `query` and its `metrics`, a list of one-key maps from a result
//! column to its `usage` (`LABEL`, `GAUGE`, `COUNTER` or `DISCARD`) and `description`. Each row
//! gives one sample of each `GAUGE` and `COUNTER` column, named `<query>_<column>`, labelled by
//! the row's `LABEL` columns. A counter gets OpenMetrics' `_total` suffix.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;

/// One query of the file.
#[derive(Clone, Debug, PartialEq)]
pub struct CustomQuery {
    pub name: String,
    pub query: String,
    /// Each column's use, in the file's order.
    pub columns: Vec<Column>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    pub name: String,
    pub usage: Usage,
    pub description: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Usage {
    Label,
    Gauge,
    Counter,
    Discard,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueryEntry {
    query: String,
    #[serde(default)]
    metrics: Vec<BTreeMap<String, ColumnEntry>>,
    /// postgres_exporter's switches; every query here runs on the instance's own server.
    #[serde(default, rename = "master")]
    _master: Option<bool>,
    #[serde(default, rename = "cache_seconds")]
    _cache_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnEntry {
    usage: Usage,
    #[serde(default)]
    description: String,
}

/// The queries of a file's text, or why it cannot be used (naming the query).
pub fn parse(text: &str) -> Result<Vec<CustomQuery>, String> {
    let entries: BTreeMap<String, QueryEntry> =
        serde_yaml::from_str(text).map_err(|error| format!("not a queries file: {error}"))?;
    let mut queries = Vec::new();
    for (name, entry) in entries {
        let mut columns = Vec::new();
        for column in entry.metrics {
            for (column_name, column) in column {
                let metric = format!("{name}_{column_name}");
                if column.usage != Usage::Label && !valid_metric_name(&metric) {
                    return Err(format!("query {name}: {metric} is not a metric name"));
                }
                columns.push(Column {
                    name: column_name,
                    usage: column.usage,
                    description: column.description,
                });
            }
        }
        if !columns
            .iter()
            .any(|c| matches!(c.usage, Usage::Gauge | Usage::Counter))
        {
            return Err(format!("query {name}: no GAUGE or COUNTER column"));
        }
        queries.push(CustomQuery {
            name,
            query: entry.query,
            columns,
        });
    }
    Ok(queries)
}

fn valid_metric_name(name: &str) -> bool {
    let mut characters = name.chars();
    characters
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && characters.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A result row: each column's name and text value (NULL: `None`).
pub type Row = Vec<(String, Option<String>)>;

/// What one scrape got for the custom queries: the file's queries with each one's rows, or
/// why none ran.
#[derive(Clone, Debug, PartialEq)]
pub enum CustomResults {
    /// The file could not be read or parsed.
    Invalid,
    /// Each query, with its rows or `None` when it failed.
    Ran(Vec<(CustomQuery, Option<Vec<Row>>)>),
}

type Labels = Vec<(String, String)>;

/// The OpenMetrics text of `results`: `pgkube_postgres_custom_queries_valid`, each query's
/// `pgkube_postgres_custom_query_up`, and the queries' own metrics.
pub fn render(results: &CustomResults) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let valid = Gauge::<i64>::default();
    valid.set(i64::from(matches!(results, CustomResults::Ran(_))));
    registry.register(
        "pgkube_postgres_custom_queries_valid",
        "whether the custom queries file could be read and parsed",
        valid,
    );
    if let CustomResults::Ran(ran) = results {
        let up = Family::<Labels, Gauge>::default();
        for (query, rows) in ran {
            up.get_or_create(&vec![("query".to_owned(), query.name.clone())])
                .set(i64::from(rows.is_some()));
            if let Some(rows) = rows {
                register_query(&mut registry, query, rows);
            }
        }
        registry.register(
            "pgkube_postgres_custom_query_up",
            "whether the custom query ran in the last scrape",
            up,
        );
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

fn register_query(registry: &mut Registry, query: &CustomQuery, rows: &[Row]) {
    let labels_of = |row: &Row| -> Labels {
        query
            .columns
            .iter()
            .filter(|column| column.usage == Usage::Label)
            .map(|column| {
                (
                    column.name.clone(),
                    value_of(row, &column.name).unwrap_or_default(),
                )
            })
            .collect()
    };
    for column in &query.columns {
        let name = format!("{}_{}", query.name, column.name);
        let values = rows.iter().filter_map(|row| {
            let value = value_of(row, &column.name)?.parse::<f64>().ok()?;
            Some((labels_of(row), value))
        });
        match column.usage {
            Usage::Gauge => {
                let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
                for (labels, value) in values {
                    family.get_or_create(&labels).set(value);
                }
                registry.register(name, column.description.clone(), family);
            }
            Usage::Counter => {
                let family = Family::<Labels, Counter<f64, AtomicU64>>::default();
                for (labels, value) in values {
                    family.get_or_create(&labels).inc_by(value);
                }
                registry.register(name, column.description.clone(), family);
            }
            Usage::Label | Usage::Discard => {}
        }
    }
}

/// A row as `row_to_json` gives it: each column's value as text (a boolean as 1 or 0, as
/// postgres_exporter reads it), in the row's order.
pub fn json_row(json: &str) -> anyhow::Result<Row> {
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json)?;
    Ok(object
        .into_iter()
        .map(|(column, value)| {
            let text = match value {
                serde_json::Value::Null => None,
                serde_json::Value::Bool(flag) => Some(u8::from(flag).to_string()),
                serde_json::Value::String(text) => Some(text),
                other => Some(other.to_string()),
            };
            (column, text)
        })
        .collect())
}

fn value_of(row: &Row, column: &str) -> Option<String> {
    row.iter()
        .find(|(name, _)| name == column)
        .and_then(|(_, value)| value.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
pg_table:
  query: "SELECT relname, n_live_tup, seq_scan FROM pg_stat_user_tables"
  master: true
  metrics:
    - relname:
        usage: "LABEL"
        description: "Name of the table"
    - n_live_tup:
        usage: "GAUGE"
        description: "Live rows"
    - seq_scan:
        usage: "COUNTER"
        description: "Sequential scans"
"#;

    fn row(values: &[(&str, Option<&str>)]) -> Row {
        values
            .iter()
            .map(|(name, value)| ((*name).to_owned(), value.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn each_row_gives_a_sample_of_each_gauge_and_counter_labelled_by_its_labels() {
        let queries = parse(FILE).expect("parses");
        assert_eq!(queries.len(), 1);
        let rows = vec![
            row(&[
                ("relname", Some("orders")),
                ("n_live_tup", Some("42")),
                ("seq_scan", Some("7")),
            ]),
            row(&[
                ("relname", Some("items")),
                ("n_live_tup", None),
                ("seq_scan", Some("1")),
            ]),
        ];
        let text =
            render(&CustomResults::Ran(vec![(queries[0].clone(), Some(rows))])).expect("renders");
        for line in [
            "pgkube_postgres_custom_queries_valid 1",
            "pgkube_postgres_custom_query_up{query=\"pg_table\"} 1",
            "pg_table_n_live_tup{relname=\"orders\"} 42.0",
            "pg_table_seq_scan_total{relname=\"orders\"} 7.0",
            "pg_table_seq_scan_total{relname=\"items\"} 1.0",
            "# HELP pg_table_n_live_tup Live rows.",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        assert!(
            !text.contains("n_live_tup{relname=\"items\"}"),
            "NULL is no sample"
        );
        let failed =
            render(&CustomResults::Ran(vec![(queries[0].clone(), None)])).expect("renders");
        assert!(failed.contains("pgkube_postgres_custom_query_up{query=\"pg_table\"} 0"));
        let invalid = render(&CustomResults::Invalid).expect("renders");
        assert!(invalid.contains("pgkube_postgres_custom_queries_valid 0"));
    }

    #[test]
    fn rows_read_as_json_keep_text_numbers_and_booleans_as_one_or_zero() {
        let row = json_row(r#"{"name":"orders","rows":42,"ratio":0.5,"hot":true,"gone":null}"#)
            .expect("a row");
        let value = |column: &str| value_of(&row, column);
        assert_eq!(value("name").as_deref(), Some("orders"));
        assert_eq!(value("rows").as_deref(), Some("42"));
        assert_eq!(value("ratio").as_deref(), Some("0.5"));
        assert_eq!(value("hot").as_deref(), Some("1"));
        assert_eq!(value("gone"), None);
    }

    #[test]
    fn a_bad_file_is_refused_naming_what_is_wrong() {
        assert!(parse("- not a map").is_err());
        let unknown_usage = FILE.replace("\"COUNTER\"", "\"HISTOGRAM\"");
        assert!(parse(&unknown_usage).is_err());
        let bad_name = FILE.replace("pg_table:", "pg-table:");
        let refused = parse(&bad_name).expect_err("a dash");
        assert!(
            refused.contains("pg-table_n_live_tup is not a metric name"),
            "{refused}"
        );
        let only_labels =
            "q:\n  query: SELECT 1 AS a\n  metrics:\n    - a:\n        usage: LABEL\n";
        assert!(
            parse(only_labels)
                .expect_err("no value")
                .contains("no GAUGE or COUNTER")
        );
    }
}
