// SPDX-License-Identifier: MIT OR Apache-2.0
//! The carrier state machine: how a stream connection moves between the
//! ring and its TCP leg without losing, duplicating or reordering a byte.
//!
//! Each direction of a connection is handled separately: a [`TxPath`] at the
//! sender and an [`RxPath`] at the receiver. Byte offsets in the stream are
//! the sequence numbers. Rings are numbered by *epoch* (0 for the ring set up
//! at connect, then one more for every ring set up afterwards), so a message
//! about a ring that is already gone can be recognised and ignored.
//!
//! ```text
//!            freeze (local suspend, peer gone, TxFreeze/Consumed seen)
//!   RING ───────────────────────────────► DRAINING ──(offsets agreed)──► TCP
//!    ▲                                                                   │
//!    │ RingFrom{epoch, M} seen / sent          peer back: RingOffer      │
//!    └────────────────────────────── UPGRADING ◄─────────────────────────┘
//! ```
//!
//! # Going to TCP
//!
//! The sender freezes its ring: it stops producing, copies the bytes the
//! receiver has not consumed back out of the ring (the ring is the
//! retransmission buffer; see [`crate::ring::Producer::read_back`]) and
//! sends `TxFreeze{epoch, sent}` on TCP. The receiver trusts nothing in
//! the ring beyond what it took, whichever side moved: a receiver restored
//! from a move may hold a torn copy of its pages (writes through a foreign
//! mapping are not logged as dirty during a live migration), and the
//! sender's copy makes the ring's unread bytes come again anyway. So no
//! host ever drains a frozen ring, and none has to keep one across its own
//! suspend.
//!
//! It answers `Consumed{epoch, M}`: "I hold everything below M". The sender
//! resends from M (or from where the ring began, if later: anything before
//! that went over TCP and is still in flight) and continues on TCP.
//!
//! # Returning to the ring
//!
//! When the peers are co-resident again the receiver grants a new ring and
//! offers it on the link (`RingOffer{epoch}`). The sender, at a byte
//! boundary `M`, sends the marker `RingFrom{epoch, M}` on TCP and writes
//! every later byte into the ring. The receiver reads TCP up to `M`, then
//! the ring. Each direction switches independently. (How the hosts carry
//! the bytes and markers on the TCP legs, the raw leg of protocol version
//! 2, is `docs/protocol.md` 5.4; this machine sees only offsets.)
//!
//! # Moves during a switch
//!
//! A move while a ring offer is outstanding abandons that epoch: the
//! receiver declares it dead with `Consumed`, the sender never accepts an
//! offer for an epoch at or below one it has seen declared dead, and a
//! `RingFrom` for a dead epoch is ignored (the bytes after it are resent on
//! TCP). Because every control frame of one direction travels on one
//! ordered TCP stream, `RingFrom` always arrives before the `TxFreeze` of
//! that ring.

/// A ring epoch.
pub type Epoch = u32;

/// A breach of the switch-over protocol by the peer (or a host bug): the
/// connection must be reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SwitchError {
    /// An offset outside what the protocol allows at this point.
    BadOffset {
        /// The offending offset.
        got: u64,
        /// Lowest acceptable value.
        min: u64,
        /// Highest acceptable value.
        max: u64,
    },
    /// A frame or call that is not valid in the current state.
    UnexpectedInState(&'static str),
    /// A ring epoch that cannot exist yet.
    BadEpoch(Epoch),
}

impl core::fmt::Display for SwitchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SwitchError::BadOffset { got, min, max } => {
                write!(f, "stream offset {got} outside [{min}, {max}]")
            }
            SwitchError::UnexpectedInState(what) => write!(f, "unexpected {what} in this state"),
            SwitchError::BadEpoch(e) => write!(f, "ring epoch {e} is not valid here"),
        }
    }
}

