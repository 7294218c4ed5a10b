//! Why a replica that follows the right primary does not stream from it, decided purely from
//! what the replica and the primary report; [`super::repair`] carries the remedy out.
//!
//! Two causes never heal by themselves, however long the WAL receiver retries:
//!
//! - **Diverged history.** The replica replayed WAL of its timeline beyond the point where the
//!   primary's timeline forked off it (a replica that was ahead of the one a failover promoted,
//!   or a former primary whose last WAL the new primary never received). PostgreSQL logs "new
//!   timeline N forked off current database system timeline M before current recovery point".
//!   Remedy: pg_rewind to the primary's history (a new clone when that fails).
//! - **WAL gone.** The segment the replica needs next was already removed from the primary
//!   ("requested WAL segment ... has already been removed"): its slot there was lost, or made
//!   too late (after a failover). Remedy: a new clone, slot first.
//!
//! Both are looked for only after the replica has not streamed for [`PATIENCE`] watch periods
//! in a row (a primary that restarts, or a replica catching up from its own WAL, is not
//! stuck), and then once per [`PATIENCE`] periods: each look is a connection to the primary.

use std::fmt;

/// Watch periods without streaming before the primary is asked why.
pub const PATIENCE: u32 = 5;

pub use pgkube_controllers::storage::lsn::Lsn;

/// One line of a timeline history file: timeline `timeline` ended at `switchpoint`, where its
/// child began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fork {
    pub timeline: u32,
    pub switchpoint: Lsn,
}

/// The ancestors of a timeline, from its history file (`pg_wal/<TLI>.history`): lines of
/// `parent-TLI <tab> switchpoint <tab> reason`; comments and blank lines skipped.
pub fn parse_history(text: &str) -> Vec<Fork> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let timeline = fields.next()?.parse().ok()?;
            let switchpoint = Lsn::parse(fields.next()?)?;
            Some(Fork {
                timeline,
                switchpoint,
            })
        })
        .collect()
}

/// The number of the WAL segment file `name` (`TTTTTTTTLLLLLLLLSSSSSSSS`, hexadecimal), with
/// segments of `segment_size` bytes; none for another kind of file.
pub fn segment_of_file(name: &str, segment_size: u64) -> Option<u64> {
    if name.len() != 24 || segment_size == 0 || !name.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let log = u64::from_str_radix(&name[8..16], 16).ok()?;
    let segment = u64::from_str_radix(&name[16..24], 16).ok()?;
    let per_log = 0x1_0000_0000 / segment_size;
    Some(log * per_log + segment)
}

/// What the replica reports of itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaView {
    /// The timeline it replays, as its control file knows it (may lag right after a switch).
    pub timeline: u32,
    /// The end of the last record replayed.
    pub replayed: Lsn,
    /// Where it asks the primary to stream from: its WAL receiver's position, at least
    /// `replayed` (the receiver asks from the start of that position's segment).
    pub needed: Lsn,
}

/// What the primary it follows reports (it answered as a primary, not in recovery).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryView {
    pub timeline: u32,
    /// Its timeline's ancestors ([`parse_history`]); empty on timeline 1.
    pub history: Vec<Fork>,
    /// The oldest WAL segment file in its `pg_wal`, as a number ([`segment_of_file`]).
    pub oldest_segment: Option<u64>,
    pub segment_size: u64,
}

/// Why the replica cannot stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stuck {
    /// It replayed its `timeline` beyond `fork`, where the primary's history left it (none:
    /// the replica's timeline is not among the primary's ancestors at all).
    Diverged {
        timeline: u32,
        fork: Option<Lsn>,
        replayed: Lsn,
    },
    /// The segment it needs next is older than any the primary keeps.
    WalRemoved { needed: u64, oldest: u64 },
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stuck::Diverged {
                timeline,
                fork: Some(fork),
                replayed,
            } => write!(
                f,
                "its history diverged: it replayed timeline {timeline} up to {replayed}, beyond {fork} where the primary's timeline forked off"
            ),
            Stuck::Diverged {
                timeline, replayed, ..
            } => write!(
                f,
                "its history diverged: its timeline {timeline} (replayed up to {replayed}) is not in the primary's history"
            ),
            Stuck::WalRemoved { needed, oldest } => write!(
                f,
                "the WAL it needs is gone from the primary: it needs segment {needed:X}, the oldest there is {oldest:X}"
            ),
        }
    }
}

/// How a stuck replica is brought back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remedy {
    /// pg_rewind to the primary's history, a new clone when that fails.
    Rewind,
    /// A new clone, slot first.
    Reclone,
}

impl Stuck {
    pub fn remedy(self) -> Remedy {
        match self {
            Stuck::Diverged { .. } => Remedy::Rewind,
            Stuck::WalRemoved { .. } => Remedy::Reclone,
        }
    }
}

/// Why `replica` cannot stream from `primary`, if it cannot. A diverged history comes first:
/// the rewind also brings the WAL it needs.
pub fn diagnose(replica: &ReplicaView, primary: &PrimaryView) -> Option<Stuck> {
    diverged(replica, primary).or_else(|| wal_removed(replica, primary))
}

