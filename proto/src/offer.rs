// SPDX-License-Identifier: MIT OR Apache-2.0
//! The offer clock: when the receiving side of a direction that is on TCP
//! offers the sender a new ring, and when it gives up an offer the sender
//! never answered. Both hosts keep one [`OfferClock`] per receiving
//! direction, tell it what happened and ask it, with the time, what to do
//! ([`OfferClock::step`]); it does no I/O and reads no clock.
//!
//! ```text
//!   left our ring ──► wait for the sender's TxFreeze (at most OFFER_AFTER_MS)
//!                                   │
//!   on TCP, link and leg up ────────┴──► Offer ──► offered ──(RingFrom)──► ring
//!                                                     │
//!                              OFFER_TIMEOUT_MS, no answer ──► Abandon ──► Offer again
//! ```
//!
//! * A receiver that left its ring on its own (it moved) waits for the
//!   sender's `TxFreeze` of that ring before offering: arriving after the
//!   offer, the freeze would read as news about the new ring, and the
//!   sender would switch onto it and straight off again. A sender that
//!   moved too, or died, never sends that freeze: after
//!   [`OFFER_AFTER_MS`] the receiver offers anyway.
//! * An offer the sender has not taken after [`OFFER_TIMEOUT_MS`] is
//!   abandoned ([`super::switch::RxPath::freeze_local`] gives the
//!   `Consumed` that declares its epoch dead) and a new one is made. The
//!   sender takes an offer only once its own direction is on TCP, which
//!   after a restore can wait for a backed-off TCP retransmission, so the
//!   bound is long; and a sender that could not map the ring says
//!   nothing, so without the bound that direction would stay on TCP.
//! * Which offer supersedes which is the switch's: epochs only grow, and
//!   a sender never takes an epoch at or below one declared dead.

use super::switch::{Epoch, RxPath, RxState};

/// A receiver that left its ring on its own offers a new one after the
/// sender's `TxFreeze` for it, or after this long without it.
pub const OFFER_AFTER_MS: u64 = 2_000;

/// An offer the sender has not taken after this long is abandoned and
/// made again.
pub const OFFER_TIMEOUT_MS: u64 = 15_000;

/// What the host does for a receiving direction now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferStep {
    /// Nothing until something happens (the link or the leg comes up, the
    /// direction leaves its ring).
    Idle,
    /// Ask again at this time (ms).
    WaitUntil(u64),
    /// Offer a ring now: [`RxPath::offer_ring`], grant it, send
    /// `RingOffer` on the link, then [`OfferClock::offered`]. If the
    /// offer cannot be sent, abandon it as for [`OfferStep::Abandon`].
    Offer,
    /// Give the outstanding offer up: [`RxPath::freeze_local`] and send
    /// its `Consumed` on TCP, release the ring, then
    /// [`OfferClock::settled`].
    Abandon,
}

/// One receiving direction's offer timing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OfferClock {
    /// The ring this side left on its own and when, while the sender's
    /// `TxFreeze` for it has not come.
    left: Option<(Epoch, u64)>,
    /// When the outstanding offer was made.
    offered_at: Option<u64>,
}

impl OfferClock {
    /// A direction with no history (on a ring, or on TCP since connect).
    pub const fn new() -> Self {
        OfferClock {
            left: None,
            offered_at: None,
        }
    }

    /// This side left ring `epoch` on its own at `now` (a local move or
    /// its peer gone: [`RxPath::freeze_local`] from a ring).
    pub fn left_ring(&mut self, epoch: Epoch, now: u64) {
        self.left = Some((epoch, now));
    }

    /// The sender's `TxFreeze` of ring `epoch` was taken: a ring this side
    /// left, that one or an older one, is answered for.
    pub fn saw_freeze(&mut self, epoch: Epoch) {
        if self.left.is_some_and(|(left, _)| epoch >= left) {
            self.left = None;
        }
    }