/// Connection-level phase, derived from both directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Both directions on the ring.
    Ring,
    /// A ring is frozen and offsets are being agreed.
    Draining,
    /// Both directions on TCP.
    Tcp,
    /// At least one direction is on its way back to (or already on) a new
    /// ring while the other is not.
    Upgrading,
}

/// Sender-side state of one direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxState {
    /// Writing into ring `epoch`, whose byte 0 is stream offset `start`.
    Ring {
        /// The ring's epoch.
        epoch: Epoch,
        /// Stream offset of the ring's first byte.
        start: u64,
    },
    /// Ring `epoch` is frozen; the host holds a copy of the stream from
    /// `resend_base` to the end. Writes wait until `Consumed` arrives.
    Frozen {
        /// The ring's epoch.
        epoch: Epoch,
        /// Stream offset of the ring's first byte.
        start: u64,
        /// Stream offset of the first byte of the host's resend copy.
        resend_base: u64,
    },
    /// Writing `Data` frames on TCP.
    Tcp,
}

/// Bytes the host must send on TCP after the receiver's `Consumed`: the
/// slice `[skip, skip + len)` of its resend copy, as `Data` frames starting
/// at stream offset `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resend {
    /// Stream offset of the first byte to send.
    pub from: u64,
    /// Bytes of the resend copy to skip (the receiver already has them).
    pub skip: u64,
    /// Bytes to send.
    pub len: u64,
}

/// What the host does with a `Consumed` frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsumedOutcome {
    /// Resend, then continue on TCP; drop the resend copy afterwards.
    Resend(Resend),
    /// The receiver abandoned the ring still in use here: freeze it first
    /// ([`TxPath::freeze`]), then hand the frame in again.
    FreezeFirst,
    /// Nothing to do (old or duplicate news).
    Ignore,
}

/// The sender's half of the state machine for one direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxPath {
    state: TxState,
    sent: u64,
    /// Highest epoch used here or declared dead by the receiver.
    last_epoch: Epoch,
    fin: bool,
}

/// What the host sends after [`TxPath::freeze`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxFreezeNotice {
    /// Epoch of the ring frozen (or of the last ring used).
    pub epoch: Epoch,
    /// Bytes sent so far.
    pub offset: u64,
}

impl TxPath {
    /// A direction starting on ring epoch 0.
    pub fn on_ring() -> Self {
        TxPath {
            state: TxState::Ring { epoch: 0, start: 0 },
            sent: 0,
            last_epoch: 0,
            fin: false,
        }
    }

    /// A direction starting on TCP (the peer was not co-resident at connect).
    pub fn on_tcp() -> Self {
        TxPath {
            state: TxState::Tcp,
            sent: 0,
            last_epoch: 0,
            fin: false,
        }
    }

    /// Current state.
    pub fn state(&self) -> TxState {
        self.state
    }

    /// Stream bytes accepted from the application so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Whether the application shut down writing.
    pub fn is_finished(&self) -> bool {
        self.fin
    }

    /// Whether the application may write now (not while frozen, not after
    /// shutdown).
    pub fn writable(&self) -> bool {
        !self.fin && !matches!(self.state, TxState::Frozen { .. })
    }

    /// Records `n` bytes accepted onto the current carrier.
    pub fn record_sent(&mut self, n: u64) -> Result<(), SwitchError> {
        if !self.writable() {
            return Err(SwitchError::UnexpectedInState("write"));
        }
        self.sent = self.sent.saturating_add(n);
        Ok(())
    }

    /// Records the application's `shutdown(SHUT_WR)`. On the ring the host
    /// sets the FIN flag; on TCP it sends `Fin{sent}`; while frozen it sends
    /// `Fin` after the resend.
    pub fn finish(&mut self) {
        self.fin = true;
    }

