//! Drift detection (pure): decides whether a child must be applied, so that an unchanged
//! cluster costs no write at all (a server-side apply is a write request even when it changes
//! nothing).
//!
//! Each applied child carries [`HASH_ANNOTATION`], a hash of the desired object as built. A
//! child is applied again when the hash differs (the desired object changed, including fields
//! that were removed from it) or when a field it sets no longer has the desired value in the
//! live object (someone edited or scaled it by hand). Fields the API server or other
//! controllers add are ignored, and quantities are compared by value because the server may
//! rewrite them (`0.5` becomes `500m`).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::quantity;

/// Annotation holding the hash of the desired object last applied.
pub const HASH_ANNOTATION: &str = "db.example.com/applied-hash";

/// The hex SHA-256 of the JSON of `desired` (object keys are sorted by serde_json's map).
pub fn desired_hash(desired: &Value) -> String {
    hex::encode(Sha256::digest(desired.to_string().as_bytes()))
}

/// `desired` with [`HASH_ANNOTATION`] set to its hash.
pub fn stamped(mut desired: Value) -> Value {
    let hash = desired_hash(&desired);
    if let Some(metadata) = desired.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(HASH_ANNOTATION.to_owned(), Value::String(hash));
        }
    }
    desired
}

/// Whether `live` is already what `stamped` (a [`stamped`] desired object) asks for.
pub fn is_up_to_date(stamped: &Value, live: &Value) -> bool {
    // Runs for every child on every reconcile: reads the hashes in place, allocating nothing.
    hash_of(stamped).is_some() && hash_of(stamped) == hash_of(live) && contains(live, stamped)
}

/// The [`HASH_ANNOTATION`] of `object`, read in place.
fn hash_of(object: &Value) -> Option<&Value> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(HASH_ANNOTATION)
}

/// Whether every field set in `desired` has the same value in `live`.
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(key, wanted)| {
            match have.get(key) {
                Some(value) => contains(value, wanted),
                // The server drops empty values.
                None => is_empty(wanted),
            }
        }),
        (Value::Object(want), Value::Null) => want.values().all(is_empty),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| contains(h, w))
        }
        (Value::Array(want), Value::Null) => want.is_empty(),
        (Value::String(want), Value::String(have)) => {
            want == have || quantity::same_value(want, have)
        }
        (Value::Null, _) => true,
        (want, have) => want == have,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.values().all(is_empty),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn desired() -> Value {
        stamped(json!({
            "metadata": {"name": "main-postgresql", "labels": {"app": "pg"}},
            "spec": {
                "replicas": 3,
                "template": {"spec": {"containers": [{"name": "pg", "resources": {"requests": {"cpu": "0.5"}}}]}},
            }
        }))
    }

    /// What the API server returns for `desired()`: defaults added, quantities normalized.
    fn live() -> Value {
        let mut live = desired();
        live["metadata"]["uid"] = json!("1234");
        live["metadata"]["annotations"]["other"] = json!("x");
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
            json!("500m");
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            json!("IfNotPresent");
        live["status"] = json!({"readyReplicas": 3});
        live
    }

    /// Live children carry hashes made by earlier versions: the format must not change, or every
    /// child would be applied again after an upgrade.
    #[test]
    fn the_hash_is_the_lowercase_hex_sha256_of_the_json() {
        assert_eq!(
            desired_hash(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn a_live_object_with_server_defaults_is_up_to_date() {
        assert!(is_up_to_date(&desired(), &live()));
    }

    #[test]
    fn a_field_changed_by_hand_is_drift() {
        let mut scaled = live();
        scaled["spec"]["replicas"] = json!(5);
        assert!(!is_up_to_date(&desired(), &scaled));
        let mut relabeled = live();
        relabeled["metadata"]["labels"] = json!({});
        assert!(!is_up_to_date(&desired(), &relabeled));
    }

    #[test]
    fn a_changed_desired_object_is_detected_by_its_hash() {
        let mut smaller = desired();
        smaller["spec"]
            .as_object_mut()
            .expect("spec is an object")
            .remove("template");
        // The live object still contains everything the new desired object sets...
        assert!(contains(&live(), &smaller));
        // ...but the hash tells that it was built from something else.
        let restamped = stamped(serde_json::from_value::<Value>(smaller).expect("json"));
        assert!(!is_up_to_date(&restamped, &live()));
    }

    #[test]
    fn an_object_without_the_hash_is_applied() {
        let mut unstamped = live();
        unstamped["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(HASH_ANNOTATION);
        assert!(!is_up_to_date(&desired(), &unstamped));
    }
}
