//! Fields one version has no place for, carried in an annotation of the object in that version,
//! as the Kubernetes API conventions describe for lossless round trips.
//!
//! The annotation holds the fields as canonical JSON (compact, keys sorted), at the paths they
//! have in the version they come from, for example
//! `{"spec":{"storage":{"storageClassName":"fast"}}}`. Conversion writes only that form and
//! reads back only that form, and only what it would have written for the object it converts
//! back (see [`super::reshape::restore`]): any other value was not written by conversion, so it
//! is left exactly as it is (and nothing is read from it) rather than failing every read of the
//! object.

use serde_json::{Map, Value};

use super::path::{Path, get, object_at_mut};

/// On a v1alpha1 object: its fields that only v1beta1 has a place for, as canonical JSON.
pub const V1BETA1_FIELDS_ANNOTATION: &str = "conversion.db.example.com/v1beta1";
/// On a v1beta1 object: its fields that only v1alpha1 has a place for, as canonical JSON.
/// pgkube's own fields all have a place in v1beta1; this carries values v1beta1 would read as
/// something else (a field v1alpha1 does not know but v1beta1 uses the name of).
pub const V1ALPHA1_FIELDS_ANNOTATION: &str = "conversion.db.example.com/v1alpha1";

const ANNOTATIONS: &Path = &["metadata", "annotations"];

/// The metadata, or its annotations, is not an object: a field cannot be carried.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NoAnnotations;

/// Writes `carried` (if it holds anything) into the annotation `key` of `object`, replacing its
/// value; with nothing to carry, leaves `object` exactly as it is.
pub(crate) fn carry(
    object: &mut Value,
    key: &str,
    carried: Map<String, Value>,
) -> Result<(), NoAnnotations> {
    if carried.is_empty() {
        return Ok(());
    }
    let mut node = object;
    for step in ANNOTATIONS {
        let fields = node.as_object_mut().ok_or(NoAnnotations)?;
        node = fields
            .entry(*step)
            .or_insert_with(|| Value::Object(Map::new()));
        if node.is_null() {
            *node = Value::Object(Map::new());
        }
    }
    let annotations = node.as_object_mut().ok_or(NoAnnotations)?;
    let value = Value::Object(carried).to_string();
    annotations.insert(key.to_owned(), Value::String(value));
    Ok(())
}

/// The fields in the annotation `key` of `object`, if its value is an object written as
/// conversion writes it (compact, keys sorted).
pub(crate) fn carried_in(object: &Value, key: &str) -> Option<Value> {
    let text = get(object, ANNOTATIONS)?.get(key)?.as_str()?;
    let fields: Value = serde_json::from_str(text).ok()?;
    // Compared as text: the canonical form is the one `carry` writes.
    let canonical = fields.to_string();
    (fields.is_object() && canonical.as_str() == text).then_some(fields)
}

/// Removes the annotation `key` from `object`, and the annotation map if that leaves it empty
/// (the API server does not tell an empty map from none).
pub(crate) fn remove(object: &mut Value, key: &str) {
    let Some(metadata) = object_at_mut(object, &ANNOTATIONS[..1]) else {
        return;
    };
    let Some(Value::Object(annotations)) = metadata.get_mut(ANNOTATIONS[1]) else {
        return;
    };
    annotations.remove(key);
    if annotations.is_empty() {
        metadata.remove(ANNOTATIONS[1]);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const KEY: &str = "conversion.db.example.com/test";

    fn fields() -> Map<String, Value> {
        let Value::Object(fields) = json!({"spec": {"b": 1, "a": "x"}}) else {
            unreachable!("an object")
        };
        fields
    }

    #[test]
    fn carried_fields_are_written_compact_with_sorted_keys_and_read_back() {
        let mut object = json!({"metadata": {"name": "n", "annotations": {"team": "db"}}});
        carry(&mut object, KEY, fields()).expect("carried");
        assert_eq!(
            object["metadata"]["annotations"],
            json!({"team": "db", KEY: r#"{"spec":{"a":"x","b":1}}"#})
        );
        assert_eq!(carried_in(&object, KEY), Some(Value::Object(fields())));
        remove(&mut object, KEY);
        assert_eq!(
            object,
            json!({"metadata": {"name": "n", "annotations": {"team": "db"}}})
        );
    }

    #[test]
    fn the_annotation_map_is_made_and_goes_when_left_empty() {
        for mut object in [json!({}), json!({"metadata": {"annotations": null}})] {
            carry(&mut object, KEY, fields()).expect("carried");
            assert!(carried_in(&object, KEY).is_some());
            remove(&mut object, KEY);
            assert_eq!(object, json!({"metadata": {}}));
        }
    }

    #[test]
    fn nothing_to_carry_changes_nothing() {
        let mut object = json!({"metadata": {"annotations": {KEY: "kept as is"}}});
        let before = object.clone();
        carry(&mut object, KEY, Map::new()).expect("nothing to do");
        assert_eq!(object, before);
    }

    #[test]
    fn metadata_that_cannot_hold_annotations_is_an_error() {
        for mut object in [
            json!({"metadata": "text"}),
            json!({"metadata": {"annotations": ["a"]}}),
        ] {
            assert_eq!(carry(&mut object, KEY, fields()), Err(NoAnnotations));
        }
    }

    /// Values conversion did not write give nothing, whatever they are.
    #[test]
    fn other_values_give_nothing() {
        for value in [
            json!("not JSON"),
            json!(r#"{"spec": {"a": "x"}}"#),
            json!(r#"{"spec":{"b":1,"a":"x"}}"#),
            json!(r#"["spec"]"#),
            json!(""),
            json!(7),
        ] {
            let object = json!({"metadata": {"annotations": {KEY: value}}});
            assert_eq!(carried_in(&object, KEY), None, "{value}");
        }
    }
}
