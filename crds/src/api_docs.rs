//! The API reference (`docs/api.md`), rendered from the CRDs' schemas (pure): for each kind, its
//! group, version and short names, the rules the API server checks, and a table of every field
//! with its type, bounds, default and description. Fields of Kubernetes' own types (affinity,
//! tolerations, resources, ...) are named, not expanded: the Kubernetes API reference has them.
//!
//! `pgkube api-docs` prints it; a test fails when the committed file differs.

use std::fmt::Write as _;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// Fields of Kubernetes' own types, by name, and the type's name.
const KUBERNETES_TYPES: &[(&str, &str)] = &[
    ("affinity", "Affinity"),
    ("tolerations", "Toleration"),
    ("resources", "ResourceRequirements"),
    ("topologySpreadConstraints", "TopologySpreadConstraint"),
    ("postgresFrom", "NetworkPolicyPeer"),
    ("conditions", "Condition"),
    ("caBundle", "SecretKeySelector"),
    ("accessKeyId", "SecretKeySelector"),
    ("secretAccessKey", "SecretKeySelector"),
];

/// The reference of `crds`, each in its first (preferred) version.
pub fn api_markdown(crds: &[CustomResourceDefinition]) -> String {
    let mut out = String::from(
        "# API reference\n\n\
         Generated from the CRD schemas by `pgkube api-docs > docs/api.md`; do not edit by hand \
         (`crds/tests/generated_yaml.rs` fails when this file and the types differ). Each kind \
         is shown in its preferred version; [api-versions.md](api-versions.md) says how the \
         others convert.\n",
    );
    for crd in crds {
        render_kind(&mut out, crd);
    }
    out
}

fn render_kind(out: &mut String, crd: &CustomResourceDefinition) {
    let Some(version) = crd.spec.versions.first() else {
        return;
    };
    let names = &crd.spec.names;
    let _ = write!(
        out,
        "\n## {}\n\n`{}/{}`, {}",
        names.kind,
        crd.spec.group,
        version.name,
        crd.spec.scope.to_lowercase()
    );
    let short_names = names.short_names.clone().unwrap_or_default();
    if !short_names.is_empty() {
        let _ = write!(out, "; short names: `{}`", short_names.join("`, `"));
    }
    let other_versions: Vec<&str> = crd.spec.versions[1..]
        .iter()
        .map(|version| version.name.as_str())
        .collect();
    if !other_versions.is_empty() {
        let _ = write!(out, "; also served as `{}`", other_versions.join("`, `"));
    }
    out.push_str(".\n");
    let schema = version
        .schema
        .as_ref()
        .and_then(|schema| schema.open_api_v3_schema.as_ref())
        .and_then(|schema| serde_json::to_value(schema).ok())
        .unwrap_or(Value::Null);
    let mut rows = Vec::new();
    let mut rules = Vec::new();
    walk(&schema, "", &mut rows, &mut rules);
    if !rules.is_empty() {
        out.push_str("\nRules the API server checks:\n\n");
        for (path, message) in rules {
            let _ = writeln!(out, "- `{path}`: {message}");
        }
    }
    out.push_str("\n| Field | Type | Description |\n|---|---|---|\n");
    for row in rows {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            row.path, row.kind, row.description
        );
    }
}

struct Row {
    path: String,
    kind: String,
    description: String,
}

/// Adds a row for each property of `schema` under `path` (and theirs), and each rule.
fn walk(schema: &Value, path: &str, rows: &mut Vec<Row>, rules: &mut Vec<(String, String)>) {
    collect_rules(schema, path, rules);
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required = string_list(schema.get("required"));
    for (name, property) in properties {
        if path.is_empty() && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let field = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let kubernetes = KUBERNETES_TYPES
            .iter()
            .find(|(known, _)| known == name)
            .map(|(_, kind)| *kind);
        rows.push(Row {
            path: field.clone(),
            kind: type_cell(property, required.contains(name), kubernetes),
            description: one_line(property.get("description")),
        });
        if kubernetes.is_some() {
            continue;
        }
        match property.get("items") {
            Some(items) if property.get("type") == Some(&Value::from("array")) => {
                walk(items, &format!("{field}[]"), rows, rules);
            }
            _ => walk(property, &field, rows, rules),
        }
    }
}

