// SPDX-License-Identifier: MIT OR Apache-2.0
//! The bound on a peer that went away while a connection is on its TCP
//! legs (`docs/migration.md`, "Bounded failure"): a leg whose peer does not
//! answer (a retransmission or a window probe outstanding) at every look,
//! without a break, for [`PEER_LOST_MS`] has a peer that died or stayed
//! away, and the connection is reset. A live peer answers within a round
//! trip, so one look that finds the leg answered starts the count over; a
//! reader that only stopped reading answers zero-window probes and is not
//! unanswered for long. Both hosts keep one [`Unanswered`] per leg and look
//! at their legs every [`LOOK_EVERY_MS`] (more often with a shorter
//! bound); they read the leg's state from their TCP stack and the time
//! from their clock.

/// The bound's default (the module's `peer_lost_ms`, the transport's
/// `Config::peer_lost_after`).
pub const PEER_LOST_MS: u64 = 10_000;

/// How often a host looks at its legs, at most.
pub const LOOK_EVERY_MS: u64 = 1_000;

/// How often a host looks at its legs under a bound of `bound_ms`: four
/// looks within the bound, at most [`LOOK_EVERY_MS`] apart.
pub fn look_every_ms(bound_ms: u64) -> u64 {
    (bound_ms / 4).clamp(1, LOOK_EVERY_MS)
}

/// One leg's answer clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unanswered {
    since: Option<u64>,
}

impl Unanswered {
    /// A leg not looked at yet.
    pub const fn new() -> Self {
        Unanswered { since: None }
    }

    /// What a look at `now` found: `None`, the leg holds nothing its peer
    /// has not acknowledged (or there is no leg); `Some(false)`, it does,
    /// and its peer answers; `Some(true)`, it waits for an answer. Returns
    /// how long (ms) it has waited at every look without a break.
    pub fn look(&mut self, waits: Option<bool>, now: u64) -> Option<u64> {
        if waits == Some(true) {
            let since = *self.since.get_or_insert(now);
            Some(now.saturating_sub(since))
        } else {
            self.since = None;
            None
        }
    }
}

/// Whether legs that waited `waited` ms (the longer of the two) end the
/// connection under a bound of `bound_ms`.
pub fn peer_lost(waited: Option<u64>, bound_ms: u64) -> bool {
    waited.is_some_and(|w| w >= bound_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_leg_unanswered_at_every_look_for_the_bound_ends_the_connection() {
        let mut u = Unanswered::new();
        assert_eq!(u.look(Some(true), 1_000), Some(0));
        assert_eq!(u.look(Some(true), 6_000), Some(5_000));
        assert!(!peer_lost(Some(5_000), PEER_LOST_MS));
        // one answer starts the count over
        assert_eq!(u.look(Some(false), 7_000), None);
        assert_eq!(u.look(Some(true), 8_000), Some(0));
        assert_eq!(u.look(Some(true), 18_000), Some(10_000));
        assert!(peer_lost(Some(10_000), PEER_LOST_MS));
        // nothing held: not waiting
        assert_eq!(u.look(None, 19_000), None);
        assert!(!peer_lost(None, PEER_LOST_MS));
    }

    #[test]
    fn looks_come_four_times_within_the_bound_and_at_least_every_second() {
        assert_eq!(look_every_ms(PEER_LOST_MS), LOOK_EVERY_MS);
        assert_eq!(look_every_ms(2_000), 500);
        assert_eq!(look_every_ms(2), 1);
    }
}