    /// An offer went out at `now`.
    pub fn offered(&mut self, now: u64) {
        self.offered_at = Some(now);
    }

    /// The outstanding offer ended: taken (the direction is on its ring),
    /// withdrawn (its link died) or abandoned.
    pub fn settled(&mut self) {
        self.offered_at = None;
    }

    /// When the outstanding offer was made, if one is.
    pub fn offered_at(&self) -> Option<u64> {
        self.offered_at
    }

    /// What to do at `now` for the direction `rx`, with the link to the
    /// peer up or not and the direction's TCP leg (the one its `RingFrom`
    /// comes on) up or not.
    pub fn step(&self, rx: &RxPath, link_up: bool, leg_up: bool, now: u64) -> OfferStep {
        if !link_up {
            // the link's coming up asks again; an offer on a link that
            // died was withdrawn with it
            return OfferStep::Idle;
        }
        if let RxState::Offered { .. } = rx.state() {
            // an offer the host did not time (none should be): as old
            let due = self
                .offered_at
                .map_or(now, |t| t.saturating_add(OFFER_TIMEOUT_MS));
            return if now >= due {
                OfferStep::Abandon
            } else {
                OfferStep::WaitUntil(due)
            };
        }
        if rx.state() != RxState::Tcp || rx.eof_at().is_some() || !leg_up {
            return OfferStep::Idle;
        }
        if let Some((_, left_at)) = self.left {
            let due = left_at.saturating_add(OFFER_AFTER_MS);
            if now < due {
                return OfferStep::WaitUntil(due);
            }
        }
        OfferStep::Offer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direction_on_tcp_offers_once_link_and_leg_are_up() {
        let rx = RxPath::on_tcp();
        let c = OfferClock::new();
        assert_eq!(c.step(&rx, false, true, 0), OfferStep::Idle);
        assert_eq!(c.step(&rx, true, false, 0), OfferStep::Idle);
        assert_eq!(c.step(&rx, true, true, 0), OfferStep::Offer);
        assert_eq!(c.step(&RxPath::on_ring(), true, true, 0), OfferStep::Idle);
    }

    #[test]
    fn after_leaving_its_ring_it_waits_for_the_freeze_or_the_bound() {
        let mut rx = RxPath::on_ring();
        let mut c = OfferClock::new();
        rx.freeze_local().unwrap();
        c.left_ring(0, 1_000);
        assert_eq!(
            c.step(&rx, true, true, 1_500),
            OfferStep::WaitUntil(1_000 + OFFER_AFTER_MS)
        );
        assert_eq!(
            c.step(&rx, true, true, 1_000 + OFFER_AFTER_MS),
            OfferStep::Offer
        );
        c.saw_freeze(0);
        assert_eq!(c.step(&rx, true, true, 1_500), OfferStep::Offer);
    }

    #[test]
    fn an_unanswered_offer_is_abandoned_after_the_timeout() {
        let mut rx = RxPath::on_tcp();
        let mut c = OfferClock::new();
        rx.offer_ring().unwrap();
        c.offered(10);
        assert_eq!(
            c.step(&rx, true, true, 11),
            OfferStep::WaitUntil(10 + OFFER_TIMEOUT_MS)
        );
        assert_eq!(
            c.step(&rx, true, true, 10 + OFFER_TIMEOUT_MS),
            OfferStep::Abandon
        );
        // abandoned: Consumed declares the epoch dead, a new offer follows
        assert!(rx.freeze_local().is_some());
        c.settled();
        assert_eq!(
            c.step(&rx, true, true, 10 + OFFER_TIMEOUT_MS),
            OfferStep::Offer
        );
        assert_eq!(rx.offer_ring().unwrap(), 2);
    }

    #[test]
    fn nothing_is_offered_after_the_end_of_stream() {
        let mut rx = RxPath::on_tcp();
        rx.on_fin(0).unwrap();
        assert_eq!(OfferClock::new().step(&rx, true, true, 0), OfferStep::Idle);
    }
}
