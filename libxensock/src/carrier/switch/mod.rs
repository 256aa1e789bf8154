// SPDX-License-Identifier: MIT OR Apache-2.0
//! One connection's carrier switch: the I/O around proto's `TxPath` (our
//! sending direction) and `RxPath` (our receiving direction).
//!
//! Every decision (may I write, where do the next bytes come from, what to
//! answer, what to resend) is the state machine's; these files move bytes
//! between the application, the ring and the TCP legs, and keeps waiting
//! threads and the driver thread informed.
//!
//! Threads: the application's reader and writer (one of each at a time),
//! and a driver that watches the TCP legs, the ring doorbell and the
//! deadlines, so control frames are answered while the application is busy
//! elsewhere. The drivers of all switches share a small pool of threads
//! (`driver.rs`), so a thousand moved connections do not cost a thousand
//! threads. The two directions have separate locks
//! and no code path holds both.
//!
//! The legs (protocol version 2, the raw leg: `docs/protocol.md` 5.4): our
//! *outbound* leg carries our stream unframed, and back from the peer the
//! control frames of both directions; our *inbound* leg carries the peer's
//! stream, and back our control frames. Control frames that arrive for
//! our receiving direction are queued (`Shared::rx_ctl`) and taken in
//! order by whoever holds that direction next.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xensock_proto::control_stream::LegControl;
use xensock_proto::ctrl::{Message, ResetReason};
use xensock_proto::dial::{Dial, DialStep};
use xensock_proto::liveness::{self, Unanswered};
use xensock_proto::mem::RawRing;
use xensock_proto::offer::{OfferClock, OfferStep};
use xensock_proto::ring::{Consumer, Producer, Received, RingError, Sent};
use xensock_proto::switch::{
    ConsumedOutcome, RingFromOutcome, RxControlError, RxControlOrder, RxControlQueue,
    RxControlTaken, RxPath, RxState, SwitchError, TxPath, TxState,
};

use super::driver::{self, Attachment, Driven};
use super::frames::{protocol_error, send_raw, Inbox, Incoming, Outbox};
use super::leg::{lock, LegListener};
use super::ring::{NewRing, SharedRing};
use crate::clock::now_ms;
use crate::sys::eventfd::EventFd;

mod legs;
mod receiving;
mod sending;
mod service;

use legs::*;
use receiving::*;

/// Why the switch leaves the ring, which decides what of the rings is
/// trusted. The sender resends from the receiver's `Consumed` whatever it
/// can; what it cannot resend the receiver must have kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// This side is moving (suspend): its receiving direction keeps what
    /// it took and nothing more of its ring (its own pages may come back
    /// torn), and its sending direction reads back what the peer has not
    /// consumed, to resend it.
    LocalMove,
    /// The peer is gone from the ring (it moved or its link died) and this
    /// side stayed: its own receive ring is what the peer wrote and the
    /// peer writes no more, so every byte in it is kept
    /// ([`RxPath::freeze_salvaged`]; a peer restored without its rings has
    /// no copy to resend them from).
    PeerGone,
    /// This side was saved or migrated while it held its rings (no suspend
    /// hook ran) and is running again: its mappings of the peer's rings
    /// are gone, so nothing is read from or written to them and nothing is
    /// resent from them; a receiver that kept less than was written
    /// fails the connection rather than take a guess.
    Restored,
}

/// Settings of one connection's switch.
#[derive(Clone, Debug)]
pub(crate) struct SwitchConfig {
    /// Our id for the connection (legs to us present it).
    pub local_id: u32,
    /// The peer's id (frames we send carry it).
    pub peer_id: u32,
    /// The connection's secret from the handshake.
    pub cookie: u64,
    /// The peer's leg listener; `None` when it has no TCP fallback.
    pub peer_tcp: Option<SocketAddr>,
    /// After the ring dies, how long both legs may take to come up before
    /// the connection fails with `ECONNRESET`. Also how long a leg may wait
    /// for an answer its peer does not give (an outstanding retransmission
    /// or window probe) before the connection fails the same way.
    pub peer_lost_after: Duration,
}

