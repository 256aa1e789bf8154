// SPDX-License-Identifier: MIT OR Apache-2.0
//! Dialling a connection's outbound TCP leg (`docs/protocol.md` 5.4): when
//! the sending side connects it, and when it gives an attempt up and
//! connects again. Both hosts keep one [`Dial`] per connection, tell it
//! what their non-blocking connect did and ask it, with the time, what to
//! do ([`Dial::step`]); it does no I/O and reads no clock.
//!
//! * A SYN sent while the peer is paused (being saved, restored or moved)
//!   is retransmitted with exponential backoff (1, 3, 7, 15, 31, 63 s
//!   after the first): a peer back after a 36 s save and restore got the
//!   next SYN only at 63 s, after the peer-lost bound had reset the
//!   connection. A connect still pending after [`DIAL_RETRY_MS`] is given
//!   up and made again, so a fresh SYN reaches a returning peer within
//!   that much of its return.
//! * Once the peer's address answers again (a segment on another leg to
//!   it), a pending connect's SYN was lost while the peer was away, and
//!   the next retransmission would wait out the rest of the period: the
//!   attempt is made again after [`DIAL_HEARD_MS`]. A SYN's own first
//!   retransmission comes after 1 s; a younger attempt is left alone.
//! * A connect that fails at once (refused, unreachable) is made again
//!   after [`DIAL_FAILED_MS`].

/// A connect still pending after this long is given up and made again.
pub const DIAL_RETRY_MS: u64 = 3_000;

/// ... and after this long once the peer's address answers again.
pub const DIAL_HEARD_MS: u64 = 1_000;

/// A connect that failed is made again after this long.
pub const DIAL_FAILED_MS: u64 = 250;

/// What the host does for the outbound leg now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialStep {
    /// Nothing: the leg is up, not wanted, or its connect is pending and
    /// young.
    Idle,
    /// Start a non-blocking connect, then [`Dial::connecting`].
    Connect,
    /// Close the pending connect's socket and start another, then
    /// [`Dial::connecting`].
    ConnectAgain,
    /// Ask again at this time (ms).
    WaitUntil(u64),
}

/// One outbound leg's dialling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dial {
    /// When the pending connect started.
    pending_since: Option<u64>,
    /// No connect before this time (after a failed one).
    not_before: u64,
    /// The leg is up: nothing more to dial.
    up: bool,
}

impl Dial {
    /// A leg not dialled yet.
    pub const fn new() -> Self {
        Dial {
            pending_since: None,
            not_before: 0,
            up: false,
        }
    }

    /// A connect started at `now`.
    pub fn connecting(&mut self, now: u64) {
        self.pending_since = Some(now);
    }

    /// The connect (or starting it) failed at `now`.
    pub fn failed(&mut self, now: u64) {
        self.pending_since = None;
        self.not_before = now.saturating_add(DIAL_FAILED_MS);
    }

    /// The connect completed: the leg is up.
    pub fn connected(&mut self) {
        self.pending_since = None;
        self.up = true;
    }

    /// Whether the leg is up.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Whether a connect is pending.
    pub fn is_pending(&self) -> bool {
        self.pending_since.is_some()
    }

    /// What to do at `now`: `wanted`, whether the connection needs the leg
    /// (it is on TCP, or its peer is); `peer_heard`, whether the peer's
    /// address answered since the host last asked.
    pub fn step(&self, wanted: bool, peer_heard: bool, now: u64) -> DialStep {
        if self.up || !wanted {
            return DialStep::Idle;
        }
        match self.pending_since {
            Some(since) => {
                let retry = since.saturating_add(DIAL_RETRY_MS);
                let heard = since.saturating_add(DIAL_HEARD_MS);
                if now >= retry || (peer_heard && now >= heard) {
                    DialStep::ConnectAgain
                } else {
                    DialStep::WaitUntil(retry)
                }
            }
            None if now >= self.not_before => DialStep::Connect,
            None => DialStep::WaitUntil(self.not_before),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leg_is_dialled_when_wanted_and_not_again_once_up() {
        let mut d = Dial::new();
        assert_eq!(d.step(false, false, 0), DialStep::Idle);
        assert_eq!(d.step(true, false, 0), DialStep::Connect);
        d.connecting(10);
        assert!(d.is_pending());
        assert_eq!(d.step(true, false, 500), DialStep::WaitUntil(3_010));
        d.connected();
        assert!(d.is_up() && !d.is_pending());
        assert_eq!(d.step(true, true, 100_000), DialStep::Idle);
    }

    #[test]
    fn a_pending_connect_is_made_again_after_the_retry_period_or_sooner_once_the_peer_answers() {
        let mut d = Dial::new();
        d.connecting(1_000);
        assert_eq!(d.step(true, false, 3_999), DialStep::WaitUntil(4_000));
        assert_eq!(d.step(true, false, 4_000), DialStep::ConnectAgain);
        // heard, but the attempt is younger than a SYN's first retransmission
        assert_eq!(d.step(true, true, 1_999), DialStep::WaitUntil(4_000));
        assert_eq!(d.step(true, true, 2_000), DialStep::ConnectAgain);
    }

    #[test]
    fn a_failed_connect_is_made_again_after_a_pause() {
        let mut d = Dial::new();
        d.connecting(0);
        d.failed(100);
        assert!(!d.is_pending());
        assert_eq!(d.step(true, false, 200), DialStep::WaitUntil(350));
        assert_eq!(d.step(true, false, 350), DialStep::Connect);
    }
}
