//! The instance manager's own health, so that what its endpoint says cannot outlive the truth.
//!
//! - **The status's age.** The supervisor sets the status at every tick ([`super::tick`]); the
//!   endpoint serves it with its age, computed when served. A status older than
//!   [`STALE_AFTER`] fails `/readyz`, and the operator counts the instance as not ready (its
//!   `Unavailable::Stale`, with the same bound). While the supervisor is in a long step
//!   (preparing the data: initdb, a clone, pg_rewind, waiting for a primary; a restart, a
//!   promotion, a stop, a rejoin), a status that is not ready stays true for as long as the
//!   step runs, and is served as current. A ready status always ages.
//! - **The supervisor's heartbeat.** Its loop beats at every turn, at least once a watch period.
//!   In its steady state, `/healthz` fails when the last beat is older than the watch period
//!   plus [`LIVENESS_MARGIN`]; the kubelet's liveness probe (6 misses 10 s apart) then restarts
//!   the container. A long step is marked [`Board::busy`] and never fails `/healthz`: the
//!   kubelet must not kill a clone in progress.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::endpoint::InstanceStatus;

/// A status older than this is stale. The operator's bound is the same
/// (`pgkube_controllers::cluster::instances::STALE_AFTER`).
pub const STALE_AFTER: Duration = Duration::from_secs(10);
/// How much longer than a watch period the supervisor loop may go without a beat in its steady
/// state: well above its longest tick ([`super::tick::OBSERVE_BUDGET`] plus
/// [`super::tick::PEERS_BUDGET`]).
pub const LIVENESS_MARGIN: Duration = Duration::from_secs(30);

/// What the supervisor shares with the endpoint: the status and the loop's heartbeat.
#[derive(Debug)]
pub struct Board {
    status: RwLock<Stamped>,
    activity: Mutex<Activity>,
    liveness_bound: Duration,
}

#[derive(Debug)]
struct Stamped {
    status: InstanceStatus,
    at: Instant,
}

#[derive(Debug)]
struct Activity {
    /// The long step under way; none in the steady state.
    busy: Option<&'static str>,
    beat: Instant,
}

impl Board {
    /// A board showing `status`, busy starting until [`Board::steady`], for a loop that turns
    /// every `watch_period`.
    pub fn new(status: InstanceStatus, watch_period: Duration) -> Arc<Self> {
        Self::with_liveness_bound(status, watch_period + LIVENESS_MARGIN)
    }

    fn with_liveness_bound(status: InstanceStatus, liveness_bound: Duration) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            status: RwLock::new(Stamped { status, at: now }),
            activity: Mutex::new(Activity {
                busy: Some("starting"),
                beat: now,
            }),
            liveness_bound,
        })
    }

    /// Shows `status`, observed now.
    pub fn set(&self, status: InstanceStatus) {
        *self.status.write().unwrap_or_else(PoisonError::into_inner) = Stamped {
            status,
            at: Instant::now(),
        };
    }

    /// The status shown.
    pub fn status(&self) -> InstanceStatus {
        self.status
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .status
            .clone()
    }

    /// The status shown and its age now.
    pub fn snapshot(&self) -> (InstanceStatus, Duration) {
        let busy = self.activity().busy.is_some();
        let stamped = self.status.read().unwrap_or_else(PoisonError::into_inner);
        let age = served_age(stamped.at.elapsed(), stamped.status.ready, busy);
        (stamped.status.clone(), age)
    }

    /// Whether the status says ready and is not stale.
    pub fn ready(&self) -> bool {
        let (status, age) = self.snapshot();
        status.ready && !is_stale(age)
    }

    /// The loop turned.
    pub fn beat(&self) {
        self.activity().beat = Instant::now();
    }

    /// The loop enters its steady state: from now on, a missing beat fails `/healthz`.
    pub fn steady(&self) {
        let mut activity = self.activity();
        activity.busy = None;
        activity.beat = Instant::now();
    }

    /// Marks a long step (`what`) until the guard is dropped.
    pub fn busy(self: &Arc<Self>, what: &'static str) -> Busy {
        let previous = self.activity().busy.replace(what);
        Busy {
            board: self.clone(),
            previous,
        }
    }

    /// Whether the supervisor loop runs as it should; why not.
    pub fn liveness(&self) -> Result<(), String> {
        let activity = self.activity();
        let since_beat = activity.beat.elapsed();
        if loop_alive(activity.busy.is_some(), since_beat, self.liveness_bound) {
            Ok(())
        } else {
            Err(format!(
                "the supervisor loop has not turned for {:.1} s (the bound is {:.1} s)",
                since_beat.as_secs_f64(),
                self.liveness_bound.as_secs_f64()
            ))
        }
    }

    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A long step under way ([`Board::busy`]); the state before it comes back on drop, with a beat.