impl SwitchConfig {
    /// Defaults for the timing fields.
    pub(crate) fn new(local_id: u32, peer_id: u32, cookie: u64, peer: Option<SocketAddr>) -> Self {
        SwitchConfig {
            local_id,
            peer_id,
            cookie,
            peer_tcp: peer,
            peer_lost_after: Duration::from_secs(10),
        }
    }
}

/// The rings a connection starts on.
#[cfg(any(test, feature = "internals"))]
pub(crate) struct InitialRings {
    /// The ring we read (we own it).
    pub rx: SharedRing,
    /// The peer's ring we write.
    pub tx: SharedRing,
}

/// Where a connection that ran on its rings without a switch stands when
/// the switch takes over (the transport's fast path before the first
/// switch): the state machines with their offsets and the live ring ends.
pub(crate) struct Seed {
    pub tx_path: TxPath,
    pub producer: Option<(Producer<RawRing>, SharedRing)>,
    pub rx_path: RxPath,
    pub consumer: Option<(Consumer<RawRing>, SharedRing)>,
    /// Bytes already delivered to the application.
    pub delivered: u64,
    /// Leave the rings at once, before any reader or writer can use them
    /// through the switch (a link that died under the connection).
    pub leave_ring: Option<Trigger>,
}

/// Notifies the peer's switch that a ring changed (an event channel).
pub(crate) type Kick = Arc<dyn Fn() + Send + Sync>;
/// Called whenever a non-blocking reader or writer that got `WouldBlock`
/// may now make progress (the transport signals the stream's readiness
/// descriptor), and when the connection fails.
pub(crate) type ReadyHook = Arc<dyn Fn() + Send + Sync>;
/// Makes a new receive ring of the given epoch for an offer.
pub(crate) type RingAlloc = Box<dyn Fn(u32) -> io::Result<NewRing> + Send + Sync>;

/// Where the peer's ring notifications arrive (our end of the event
/// channel).
#[derive(Clone)]
pub(crate) struct Doorbell(Arc<EventFd>);

impl Doorbell {
    pub(crate) fn new() -> io::Result<Doorbell> {
        Ok(Doorbell(Arc::new(EventFd::new()?)))
    }

    /// Rings it (what the peer's kick does).
    pub(crate) fn ring(&self) {
        self.0.signal();
    }
}

/// What the switch reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SwitchStatus {
    pub tx: TxState,
    pub rx: RxState,
    /// Bytes the application wrote / read.
    pub sent: u64,
    pub delivered: u64,
    /// Our sending direction moved to TCP / onto a new ring.
    pub tx_to_tcp: u64,
    pub tx_to_ring: u64,
    /// Our receiving direction switched onto a new ring.
    pub rx_to_ring: u64,
    /// Both legs are up.
    pub legs_up: bool,
    /// Why the connection failed, if it did.
    pub failure: Option<String>,
}

/// Wait for something on a leg while sleeping.
const NO_LEG: i16 = 0;

struct Tx {
    path: TxPath,
    producer: Option<Producer<RawRing>>,
    ring: Option<SharedRing>,
    /// Unconsumed bytes copied out of the frozen ring.
    resend: Vec<u8>,
    /// An offer that arrived before the `Consumed` for the ring in use.
    pending_offer: Option<(u32, SharedRing)>,
    leg: Option<TcpStream>,
    leg_closed: bool,
    /// Since when the leg has waited for an answer its peer does not give
    /// (`check_stall`).
    leg_unanswered: Unanswered,
    /// The leg was asked for: keep retrying until it is up.
    leg_wanted: bool,
    /// The outbound leg's connect while it is pending (non-blocking).
    dialing: Option<socket2::Socket>,
    /// When to connect the outbound leg, and connect it again (proto's).
    dial: Dial,
    /// Our stream's bytes (and the leg's hello) not yet taken by the leg.
    out: Outbox,
    /// Control frames from the peer (both directions').
    inbox: Inbox,
    waiting: bool,
    writer_polls: bool,
    /// A non-blocking writer got `WouldBlock`: tell the ready hook once.
    nb_waiting: AtomicBool,
}

