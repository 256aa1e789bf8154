// SPDX-License-Identifier: MIT OR Apache-2.0
//! A receiving direction's control frames as they come on the sender's
//! leg, put back in order (docs/protocol.md 5.4).

use super::{ConsumedNotice, Epoch, RingFromOutcome, RxPath, SwitchError};

/// A control frame for a receiving direction, as it came on the sender's
/// leg (docs/protocol.md 5.4): taken in order by [`RxControlOrder::take`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxControl {
    /// A run of raw stream bytes on the leg starts at `offset`.
    RawFrom {
        /// Stream offset of the run's first byte.
        offset: u64,
    },
    /// The run ends at `offset`; ring `epoch` carries what follows.
    RingFrom {
        /// The offered ring's epoch.
        epoch: Epoch,
        /// Stream offset where the ring takes over.
        offset: u64,
    },
    /// The sender froze ring `epoch` after `offset` bytes.
    TxFreeze {
        /// The frozen ring's epoch.
        epoch: Epoch,
        /// Bytes the sender had sent when it froze.
        offset: u64,
    },
    /// The stream ends at `offset`.
    Fin {
        /// The stream's length.
        offset: u64,
    },
}

/// How many [`RxControl`] frames a receiving direction queues. A frame
/// waits only while a `RingFrom` ahead of it waits for the bytes before
/// it, and a sender sends few frames before it needs an answer: a peer
/// that sends more is in breach.
pub const RX_CONTROL_MAX: usize = 64;

/// The receiving direction's control frames in arrival order, at most
/// [`RX_CONTROL_MAX`] (no allocation: the kernel host has no deque).
#[derive(Clone, Debug)]
pub struct RxControlQueue {
    q: [RxControl; RX_CONTROL_MAX],
    head: usize,
    len: usize,
}

impl Default for RxControlQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl RxControlQueue {
    /// An empty queue.
    pub const fn new() -> Self {
        RxControlQueue {
            q: [RxControl::Fin { offset: 0 }; RX_CONTROL_MAX],
            head: 0,
            len: 0,
        }
    }

    /// Frames queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no frame is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest frame.
    pub fn front(&self) -> Option<RxControl> {
        (self.len > 0).then(|| self.q[self.head])
    }

    /// Drops the oldest frame (it was taken).
    pub fn pop(&mut self) {
        if self.len > 0 {
            self.head = (self.head + 1) % RX_CONTROL_MAX;
            self.len -= 1;
        }
    }

    /// Queues `frame` last; Err: the queue is full (the peer is in breach).
    pub fn push(&mut self, frame: RxControl) -> Result<(), SwitchError> {
        if self.len == RX_CONTROL_MAX {
            return Err(SwitchError::UnexpectedInState(
                "control frame beyond the queue",
            ));
        }
        self.q[(self.head + self.len) % RX_CONTROL_MAX] = frame;
        self.len += 1;
        Ok(())
    }

    /// Where the run being read ends, if its `RingFrom` is queued already.
    pub fn run_end(&self) -> Option<u64> {
        (0..self.len).find_map(|k| match self.q[(self.head + k) % RX_CONTROL_MAX] {
            RxControl::RingFrom { offset, .. } => Some(offset),
            _ => None,
        })
    }
}

/// What taking a control frame did, for the host to act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxControlTaken {
    /// A `RawFrom`: the leg carries stream bytes from where we stand.
    Run,
    /// A `RingFrom`; [`RingFromOutcome::Switch`]: read the offered ring
    /// (epoch `epoch`) from now on.
    RingFrom {
        /// The ring's epoch.
        epoch: Epoch,
        /// Where the ring takes over.
        offset: u64,
        /// Switch to it, or keep reading TCP.
        outcome: RingFromOutcome,
    },
    /// A `TxFreeze`; `consumed`: the `Consumed` to send, if one is due.
    TxFreeze {
        /// The frozen ring's epoch.
        epoch: Epoch,
        /// Bytes the sender had sent.
        offset: u64,
        /// What to answer.
        consumed: Option<ConsumedNotice>,
    },
    /// A `Fin`: the stream ends there.
    Fin,
}

/// A control frame out of order: the connection must be reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RxControlError {
    /// A `RawFrom` while a run is open.
    RawFromInsideRun,
    /// The reader read on past a run's end (before that run's `RingFrom`
    /// came), and the next run does not start there.
    RunNotFromRunEnd {
        /// Where the earlier run ended.
        end: u64,
        /// Where the next one says it starts.
        offset: u64,
    },
    /// A `RingFrom` with no open run to end.
    RingFromWithoutRun,
    /// A `RingFrom` that switches to a ring at an offset the reader
    /// already read past on TCP.
    ReadPastRunEnd,
    /// The frame breaks the switch-over protocol.
    Switch(SwitchError),
}

