//! Reshaping and restoring along the cluster's plans: what is carried, and when carried fields
//! are put back or refused.

use serde_json::{Value, json};

use super::*;
use crate::conversion::cluster::MOVES;
use crate::conversion::plan::{Direction, Plan};

fn fields(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(fields) => fields,
        other => panic!("not an object: {other}"),
    }
}

#[test]
fn moved_fields_move_and_everything_else_stays() {
    let mut object = json!({
        "spec": {"version": "16", "storage": "1Gi", "future": {"a": [1, 2]},
                 "backup": {"schedule": "@daily", "s3": {"bucket": "b", "new": 1}, "knob": true}},
        "status": {"phase": "Running", "later": null},
    });
    let carried = reshape(&mut object, &Plan::new(MOVES, Direction::Up)).expect("reshaped");
    assert!(carried.is_empty());
    assert_eq!(
        object,
        json!({
            "spec": {"postgresVersion": "16", "storage": {"size": "1Gi"}, "future": {"a": [1, 2]},
                     "backup": {"schedule": {"cron": "@daily"},
                                "storage": {"s3": {"bucket": "b", "new": 1}}, "knob": true}},
            "status": {"phase": "Running", "later": null},
        })
    );
}

#[test]
fn what_only_v1beta1_has_is_taken_out_going_down() {
    let mut object = json!({
        "spec": {"postgresVersion": "16", "version": "not v1beta1's",
                 "storage": {"size": "1Gi", "storageClassName": "fast", "iops": 3000},
                 "backup": {"schedule": {"cron": "@daily"}, "retention": {},
                            "storage": "odd", "suspend": "not v1beta1's"}},
    });
    let carried = reshape(&mut object, &Plan::new(MOVES, Direction::Down)).expect("reshaped");
    assert_eq!(
        object,
        json!({"spec": {"version": "16", "storage": "1Gi", "backup": {"schedule": "@daily"}}})
    );
    assert_eq!(
        carried,
        fields(json!({"spec": {
            "version": "not v1beta1's",
            "storage": {"storageClassName": "fast", "iops": 3000},
            "backup": {"retention": {}, "storage": "odd", "suspend": "not v1beta1's"},
        }}))
    );
}

/// v1beta1 fields carried down, put back after converting up.
fn carried_down() -> (Value, Value) {
    let mut alpha =
        json!({"spec": {"version": "16", "storage": "1Gi", "backup": {"schedule": "@daily"}}});
    reshape(&mut alpha, &Plan::new(MOVES, Direction::Up)).expect("reshaped");
    let carried = json!({"spec": {"storage": {"storageClassName": "fast"},
                                  "backup": {"retention": {"keep": 2}}}});
    (alpha, carried)
}

#[test]
fn carried_fields_go_back_beside_the_moved_ones() {
    let (mut object, carried) = carried_down();
    assert!(restore(
        &mut object,
        &carried,
        &Plan::new(MOVES, Direction::Down)
    ));
    assert_eq!(
        object,
        json!({"spec": {"postgresVersion": "16",
                        "storage": {"size": "1Gi", "storageClassName": "fast"},
                        "backup": {"schedule": {"cron": "@daily"}, "retention": {"keep": 2}}}})
    );
}

/// Each of these is something reshaping going down never carries for this object: it is refused
/// as a whole, and the object is left as it was.
#[test]
fn what_does_not_fit_is_refused_whole() {
    let down = Plan::new(MOVES, Direction::Down);
    for carried in [
        // A moved field: reshaping takes it out before the container.
        json!({"spec": {"storage": {"size": "2Gi"}}}),
        // An empty rest of a container the moved fields are in: never carried.
        json!({"spec": {"storage": {}}}),
        // Not an object, where a moved field is.
        json!({"spec": {"backup": {"schedule": "weekly"}}}),
        // A place nothing is carried from.
        json!({"spec": {"replicas": 3}}),
        json!({"spec": {"storage": {"storageClassName": "fast"}}, "status": {}}),
        // An empty object on the way.
        json!({"spec": {"storage": {"storageClassName": "fast"}, "bootstrap": {}}}),
        // The object around it is not there: taking it out again would leave one.
        json!({"spec": {"bootstrap": {"source": {"storage": {"gcs": {}}}}}}),
        // Nothing at all.
        json!({}),
    ] {
        let (mut object, _) = carried_down();
        let before = object.clone();
        assert!(!restore(&mut object, &carried, &down), "{carried}");
        assert_eq!(object, before, "{carried}");
    }
}

#[test]
fn a_place_already_taken_is_refused() {
    let (mut object, _) = carried_down();
    object["spec"]["version"] = json!("there");
    let before = object.clone();
    let carried = json!({"spec": {"version": "carried"}});
    assert!(!restore(
        &mut object,
        &carried,
        &Plan::new(MOVES, Direction::Down)
    ));
    assert_eq!(object, before);
}

/// The rest of a container that the object lacks never holds a moved field: reshaping would
/// have moved it.
#[test]
fn a_moved_field_in_the_rest_of_a_missing_container_is_refused() {
    let mut object = json!({"spec": {"postgresVersion": "16"}});
    let before = object.clone();
    let down = Plan::new(MOVES, Direction::Down);
    for carried in [
        json!({"spec": {"storage": {"size": "1Gi"}}}),
        json!({"spec": {"backup": {"schedule": {"cron": "@daily", "jitter": 5}}}}),
    ] {
        object["spec"]["backup"] = json!({});
        let with_backup = object.clone();
        assert!(!restore(&mut object, &carried, &down), "{carried}");
        assert_eq!(object, with_backup, "{carried}");
        object = before.clone();
    }
}

#[test]
fn a_carried_value_fits_where_the_object_around_it_is() {
    let down = Plan::new(MOVES, Direction::Down);
    for carried in [
        json!({"spec": {"version": "v1beta1 knew none"}}),
        json!({"spec": {"backup": {"storage": {}}}}),
        json!({"spec": {"backup": {"retention": 7, "s3": "x"}}}),
    ] {
        let (mut object, _) = carried_down();
        assert!(restore(&mut object, &carried, &down), "{carried}");
        let mut back = object.clone();
        let again = reshape(&mut back, &down).expect("reshaped");
        assert_eq!(Value::Object(again), carried);
    }
}