#[derive(Debug)]
pub struct Busy {
    board: Arc<Board>,
    previous: Option<&'static str>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut activity = self.board.activity();
        activity.busy = self.previous;
        activity.beat = Instant::now();
    }
}

/// The age to serve of a status set `since_set` ago: a status that is not ready is current
/// while a long step runs (the step set it and is still under way); any other ages.
pub fn served_age(since_set: Duration, ready: bool, busy: bool) -> Duration {
    if busy && !ready {
        Duration::ZERO
    } else {
        since_set
    }
}

/// Whether a status of this age is too old to go by.
pub fn is_stale(age: Duration) -> bool {
    age > STALE_AFTER
}

/// Whether the supervisor loop is alive: always during a long step, else when it beat within
/// `bound`.
pub fn loop_alive(busy: bool, since_beat: Duration, bound: Duration) -> bool {
    busy || since_beat <= bound
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_ready_status_ages_even_during_a_long_step_and_goes_stale() {
        assert_eq!(served_age(3 * SECOND, true, false), 3 * SECOND);
        assert_eq!(served_age(3 * SECOND, true, true), 3 * SECOND);
        assert!(!is_stale(STALE_AFTER));
        assert!(is_stale(STALE_AFTER + Duration::from_millis(1)));
        assert!(is_stale(served_age(60 * SECOND, true, true)));
    }

    #[test]
    fn a_status_that_is_not_ready_is_current_only_during_a_long_step() {
        assert_eq!(served_age(600 * SECOND, false, true), Duration::ZERO);
        assert_eq!(served_age(600 * SECOND, false, false), 600 * SECOND);
    }

    #[test]
    fn the_loop_is_alive_while_it_beats_or_is_in_a_long_step() {
        let bound = 32 * SECOND;
        assert!(loop_alive(false, bound, bound));
        assert!(!loop_alive(false, bound + SECOND, bound));
        assert!(loop_alive(true, 3600 * SECOND, bound));
    }

    #[test]
    fn the_board_fails_liveness_only_in_the_steady_state_without_beats() {
        let bound = Duration::from_millis(50);
        let board = Board::with_liveness_bound(InstanceStatus::starting("p"), bound);
        // Starting is a long step: alive without beats, its status current.
        std::thread::sleep(bound * 2);
        assert!(board.liveness().is_ok());
        assert_eq!(board.snapshot().1, Duration::ZERO);
        board.steady();
        assert!(board.liveness().is_ok());
        std::thread::sleep(bound * 2);
        assert!(board.liveness().is_err(), "no beat for twice the bound");
        {
            let _busy = board.busy("cloning");
            std::thread::sleep(bound * 2);
            assert!(board.liveness().is_ok(), "a long step");
        }
        // The end of the step counts as a beat.
        assert!(board.liveness().is_ok());
        std::thread::sleep(bound * 2);
        assert!(board.liveness().is_err());
        board.beat();
        assert!(board.liveness().is_ok());
    }

    #[test]
    fn the_board_serves_a_ready_status_with_its_age() {
        let board = Board::new(InstanceStatus::starting("p"), Duration::from_secs(2));
        board.steady();
        board.set(InstanceStatus {
            ready: true,
            ..InstanceStatus::starting("p")
        });
        assert!(board.ready());
        std::thread::sleep(Duration::from_millis(20));
        let (status, age) = board.snapshot();
        assert!(status.ready);
        assert!(age >= Duration::from_millis(20), "{age:?}");
    }

    #[test]
    fn the_bounds_leave_room_for_the_slowest_tick() {
        use super::super::tick::{OBSERVE_BUDGET, PEERS_BUDGET};
        let watch_period = 2 * SECOND;
        // A ready status is set at the end of a tick's observation; the next one comes at most
        // a watch period or the rest of a tick later, plus an observation.
        assert!(watch_period.max(PEERS_BUDGET) + OBSERVE_BUDGET < STALE_AFTER);
        assert!((OBSERVE_BUDGET + PEERS_BUDGET) * 2 < LIVENESS_MARGIN);
    }
}