/// Where a stopped standby's data stands, from its `pg_controldata` output: the furthest of its
/// last restartpoint and its minimum recovery point, with its timeline. PostgreSQL refuses to
/// start it ("requested timeline N is not a child of this server's history") when the primary's
/// timeline forked off before that point, so that is checked before it starts ([`diverged`]).
pub fn stopped_view(controldata: &str) -> Option<ReplicaView> {
    let field = |label: &str| {
        controldata
            .lines()
            .find_map(|line| line.strip_prefix(label))
            .map(str::trim)
    };
    let checkpoint = (
        field("Latest checkpoint's TimeLineID:")?
            .parse::<u32>()
            .ok()?,
        Lsn::parse(field("Latest checkpoint location:")?)?,
    );
    let min_recovery = field("Min recovery ending loc's timeline:")
        .and_then(|timeline| timeline.parse::<u32>().ok())
        .zip(field("Minimum recovery ending location:").and_then(Lsn::parse))
        .filter(|(timeline, _)| *timeline != 0);
    let (timeline, replayed) = min_recovery.map_or(checkpoint, |point| checkpoint.max(point));
    Some(ReplicaView {
        timeline,
        replayed,
        needed: replayed,
    })
}

/// Whether `replica` replayed its timeline beyond where `primary`'s history forked off it.
pub fn diverged(replica: &ReplicaView, primary: &PrimaryView) -> Option<Stuck> {
    if replica.timeline == primary.timeline {
        return None;
    }
    let fork = primary
        .history
        .iter()
        .find(|fork| fork.timeline == replica.timeline)
        .map(|fork| fork.switchpoint);
    // Replaying up to the switchpoint exactly is fine: the child timeline starts there.
    let beyond = fork.is_none_or(|fork| replica.replayed > fork);
    beyond.then_some(Stuck::Diverged {
        timeline: replica.timeline,
        fork,
        replayed: replica.replayed,
    })
}

fn wal_removed(replica: &ReplicaView, primary: &PrimaryView) -> Option<Stuck> {
    let oldest = primary.oldest_segment?;
    let needed = replica.replayed.max(replica.needed).0 / primary.segment_size.max(1);
    (needed < oldest).then_some(Stuck::WalRemoved { needed, oldest })
}

/// Counts the watch periods a replica has not streamed, in a row.
#[derive(Debug, Default)]
pub struct Stall {
    periods: u32,
}

impl Stall {
    /// One observation; true when it is time to ask the primary why ([`PATIENCE`] periods
    /// without streaming since the start or the last time asked).
    pub fn observe(&mut self, streaming: bool) -> bool {
        if streaming {
            self.periods = 0;
            return false;
        }
        self.periods += 1;
        if self.periods >= PATIENCE {
            self.periods = 0;
            return true;
        }
        false
    }

