// SPDX-License-Identifier: MIT OR Apache-2.0
//! One connection's state: its two rings, its readiness descriptor and the
//! wait/wake discipline shared by blocking callers, poll/epoll users and
//! the link manager.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Instant;

use xensock_proto::ctrl::RingGrant;
use xensock_proto::mem::RawRing;
use xensock_proto::ring::{Consumer, Producer, Received, RingError, Sent};
use xensock_proto::switch::{RxPath, TxPath};
use xensock_xenif::{DomId, EventChannel};

use crate::carrier::{Doorbell, Switch};
use crate::error::errno;
use crate::rings::{MappedRing, OwnedRing};
use crate::sys::eventfd::EventFd;

pub(crate) const WANT_READ: u8 = 1;
pub(crate) const WANT_WRITE: u8 = 2;

/// Event-index value of a side that has not waited yet. A fresh header has
/// 0 there, which would read as "waiting at position 0"; each side stores
/// this into its own event index when it attaches, so that a close can
/// tell whether the peer sleeps on the ring (`ConnIo::peer_waiting`).
/// Kicks are unaffected: `need_event` never fires for it before 4 GiB
/// have passed, and a side publishes a real index before it sleeps.
pub(crate) const NOT_WAITING: u32 = u32::MAX;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnPhase {
    /// ConnectRequest sent, waiting for the answer.
    Connecting,
    /// Both rings are up.
    Open,
    /// The connect failed with this errno.
    Failed(i32),
    /// Reset (by the peer, by a ring violation, or because the peer died);
    /// `reported` once a read or write has returned `ECONNRESET`.
    Reset {
        /// Whether `ECONNRESET` was returned once already.
        reported: bool,
    },
    /// Closed locally.
    Closed,
}

/// The link a connection rides on, as seen from the connection: the list
/// of connections waiting for a kick.
pub(crate) struct LinkShared {
    pub armed: Mutex<Vec<Weak<Conn>>>,
    /// A second descriptor of the link's inbound event channel: one
    /// blocked reader or writer at a time sleeps on it directly, so the
    /// peer's kick wakes it without a hop through the manager thread.
    pub kick_fd: Option<OwnedFd>,
    /// Whether a waiter holds the direct slot on `kick_fd`.
    pub direct: AtomicBool,
}

impl LinkShared {
    pub(crate) fn new(kick_fd: Option<OwnedFd>) -> LinkShared {
        LinkShared {
            armed: Mutex::new(Vec::new()),
            kick_fd,
            direct: AtomicBool::new(false),
        }
    }
}

pub(crate) struct RxSide {
    pub c: Consumer<RawRing>,
    /// The granted pages `c` reads: kept as long as it uses them, and
    /// handed on with it (to the ring pool, to the switch).
    pub owned: OwnedRing,
}

pub(crate) struct TxSide {
    pub p: Producer<RawRing>,
    pub mapped: MappedRing,
    /// How the peer offered the ring: the key under which the mapping is
    /// kept for reuse after the connection (docs/protocol.md 6.6).
    pub grant: RingGrant,
}

pub(crate) struct ConnIo {
    pub phase: ConnPhase,
    pub peer_id: u32,
    pub rx: Option<RxSide>,
    pub tx: Option<TxSide>,
    pub kicker: Option<Arc<dyn EventChannel>>,
    pub rx_path: RxPath,
    pub tx_path: TxPath,
    pub shut_rd: bool,
    pub shut_wr: bool,
    pub peer_closed: bool,
    pub close_received: bool,
    /// Our `Close` went out (on a ring-reuse link it is also sent as the
    /// answer to the peer's, so each side sends exactly one).
    pub close_sent: bool,
    /// `SO_LINGER` 0: the close resets the connection instead of ending it.
    pub abort_on_close: bool,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Ring error waiting to be turned into a Reset frame by the caller.
    pub violation: Option<RingError>,
    /// The carrier switch took the rings over (`Conn::switch`): every
    /// operation goes there.
    pub carried: bool,
}

