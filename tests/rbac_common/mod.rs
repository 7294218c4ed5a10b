//! RBAC rules as permissions: what each (API group, resource, verb[, object name]) a Role or
//! ClusterRole grants, shared by `tests/rbac_calls.rs` and `tests/deploy_rbac.rs`.

#![allow(dead_code)] // each test file uses a different part

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde::Deserialize as _;

/// What RBAC authorizes: a verb on a resource (with its subresource) of an API group.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub group: String,
    pub resource: String,
    pub verb: String,
    /// The one object it is for (a rule's `resourceNames`), or any.
    pub name: Option<String>,
}

impl Permission {
    pub fn new(group: &str, resource: &str, verb: &str) -> Permission {
        Permission {
            group: group.to_owned(),
            resource: resource.to_owned(),
            verb: verb.to_owned(),
            name: None,
        }
    }

    pub fn named(self, name: &str) -> Permission {
        Permission {
            name: Some(name.to_owned()),
            ..self
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {} ({group})", self.verb, self.resource)?;
        match &self.name {
            Some(name) => write!(f, " named {name}"),
            None => Ok(()),
        }
    }
}

/// Every (group, resource, verb[, name]) the Roles and ClusterRoles of a multi-document YAML
/// grant, with the role that grants it. Wildcards and non-resource URLs are refused: an exact
/// policy has none.
pub fn granted_permissions(yaml: &str) -> BTreeMap<Permission, String> {
    let mut granted = BTreeMap::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(document).expect("RBAC YAML parses");
        let kind = value["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let role = format!(
            "{kind} {}",
            value["metadata"]["name"].as_str().unwrap_or("?")
        );
        let rules: Vec<PolicyRule> =
            serde_yaml::from_value(value["rules"].clone()).expect("rules are PolicyRules");
        for rule in &rules {
            for permission in expand(rule, &role) {
                granted.insert(permission, role.clone());
            }
        }
    }
    granted
}

fn expand(rule: &PolicyRule, role: &str) -> Vec<Permission> {
    assert!(
        rule.non_resource_urls.is_none(),
        "{role}: a rule with nonResourceURLs: {rule:?}"
    );
    let names = rule.resource_names.clone().unwrap_or_default();
    let groups = rule.api_groups.clone().unwrap_or_default();
    let resources = rule.resources.clone().unwrap_or_default();
    let mut permissions = Vec::new();
    for group in &groups {
        for resource in &resources {
            for verb in &rule.verbs {
                assert!(
                    ![group, resource, verb].contains(&&"*".to_owned()),
                    "{role}: a wildcard in {rule:?}"
                );
                let permission = Permission::new(group, resource, verb);
                if names.is_empty() {
                    permissions.push(permission);
                } else {
                    permissions.extend(names.iter().map(|name| permission.clone().named(name)));
                }
            }
        }
    }
    permissions
}