/// The CEL rules of `schema`, with the path they apply to.
fn collect_rules(schema: &Value, path: &str, rules: &mut Vec<(String, String)>) {
    let Some(validations) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    else {
        return;
    };
    let at = if path.is_empty() { "." } else { path };
    for rule in validations {
        let message = rule
            .get("message")
            .or_else(|| rule.get("rule"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        rules.push((at.to_owned(), escape(message)));
    }
}

/// The type of a field, with what bounds it: required, enum values, range, length, default.
fn type_cell(schema: &Value, required: bool, kubernetes: Option<&str>) -> String {
    let is_array = schema.get("type") == Some(&Value::from("array"));
    let mut parts = vec![match kubernetes {
        Some(kind) if is_array => format!("[]{kind} (Kubernetes)"),
        Some(kind) => format!("{kind} (Kubernetes)"),
        None => base_type(schema),
    }];
    if required {
        parts.push("required".to_owned());
    }
    let values = schema
        .get("enum")
        .and_then(Value::as_array)
        .map(|values| values.iter().map(compact).collect::<Vec<_>>());
    if let Some(values) = values.filter(|values| !values.is_empty()) {
        parts.push(format!("one of {}", values.join(", ")));
    }
    let bound = |key: &str| schema.get(key).map(compact);
    match (bound("minimum"), bound("maximum")) {
        (Some(min), Some(max)) => parts.push(format!("{min} to {max}")),
        (Some(min), None) => parts.push(format!("at least {min}")),
        (None, Some(max)) => parts.push(format!("at most {max}")),
        (None, None) => {}
    }
    match (bound("minLength"), bound("maxLength")) {
        (Some(min), Some(max)) => parts.push(format!("{min} to {max} characters")),
        (None, Some(max)) => parts.push(format!("at most {max} characters")),
        (Some(min), None) => parts.push(format!("at least {min} characters")),
        (None, None) => {}
    }
    if let Some(default) = schema.get("default") {
        parts.push(format!("default {}", compact(default)));
    }
    parts.join(", ")
}

fn base_type(schema: &Value) -> String {
    let kind = schema.get("type").and_then(Value::as_str);
    match kind {
        Some("array") => {
            let items = schema.get("items").map(base_type).unwrap_or_default();
            format!("[]{items}")
        }
        Some("object") => match schema.get("additionalProperties") {
            Some(values) if values.is_object() => format!("map of {}", base_type(values)),
            _ => "object".to_owned(),
        },
        Some("string") => match schema.get("format").and_then(Value::as_str) {
            Some(format) => format!("string ({format})"),
            None => "string".to_owned(),
        },
        Some(other) => other.to_owned(),
        None if schema.get("x-kubernetes-int-or-string").is_some() => {
            "integer or string".to_owned()
        }
        None => "any".to_owned(),
    }
}

/// A JSON value as it is written in a manifest, in backquotes (a whole number without `.0`,
/// as the schema's bounds are floats).
fn compact(value: &Value) -> String {
    let whole = value
        .as_f64()
        .filter(|number| number.fract() == 0.0 && number.abs() < 1e15)
        .map(|number| format!("{number:.0}"));
    format!("`{}`", escape(&whole.unwrap_or_else(|| value.to_string())))
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A description on one line of a table.
fn one_line(description: Option<&Value>) -> String {
    let text = description.and_then(Value::as_str).unwrap_or_default();
    escape(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Text safe in a table cell.
fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_shows_its_bounds_default_and_description_on_one_line() {
        let schema = serde_json::json!({
            "type": "object",
            "required": ["size"],
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "immutable"}],
            "properties": {
                "size": {"type": "integer", "minimum": 1.0, "maximum": 10, "default": 1,
                         "description": "How many.\nAt most ten | or less."},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "tolerations": {"type": "array", "items": {"type": "object",
                                "properties": {"key": {"type": "string"}}}},
                "items": {"type": "array", "items": {"type": "object",
                          "properties": {"name": {"type": "string", "maxLength": 63}}}},
            }
        });
        let (mut rows, mut rules) = (Vec::new(), Vec::new());
        walk(&schema, "spec", &mut rows, &mut rules);
        let table: Vec<(String, String, String)> = rows
            .into_iter()
            .map(|row| (row.path, row.kind, row.description))
            .collect();
        let row = |path: &str, kind: &str, description: &str| {
            (path.to_owned(), kind.to_owned(), description.to_owned())
        };
        assert_eq!(
            table,
            [
                row("spec.items", "[]object", ""),
                row("spec.items[].name", "string, at most `63` characters", ""),
                row("spec.labels", "map of string", ""),
                row("spec.mode", "string, one of `\"a\"`, `\"b\"`", ""),
                row(
                    "spec.size",
                    "integer, required, `1` to `10`, default `1`",
                    "How many. At most ten \\| or less."
                ),
                row("spec.tolerations", "[]Toleration (Kubernetes)", ""),
            ]
        );
        assert_eq!(rules, [("spec".to_owned(), "immutable".to_owned())]);
    }
}