/// What a ring operation returns once the connection's carrier switch has
/// taken over: the caller retries on the switch.
#[derive(Debug)]
pub(crate) struct Carried;

impl std::fmt::Display for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection moved to its carrier switch")
    }
}

impl std::error::Error for Carried {}

pub(crate) fn carried() -> io::Error {
    io::Error::other(Carried)
}

pub(crate) fn is_carried(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<Carried>())
}

impl ConnIo {
    pub(crate) fn new(rx: Option<RxSide>) -> ConnIo {
        ConnIo {
            phase: ConnPhase::Connecting,
            peer_id: 0,
            rx,
            tx: None,
            kicker: None,
            rx_path: RxPath::on_ring(),
            tx_path: TxPath::on_ring(),
            shut_rd: false,
            shut_wr: false,
            peer_closed: false,
            close_received: false,
            close_sent: false,
            abort_on_close: false,
            bytes_in: 0,
            bytes_out: 0,
            violation: None,
            carried: false,
        }
    }

    fn kick(&self) {
        if let Some(k) = &self.kicker {
            let _ = k.notify();
        }
    }

    /// Drops both rings (unmap the peer's, end our grant) and the kicker.
    pub(crate) fn release(&mut self) {
        self.tx = None;
        self.rx = None;
        self.kicker = None;
    }

    /// Marks the connection reset and releases its rings, setting the RESET
    /// flags first so the peer sees them if it still looks.
    pub(crate) fn reset_local(&mut self) {
        if let Some(tx) = &mut self.tx {
            tx.p.reset();
            let _ = tx.p.flush();
        }
        if let Some(rx) = &mut self.rx {
            rx.c.reset();
        }
        self.kick();
        self.release();
        match self.phase {
            ConnPhase::Connecting => self.phase = ConnPhase::Failed(libc::ECONNREFUSED),
            ConnPhase::Open => self.phase = ConnPhase::Reset { reported: false },
            _ => {}
        }
    }

    /// The link goes while the peer has ended its half (a FIN on our ring
    /// or its Close): as after a TCP FIN, what it wrote stays readable (the
    /// ring is our own grant), then end of stream, and writes get `EPIPE`.
    /// Returns false when the connection is to be reset instead.
    pub(crate) fn end_with_link(&mut self) -> bool {
        if self.phase != ConnPhase::Open || self.carried {
            return false;
        }
        let ended = match self.rx.as_ref().map(|rx| rx.c.peer_end()) {
            Some(Ok(end)) => !end.reset && (end.fin || self.close_received),
            Some(Err(_)) | None => false,
        };
        if !ended {
            return false;
        }
        self.peer_closed = true;
        self.tx = None;
        self.kicker = None;
        true
    }

    fn violated(&mut self, e: RingError) -> io::Error {
        self.violation = Some(e);
        self.reset_local();
        self.phase = ConnPhase::Reset { reported: true };
        errno(libc::ECONNRESET)
    }

    fn dead_state_error(&mut self, write: bool) -> Option<io::Result<usize>> {
        match self.phase {
            ConnPhase::Open => None,
            // A non-blocking connect in progress: wait for the handshake.
            ConnPhase::Connecting => Some(Err(io::ErrorKind::WouldBlock.into())),
            ConnPhase::Failed(e) => Some(Err(errno(e))),
            ConnPhase::Reset { reported: false } => {
                self.phase = ConnPhase::Reset { reported: true };
                Some(Err(errno(libc::ECONNRESET)))
            }
            ConnPhase::Reset { reported: true } | ConnPhase::Closed => Some(if write {
                Err(errno(libc::EPIPE))
            } else {
                Ok(0)
            }),
        }
    }

