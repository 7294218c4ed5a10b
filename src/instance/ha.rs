//! The instance manager's decisions about who is the primary (issue 16), pure so that they
//! are tested on their own; [`super::roles`] carries them out.
//!
//! The operator decides: it pushes `/control/promote` and `/control/follow`, and names the
//! primary in `instance.json`, which reaches the pod later. The manager never promotes itself
//! from the file; it follows the primary the file names when the file changes to another pod.

use super::control::Target;
use super::datadir::Role;
use super::desired::Topology;

/// What to do when `instance.json` names a new primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Designation {
    /// Already so: this instance is the primary, or follows the one named.
    Keep,
    /// This standby is named the primary: it waits for `/control/promote`, which the operator
    /// sends once it has checked that nothing is lost by promoting it.
    WaitForPromote,
    /// Become a standby of that primary, as `/control/follow` would (a primary demotes).
    Follow(Target),
}

/// What to do when `instance.json` changes to `topology` while this instance (`pod`) is in
/// `role`, following `following`.
pub fn on_new_designation(
    pod: &str,
    role: Role,
    following: Option<&str>,
    topology: &Topology,
) -> Designation {
    if topology.primary == pod {
        return match role {
            Role::Primary => Designation::Keep,
            Role::Replica => Designation::WaitForPromote,
        };
    }
    if role == Role::Replica && following == Some(topology.primary.as_str()) {
        return Designation::Keep;
    }
    Designation::Follow(Target {
        pod: topology.primary.clone(),
        host: topology.primary_host.clone(),
    })
}

/// What a stopped former primary waits for before it rejoins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The new primary answers as a primary (failover, or a start on a primary's data that is
    /// not the designated one's): its history is the one to rewind to.
    ForPrimary,
    /// The new primary answers at all. Still a standby, it is the target of a switchover,
    /// promoted only once this instance reports itself a replica; this one shut down at its
    /// last WAL, which the target has or gets from it.
    ForAnswer,
}

/// How a stopped former primary becomes a standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejoin {
    /// pg_rewind to the new primary's history (a new clone when that fails).
    Rewind,
    /// On its own data, as it is.
    Standby,
}

/// How to rejoin, given whether the new primary answered and whether it is still in recovery;
/// none: wait and ask again.
pub fn rejoin_path(target_in_recovery: Option<bool>, wait: Wait) -> Option<Rejoin> {
    match (target_in_recovery, wait) {
        (Some(false), _) => Some(Rejoin::Rewind),
        (Some(true), Wait::ForAnswer) => Some(Rejoin::Standby),
        (Some(true), Wait::ForPrimary) | (None, _) => None,
    }
}

/// Whether another instance's `/status` body says it is a primary.
pub fn reports_primary(status_body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(status_body)
        .is_ok_and(|status| status["role"] == "primary")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn named(primary: &str) -> Topology {
        Topology::parse(
            &format!(
                r#"{{"primary":"{primary}","primaryHost":"{primary}.h.ns.svc","port":5432,
                     "replicas":3,"statefulset":"a"}}"#
            ),
            Path::new("instance.json"),
        )
        .expect("valid")
    }

    fn follow(pod: &str) -> Designation {
        Designation::Follow(Target {
            pod: pod.to_owned(),
            host: format!("{pod}.h.ns.svc"),
        })
    }

    #[test]
    fn the_file_never_promotes_but_moves_replicas_and_demotes_a_primary() {
        use Role::*;
        let cases = [
            // This instance named: a primary stays, a standby waits for /control/promote.
            ("a-0", Primary, None, "a-0", Designation::Keep),
            (
                "a-0",
                Replica,
                Some("a-1"),
                "a-0",
                Designation::WaitForPromote,
            ),
            // Another named: a replica of it stays; others follow it, a primary demotes.
            ("a-0", Replica, Some("a-1"), "a-1", Designation::Keep),
            ("a-0", Replica, Some("a-2"), "a-1", follow("a-1")),
            ("a-0", Replica, None, "a-1", follow("a-1")),
            ("a-0", Primary, None, "a-1", follow("a-1")),
        ];
        for (pod, role, following, primary, expected) in cases {
            assert_eq!(
                on_new_designation(pod, role, following, &named(primary)),
                expected,
                "{pod} as {role:?} following {following:?}, {primary} named"
            );
        }
    }

    #[test]
    fn a_former_primary_rewinds_to_a_primary_and_waits_for_one_that_does_not_answer() {
        use Wait::*;
        assert_eq!(rejoin_path(Some(false), ForPrimary), Some(Rejoin::Rewind));
        assert_eq!(rejoin_path(Some(false), ForAnswer), Some(Rejoin::Rewind));
        // Switchover: the target is promoted after this one is a standby.
        assert_eq!(rejoin_path(Some(true), ForAnswer), Some(Rejoin::Standby));
        assert_eq!(rejoin_path(Some(true), ForPrimary), None);
        assert_eq!(rejoin_path(None, ForAnswer), None);
        assert_eq!(rejoin_path(None, ForPrimary), None);
    }

    #[test]
    fn only_a_status_with_role_primary_counts() {
        assert!(reports_primary(
            r#"{"pod":"a-1","role":"primary","ready":true}"#
        ));
        assert!(!reports_primary(r#"{"pod":"a-1","role":"replica"}"#));
        assert!(!reports_primary(r#"{"pod":"a-1","role":"starting"}"#));
        assert!(!reports_primary("<html>"));
    }
}