struct Rx {
    path: RxPath,
    /// Bytes copied out of the ring the peer left without freezing
    /// ([`Trigger::PeerGone`]): read before anything that follows them.
    salvaged: VecDeque<u8>,
    consumer: Option<Consumer<RawRing>>,
    ring: Option<SharedRing>,
    offered: Option<SharedRing>,
    /// The peer's stream, raw; our control frames go back on it
    /// (`Shared::ctl_out` holds it too).
    leg: Option<Arc<TcpStream>>,
    leg_closed: bool,
    /// As `Tx::leg_unanswered`.
    leg_unanswered: Unanswered,
    /// The raw runs on the inbound leg, as the sender's control frames
    /// open and end them (`Shared::pump_rx`).
    order: RxControlOrder,
    /// When to offer a ring, when to give an offer up (proto's rule).
    clock: OfferClock,
    /// The reader's last read from the leg emptied it: a blocking reader
    /// polls before it reads again.
    leg_drained: bool,
    /// Segments the inbound leg had received at the last look
    /// (`Shared::peer_heard`).
    segs_seen: u32,
    delivered: u64,
    waiting: bool,
    reader_polls: bool,
    /// A non-blocking reader got `WouldBlock`: tell the ready hook once.
    nb_waiting: AtomicBool,
}

#[derive(Default)]
struct Counters {
    tx_to_tcp: AtomicU64,
    tx_to_ring: AtomicU64,
    rx_to_ring: AtomicU64,
}

/// Our control frames and the leg they go on (the inbound one). Taken
/// under either direction's lock or none; nothing is locked under it.
#[derive(Default)]
struct CtlOut {
    out: Outbox,
    leg: Option<Arc<TcpStream>>,
}

struct Shared {
    cfg: SwitchConfig,
    tx: Mutex<Tx>,
    rx: Mutex<Rx>,
    ctl_out: Mutex<CtlOut>,
    /// Control frames for our receiving direction, in the order they came
    /// (a leaf lock, as `ctl_out`).
    rx_ctl: Mutex<RxControlQueue>,
    /// The peer closed its control stream (our outbound leg's way back).
    ctl_in_closed: AtomicBool,
    /// Serialise readers and writers: one waiter per side.
    read_lock: Mutex<()>,
    write_lock: Mutex<()>,
    tx_wake: EventFd,
    rx_wake: EventFd,
    /// Wakes the driver.
    ctl: EventFd,
    doorbell: Doorbell,
    kick_peer: Kick,
    alloc: RingAlloc,
    inbound: Mutex<Vec<TcpStream>>,
    /// Since when the connection has needed its legs and not had both.
    stall_since: Mutex<Option<Instant>>,
    /// When the legs were last looked at for an unanswered peer
    /// (`check_stall`; a look costs two socket calls per leg, so not at
    /// every turn of the loop).
    legs_sampled: Mutex<Instant>,
    /// errno of the failure, 0 while healthy.
    failed: AtomicI32,
    failure_reason: Mutex<ResetReason>,
    /// What broke the connection, for status displays.
    failure: Mutex<Option<String>>,
    stop: AtomicBool,
    /// The failure was told to the peer (`propagate_failure`, once).
    propagated: AtomicBool,
    counters: Counters,
    ready_hook: Option<ReadyHook>,
    /// Closed by the application after `linger`: close the legs the way
    /// TCP closes, without a reset.
    graceful: AtomicBool,
}

/// One connection's carrier switch.
pub(crate) struct Switch {
    shared: Arc<Shared>,
    listener: Arc<LegListener>,
    /// Our place in the driver pool (`driver.rs`).
    driver: Option<Attachment>,
}

fn switch_error(e: SwitchError) -> io::Error {
    protocol_error(format!("carrier switch: {e}"))
}

fn ring_error(e: RingError) -> io::Error {
    protocol_error(format!("ring: {e}"))
}

