// SPDX-License-Identifier: MIT OR Apache-2.0
//! The link-half decision (`docs/protocol.md` 6.2): given what we hold of
//! the link with one peer and what its half in XenStore says, what to do.
//! Both hosts call [`follow`] whenever the peer's node changes; they own
//! the grants, mappings, ports and XenStore writes the step names.

use super::link::PeerHalf;

/// One instance of a peer's half: its generation (written or derived) and
/// the page and port it offers. Two reads name the same instance only when
/// all three agree (a derived generation alone could collide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HalfId {
    /// [`PeerHalf::generation`].
    pub generation: u32,
    /// [`PeerHalf::ring_ref`].
    pub ring_ref: u32,
    /// [`PeerHalf::event_channel`].
    pub event_channel: u32,
}

impl From<&PeerHalf> for HalfId {
    fn from(h: &PeerHalf) -> HalfId {
        HalfId {
            generation: h.generation,
            ring_ref: h.ring_ref,
            event_channel: h.event_channel,
        }
    }
}

/// How long a half we could not attach to is left alone: a peer whose
/// half names a page or port we cannot map or bind (broken, hostile, or
/// gone mid-read) would otherwise be retried at every event, and making
/// our half anew makes events of its own.
pub const ATTACH_RETRY_MS: u64 = 1000;

/// The last half we could not attach to, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedAttach {
    /// The instance of the peer's half.
    pub half: HalfId,
    /// When the attach failed (host clock, ms).
    pub at_ms: u64,
}

impl FailedAttach {
    /// Whether `half` is still left alone at `now_ms`.
    pub fn holds(&self, half: &PeerHalf, now_ms: u64) -> bool {
        self.half == HalfId::from(half) && now_ms < self.at_ms.saturating_add(ATTACH_RETRY_MS)
    }
}

/// What we hold of the link with the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ours {
    /// No half of ours (the user-space transport between links; the kernel
    /// module keeps its half for as long as the link exists).
    Nothing,
    /// Our half is offered and we are not attached to the peer's.
    /// `generation` is ours when we write one (the kernel module does not).
    Offered {
        /// Our written generation.
        generation: Option<u32>,
    },
    /// Attached to this instance of the peer's half.
    Attached(HalfId),
}

/// The peer's half as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Theirs {
    /// Its node is gone: a destroyed domain, or a pair dom0 ended.
    Removed,
    /// There, but not offered: withdrawn (state 5 or 6), incomplete, or
    /// not readable.
    Withdrawn,
    /// Offered or connected, complete.
    Offered(PeerHalf),
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfStep {
    /// Nothing (a repeated event, an answer to an older offer of ours, a
    /// half held dead, a peer that went away before we attached).
    Ignore,
    /// Make our half answering the peer's generation, then attach to its.
    Answer {
        /// The `peer-generation` our half writes.
        answering: u32,
    },
    /// Attach to the peer's half (ours is offered).
    Attach,
    /// The peer restarted while we were attached: everything on the old
    /// link is dead. Take it down, then decide again (the peer's new half
    /// is an offer).
    Restart,
    /// The peer went away while we were attached: take the link down.
    /// `removed` tells a node that vanished (a domain that may be dead)
    /// from one withdrawn (a guest leaving for a save or migration says so
    /// first).
    Detach {
        /// The node was removed, not withdrawn.
        removed: bool,
    },
}

/// What we hold against the peer's halves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// A generation the peer wrote and that we saw die (its process
    /// killed: a dead process cannot withdraw its node). Only a written
    /// generation names one instance, so a derived one is never held (the
    /// kernel module offers its same half again after a link went down).
    pub dead: Option<u32>,
    /// The last half we could not attach to.
    pub failed: Option<FailedAttach>,
}

