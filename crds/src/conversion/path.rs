//! Places in a JSON object, named by the keys from its root (`["spec", "storage", "size"]`):
//! reading, taking out and putting in, without looking at anything else.

use serde_json::{Map, Value};

/// A place in a JSON object: the keys from its root.
pub(crate) type Path = [&'static str];

/// `path` as `spec.storage.size`, for messages.
pub(crate) fn display(path: &Path) -> String {
    path.join(".")
}

/// The value at `path`, if each step on the way is an object that has the key.
pub(crate) fn get<'a>(value: &'a Value, path: &Path) -> Option<&'a Value> {
    path.iter()
        .try_fold(value, |node, key| node.as_object()?.get(*key))
}

/// The object at `path` (the root for an empty path), if there is one.
pub(crate) fn object_at<'a>(value: &'a Value, path: &Path) -> Option<&'a Map<String, Value>> {
    get(value, path)?.as_object()
}

/// The object at `path`, to change it.
pub(crate) fn object_at_mut<'a>(
    value: &'a mut Value,
    path: &Path,
) -> Option<&'a mut Map<String, Value>> {
    path.iter()
        .try_fold(value, |node, key| node.as_object_mut()?.get_mut(*key))?
        .as_object_mut()
}

/// Takes the value at `path` out of `value`, leaving the objects around it.
pub(crate) fn take(value: &mut Value, path: &Path) -> Option<Value> {
    let (last, parent) = path.split_last()?;
    object_at_mut(value, parent)?.remove(*last)
}

/// A place could not be reached: the value at this path is not an object.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotAnObject(pub(crate) &'static Path);

/// Puts `new` at `path` (replacing what is there), making the objects missing on the way.
pub(crate) fn put(value: &mut Value, path: &'static Path, new: Value) -> Result<(), NotAnObject> {
    let Some((last, parent)) = path.split_last() else {
        return Err(NotAnObject(path));
    };
    let mut node = value;
    for (depth, key) in parent.iter().enumerate() {
        let fields = node.as_object_mut().ok_or(NotAnObject(&path[..depth]))?;
        node = fields
            .entry(*key)
            .or_insert_with(|| Value::Object(Map::new()));
    }
    let fields = node.as_object_mut().ok_or(NotAnObject(parent))?;
    fields.insert((*last).to_owned(), new);
    Ok(())
}

/// Whether `path` is `prefix` or under it.
pub(crate) fn is_within(path: &Path, prefix: &Path) -> bool {
    path.starts_with(prefix)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn take_leaves_the_objects_around() {
        let mut value = json!({"a": {"b": {"c": 1, "d": 2}}});
        assert_eq!(take(&mut value, &["a", "b", "c"]), Some(json!(1)));
        assert_eq!(value, json!({"a": {"b": {"d": 2}}}));
        assert_eq!(take(&mut value, &["a", "x", "c"]), None);
        assert_eq!(take(&mut value, &["a", "b", "d", "e"]), None);
        assert_eq!(value, json!({"a": {"b": {"d": 2}}}));
    }

    #[test]
    fn put_makes_missing_objects_and_stops_at_other_values() {
        let mut value = json!({"a": {"keep": true}, "s": "text"});
        put(&mut value, &["a", "b", "c"], json!(1)).expect("put");
        assert_eq!(
            value,
            json!({"a": {"keep": true, "b": {"c": 1}}, "s": "text"})
        );
        assert_eq!(
            put(&mut value, &["s", "x"], json!(2)),
            Err(NotAnObject(&["s"]))
        );
        assert_eq!(
            put(&mut value, &["a", "keep", "x", "y"], json!(2)),
            Err(NotAnObject(&["a", "keep"]))
        );
    }

    #[test]
    fn get_follows_objects_only() {
        let value = json!({"a": [{"b": 1}], "c": {"d": null}});
        assert_eq!(get(&value, &["a", "0", "b"]), None);
        assert_eq!(get(&value, &["c", "d"]), Some(&Value::Null));
        assert_eq!(get(&value, &[]), Some(&value));
        assert!(object_at(&value, &["c"]).is_some());
        assert!(object_at(&value, &["a"]).is_none());
    }
}