impl Switch {
    /// Starts a connection's switch: on `rings` when given, else on TCP.
    /// (The transport adopts connections that ran on rings instead.)
    /// Legs presenting `cfg.local_id` and `cfg.cookie` at `listener` are
    /// routed here; `doorbell` is where the peer's kicks arrive and
    /// `kick_peer` rings the peer's; `alloc` makes receive rings for
    /// [`Switch::offer_ring`].
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn start(
        cfg: SwitchConfig,
        rings: Option<InitialRings>,
        listener: Arc<LegListener>,
        doorbell: Doorbell,
        kick_peer: Kick,
        alloc: RingAlloc,
    ) -> io::Result<Switch> {
        let seed = match rings {
            Some(r) => Seed {
                tx_path: TxPath::on_ring(),
                producer: Some((Producer::new(r.tx.ring()), r.tx)),
                rx_path: RxPath::on_ring(),
                consumer: Some((Consumer::new(r.rx.ring()), r.rx)),
                delivered: 0,
                leave_ring: None,
            },
            None => Seed {
                tx_path: TxPath::on_tcp(),
                producer: None,
                rx_path: RxPath::on_tcp(),
                consumer: None,
                delivered: 0,
                leave_ring: None,
            },
        };
        Self::start_seeded(cfg, seed, listener, doorbell, kick_peer, alloc, None)
    }

    /// Starts a switch for a connection that has run without one so far,
    /// from where it stands (`seed`). `ready` is told whenever a
    /// non-blocking caller that got `WouldBlock` may retry.
    pub(crate) fn start_seeded(
        cfg: SwitchConfig,
        seed: Seed,
        listener: Arc<LegListener>,
        doorbell: Doorbell,
        kick_peer: Kick,
        alloc: RingAlloc,
        ready: Option<ReadyHook>,
    ) -> io::Result<Switch> {
        let needs_legs = !matches!(seed.tx_path.state(), TxState::Ring { .. })
            || !matches!(seed.rx_path.state(), RxState::Ring { .. });
        let tx_on_tcp = seed.tx_path.state() == TxState::Tcp;
        let (producer, tx_ring) = match seed.producer {
            Some((p, r)) => (Some(p), Some(r)),
            None => (None, None),
        };
        let (consumer, rx_ring) = match seed.consumer {
            Some((c, r)) => (Some(c), Some(r)),
            None => (None, None),
        };
        let (tx_wake, rx_wake, ctl) = (EventFd::new()?, EventFd::new()?, EventFd::new()?);
        let shared = Arc::new(Shared {
            tx: Mutex::new(Tx {
                path: seed.tx_path,
                producer,
                ring: tx_ring,
                resend: Vec::new(),
                pending_offer: None,
                leg: None,
                leg_closed: false,
                leg_unanswered: Unanswered::new(),
                leg_wanted: false,
                dialing: None,
                dial: Dial::new(),
                out: Outbox::default(),
                inbox: Inbox::default(),
                waiting: false,
                writer_polls: false,
                nb_waiting: AtomicBool::new(false),
            }),
            rx: Mutex::new(Rx {
                path: seed.rx_path,
                salvaged: VecDeque::new(),
                consumer,
                ring: rx_ring,
                offered: None,
                leg: None,
                leg_closed: false,
                leg_unanswered: Unanswered::new(),
                order: RxControlOrder::new(),
                clock: OfferClock::new(),
                leg_drained: false,
                segs_seen: 0,
                delivered: seed.delivered,
                waiting: false,
                reader_polls: false,
                nb_waiting: AtomicBool::new(false),
            }),
            ctl_out: Mutex::new(CtlOut::default()),
            rx_ctl: Mutex::new(RxControlQueue::new()),
            ctl_in_closed: AtomicBool::new(false),
            read_lock: Mutex::new(()),
            write_lock: Mutex::new(()),
            tx_wake,
            rx_wake,
            ctl,
            doorbell,
            kick_peer,
            alloc,
            inbound: Mutex::new(Vec::new()),
            stall_since: Mutex::new(if needs_legs {
                Some(Instant::now())
            } else {
                None
            }),
            legs_sampled: Mutex::new(Instant::now()),
            failed: AtomicI32::new(0),
            failure_reason: Mutex::new(ResetReason::ProtocolError),
            failure: Mutex::new(None),
            stop: AtomicBool::new(false),
            propagated: AtomicBool::new(false),
            counters: Counters::default(),
            ready_hook: ready,
            graceful: AtomicBool::new(false),
            cfg,
        });
        let weak = Arc::downgrade(&shared);
        listener.register(
            shared.cfg.local_id,
            shared.cfg.cookie,
            Arc::new(move |sock| {
                if let Some(s) = weak.upgrade() {
                    lock(&s.inbound).push(sock);
                    s.ctl.signal();
                }
            }),
        );
        if let Some(trigger) = seed.leave_ring {
            if let Err(e) = shared.freeze(trigger) {
                listener.unregister(shared.cfg.local_id);
                return Err(e);
            }
        }
        if tx_on_tcp {
            let mut tx = lock(&shared.tx);
            shared.open_run(&tx);
            shared.ensure_tx_leg(&mut tx);
        }
        let driver = match driver::attach(shared.clone()) {
            Ok(d) => d,
            Err(e) => {
                listener.unregister(shared.cfg.local_id);
                return Err(e);
            }
        };
        Ok(Switch {
            shared,
            listener,
            driver: Some(driver),
        })
    }