    /// Starts counting afresh (a new server, a new primary).
    pub fn reset(&mut self) {
        self.periods = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB16: u64 = 16 * 1024 * 1024;

    fn lsn(text: &str) -> Lsn {
        Lsn::parse(text).expect("an LSN")
    }

    fn primary(timeline: u32, history: &str, oldest: Option<&str>) -> PrimaryView {
        PrimaryView {
            timeline,
            history: parse_history(history),
            oldest_segment: oldest.and_then(|name| segment_of_file(name, MB16)),
            segment_size: MB16,
        }
    }

    fn replica(timeline: u32, replayed: &str) -> ReplicaView {
        ReplicaView {
            timeline,
            replayed: lsn(replayed),
            needed: lsn(replayed),
        }
    }

    const STOPPED: &str = "pg_control version number:            1300
Latest checkpoint location:           0/5000060
Latest checkpoint's REDO location:    0/5000028
Latest checkpoint's TimeLineID:       1
Minimum recovery ending location:     0/6000108
Min recovery ending loc's timeline:   1
";

    #[test]
    fn a_stopped_standby_stands_at_the_furthest_of_its_restartpoint_and_minimum_recovery_point() {
        assert_eq!(stopped_view(STOPPED), Some(replica(1, "0/6000108")));
        let unset = STOPPED
            .replace("0/6000108", "0/0")
            .replace("loc's timeline:   1", "loc's timeline:   0");
        assert_eq!(stopped_view(&unset), Some(replica(1, "0/5000060")));
        let later_timeline = STOPPED.replace("loc's timeline:   1", "loc's timeline:   2");
        assert_eq!(stopped_view(&later_timeline), Some(replica(2, "0/6000108")));
        assert_eq!(stopped_view("pg_control version number: 1300"), None);
    }

    #[test]
    fn a_stopped_standby_past_the_primarys_fork_has_diverged_one_at_it_has_not() {
        let new_primary = primary(2, "1\t0/5800000\tno recovery target specified", None);
        let past = stopped_view(STOPPED).expect("a position");
        assert!(matches!(
            diverged(&past, &new_primary),
            Some(Stuck::Diverged { timeline: 1, .. })
        ));
        let at_fork = STOPPED.replace("0/6000108", "0/5800000");
        let at_fork = stopped_view(&at_fork).expect("a position");
        assert_eq!(diverged(&at_fork, &new_primary), None);
    }

    #[test]
    fn lsns_parse_compare_and_print_as_postgresql_does() {
        assert_eq!(lsn("0/3000060"), Lsn(0x300_0060));
        assert_eq!(lsn("1/0"), Lsn(1 << 32));
        assert!(lsn("0/3000061") > lsn("0/3000060"));
        assert!(lsn("1/0") > lsn("0/FFFFFFFF"));
        assert_eq!(lsn("A/3000060").to_string(), "A/3000060");
        for bad in ["", "3000060", "x/1", "100000000/0"] {
            assert_eq!(Lsn::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn history_files_list_the_ancestors_and_their_switchpoints() {
        let text = "1\t0/3000060\tno recovery target specified\n\n\
                    # a comment\n2\t0/5000000\tno recovery target specified\n";
        assert_eq!(
            parse_history(text),
            [
                Fork {
                    timeline: 1,
                    switchpoint: lsn("0/3000060")
                },
                Fork {
                    timeline: 2,
                    switchpoint: lsn("0/5000000")
                },
            ]
        );
        assert!(parse_history("").is_empty());
    }

    #[test]
    fn segment_numbers_come_from_the_file_names() {
        assert_eq!(segment_of_file("000000010000000000000003", MB16), Some(3));
        // 256 segments of 16 MiB in each 4 GiB "log".
        assert_eq!(segment_of_file("000000020000000100000002", MB16), Some(258));
        assert_eq!(segment_of_file("00000002.history", MB16), None);
        assert_eq!(
            segment_of_file("000000010000000000000003.partial", MB16),
            None
        );
    }

    #[test]
    fn a_replica_that_replayed_beyond_the_fork_has_diverged() {
        let history = "1\t0/3000060\tno recovery target specified\n";
        // C was ahead of the promoted replica: it replayed timeline 1 past the fork.
        assert_eq!(
            diagnose(&replica(1, "0/3001234"), &primary(2, history, None)),
            Some(Stuck::Diverged {
                timeline: 1,
                fork: Some(lsn("0/3000060")),
                replayed: lsn("0/3001234"),
            })
        );
        // Up to the fork, or behind it: it follows the new timeline by itself.
        assert_eq!(
            diagnose(&replica(1, "0/3000060"), &primary(2, history, None)),
            None
        );
        assert_eq!(
            diagnose(&replica(1, "0/2000000"), &primary(2, history, None)),
            None
        );
        // Same timeline: nothing diverged.
        assert_eq!(
            diagnose(&replica(2, "0/9000000"), &primary(2, history, None)),
            None
        );
        // A timeline the primary never had (a sibling, or a later one).
        let stuck = diagnose(&replica(3, "0/3000000"), &primary(2, history, None));
        assert!(
            matches!(
                stuck,
                Some(Stuck::Diverged {
                    timeline: 3,
                    fork: None,
                    ..
                })
            ),
            "{stuck:?}"
        );
        assert_eq!(stuck.map(Stuck::remedy), Some(Remedy::Rewind));
    }

    #[test]
    fn a_replica_whose_next_segment_is_gone_from_the_primary_is_cloned_again() {
        let gone = Some("000000010000000000000005");
        let stuck = diagnose(&replica(1, "0/3000060"), &primary(1, "", gone));
        assert_eq!(
            stuck,
            Some(Stuck::WalRemoved {
                needed: 3,
                oldest: 5
            })
        );
        assert_eq!(stuck.map(Stuck::remedy), Some(Remedy::Reclone));
        assert!(stuck.is_some_and(|stuck| stuck.to_string().contains("segment 3")));
        // The receiver's position counts when it is further on.
        let ahead = ReplicaView {
            needed: lsn("0/5000000"),
            ..replica(1, "0/3000060")
        };
        assert_eq!(diagnose(&ahead, &primary(1, "", gone)), None);
        assert_eq!(
            diagnose(&replica(1, "0/5000060"), &primary(1, "", gone)),
            None
        );
        // Unknown: nothing to say.
        assert_eq!(diagnose(&replica(1, "0/0"), &primary(1, "", None)), None);
        // A diverged history is rewound first: pg_rewind brings the WAL too.
        let both = diagnose(
            &replica(1, "0/3001234"),
            &primary(2, "1\t0/3000060\tx\n", gone),
        );
        assert_eq!(both.map(Stuck::remedy), Some(Remedy::Rewind));
    }

    #[test]
    fn the_primary_is_asked_after_patience_periods_without_streaming_then_again_later() {
        let mut stall = Stall::default();
        for _ in 1..PATIENCE {
            assert!(!stall.observe(false));
        }
        // Streaming again: the count starts over.
        assert!(!stall.observe(true));
        for _ in 1..PATIENCE {
            assert!(!stall.observe(false));
        }
        assert!(stall.observe(false));
        for _ in 1..PATIENCE {
            assert!(!stall.observe(false));
        }
        assert!(stall.observe(false));
        stall.reset();
        assert!(!stall.observe(false));
    }
}