    /// One non-blocking read attempt: `Err(WouldBlock)` when empty.
    pub(crate) fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.take(buf, false)
    }

    /// One non-blocking peek: what [`ConnIo::try_read`] would return,
    /// left in the ring for the next read.
    pub(crate) fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.take(buf, true)
    }

    fn take(&mut self, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        if self.carried {
            return Err(carried());
        }
        if let Some(r) = self.dead_state_error(false) {
            return r;
        }
        if self.shut_rd || buf.is_empty() {
            return Ok(0);
        }
        let Some(rx) = self.rx.as_mut() else {
            return Ok(0);
        };
        // Flags first: FIN is set after the last `prod` store, so FIN and
        // then an empty ring is a true end of stream.
        let step = if peek {
            rx.c.receive_peek(buf)
        } else {
            rx.c.receive(buf)
        };
        match step {
            Ok(Received::Bytes { n, .. }) if peek => Ok(n),
            Ok(Received::Bytes { n, kick }) => {
                let _ = self.rx_path.record_ring_taken(n as u64);
                self.bytes_in += n as u64;
                if kick {
                    self.kick();
                }
                Ok(n)
            }
            Ok(Received::Reset) => {
                self.reset_local();
                self.phase = ConnPhase::Reset { reported: true };
                Err(errno(libc::ECONNRESET))
            }
            Ok(Received::Empty(end)) if end.fin || self.peer_closed => Ok(0),
            Ok(Received::Empty(_)) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(self.violated(e)),
        }
    }

    /// One non-blocking write attempt: `Err(WouldBlock)` when full.
    pub(crate) fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.carried {
            return Err(carried());
        }
        if let Some(r) = self.dead_state_error(true) {
            return r;
        }
        if self.shut_wr || self.peer_closed {
            return Err(errno(libc::EPIPE));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let Some(tx) = self.tx.as_mut() else {
            return Err(errno(libc::EPIPE));
        };
        match tx.p.send(buf) {
            Ok(Sent::ReaderReset) => {
                self.reset_local();
                self.phase = ConnPhase::Reset { reported: true };
                Err(errno(libc::ECONNRESET))
            }
            Ok(Sent::ReaderClosed) => Err(errno(libc::EPIPE)),
            Ok(Sent::Full) => Err(io::ErrorKind::WouldBlock.into()),
            Ok(Sent::Bytes { n, kick }) => {
                let _ = self.tx_path.record_sent(n as u64);
                self.bytes_out += n as u64;
                if kick {
                    self.kick();
                }
                Ok(n)
            }
            Err(e) => Err(self.violated(e)),
        }
    }

    /// Publishes the event indices for `want` and re-checks. Returns
    /// whether the caller may sleep (nothing it waits for is there yet).
    pub(crate) fn prepare_wait(&mut self, want: u8, write_want: u32) -> bool {
        if self.carried {
            return false;
        }
        match self.phase {
            ConnPhase::Open => {}
            // The answer to the request signals the connection.
            ConnPhase::Connecting => return true,
            _ => return false,
        }
        let mut sleep = true;
        if want & WANT_READ != 0 && !self.shut_rd {
            if self.peer_closed {
                return false;
            }
            match self.rx.as_mut().map(|rx| rx.c.prepare_wait()) {
                Some(Ok(true)) => {}
                _ => sleep = false,
            }
        }
        if want & WANT_WRITE != 0 && !self.shut_wr {
            if self.peer_closed {
                return false;
            }
            match self.tx.as_mut().map(|tx| tx.p.prepare_wait(write_want)) {
                Some(Ok(true)) => {}
                _ => sleep = false,
            }
        }
        sleep
    }

    /// Whether a waiter for `want` should be woken (checked by the link
    /// manager after a kick).
    pub(crate) fn ready_for(&mut self, want: u8) -> bool {
        if self.carried || self.phase != ConnPhase::Open || self.peer_closed {
            return true;
        }
        if want & WANT_READ != 0 {
            if let Some(rx) = &self.rx {
                match (rx.c.readable(), rx.c.peer_end()) {
                    (Ok(0), Ok(e)) if !e.fin && !e.reset && !e.frozen => {}
                    _ => return true,
                }
            }
        }
        if want & WANT_WRITE != 0 {
            if let Some(tx) = &mut self.tx {
                // As permissive as any `prepare_wait(want)`: the producer's
                // event index fires once, so a kick must never be ignored.
                match (tx.p.free_space(), tx.p.reader_end()) {
                    (Ok(0), Ok(r)) if !r.closed && !r.reset => {}
                    _ => return true,
                }
            }
        }
        false
    }

    /// After FIN and CLOSED were set without a kick: whether the peer may
    /// sleep on one of our rings (its reader waiting for data at our
    /// `prod`, or its writer for space we would free), so that a kick is
    /// due now. Each side's re-check after publishing its event index (and
    /// the fence here) means one of the two sees the other.
    pub(crate) fn peer_waiting(&self) -> bool {
        let reader = self.tx.as_ref().is_some_and(|tx| tx.p.consumer_waiting());
        let writer = self.rx.as_ref().is_some_and(|rx| rx.c.producer_waiting());
        reader || writer
    }

    /// `shutdown(Write)`: FIN after the bytes written so far.
    pub(crate) fn shutdown_write(&mut self) {
        self.shutdown_write_kick(true);
    }

    /// [`ConnIo::shutdown_write`], kicking the peer only if `kick` (a
    /// caller that sends a control frame right after lets that kick).
    pub(crate) fn shutdown_write_kick(&mut self, kick: bool) {
        if self.shut_wr {
            return;
        }
        self.shut_wr = true;
        self.tx_path.finish();
        if let Some(tx) = &mut self.tx {
            tx.p.finish();
            let _ = tx.p.flush();
            if kick {
                self.kick();
            }
        }
    }

    /// `shutdown(Read)`: the writer gets `EPIPE`.
    pub(crate) fn shutdown_read(&mut self) {
        self.shutdown_read_kick(true);
    }

    /// [`ConnIo::shutdown_read`], kicking the peer only if `kick`.
    pub(crate) fn shutdown_read_kick(&mut self, kick: bool) {
        if self.shut_rd {
            return;
        }
        self.shut_rd = true;
        if let Some(rx) = &mut self.rx {
            rx.c.close();
            if kick {
                self.kick();
            }
        }
    }
}