    /// Writes some of `buf` to the current carrier; blocks while the ring
    /// is full, the leg does not take more, or a switch is in progress.
    pub(crate) fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.shared.write(buf, false)
    }

    /// [`Switch::write`] that returns `WouldBlock` instead of waiting; the
    /// ready hook is told when to retry.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.shared.write(buf, true)
    }

    /// [`Switch::read`] that returns `WouldBlock` instead of waiting.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.shared.read(buf, Take::Consume, true)
    }

    /// What [`Switch::read`] (`nonblocking`: [`Switch::try_read`]) would
    /// return, left for the next read.
    pub(crate) fn peek(&self, buf: &mut [u8], nonblocking: bool) -> io::Result<usize> {
        self.shared.read(buf, Take::Peek, nonblocking)
    }

    /// A leg that reached the transport's listener before this switch
    /// existed (it registered the connection itself).
    pub(crate) fn adopt_leg(&self, sock: TcpStream) {
        lock(&self.shared.inbound).push(sock);
        self.shared.ctl.signal();
    }

    /// An abortive close (`SO_LINGER` 0): the peer is reset now, on every
    /// carrier we still have, and what it has not read is dropped.
    pub(crate) fn abort(&self) {
        self.shared.fail(libc::ECONNRESET, ResetReason::Abort);
        self.shared.propagate_failure_once();
    }

    /// After `shutdown_write`: waits, at most `limit`, until everything
    /// written and the end of stream have left on the current carrier and
    /// everything queued for either leg is written and acknowledged, so
    /// closing the legs cannot discard it, then returns; dropping the
    /// switch then closes the legs. On a ring too: a switch to it queues
    /// its `RingFrom` for the inbound leg, and without it the receiver
    /// never looks at the ring.
    pub(crate) fn linger(&self, limit: Duration) {
        self.shared.graceful.store(true, Ordering::SeqCst);
        let end = Instant::now() + limit;
        loop {
            if self.failed() {
                return;
            }
            let settled = {
                let tx = lock(&self.shared.tx);
                !matches!(tx.path.state(), TxState::Frozen { .. })
                    && tx.out.is_empty()
                    && tx.leg.as_ref().is_none_or(|l| unacked(l) == 0)
            } && {
                let c = lock(&self.shared.ctl_out);
                c.out.is_empty() && c.leg.as_deref().is_none_or(|l| unacked(l) == 0)
            };
            if settled || Instant::now() >= end {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Whether a non-blocking reader (`read`) or writer that got
    /// `WouldBlock` still waits for its ready-hook call.
    pub(crate) fn nb_pending(&self, read: bool) -> bool {
        if read {
            lock(&self.shared.rx).nb_waiting.load(Ordering::Acquire)
        } else {
            lock(&self.shared.tx).nb_waiting.load(Ordering::Acquire)
        }
    }

    /// The peer's domain was destroyed (dom0 noted it gone for good): the
    /// connection fails now with `ECONNRESET`, not after its TCP legs
    /// stayed unanswered for the lost-peer bound.
    pub(crate) fn peer_dead(&self) {
        lock(&self.shared.failure).get_or_insert_with(|| "peer domain destroyed".into());
        self.shared.fail(libc::ECONNRESET, ResetReason::PeerLost);
    }

    /// Whether the connection failed (reads and writes return the error).
    pub(crate) fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst) != 0
    }

    /// Reads stream bytes in order; 0 at end of stream. Blocks until at
    /// least one byte (or the end) is there.
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.shared.read(buf, Take::Consume, false)
    }

    /// `shutdown(SHUT_WR)`: end of stream after the bytes written so far,
    /// on whichever carrier is current.
    pub(crate) fn shutdown_write(&self) -> io::Result<()> {
        self.shared.shutdown_write()
    }

    /// Leaves the ring for TCP (see [`Trigger`]). Returns at once; readers
    /// and writers pause until the offsets are agreed.
    pub(crate) fn freeze(&self, trigger: Trigger) -> io::Result<()> {
        self.shared.freeze(trigger)
    }

    /// The peers are co-resident again: makes a new receive ring for our
    /// receiving direction and returns its epoch and the sender's view, for
    /// the link's `RingOffer`. `None` when that direction is not on TCP.
    pub(crate) fn offer_ring(&self) -> io::Result<Option<(u32, SharedRing)>> {
        self.shared.offer_ring()
    }

    /// Gives up our offer of ring `epoch` if it is still pending: this
    /// side goes on on TCP and says so with `Consumed` for the epoch (a
    /// sender that switched onto the ring after all resends from there).
    /// Returns whether it was pending.
    pub(crate) fn abandon_offer(&self, epoch: u32) -> bool {
        let mut rx = lock(&self.shared.rx);
        if rx.path.state() != (RxState::Offered { epoch }) {
            return false;
        }
        let Some(n) = rx.path.freeze_local() else {
            return false;
        };
        rx.offered = None;
        self.shared.queue_consumed(n.epoch, n.offset);
        true
    }

    /// The peer's `RingOffer` for our sending direction. Returns whether
    /// this side switches to it (`false`: stale offer, declined).
    pub(crate) fn accept_ring_offer(&self, epoch: u32, ring: SharedRing) -> io::Result<bool> {
        self.shared.accept_ring_offer(epoch, ring)
    }

    /// Whether the connection still holds a shared page: a ring of ours
    /// granted to the peer or one of the peer's mapped, in either
    /// direction (in use or offered). The suspend hook waits for
    /// none: grant mappings do not survive a save (a PV guest restored with
    /// `gntdev` mappings of another domain's pages crashed in the lab).
    pub(crate) fn holds_rings(&self) -> bool {
        let tx = {
            let t = lock(&self.shared.tx);
            t.producer.is_some() || t.ring.is_some() || t.pending_offer.is_some()
        };
        let r = lock(&self.shared.rx);
        tx || r.consumer.is_some() || r.ring.is_some() || r.offered.is_some()
    }

    /// Drops a peer's ring offer not taken yet (the suspend hook: it would
    /// stay mapped through the move). The peer offers again on a new link.
    pub(crate) fn drop_pending_offer(&self) {
        lock(&self.shared.tx).pending_offer = None;
    }

    /// A snapshot for tests and status displays.
    /// Whether either direction writes or reads a ring now (a move must
    /// take it off that ring, as it takes a connection off its first one).
    pub(crate) fn on_ring(&self) -> bool {
        let tx = matches!(lock(&self.shared.tx).path.state(), TxState::Ring { .. });
        tx || matches!(lock(&self.shared.rx).path.state(), RxState::Ring { .. })
    }

    pub(crate) fn status(&self) -> SwitchStatus {
        let s = &self.shared;
        let (tx, sent, tx_leg) = {
            let t = lock(&s.tx);
            (t.path.state(), t.path.sent(), t.leg.is_some())
        };
        let (rx, delivered, rx_leg) = {
            let r = lock(&s.rx);
            (r.path.state(), r.delivered, r.leg.is_some())
        };
        SwitchStatus {
            tx,
            rx,
            sent,
            delivered,
            tx_to_tcp: s.counters.tx_to_tcp.load(Ordering::Relaxed),
            tx_to_ring: s.counters.tx_to_ring.load(Ordering::Relaxed),
            rx_to_ring: s.counters.rx_to_ring.load(Ordering::Relaxed),
            legs_up: tx_leg && rx_leg,
            failure: lock(&s.failure).clone(),
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.listener.unregister(self.shared.cfg.local_id);
        self.shared.stop.store(true, Ordering::SeqCst);
        // Once detached, the pool never calls into us again.
        drop(self.driver.take());
        if self.shared.graceful.load(Ordering::SeqCst)
            && self.shared.failed.load(Ordering::SeqCst) == 0
        {
            // Frames the peer still sends (answers to a last freeze, say)
            // must not be left unread: closing a socket with unread data
            // resets it, and the reset discards what the peer has not read
            // yet of ours.
            drop(lock(&self.shared.ctl_out).leg.take());
            let legs: Vec<Arc<TcpStream>> = [
                lock(&self.shared.tx).leg.take().map(Arc::new),
                lock(&self.shared.rx).leg.take(),
            ]
            .into_iter()
            .flatten()
            .collect();
            close_quietly(legs, Duration::from_secs(1));
        }
    }
}

