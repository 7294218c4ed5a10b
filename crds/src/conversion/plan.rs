//! What converting one kind in one direction does, derived from the one statement of each
//! kind's differences: the list of fields that are at another place in each version
//! ([`Move`]s, in `cluster.rs`, `backup.rs` and `restore.rs`).
//!
//! From the moves alone come the objects only the source version has (what is left in them has
//! no place in the target version), and the places the target version reads as its own that
//! the source version does not (whatever the source object has there has no place either).
//! Both are carried in an annotation, so that converting back finds them.

use super::annotation::{V1ALPHA1_FIELDS_ANNOTATION, V1BETA1_FIELDS_ANNOTATION};
use super::path::{Path, is_within};

/// A field at a different place in each version. Everything not named by a move is at the same
/// place in both versions and is left as it is.
#[derive(Debug)]
pub(crate) struct Move {
    pub(crate) v1alpha1: &'static Path,
    pub(crate) v1beta1: &'static Path,
}

/// Which way an object is converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// v1alpha1 to v1beta1.
    Up,
    /// v1beta1 to v1alpha1.
    Down,
}

impl Direction {
    pub(crate) fn reverse(self) -> Self {
        match self {
            Direction::Up => Direction::Down,
            Direction::Down => Direction::Up,
        }
    }

    /// The annotation that carries, on the converted object, the fields that have no place in
    /// its version: named after the version they come from.
    pub(crate) fn annotation(self) -> &'static str {
        match self {
            Direction::Up => V1ALPHA1_FIELDS_ANNOTATION,
            Direction::Down => V1BETA1_FIELDS_ANNOTATION,
        }
    }
}

/// One kind's conversion in one direction.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Each moved field's place in the source version, and in the target version.
    pub(crate) moves: Vec<(&'static Path, &'static Path)>,
    /// Objects that hold moved fields in the source version only: once the moved fields are
    /// out, what is left in them has no place in the target version.
    pub(crate) containers: Vec<&'static Path>,
    /// Places that the target version reads as moved fields or their objects, and the source
    /// version does not: a value the source object has there has no place in the target.
    pub(crate) collisions: Vec<&'static Path>,
}

impl Plan {
    pub(crate) fn new(moves: &'static [Move], direction: Direction) -> Plan {
        let moves: Vec<(&'static Path, &'static Path)> = moves
            .iter()
            .map(|m| match direction {
                Direction::Up => (m.v1alpha1, m.v1beta1),
                Direction::Down => (m.v1beta1, m.v1alpha1),
            })
            .collect();
        let sources: Vec<&'static Path> = moves.iter().map(|(from, _)| *from).collect();
        let targets: Vec<&'static Path> = moves.iter().map(|(_, to)| *to).collect();
        let source_objects = strict_prefixes(&sources);
        let target_objects = strict_prefixes(&targets);
        let containers = without(&source_objects, &target_objects);
        let target_only = without(&target_objects, &source_objects);
        let source_places: Vec<&'static Path> =
            sources.iter().chain(&containers).copied().collect();
        let candidates: Vec<&'static Path> = unique(targets.iter().chain(&target_only).copied())
            .into_iter()
            .filter(|place| !source_places.iter().any(|source| is_within(place, source)))
            .collect();
        let collisions = candidates
            .iter()
            .copied()
            .filter(|place| {
                !candidates
                    .iter()
                    .any(|outer| outer != place && is_within(place, outer))
            })
            .collect();
        Plan {
            moves,
            containers,
            collisions,
        }
    }

    /// The keys of the moved fields that `container` holds in the source version.
    pub(crate) fn moved_keys(&self, container: &Path) -> impl Iterator<Item = &'static str> {
        self.moves
            .iter()
            .filter_map(move |(from, _)| match from.split_last() {
                Some((key, parent)) if *parent == *container => Some(*key),
                _ => None,
            })
    }

    /// Every place whose value is carried: the containers and the collisions.
    pub(crate) fn carried_places(&self) -> impl Iterator<Item = &'static Path> {
        self.containers.iter().chain(&self.collisions).copied()
    }
}

/// Every object on the way to each path (the paths themselves excluded), once each.
fn strict_prefixes(paths: &[&'static Path]) -> Vec<&'static Path> {
    unique(
        paths
            .iter()
            .flat_map(|path| (1..path.len()).map(move |length| &path[..length])),
    )
}

/// `paths` without those in `other`.
fn without(paths: &[&'static Path], other: &[&'static Path]) -> Vec<&'static Path> {
    paths
        .iter()
        .copied()
        .filter(|path| !other.contains(path))
        .collect()
}

fn unique(paths: impl Iterator<Item = &'static Path>) -> Vec<&'static Path> {
    let mut seen: Vec<&'static Path> = Vec::new();
    for path in paths {
        if !seen.contains(&path) {
            seen.push(path);
        }
    }
    seen
}

#[cfg(test)]
mod tests;
