//! The entry point of the conversion webhook: an object as JSON in, the same object in the
//! desired `apiVersion` out.

use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{v1alpha1, v1beta1};

/// Why an object could not be converted. Each message is one line, fit for a ConversionReview's
/// failure.
#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    /// The object lacks `apiVersion` or `kind`.
    #[error("the object has no {0} string")]
    MissingField(&'static str),
    /// An `apiVersion` (of the object, or the desired one) that pgkube does not serve.
    #[error(
        "unknown apiVersion {0:?}: pgkube converts between db.example.com/v1alpha1 and db.example.com/v1beta1"
    )]
    UnknownApiVersion(String),
    /// A kind that is not pgkube's.
    #[error(
        "unknown kind {0:?}: pgkube converts PostgreSQLCluster, PostgreSQLBackup and PostgreSQLRestore"
    )]
    UnknownKind(String),
    /// The object does not parse as the kind and version it claims to be.
    #[error("not a valid {kind} of {api_version}: {source}")]
    InvalidObject {
        kind: String,
        api_version: String,
        source: serde_json::Error,
    },
    /// The converted object could not be written as JSON.
    #[error("the converted {kind} could not be written as JSON: {source}")]
    Unserializable {
        kind: String,
        source: serde_json::Error,
    },
}

/// `object` (a PostgreSQLCluster, PostgreSQLBackup or PostgreSQLRestore of
/// `db.example.com/v1alpha1` or `db.example.com/v1beta1`) converted to `desired_api_version`.
/// An object already in that version comes back unchanged. The converted object's metadata is
/// the original's, byte for byte, except for the annotation that carries the fields only one
/// version has (see [`crate::conversion`]).
pub fn convert(object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let from = Version::of(string_field(&object, "apiVersion")?)?;
    let to = Version::of(desired_api_version)?;
    let kind = string_field(&object, "kind")?;
    if from == to {
        return known_kind(kind).map(|_| object);
    }
    let converted = match known_kind(kind)? {
        Kind::Cluster => convert_kind::<v1alpha1::PostgreSQLCluster, v1beta1::PostgreSQLCluster>,
        Kind::Backup => convert_kind::<v1alpha1::PostgreSQLBackup, v1beta1::PostgreSQLBackup>,
        Kind::Restore => convert_kind::<v1alpha1::PostgreSQLRestore, v1beta1::PostgreSQLRestore>,
    };
    converted(object, to)
}

/// The API versions pgkube serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1alpha1,
    V1beta1,
}

impl Version {
    fn of(api_version: &str) -> Result<Self, ConversionError> {
        match api_version {
            v1alpha1::API_VERSION => Ok(Self::V1alpha1),
            v1beta1::API_VERSION => Ok(Self::V1beta1),
            other => Err(ConversionError::UnknownApiVersion(other.to_owned())),
        }
    }
}

/// pgkube's kinds.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Cluster,
    Backup,
    Restore,
}

fn known_kind(kind: &str) -> Result<Kind, ConversionError> {
    match kind {
        "PostgreSQLCluster" => Ok(Kind::Cluster),
        "PostgreSQLBackup" => Ok(Kind::Backup),
        "PostgreSQLRestore" => Ok(Kind::Restore),
        other => Err(ConversionError::UnknownKind(other.to_owned())),
    }
}

fn string_field<'a>(object: &'a Value, field: &'static str) -> Result<&'a str, ConversionError> {
    object
        .get(field)
        .and_then(Value::as_str)
        .ok_or(ConversionError::MissingField(field))
}

/// Converts `object`, of one kind's version `A` or `B`, to the version `to`.
fn convert_kind<A, B>(object: Value, to: Version) -> Result<Value, ConversionError>
where
    A: Resource<DynamicType = ()> + DeserializeOwned + Serialize + From<B>,
    B: Resource<DynamicType = ()> + DeserializeOwned + Serialize + From<A>,
{
    match to {
        Version::V1beta1 => retype::<A, B>(object),
        Version::V1alpha1 => retype::<B, A>(object),
    }
}

/// Parses `object` as a `Source`, converts it to a `Target`, and gives it back as JSON with the
/// original metadata but for the converted annotations.
fn retype<Source, Target>(object: Value) -> Result<Value, ConversionError>
where
    Source: Resource<DynamicType = ()> + DeserializeOwned,
    Target: Resource<DynamicType = ()> + Serialize + From<Source>,
{
    let original_metadata = object.get("metadata").cloned();
    let typed: Source =
        serde_json::from_value(object).map_err(|source| ConversionError::InvalidObject {
            kind: Source::kind(&()).into_owned(),
            api_version: Source::api_version(&()).into_owned(),
            source,
        })?;
    let mut converted = serde_json::to_value(Target::from(typed)).map_err(|source| {
        ConversionError::Unserializable {
            kind: Target::kind(&()).into_owned(),
            source,
        }
    })?;
    if let Some(metadata) = original_metadata {
        keep_metadata(&mut converted, metadata);
    }
    Ok(converted)
}

/// Puts the original `metadata` into `converted`, with the converted object's annotations: the
/// API server refuses a conversion that changes any other metadata, and the typed round trip
/// could reformat some (timestamps, for example).
fn keep_metadata(converted: &mut Value, mut metadata: Value) {
    let annotations = converted.pointer("/metadata/annotations").cloned();
    if let Some(fields) = metadata.as_object_mut() {
        match annotations {
            Some(annotations) => fields.insert("annotations".to_owned(), annotations),
            None => fields.remove("annotations"),
        };
    }
    if let Some(fields) = converted.as_object_mut() {
        fields.insert("metadata".to_owned(), metadata);
    }
}

#[cfg(test)]
mod tests;