impl Shared {
    fn check_failed(&self) -> io::Result<()> {
        match self.failed.load(Ordering::SeqCst) {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    /// Fails the connection (once); readers and writers get `errno`.
    fn fail(&self, errno: i32, reason: ResetReason) {
        if self
            .failed
            .compare_exchange(0, errno, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            *lock(&self.failure_reason) = reason;
        }
        self.ctl.signal();
        self.tx_wake.signal();
        self.rx_wake.signal();
        if let Some(h) = &self.ready_hook {
            h();
        }
    }

    /// Fails on a protocol or I/O error and returns it as ECONNRESET.
    fn breach(&self, e: io::Error) -> io::Error {
        {
            let mut why = lock(&self.failure);
            if why.is_none() {
                tracing::warn!(conn = self.cfg.local_id, "connection fails: {e}");
                *why = Some(e.to_string());
            }
        }
        let reason = if e.kind() == io::ErrorKind::InvalidData {
            ResetReason::ProtocolError
        } else {
            ResetReason::PeerLost
        };
        self.fail(libc::ECONNRESET, reason);
        io::Error::from_raw_os_error(libc::ECONNRESET)
    }

    fn notify_tx(&self, tx: &Tx) {
        if tx.waiting {
            self.tx_wake.signal();
        }
        if tx.nb_waiting.swap(false, Ordering::AcqRel) {
            if let Some(h) = &self.ready_hook {
                h();
            }
        }
    }

    fn notify_rx(&self, rx: &Rx) {
        if rx.waiting {
            self.rx_wake.signal();
        }
        if rx.nb_waiting.swap(false, Ordering::AcqRel) {
            if let Some(h) = &self.ready_hook {
                h();
            }
        }
    }

    fn kick(&self) {
        (self.kick_peer)()
    }

    fn start_stall_clock(&self) {
        let mut s = lock(&self.stall_since);
        if s.is_none() {
            *s = Some(Instant::now());
        }
    }

    // ---- both --------------------------------------------------------

    fn freeze(&self, trigger: Trigger) -> io::Result<()> {
        self.check_failed()?;
        {
            let mut tx = lock(&self.tx);
            let ring_mapped = trigger != Trigger::Restored;
            self.freeze_tx(&mut tx, ring_mapped)
                .map_err(|e| self.breach(e))?;
            self.flush_tx(&mut tx);
            self.ensure_tx_leg(&mut tx);
            self.notify_tx(&tx);
        }
        {
            let mut rx = lock(&self.rx);
            let left_ring = match rx.path.state() {
                RxState::Ring { epoch, .. } => Some(epoch),
                _ => None,
            };
            // A peer gone leaves an offer out standing (the link it went
            // over answers for it).
            let notice = match trigger {
                Trigger::LocalMove | Trigger::Restored => rx.path.freeze_local(),
                Trigger::PeerGone if left_ring.is_some() => {
                    let n = self.salvage(&mut rx).map_err(|e| self.breach(e))?;
                    rx.path.freeze_salvaged(n)
                }
                Trigger::PeerGone => None,
            };
            if let Some(c) = notice {
                self.queue_consumed(c.epoch, c.offset);
                if left_ring == Some(c.epoch) {
                    // The sender froze (or will freeze, on our Consumed)
                    // this ring: its TxFreeze is on the way.
                    rx.clock.left_ring(c.epoch, now_ms());
                }
            }
            Self::settle_rx_rings(&mut rx);
            self.notify_rx(&rx);
        }
        self.start_stall_clock();
        self.ctl.signal();
        Ok(())
    }
}
