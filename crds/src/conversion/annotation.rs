//! Fields one version has and the other lacks, carried in an annotation of the other version's
//! object, as the Kubernetes API conventions describe for lossless round trips.
//!
//! The annotation holds the fields as canonical JSON (compact, keys sorted), at the paths they
//! have in the version they come from, for example
//! `{"spec":{"storage":{"storageClassName":"fast"}}}`. Conversion writes only that form and
//! reads back only that form: a value that does not parse, lacks the fields, has others, or is
//! written differently (spacing, key order) was not written by conversion, so it is left exactly
//! as it is (and the fields stay unset) rather than failing every read of the object. That
//! makes v1alpha1 -> v1beta1 -> v1alpha1 the identity whatever the annotation holds.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// On a v1alpha1 object: its fields that only v1beta1 has, as canonical JSON.
pub const V1BETA1_FIELDS_ANNOTATION: &str = "conversion.db.example.com/v1beta1";
/// On a v1beta1 object: its fields that only v1alpha1 has. Reserved: v1alpha1 has none today,
/// so conversion neither writes nor reads it.
pub const V1ALPHA1_FIELDS_ANNOTATION: &str = "conversion.db.example.com/v1alpha1";

/// A set of fields carried in an annotation.
pub(crate) trait CarriedFields: Sized {
    /// The fields as JSON; its compact form is the annotation's value.
    fn to_json(&self) -> Value;
    /// The fields in `json`, if it has them. Anything else in it makes [`take_carried`] leave
    /// the annotation alone, since [`Self::to_json`] then does not give it back.
    fn from_json(json: &Value) -> Option<Self>;
}

/// Writes `fields` into the annotation `key` (replacing its value) when there are any; with
/// none, leaves the metadata exactly as it is.
pub(crate) fn carry<T: CarriedFields>(metadata: &mut ObjectMeta, key: &str, fields: Option<T>) {
    let Some(fields) = fields else { return };
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), fields.to_json().to_string());
}

/// Takes the fields out of the annotation `key` when conversion wrote it, and removes it (and an
/// annotation map left empty). Any other value stays where it is and gives no fields.
pub(crate) fn take_carried<T: CarriedFields>(metadata: &mut ObjectMeta, key: &str) -> Option<T> {
    let annotations = metadata.annotations.as_mut()?;
    let fields = parse_canonical::<T>(annotations.get(key)?)?;
    annotations.remove(key);
    if annotations.is_empty() {
        metadata.annotations = None;
    }
    Some(fields)
}

/// The fields in `value` if it is exactly what [`carry`] writes for them.
fn parse_canonical<T: CarriedFields>(value: &str) -> Option<T> {
    let json: Value = serde_json::from_str(value).ok()?;
    let fields = T::from_json(&json)?;
    let canonical = fields.to_json().to_string();
    (canonical == value).then_some(fields)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, PartialEq)]
    struct Color {
        color: String,
    }

    impl CarriedFields for Color {
        fn to_json(&self) -> Value {
            json!({ "color": self.color })
        }

        fn from_json(json: &Value) -> Option<Self> {
            let color = json.get("color")?.as_str()?.to_owned();
            Some(Self { color })
        }
    }

    const KEY: &str = "conversion.db.example.com/test";

    fn metadata_with(annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn carried_fields_come_back_and_the_annotation_goes() {
        let mut metadata = metadata_with(&[("team", "db")]);
        let blue = Color {
            color: "blue".into(),
        };
        carry(&mut metadata, KEY, Some(blue));
        assert_eq!(
            metadata,
            metadata_with(&[("team", "db"), (KEY, r#"{"color":"blue"}"#)])
        );
        let taken = take_carried::<Color>(&mut metadata, KEY);
        assert_eq!(taken.map(|c| c.color).as_deref(), Some("blue"));
        assert_eq!(metadata, metadata_with(&[("team", "db")]));
    }

    #[test]
    fn an_annotation_map_left_empty_goes_too() {
        let mut metadata = ObjectMeta::default();
        carry(
            &mut metadata,
            KEY,
            Some(Color {
                color: "red".into(),
            }),
        );
        assert!(take_carried::<Color>(&mut metadata, KEY).is_some());
        assert_eq!(metadata.annotations, None);
    }

    #[test]
    fn nothing_to_carry_changes_nothing() {
        let mut metadata = metadata_with(&[(KEY, "kept as is")]);
        carry::<Color>(&mut metadata, KEY, None);
        assert_eq!(metadata, metadata_with(&[(KEY, "kept as is")]));
    }

    /// Values conversion did not write are left alone, whatever they are.
    #[test]
    fn other_values_are_kept_and_give_no_fields() {
        for value in [
            "not JSON",
            r#"{"color":"blue","size":3}"#,
            r#"{"color": "blue"}"#,
            r#"{}"#,
            "",
        ] {
            let mut metadata = metadata_with(&[(KEY, value)]);
            assert_eq!(take_carried::<Color>(&mut metadata, KEY), None, "{value}");
            assert_eq!(metadata, metadata_with(&[(KEY, value)]));
        }
    }
}