/// Decides the step for one reading of the peer's half at `now_ms`.
pub fn follow(ours: Ours, theirs: Theirs, held: Held, now_ms: u64) -> HalfStep {
    let half = match theirs {
        Theirs::Offered(h) => h,
        Theirs::Removed | Theirs::Withdrawn => {
            return match ours {
                Ours::Attached(_) => HalfStep::Detach {
                    removed: theirs == Theirs::Removed,
                },
                Ours::Nothing | Ours::Offered { .. } => HalfStep::Ignore,
            };
        }
    };
    if half.generation_written && held.dead == Some(half.generation) {
        return HalfStep::Ignore;
    }
    if held.failed.is_some_and(|f| f.holds(&half, now_ms)) {
        return HalfStep::Ignore;
    }
    match ours {
        Ours::Attached(id) if id == HalfId::from(&half) => HalfStep::Ignore,
        Ours::Attached(_) => HalfStep::Restart,
        Ours::Offered { generation } => match generation {
            // It answered an older offer of ours: it will see the current
            // one and answer again.
            Some(mine) if half.peer_generation != 0 && half.peer_generation != mine => {
                HalfStep::Ignore
            }
            _ => HalfStep::Attach,
        },
        Ours::Nothing => HalfStep::Answer {
            answering: half.generation,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half(generation: u32, written: bool, peer_generation: u32) -> PeerHalf {
        PeerHalf {
            generation,
            generation_written: written,
            ring_ref: 8,
            event_channel: 9,
            peer_generation,
            ring_reuse: false,
        }
    }

    fn dead(generation: u32) -> Held {
        Held {
            dead: Some(generation),
            failed: None,
        }
    }

    #[test]
    fn an_offer_is_answered_when_we_hold_nothing() {
        let h = half(41, true, 0);
        assert_eq!(
            follow(Ours::Nothing, Theirs::Offered(h), Held::default(), 0),
            HalfStep::Answer { answering: 41 }
        );
        // a derived generation is answered the same way
        let k = half(0x5853_0001, false, 0);
        assert_eq!(
            follow(Ours::Nothing, Theirs::Offered(k), Held::default(), 0),
            HalfStep::Answer {
                answering: 0x5853_0001
            }
        );
    }

    #[test]
    fn our_offer_takes_answers_to_it_and_crossed_offers() {
        let ours = Ours::Offered {
            generation: Some(7),
        };
        for answered in [0, 7] {
            assert_eq!(
                follow(
                    ours,
                    Theirs::Offered(half(41, true, answered)),
                    Held::default(),
                    0
                ),
                HalfStep::Attach,
                "peer-generation {answered}"
            );
        }
        // an answer to an older offer of ours waits for the next one
        assert_eq!(
            follow(ours, Theirs::Offered(half(41, true, 6)), Held::default(), 0),
            HalfStep::Ignore
        );
        // a host that writes no generation attaches to whatever answers it
        let kernel = Ours::Offered { generation: None };
        assert_eq!(
            follow(
                kernel,
                Theirs::Offered(half(41, true, 6)),
                Held::default(),
                0
            ),
            HalfStep::Attach
        );
    }

    #[test]
    fn the_same_instance_is_left_alone_and_another_restarts() {
        let h = half(41, true, 7);
        let ours = Ours::Attached(HalfId::from(&h));
        assert_eq!(
            follow(ours, Theirs::Offered(h), Held::default(), 0),
            HalfStep::Ignore
        );
        assert_eq!(
            follow(ours, Theirs::Offered(half(42, true, 7)), Held::default(), 0),
            HalfStep::Restart
        );
        // same generation, another page: another instance (a derived
        // generation can collide)
        let moved = PeerHalf { ring_ref: 99, ..h };
        assert_eq!(
            follow(ours, Theirs::Offered(moved), Held::default(), 0),
            HalfStep::Restart
        );
    }

    #[test]
    fn a_half_going_away_detaches_only_an_attached_link() {
        let ours = Ours::Attached(HalfId::from(&half(41, true, 0)));
        assert_eq!(
            follow(ours, Theirs::Removed, Held::default(), 0),
            HalfStep::Detach { removed: true }
        );
        assert_eq!(
            follow(ours, Theirs::Withdrawn, Held::default(), 0),
            HalfStep::Detach { removed: false }
        );
        for ours in [
            Ours::Nothing,
            Ours::Offered {
                generation: Some(7),
            },
        ] {
            for theirs in [Theirs::Removed, Theirs::Withdrawn] {
                assert_eq!(follow(ours, theirs, Held::default(), 0), HalfStep::Ignore);
            }
        }
    }

    #[test]
    fn only_a_written_generation_is_held_dead() {
        let killed = half(41, true, 0);
        for ours in [
            Ours::Nothing,
            Ours::Offered {
                generation: Some(7),
            },
        ] {
            assert_eq!(
                follow(ours, Theirs::Offered(killed), dead(41), 0),
                HalfStep::Ignore
            );
        }
        // the module's same half, offered again after its link went down
        let kernel = half(41, false, 0);
        assert_eq!(
            follow(Ours::Nothing, Theirs::Offered(kernel), dead(41), 0),
            HalfStep::Answer { answering: 41 }
        );
    }

    #[test]
    fn a_half_we_could_not_attach_to_is_left_alone_for_a_while() {
        let h = half(41, false, 0);
        let held = Held {
            dead: None,
            failed: Some(FailedAttach {
                half: HalfId::from(&h),
                at_ms: 100,
            }),
        };
        for ours in [
            Ours::Nothing,
            Ours::Offered {
                generation: Some(7),
            },
        ] {
            assert_eq!(
                follow(ours, Theirs::Offered(h), held, 100 + ATTACH_RETRY_MS - 1),
                HalfStep::Ignore
            );
            assert_ne!(
                follow(ours, Theirs::Offered(h), held, 100 + ATTACH_RETRY_MS),
                HalfStep::Ignore
            );
            // another instance is not held
            let restarted = PeerHalf { ring_ref: 10, ..h };
            assert_ne!(
                follow(ours, Theirs::Offered(restarted), held, 100),
                HalfStep::Ignore
            );
        }
    }
}