impl From<SwitchError> for RxControlError {
    fn from(e: SwitchError) -> Self {
        RxControlError::Switch(e)
    }
}

impl RxControlError {
    /// What went wrong, in a few words (for hosts that log a static text).
    pub fn what(&self) -> &'static str {
        match self {
            RxControlError::RawFromInsideRun => "RawFrom inside a run",
            RxControlError::RunNotFromRunEnd { .. } => {
                "a run after reading on past a run's end, not from there"
            }
            RxControlError::RingFromWithoutRun => "RingFrom without a run",
            RxControlError::ReadPastRunEnd => "read past a run's end",
            RxControlError::Switch(_) => "a control frame out of place",
        }
    }
}

impl core::fmt::Display for RxControlError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RxControlError::RawFromInsideRun => f.write_str("RawFrom inside a run"),
            RxControlError::RunNotFromRunEnd { end, offset } => write!(
                f,
                "run from {offset} after reading on past a run's end at {end}"
            ),
            RxControlError::RingFromWithoutRun => f.write_str("RingFrom without a run"),
            RxControlError::ReadPastRunEnd => f.write_str("read past a run's end"),
            RxControlError::Switch(e) => write!(f, "{e}"),
        }
    }
}

/// The order in which a receiving direction takes its control frames: as
/// on one ordered stream, a `RingFrom` waits until every byte before it
/// was read off the leg, a `RawFrom` or `Fin` until the ring in use gave
/// way, and what follows waits with them. It tracks the raw runs on
/// the leg: one is open from its `RawFrom` to its `RingFrom`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxControlOrder {
    run_open: bool,
    /// The reader read past a run's end before that run's `RingFrom` came
    /// (it was abandoned): the next run must start exactly there.
    join_at: Option<u64>,
}

impl RxControlOrder {
    /// No run open (a connection set up on rings).
    pub const fn new() -> Self {
        RxControlOrder {
            run_open: false,
            join_at: None,
        }
    }

    /// Whether a raw run is open: the leg's bytes are stream bytes.
    pub fn run_open(&self) -> bool {
        self.run_open
    }

    /// Where the next run must start, if the reader read past a run's end.
    pub fn join_at(&self) -> Option<u64> {
        self.join_at
    }

    /// Whether `frame` must wait for bytes ahead of it.
    pub fn waits(path: &RxPath, frame: &RxControl) -> bool {
        let takeable = path.tcp_data_takeable();
        match *frame {
            RxControl::RingFrom { offset, .. } => !takeable || path.taken() < offset,
            RxControl::RawFrom { .. } | RxControl::Fin { .. } => !takeable,
            RxControl::TxFreeze { .. } => false,
        }
    }

    /// Takes `frame`, the oldest queued, into `path` if it can be taken
    /// now; Ok(None): it waits (leave it queued).
    pub fn take(
        &mut self,
        path: &mut RxPath,
        frame: RxControl,
    ) -> Result<Option<RxControlTaken>, RxControlError> {
        if Self::waits(path, &frame) {
            return Ok(None);
        }
        let taken = match frame {
            RxControl::RawFrom { offset } => {
                match self.join_at.take() {
                    Some(end) if end == offset => {}
                    Some(end) => return Err(RxControlError::RunNotFromRunEnd { end, offset }),
                    None if self.run_open => return Err(RxControlError::RawFromInsideRun),
                    None => {
                        // the run starts where we stand
                        path.on_data(offset, 0)?;
                        self.run_open = true;
                    }
                }
                RxControlTaken::Run
            }
            RxControl::RingFrom { epoch, offset } => {
                if !self.run_open || self.join_at.is_some() {
                    return Err(RxControlError::RingFromWithoutRun);
                }
                let outcome = path.on_ring_from(epoch, offset)?;
                if path.taken() > offset {
                    // We read past the run's end before its RingFrom was
                    // here. The bytes after it are the next run's, which
                    // (an offer we abandoned, whose Consumed left before
                    // this RingFrom came) goes on from that very end: its
                    // RawFrom must say so.
                    if outcome == RingFromOutcome::Switch {
                        return Err(RxControlError::ReadPastRunEnd);
                    }
                    self.join_at = Some(offset);
                } else {
                    self.run_open = false;
                }
                RxControlTaken::RingFrom {
                    epoch,
                    offset,
                    outcome,
                }
            }
            RxControl::TxFreeze { epoch, offset } => RxControlTaken::TxFreeze {
                epoch,
                offset,
                consumed: path.on_tx_freeze(epoch, Some(offset))?,
            },
            RxControl::Fin { offset } => {
                path.on_fin(offset)?;
                RxControlTaken::Fin
            }
        };
        Ok(Some(taken))
    }
}
