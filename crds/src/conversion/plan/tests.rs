//! The plans derived from each kind's moves, written out: what moves, and what is carried.

use super::*;
use crate::conversion::{backup, cluster, restore};

const KINDS: [&[Move]; 3] = [cluster::MOVES, backup::MOVES, restore::MOVES];

#[test]
fn a_cluster_going_down_carries_the_objects_only_v1beta1_has_and_its_names_v1alpha1_uses() {
    let plan = Plan::new(cluster::MOVES, Direction::Down);
    let containers: Vec<&Path> = vec![
        &["spec", "storage"],
        &["spec", "backup", "schedule"],
        &["spec", "backup", "retention"],
        &["spec", "backup", "storage"],
        &["spec", "bootstrap", "source", "storage"],
        &["spec", "bootstrap", "recovery", "source", "storage"],
    ];
    assert_eq!(plan.containers, containers);
    let collisions: Vec<&Path> = vec![
        &["spec", "version"],
        &["spec", "backup", "timeZone"],
        &["spec", "backup", "suspend"],
        &["spec", "backup", "retentionDays"],
        &["spec", "backup", "s3"],
        &["spec", "bootstrap", "source", "s3"],
        &["spec", "bootstrap", "recovery", "source", "s3"],
    ];
    assert_eq!(plan.collisions, collisions);
    assert_eq!(
        plan.moved_keys(&["spec", "storage"]).collect::<Vec<_>>(),
        ["size"]
    );
    assert_eq!(
        plan.moved_keys(&["spec", "backup", "schedule"])
            .collect::<Vec<_>>(),
        ["cron", "timeZone", "suspend"]
    );
}

#[test]
fn a_cluster_going_up_carries_only_what_sits_where_v1beta1_puts_its_objects() {
    let plan = Plan::new(cluster::MOVES, Direction::Up);
    assert!(plan.containers.is_empty());
    let collisions: Vec<&Path> = vec![
        &["spec", "postgresVersion"],
        &["spec", "backup", "retention"],
        &["spec", "backup", "storage"],
        &["spec", "bootstrap", "source", "storage"],
        &["spec", "bootstrap", "recovery", "source", "storage"],
    ];
    assert_eq!(plan.collisions, collisions);
}

#[test]
fn backups_and_restores_carry_what_is_beside_their_s3() {
    let down = Plan::new(backup::MOVES, Direction::Down);
    assert_eq!(down.containers, vec![&["status", "storage"] as &Path]);
    assert!(down.collisions.is_empty());
    let up = Plan::new(backup::MOVES, Direction::Up);
    assert!(up.containers.is_empty() && up.collisions.is_empty());

    let down = Plan::new(restore::MOVES, Direction::Down);
    assert_eq!(
        down.containers,
        vec![&["spec", "source", "storage"] as &Path]
    );
    assert_eq!(down.collisions, vec![&["spec", "source", "s3"] as &Path]);
    let up = Plan::new(restore::MOVES, Direction::Up);
    assert!(up.containers.is_empty());
    assert_eq!(up.collisions, vec![&["spec", "source", "storage"] as &Path]);
}

/// Carried values are whole: none is inside another, and none is inside a moved field, so that
/// each is taken out and put back on its own.
#[test]
fn carried_places_are_apart_from_each_other_and_from_moved_fields() {
    for moves in KINDS {
        for direction in [Direction::Up, Direction::Down] {
            let plan = Plan::new(moves, direction);
            let places: Vec<&Path> = plan.carried_places().collect();
            for (i, place) in places.iter().enumerate() {
                for (j, other) in places.iter().enumerate() {
                    assert!(i == j || !is_within(place, other), "{place:?} in {other:?}");
                }
                for (from, _) in &plan.moves {
                    assert!(!is_within(place, from), "{place:?} in moved {from:?}");
                }
            }
        }
    }
}

/// A field moves within the object that holds it in both versions (the deeper side adding or
/// dropping objects only one version has), so that moving it never needs an object the other
/// version's object may not have.
#[test]
fn each_field_moves_within_the_objects_both_versions_share() {
    for moves in KINDS {
        for direction in [Direction::Up, Direction::Down] {
            let plan = Plan::new(moves, direction);
            for (from, to) in &plan.moves {
                let shared = from.len().min(to.len()) - 1;
                assert_eq!(from[..shared], to[..shared], "{from:?} -> {to:?}");
            }
        }
    }
}