/// What ended a sleep on a connection's eventfd and its link's kick
/// descriptor ([`Conn::wait_kick`]).
pub(crate) enum KickWait {
    /// The connection was signalled (its state changed).
    Signalled,
    /// The link was kicked: look at the control ring.
    Kicked,
    /// The deadline passed.
    TimedOut,
}

/// A connection, shared by its stream handles, the transport's tables and
/// the link's armed list.
pub(crate) struct Conn {
    pub id: u32,
    /// The peer's domid; changes when the peer migrates and the connection
    /// returns to a ring on the new link.
    peer: AtomicU16,
    pub local_port: u32,
    pub peer_port: u32,
    pub evfd: EventFd,
    pub io: Mutex<ConnIo>,
    pub link: Arc<LinkShared>,
    pub want: AtomicU8,
    /// Directions whose last non-blocking attempt returned `WouldBlock`
    /// (cleared when one succeeds): re-checked on every re-arm so that one
    /// direction's `WouldBlock` never swallows the other's readiness edge.
    pub waiting: AtomicU8,
    armed: Mutex<bool>,
    gen: Mutex<u64>,
    cv: Condvar,
    pub nonblocking: AtomicBool,
    /// The connection's secret from the handshake (authenticates its TCP
    /// legs and ring offers).
    pub cookie: AtomicU64,
    /// The peer's leg listener, from the handshake.
    pub peer_tcp: Mutex<Option<SocketAddr>>,
    /// The carrier switch, once a switch made the connection leave the
    /// transport's ring fast path (set once, never taken back before close).
    pub switch: Mutex<Option<Arc<Switch>>>,
    /// Where the link manager rings the switch when the link is kicked.
    pub doorbell: Doorbell,
    /// Our end of the link's event channel the switch kicks (replaced when
    /// the connection moves to a new link).
    pub carrier_kick: Mutex<Option<Arc<dyn EventChannel>>>,
    /// The grant of the receive ring the switch's last `offer_ring` made.
    pub offered_grant: Mutex<Option<RingGrant>>,
    /// The domain the next offer's ring is granted to.
    pub offer_target: AtomicU16,
    /// Where our last ring offer went, and its epoch.
    pub offered_to: Mutex<Option<(DomId, u32)>>,
    /// An offer from a domain the connection is not on (yet): taken once
    /// that domain proved to be the peer (see `Inner::on_ring_offer`).
    pub pending_offer: Mutex<Option<(DomId, RingGrant)>>,
}