    /// Freezes the ring in use: the host has stopped writing it and copied
    /// its `unconsumed` bytes out with
    /// [`crate::ring::Producer::read_back`]. Returns the `TxFreeze` to send
    /// on TCP.
    ///
    /// Every freeze yields a notice, also when already frozen or on TCP
    /// (`unconsumed` is then ignored): a move loses the link and with it any
    /// ring offer in flight, and the notice is how a receiver waiting on
    /// such an offer learns it is void.
    pub fn freeze(&mut self, unconsumed: u64) -> Result<TxFreezeNotice, SwitchError> {
        match self.state {
            TxState::Ring { epoch, start } => {
                let in_ring = self.sent - start;
                if unconsumed > in_ring {
                    return Err(SwitchError::BadOffset {
                        got: unconsumed,
                        min: 0,
                        max: in_ring,
                    });
                }
                self.state = TxState::Frozen {
                    epoch,
                    start,
                    resend_base: self.sent - unconsumed,
                };
                Ok(TxFreezeNotice {
                    epoch,
                    offset: self.sent,
                })
            }
            TxState::Frozen { epoch, .. } => Ok(TxFreezeNotice {
                epoch,
                offset: self.sent,
            }),
            TxState::Tcp => Ok(TxFreezeNotice {
                epoch: self.last_epoch,
                offset: self.sent,
            }),
        }
    }

    /// Handles the receiver's `Consumed{epoch, offset}`.
    pub fn on_consumed(
        &mut self,
        epoch: Epoch,
        offset: u64,
    ) -> Result<ConsumedOutcome, SwitchError> {
        if offset > self.sent {
            return Err(SwitchError::BadOffset {
                got: offset,
                min: 0,
                max: self.sent,
            });
        }
        match self.state {
            TxState::Ring { epoch: current, .. } if epoch == current => {
                Ok(ConsumedOutcome::FreezeFirst)
            }
            TxState::Frozen {
                epoch: current,
                start,
                resend_base,
            } if epoch == current => {
                let from = offset.max(start);
                if from < resend_base {
                    return Err(SwitchError::BadOffset {
                        got: offset,
                        min: resend_base,
                        max: self.sent,
                    });
                }
                self.state = TxState::Tcp;
                Ok(ConsumedOutcome::Resend(Resend {
                    from,
                    skip: from - resend_base,
                    len: self.sent - from,
                }))
            }
            TxState::Ring { epoch: current, .. } | TxState::Frozen { epoch: current, .. } => {
                // Older: stale news. Newer: the receiver voids an offer that
                // has not reached us; never accept it later.
                if epoch > current {
                    self.last_epoch = self.last_epoch.max(epoch);
                }
                Ok(ConsumedOutcome::Ignore)
            }
            TxState::Tcp => {
                self.last_epoch = self.last_epoch.max(epoch);
                Ok(ConsumedOutcome::Ignore)
            }
        }
    }

    /// Whether a `RingOffer{epoch}` must wait for the receiver's `Consumed`
    /// before it is handed to [`TxPath::on_ring_offer`].
    ///
    /// A receiver offers a ring only once it is on TCP, i.e. after it sent
    /// `Consumed` for the ring this side may still be writing. That
    /// `Consumed` travels on TCP and the offer on the link, so the offer can
    /// arrive first: this side is then still on (or frozen on) an older
    /// ring. The host keeps the newest such offer and hands it in once a
    /// `Consumed` moved this direction to TCP. (Handing it in at once is a
    /// protocol error: an offer while a ring is in use.)
    pub fn offer_waits_for_consumed(&self, epoch: Epoch) -> bool {
        match self.state {
            TxState::Ring { epoch: current, .. } | TxState::Frozen { epoch: current, .. } => {
                epoch > current
            }
            TxState::Tcp => false,
        }
    }

