//! The entry point of the conversion webhook: an object as JSON in, the same object in the
//! desired `apiVersion` out. The JSON is converted as it is, without going through the Rust
//! types: only the fields at a different place in each version move (see [`super::plan`]).

use serde_json::Value;

use super::annotation::{NoAnnotations, carried_in, carry, remove};
use super::path::{NotAnObject, display};
use super::plan::{Direction, Move, Plan};
use super::reshape::{reshape, restore};
use super::{backup, cluster, restore as restore_kind};
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
    /// The object cannot take the converted fields: where they go (or the annotation that carries
    /// them) is something other than an object.
    #[error(
        "{kind} of {api_version}: {place} is not an object, so the converted fields have no place"
    )]
    NotAnObject {
        kind: String,
        api_version: String,
        place: String,
    },
}

/// `object` (a PostgreSQLCluster, PostgreSQLBackup or PostgreSQLRestore of
/// `db.example.com/v1alpha1` or `db.example.com/v1beta1`) converted to `desired_api_version`.
/// An object already in that version comes back unchanged. Otherwise only the fields at a
/// different place in each version move; everything else, fields the Rust types do not know
/// included, stays as it is, and no default is added. What has no place in the desired version
/// is carried in an annotation, and what such an annotation carries is put back (see
/// [`crate::conversion`]); the rest of the metadata is not touched.
pub fn convert(mut object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let from = Version::of(string_field(&object, "apiVersion")?)?;
    let to = Version::of(desired_api_version)?;
    let kind = known_kind(string_field(&object, "kind")?)?;
    if from == to {
        return Ok(object);
    }
    let direction = match to {
        Version::V1beta1 => Direction::Up,
        Version::V1alpha1 => Direction::Down,
    };
    let refused = |place: String| ConversionError::NotAnObject {
        kind: kind.name().to_owned(),
        api_version: from.api_version().to_owned(),
        place,
    };
    let plan = Plan::new(kind.moves(), direction);
    let carried =
        reshape(&mut object, &plan).map_err(|NotAnObject(path)| refused(display(path)))?;
    let reverse = Plan::new(kind.moves(), direction.reverse());
    let key = direction.reverse().annotation();
    if let Some(fields) = carried_in(&object, key)
        && restore(&mut object, &fields, &reverse)
    {
        remove(&mut object, key);
    }
    carry(&mut object, direction.annotation(), carried)
        .map_err(|NoAnnotations| refused("metadata.annotations".to_owned()))?;
    if let Some(fields) = object.as_object_mut() {
        fields.insert(
            "apiVersion".to_owned(),
            Value::String(to.api_version().to_owned()),
        );
    }
    Ok(object)
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

    fn api_version(self) -> &'static str {
        match self {
            Self::V1alpha1 => v1alpha1::API_VERSION,
            Self::V1beta1 => v1beta1::API_VERSION,
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

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Cluster => "PostgreSQLCluster",
            Kind::Backup => "PostgreSQLBackup",
            Kind::Restore => "PostgreSQLRestore",
        }
    }

    /// The kind's fields at a different place in each version.
    fn moves(self) -> &'static [Move] {
        match self {
            Kind::Cluster => cluster::MOVES,
            Kind::Backup => backup::MOVES,
            Kind::Restore => restore_kind::MOVES,
        }
    }
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

#[cfg(test)]
mod tests;