impl Conn {
    pub(crate) fn new(
        id: u32,
        peer: DomId,
        local_port: u32,
        peer_port: u32,
        io: ConnIo,
        link: Arc<LinkShared>,
    ) -> io::Result<Arc<Conn>> {
        Ok(Arc::new(Conn {
            id,
            peer: AtomicU16::new(peer),
            local_port,
            peer_port,
            evfd: EventFd::new()?,
            io: Mutex::new(io),
            link,
            want: AtomicU8::new(0),
            waiting: AtomicU8::new(0),
            armed: Mutex::new(false),
            gen: Mutex::new(0),
            cv: Condvar::new(),
            nonblocking: AtomicBool::new(false),
            cookie: AtomicU64::new(0),
            peer_tcp: Mutex::new(None),
            switch: Mutex::new(None),
            doorbell: Doorbell::new()?,
            carrier_kick: Mutex::new(None),
            offered_grant: Mutex::new(None),
            offer_target: AtomicU16::new(peer),
            offered_to: Mutex::new(None),
            pending_offer: Mutex::new(None),
        }))
    }

    /// The peer's current domid.
    pub(crate) fn peer(&self) -> DomId {
        self.peer.load(Ordering::Acquire)
    }

    pub(crate) fn set_peer(&self, peer: DomId) {
        self.peer.store(peer, Ordering::Release);
    }

    /// The carrier switch, if the connection has left the fast path.
    pub(crate) fn switch(&self) -> Option<Arc<Switch>> {
        lock(&self.switch).clone()
    }