    /// Handles the receiver's `RingOffer{epoch}` from the link. Returns the
    /// stream offset `M` for the marker `RingFrom{epoch, M}`, which the host
    /// sends on TCP *before* writing into the new ring; `None` means the
    /// offer is stale (or the stream is finished) and the host declines it.
    pub fn on_ring_offer(&mut self, epoch: Epoch) -> Result<Option<u64>, SwitchError> {
        match self.state {
            TxState::Tcp if epoch > self.last_epoch && !self.fin => {
                self.last_epoch = epoch;
                self.state = TxState::Ring {
                    epoch,
                    start: self.sent,
                };
                Ok(Some(self.sent))
            }
            TxState::Tcp => Ok(None),
            // An offer for a ring after the one in use: resizing in place is
            // not part of this protocol version.
            TxState::Ring { epoch: current, .. } | TxState::Frozen { epoch: current, .. } => {
                if epoch <= current {
                    Ok(None)
                } else {
                    Err(SwitchError::UnexpectedInState(
                        "ring offer while a ring is in use",
                    ))
                }
            }
        }
    }
}

/// Receiver-side state of one direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxState {
    /// Reading ring `epoch`, whose byte 0 is stream offset `start`.
    Ring {
        /// The ring's epoch.
        epoch: Epoch,
        /// Stream offset of the ring's first byte.
        start: u64,
    },
    /// Reading `Data` frames on TCP.
    Tcp,
    /// A new ring `epoch` was offered; TCP is read until its `RingFrom`.
    Offered {
        /// The offered ring's epoch.
        epoch: Epoch,
    },
}

/// What the host does with a `RingFrom` marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingFromOutcome {
    /// Read the offered ring from now on.
    Switch,
    /// The epoch was abandoned; keep reading TCP.
    Ignore,
}

/// The receiver's half of the state machine for one direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RxPath {
    state: RxState,
    /// Stream bytes taken off the carriers (ring or TCP).
    taken: u64,
    /// Stream offset the next TCP `Data` frame must start at.
    next_tcp: u64,
    last_epoch: Epoch,
    eof: Option<u64>,
}

/// The `Consumed` the host sends on TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumedNotice {
    /// Epoch of the ring abandoned.
    pub epoch: Epoch,
    /// The sender resends from here.
    pub offset: u64,
}

impl RxPath {
    /// A direction starting on ring epoch 0.
    pub fn on_ring() -> Self {
        RxPath {
            state: RxState::Ring { epoch: 0, start: 0 },
            taken: 0,
            next_tcp: 0,
            last_epoch: 0,
            eof: None,
        }
    }

    /// A direction starting on TCP.
    pub fn on_tcp() -> Self {
        RxPath {
            state: RxState::Tcp,
            ..Self::on_ring()
        }
    }

    /// Current state.
    pub fn state(&self) -> RxState {
        self.state
    }

    /// Stream bytes taken off the carriers.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// Offset of the end of stream, once known.
    pub fn eof_at(&self) -> Option<u64> {
        self.eof
    }

    /// Whether the ring is where the next bytes come from.
    pub fn reads_ring(&self) -> bool {
        matches!(self.state, RxState::Ring { .. })
    }

    /// Records `n` bytes taken off the ring.
    pub fn record_ring_taken(&mut self, n: u64) -> Result<(), SwitchError> {
        match self.state {
            RxState::Ring { .. } => {
                self.taken += n;
                Ok(())
            }
            _ => Err(SwitchError::UnexpectedInState("ring read")),
        }
    }

    /// This side is moving (local suspend): bytes in its ring beyond what it
    /// took are not trusted. Returns the `Consumed` to send, if any.
    pub fn freeze_local(&mut self) -> Option<ConsumedNotice> {
        match self.state {
            RxState::Ring { epoch, .. } => {
                self.state = RxState::Tcp;
                self.next_tcp = self.taken;
                Some(ConsumedNotice {
                    epoch,
                    offset: self.taken,
                })
            }
            RxState::Offered { epoch } => {
                self.abandon(epoch);
                Some(ConsumedNotice {
                    epoch,
                    offset: self.next_tcp,
                })
            }
            RxState::Tcp => None,
        }
    }

