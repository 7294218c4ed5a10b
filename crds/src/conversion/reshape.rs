//! The conversion of an object's JSON along a [`Plan`]: the moved fields go to their places in
//! the target version, what has no place there is taken out (to be carried in an annotation),
//! and what the reverse conversion carried is put back. Nothing else is looked at, so fields
//! neither version's types know stay where they are, and no default is added.

use serde_json::{Map, Value};

use super::path::{NotAnObject, Path, get, object_at, object_at_mut, put, take};
use super::plan::Plan;

/// Converts `object` along `plan`, in place. Gives back what has no place in the target
/// version, as an object holding each value at its source path (empty when there is none).
pub(crate) fn reshape(object: &mut Value, plan: &Plan) -> Result<Map<String, Value>, NotAnObject> {
    let moved: Vec<(&'static Path, &'static Path, Value)> = plan
        .moves
        .iter()
        .filter_map(|(from, to)| Some((*from, *to, take(object, from)?)))
        .collect();
    let mut carried = Value::Object(Map::new());
    for container in &plan.containers {
        let Some(rest) = take(object, container) else {
            continue;
        };
        // Left empty by the moves, it comes back with them; empty from the start, it is carried
        // so that it comes back too.
        let emptied = moved.iter().any(|(from, _, _)| from.starts_with(container));
        let keep = match &rest {
            Value::Object(fields) => !fields.is_empty() || !emptied,
            _ => true,
        };
        if keep {
            put(&mut carried, container, rest)?;
        }
    }
    for place in &plan.collisions {
        if let Some(value) = take(object, place) {
            put(&mut carried, place, value)?;
        }
    }
    for (_, to, value) in moved {
        put(object, to, value)?;
    }
    match carried {
        Value::Object(fields) => Ok(fields),
        _ => Ok(Map::new()),
    }
}

/// Puts `carried` back into `object`, which [`reshape`] along `plan`'s reverse gave: `carried`
/// is what [`reshape`] along `plan` took out of an object of the version `object` is now in.
///
/// All or nothing: only if `carried` is exactly what [`reshape`] along `plan` would take out of
/// the result, so that converting it again gives `carried` back. Otherwise `object` is left as
/// it is and `false` comes back: the annotation it came from was not written for this object.
pub(crate) fn restore(object: &mut Value, carried: &Value, plan: &Plan) -> bool {
    let items: Vec<(&'static Path, &Value)> = plan
        .carried_places()
        .filter_map(|place| Some((place, get(carried, place)?)))
        .collect();
    if items.is_empty() || !holds_only(carried, &items) {
        return false;
    }
    if !items
        .iter()
        .all(|(place, value)| fits(object, plan, place, value))
    {
        return false;
    }
    for (place, value) in items {
        // `fits` checked that the object around each place is there.
        let Some((key, parent)) = place.split_last() else {
            continue;
        };
        let Some(fields) = object_at_mut(object, parent) else {
            continue;
        };
        match (fields.get_mut(*key), value) {
            (Some(Value::Object(existing)), Value::Object(rest)) => existing.extend(rest.clone()),
            _ => {
                fields.insert((*key).to_owned(), value.clone());
            }
        }
    }
    true
}

/// Whether `carried` is made of `items` and nothing else: no other field, no empty object.
fn holds_only(carried: &Value, items: &[(&'static Path, &Value)]) -> bool {
    let mut rebuilt = Value::Object(Map::new());
    for (place, value) in items {
        if put(&mut rebuilt, place, (*value).clone()).is_err() {
            return false;
        }
    }
    rebuilt == *carried
}

/// Whether `value` can go back to `place` in `object` so that [`reshape`] along `plan` takes
/// exactly it out again, and leaves nothing behind that was not there.
fn fits(object: &Value, plan: &Plan, place: &Path, value: &Value) -> bool {
    let Some((_, parent)) = place.split_last() else {
        return false;
    };
    // Taking it out again would leave an object that was not there.
    if object_at(object, parent).is_none() {
        return false;
    }
    let is_container = plan.containers.contains(&place);
    let holds_moved =
        |fields: &Map<String, Value>| plan.moved_keys(place).any(|key| fields.contains_key(key));
    match (get(object, place), value) {
        // A collision, or what is left of a container that held no moved field.
        (None, Value::Object(fields)) => !is_container || !holds_moved(fields),
        (None, _) => true,
        // The rest of a container the moved fields are back in.
        (Some(Value::Object(_)), Value::Object(fields)) => {
            is_container && !fields.is_empty() && !holds_moved(fields)
        }
        (Some(_), _) => false,
    }
}

#[cfg(test)]
mod tests;