    pub(crate) fn io(&self) -> MutexGuard<'_, ConnIo> {
        lock(&self.io)
    }

    /// Wakes every waiter: blocking callers and the readiness descriptor.
    pub(crate) fn signal(&self) {
        {
            let mut g = lock(&self.gen);
            *g = g.wrapping_add(1);
        }
        self.cv.notify_all();
        self.evfd.signal();
    }

    /// Puts this connection on its link's list of waiters for `want`.
    pub(crate) fn arm(self: &Arc<Self>, want: u8) {
        self.want.fetch_or(want, Ordering::AcqRel);
        let mut list = lock(&self.link.armed);
        let mut armed = lock(&self.armed);
        if !*armed {
            *armed = true;
            list.push(Arc::downgrade(self));
        }
    }

    /// Called by the manager with the link's armed list locked: wakes this
    /// connection if what it waits for is there. Returns whether it stays
    /// armed.
    pub(crate) fn check_armed(&self) -> bool {
        let want = self.want.load(Ordering::Acquire);
        let ready = want == 0 || self.io().ready_for(want);
        if ready {
            *lock(&self.armed) = false;
            self.want.store(0, Ordering::Release);
            self.signal();
        }
        !ready
    }

    /// Blocks until signalled or `deadline`, unless what `want` asks for is
    /// already there. Returns false on timeout.
    pub(crate) fn wait(
        self: &Arc<Self>,
        want: u8,
        write_want: u32,
        deadline: Option<Instant>,
    ) -> bool {
        // One waiter per link sleeps on the link's event channel itself:
        // the peer's kick wakes it directly, where the others (and this one,
        // after a kick meant for another connection) wait for the manager
        // thread to check their rings and signal them: two wake-ups.
        let direct = self.link.kick_fd.is_some()
            && self
                .link
                .direct
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if direct {
            // Signals after this drain make it readable again; the
            // generation read below is at least as new as any before it.
            self.evfd.drain();
        }
        let g0 = self.generation();
        self.arm(want);
        if !self.io().prepare_wait(want, write_want) {
            if direct {
                self.link.direct.store(false, Ordering::Release);
            }
            return true;
        }
        if !direct {
            return self.wait_since(g0, deadline);
        }
        let r = self.wait_direct(want, g0, deadline);
        self.link.direct.store(false, Ordering::Release);
        match r {
            Some(r) => r,
            None => self.wait_since(g0, deadline),
        }
    }

    /// For a blocking connect waiting for its answer: sleeps on the
    /// connection's eventfd and the link's kick descriptor, if the link's
    /// direct slot is free (`None` otherwise). The eventfd must have been
    /// drained before `g0` was read.
    pub(crate) fn wait_kick(&self, g0: u64, deadline: Instant) -> Option<KickWait> {
        let kick = self.link.kick_fd.as_ref()?;
        self.link
            .direct
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let r = self.poll_signal_or_kick(kick, g0, Some(deadline));
        self.link.direct.store(false, Ordering::Release);
        Some(r)
    }

    /// Sleeps on the connection's eventfd and the link's kick descriptor.
    /// `Some(false)` on timeout, `Some(true)` when signalled or when a kick
    /// made `want` ready, `None` after a kick for another connection (the
    /// caller then waits for the manager, which has that kick to ack).
    fn wait_direct(&self, want: u8, g0: u64, deadline: Option<Instant>) -> Option<bool> {
        let kick = self.link.kick_fd.as_ref()?;
        match self.poll_signal_or_kick(kick, g0, deadline) {
            KickWait::Signalled => Some(true),
            KickWait::TimedOut => Some(false),
            KickWait::Kicked if self.io().ready_for(want) => Some(true),
            KickWait::Kicked => None,
        }
    }

    /// Sleeps in `poll` on our eventfd and the link's kick descriptor until
    /// either is readable (or the generation moved past `g0`, or the
    /// deadline passed).
    fn poll_signal_or_kick(&self, kick: &OwnedFd, g0: u64, deadline: Option<Instant>) -> KickWait {
        loop {
            if self.generation() != g0 {
                return KickWait::Signalled;
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return KickWait::TimedOut;
                    }
                    i32::try_from((d - now).as_millis() + 1).unwrap_or(i32::MAX)
                }
            };
            let mut fds = [
                libc::pollfd {
                    fd: self.evfd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: kick.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // (both descriptors stay open: this connection and its link
            // share hold them)
            let n = crate::sys::poll(&mut fds, ms);
            if n <= 0 {
                // EINTR or the timeout: the checks above decide.
                continue;
            }
            if fds[0].revents != 0 || self.generation() != g0 {
                return KickWait::Signalled;
            }
            return KickWait::Kicked;
        }
    }

    /// The signal counter, read before checking a condition that
    /// [`Conn::wait_since`] then waits on.
    pub(crate) fn generation(&self) -> u64 {
        *lock(&self.gen)
    }

    /// Blocks until [`Conn::signal`] is called after `g0` was read, or
    /// `deadline`. Returns false on timeout.
    pub(crate) fn wait_since(&self, g0: u64, deadline: Option<Instant>) -> bool {
        let mut g = lock(&self.gen);
        while *g == g0 {
            match deadline {
                None => g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    g = self
                        .cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
        true
    }

    /// Non-blocking path after a `WouldBlock`: clears the descriptor's
    /// readiness, re-arms, and makes it readable again at once if anything
    /// a waiter asked for is already there (so neither direction loses an
    /// edge to the other).
    pub(crate) fn rearm_nonblocking(self: &Arc<Self>, want: u8, write_want: u32) {
        self.waiting.fetch_or(want, Ordering::AcqRel);
        self.evfd.drain();
        let all = self.waiting.load(Ordering::Acquire) | want;
        self.arm(all);
        if !self.io().prepare_wait(all, write_want) {
            self.evfd.signal();
        }
    }
}
