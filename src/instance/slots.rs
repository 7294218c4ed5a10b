//! When the primary drops the replication slot of an instance that left the cluster.
//!
//! The primary learns the instance count from its mounted ConfigMap, which a kubelet refreshes
//! up to a minute or two after the operator changed it. Meanwhile a new replica of a scale-up
//! makes its own slot, which the primary, still counting the old number of instances, sees as
//! the slot of no instance. So a slot is dropped only once it has been unused and unwanted for
//! a grace period longer than that delay; a replica that starts streaming, or an instance count
//! that catches up, takes it off the list.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The slots seen unused and unwanted, and since when.
#[derive(Debug)]
pub struct SlotReaper {
    grace: Duration,
    unwanted_since: HashMap<String, Instant>,
}

impl SlotReaper {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            unwanted_since: HashMap::new(),
        }
    }

    /// Given the slots unused and unwanted now, those to drop: unwanted for the whole grace
    /// period, without interruption.
    pub fn due(&mut self, unwanted: &[String], now: Instant) -> Vec<String> {
        self.unwanted_since
            .retain(|slot, _| unwanted.contains(slot));
        for slot in unwanted {
            self.unwanted_since.entry(slot.clone()).or_insert(now);
        }
        let mut due: Vec<String> = self
            .unwanted_since
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= self.grace)
            .map(|(slot, _)| slot.clone())
            .collect();
        due.sort();
        due
    }

    /// Forgets a slot once dropped.
    pub fn dropped(&mut self, slot: &str) {
        self.unwanted_since.remove(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_goes_only_after_being_unwanted_for_the_whole_grace_period() {
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        let slot = |name: &str| vec![name.to_owned()];
        let mut reaper = SlotReaper::new(Duration::from_secs(120));
        assert!(reaper.due(&slot("pgkube_a_3"), at(0)).is_empty());
        assert!(reaper.due(&slot("pgkube_a_3"), at(119)).is_empty());
        // Wanted again (the instance count caught up, or the replica streams): the clock restarts.
        assert!(reaper.due(&[], at(120)).is_empty());
        assert!(reaper.due(&slot("pgkube_a_3"), at(130)).is_empty());
        assert_eq!(reaper.due(&slot("pgkube_a_3"), at(250)), ["pgkube_a_3"]);
        reaper.dropped("pgkube_a_3");
        assert!(reaper.due(&[], at(251)).is_empty());
    }
}