    /// This side stayed and its peer left the ring without freezing it
    /// first (its link died: the peer was saved, migrated or destroyed
    /// without retracting): the host copied the `n` bytes its own ring
    /// still held past what was taken out of it, into its own memory, and
    /// they count as taken. The peer cannot write more (it is gone), and a
    /// peer restored without its rings has nothing to resend them from, so
    /// they are kept rather than asked for again. A peer that is still
    /// running resends what it writes after the copy from its own read
    /// back, as after [`RxPath::freeze_local`]. Returns the `Consumed` to
    /// send, if any.
    pub fn freeze_salvaged(&mut self, n: u64) -> Option<ConsumedNotice> {
        match self.state {
            RxState::Ring { .. } => {
                self.taken += n;
                self.freeze_local()
            }
            _ => self.freeze_local(),
        }
    }

    fn abandon(&mut self, epoch: Epoch) {
        self.last_epoch = self.last_epoch.max(epoch);
        self.state = RxState::Tcp;
    }

    /// The sender froze ring `epoch` after sending `sent` bytes (from its
    /// `TxFreeze`; `None` when only the link reported the peer gone). This
    /// side keeps what it took and nothing more of the ring (module docs:
    /// its pages may be torn, and the sender sends the rest again).
    /// Returns the `Consumed` to send.
    pub fn on_tx_freeze(
        &mut self,
        epoch: Epoch,
        sent: Option<u64>,
    ) -> Result<Option<ConsumedNotice>, SwitchError> {
        match self.state {
            RxState::Ring { epoch: current, .. } if epoch == current => {
                if let Some(sent) = sent {
                    if self.taken > sent {
                        return Err(SwitchError::BadOffset {
                            got: sent,
                            min: self.taken,
                            max: u64::MAX,
                        });
                    }
                }
                self.next_tcp = self.taken;
                self.state = RxState::Tcp;
                Ok(Some(ConsumedNotice {
                    epoch,
                    offset: self.taken,
                }))
            }
            RxState::Ring { epoch: current, .. } if epoch < current => Ok(None),
            RxState::Ring { .. } => Err(SwitchError::BadEpoch(epoch)),
            // The sender left an older ring while this side is off every
            // ring: it is answered with what TCP brought us, always. A ring
            // this side left or abandoned was answered then and the sender
            // ignores the repeat; but a sender frozen on a ring nobody
            // answers stays frozen for good, and answering costs nothing.
            // An offer out stands: the sender may take it (its RingFrom
            // follows this on the stream). Abandoning it here would answer
            // a freeze that crossed our offer with a Consumed that freezes
            // the ring the sender just took, whose TxFreeze crosses our
            // next offer: a chain of rings, one per round trip, for as long
            // as offers outrun freezes.
            RxState::Offered { epoch: offered } if epoch < offered => Ok(Some(ConsumedNotice {
                epoch,
                offset: self.next_tcp,
            })),
            RxState::Offered { .. } => Err(SwitchError::BadEpoch(epoch)),
            RxState::Tcp if epoch <= self.last_epoch => Ok(Some(ConsumedNotice {
                epoch,
                offset: self.next_tcp,
            })),
            RxState::Tcp => Ok(None),
        }
    }

    /// Validates a TCP `Data` frame of `len` bytes at `offset` and records
    /// it as taken.
    pub fn on_data(&mut self, offset: u64, len: u64) -> Result<(), SwitchError> {
        if !self.tcp_data_takeable() {
            return Err(SwitchError::UnexpectedInState(
                "TCP data before the ring's bytes",
            ));
        }
        if offset != self.next_tcp {
            return Err(SwitchError::BadOffset {
                got: offset,
                min: self.next_tcp,
                max: self.next_tcp,
            });
        }
        if let Some(eof) = self.eof {
            if offset + len > eof {
                return Err(SwitchError::UnexpectedInState("data after end of stream"));
            }
        }
        self.next_tcp += len;
        self.taken = self.next_tcp;
        Ok(())
    }

    /// Whether TCP `Data` may be taken now: not while the ring in use
    /// holds the earlier bytes. The host leaves later frames in
    /// the TCP socket until then; control for this direction's sender
    /// travels on the reverse stream, so nothing it needs is stuck behind.
    pub fn tcp_data_takeable(&self) -> bool {
        !matches!(self.state, RxState::Ring { .. })
    }

    /// Records end of stream at `offset` (ring FIN flag seen with the ring
    /// empty, or a TCP `Fin`). A repeat with the same offset is fine.
    pub fn on_fin(&mut self, offset: u64) -> Result<(), SwitchError> {
        match self.eof {
            Some(eof) if eof != offset => Err(SwitchError::BadOffset {
                got: offset,
                min: eof,
                max: eof,
            }),
            _ if offset < self.taken => Err(SwitchError::BadOffset {
                got: offset,
                min: self.taken,
                max: u64::MAX,
            }),
            _ => {
                self.eof = Some(offset);
                Ok(())
            }
        }
    }

    /// The epoch for a new receive ring to offer; moves to `Offered`. Only
    /// on TCP.
    pub fn offer_ring(&mut self) -> Result<Epoch, SwitchError> {
        match self.state {
            RxState::Tcp => {
                let epoch = self
                    .last_epoch
                    .checked_add(1)
                    .ok_or(SwitchError::BadEpoch(Epoch::MAX))?;
                self.last_epoch = epoch;
                self.state = RxState::Offered { epoch };
                Ok(epoch)
            }
            _ => Err(SwitchError::UnexpectedInState("ring offer")),
        }
    }

    /// Handles the `RingFrom{epoch, offset}` marker (the host hands it in once
    /// every byte before `offset` was taken off TCP).
    pub fn on_ring_from(
        &mut self,
        epoch: Epoch,
        offset: u64,
    ) -> Result<RingFromOutcome, SwitchError> {
        match self.state {
            RxState::Offered { epoch: offered } if epoch == offered => {
                if offset != self.next_tcp {
                    return Err(SwitchError::BadOffset {
                        got: offset,
                        min: self.next_tcp,
                        max: self.next_tcp,
                    });
                }
                self.taken = offset;
                self.state = RxState::Ring {
                    epoch,
                    start: offset,
                };
                Ok(RingFromOutcome::Switch)
            }
            _ if epoch <= self.last_epoch => Ok(RingFromOutcome::Ignore),
            _ => Err(SwitchError::BadEpoch(epoch)),
        }
    }
}

/// Both directions of one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Our sending direction.
    pub tx: TxPath,
    /// Our receiving direction.
    pub rx: RxPath,
}

impl Connection {
    /// A connection set up on rings.
    pub fn on_ring() -> Self {
        Connection {
            tx: TxPath::on_ring(),
            rx: RxPath::on_ring(),
        }
    }

    /// A connection set up on TCP.
    pub fn on_tcp() -> Self {
        Connection {
            tx: TxPath::on_tcp(),
            rx: RxPath::on_tcp(),
        }
    }

    /// The connection-level phase shown to operators.
    pub fn phase(&self) -> Phase {
        let tx_ring = matches!(self.tx.state(), TxState::Ring { .. });
        let rx_ring = matches!(self.rx.state(), RxState::Ring { .. });
        let frozen = matches!(self.tx.state(), TxState::Frozen { .. });
        let offered = matches!(self.rx.state(), RxState::Offered { .. });
        if frozen {
            Phase::Draining
        } else if tx_ring && rx_ring {
            Phase::Ring
        } else if tx_ring || rx_ring || offered {
            Phase::Upgrading
        } else {
            Phase::Tcp
        }
    }
}

// The module also includes this file by `#[path]`, which makes a bare
// `mod x;` resolve beside it; explicit paths resolve the same way from
// both crates.
#[path = "switch/rx_control.rs"]
mod rx_control;
pub use rx_control::*;

#[cfg(test)]
#[path = "switch/tests.rs"]
mod tests;
