// SPDX-License-Identifier: MIT OR Apache-2.0
//! One connection's carrier switch: the I/O around proto's `TxPath` (our
//! sending direction) and `RxPath` (our receiving direction).
//!
//! Every decision (may I write, where do the next bytes come from, what to
//! answer, what to resend) is the state machine's; this file moves bytes
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

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xensock_proto::control_stream::LegControl;
use xensock_proto::ctrl::{Message, ResetReason};
use xensock_proto::dial::{Dial, DialStep};
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

/// Why the switch leaves the ring (for the log: either way the receiving
/// direction keeps what it took and nothing more of its ring, proto's one
/// trust rule, and the sender resends the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// This side is moving (suspend).
    LocalMove,
    /// The peer is gone from the ring (it moved or its link died) and this
    /// side stayed.
    PeerGone,
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
    leg_unanswered: Option<Instant>,
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
    consumer: Option<Consumer<RawRing>>,
    ring: Option<SharedRing>,
    offered: Option<SharedRing>,
    /// The peer's stream, raw; our control frames go back on it
    /// (`Shared::ctl_out` holds it too).
    leg: Option<Arc<TcpStream>>,
    leg_closed: bool,
    /// As `Tx::leg_unanswered`.
    leg_unanswered: Option<Instant>,
    /// The raw runs on the inbound leg, as the sender's control frames
    /// open and end them (`Shared::pump_rx`).
    order: RxControlOrder,
    /// When to offer a ring, when to give an offer up (proto's rule).
    clock: OfferClock,
    /// The reader's last read from the leg emptied it: a blocking reader
    /// polls before it reads again.
    leg_drained: bool,
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
            },
            None => Seed {
                tx_path: TxPath::on_tcp(),
                producer: None,
                rx_path: RxPath::on_tcp(),
                consumer: None,
                delivered: 0,
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
                leg_unanswered: None,
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
                consumer,
                ring: rx_ring,
                offered: None,
                leg: None,
                leg_closed: false,
                leg_unanswered: None,
                order: RxControlOrder::new(),
                clock: OfferClock::new(),
                leg_drained: false,
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
                    && tx.leg.as_ref().map_or(true, |l| unacked(l) == 0)
            } && {
                let c = lock(&self.shared.ctl_out);
                c.out.is_empty() && c.leg.as_deref().map_or(true, |l| unacked(l) == 0)
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

/// Sends FIN on each leg, then reads and drops what arrives until the
/// peer closes too or nothing came for a moment (at most `limit`).
fn close_quietly(legs: Vec<Arc<TcpStream>>, limit: Duration) {
    for l in &legs {
        let _ = l.shutdown(std::net::Shutdown::Write);
    }
    let end = Instant::now() + limit;
    let mut open: Vec<&TcpStream> = legs.iter().map(|l| &**l).collect();
    let mut buf = [0u8; 4096];
    while !open.is_empty() && Instant::now() < end {
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|l| libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let n = crate::sys::poll(&mut fds, 50);
        if n <= 0 {
            return;
        }
        let mut still = Vec::new();
        for (l, f) in open.into_iter().zip(&fds) {
            if f.revents == 0 {
                still.push(l);
                continue;
            }
            let mut r = l;
            match r.read(&mut buf) {
                Ok(0) | Err(_) => {}
                Ok(_) => still.push(l),
            }
        }
        open = still;
    }
}

/// Polls `wake` and optionally `fd` for `events`, no timeout.
fn sleep_on(wake: &EventFd, fd: Option<RawFd>, events: i16) {
    let mut fds = [
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: fd.unwrap_or(-1),
            events,
            revents: 0,
        },
    ];
    let n = if fd.is_some() { 2 } else { 1 };
    let r = crate::sys::poll(&mut fds[..n], -1);
    if r < 0 || fds[0].revents != 0 {
        wake.drain();
    }
}

/// Bytes written to `sock` and not yet acknowledged by the peer.
fn unacked(sock: &TcpStream) -> i32 {
    crate::sys::unsent_bytes(sock.as_fd()).map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX))
}

/// A leg's socket options. No TCP_USER_TIMEOUT: besides a peer that stops
/// acknowledging, it ends a leg whose live peer keeps its window shut that
/// long (Linux's zero-window probing counts against it), so a reader that
/// stopped reading for `peer_lost_after` reset the connection; the bound
/// is the switch's own ([`leg_waits`], `check_stall`).
fn set_leg_options(sock: &TcpStream) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    sock.set_nodelay(true)
}

/// Starts a non-blocking connect of an outbound leg to `addr`.
fn connect_start(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.cloexec(),
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_nonblocking(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => Ok(sock),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(sock),
        Err(e) => Err(e),
    }
}

/// Whether a connect [`connect_start`] began has completed; its error if
/// it failed.
fn connect_done(sock: &socket2::Socket) -> io::Result<bool> {
    if let Some(e) = sock.take_error()? {
        return Err(e);
    }
    match sock.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether `sock` waits for an answer from its peer: None when it holds no
/// unacknowledged byte (TIOCOUTQ); else whether a retransmission or a
/// window probe is outstanding (TCP_INFO's retransmits, probes). A peer
/// that answers zero-window probes clears `probes` with each answer, so a
/// reader that only stopped reading is not unanswered for long, however
/// far apart the probes have backed off; `check_stall` fails a leg only
/// after it stayed unanswered for the whole bound.
fn leg_waits(sock: &TcpStream) -> Option<bool> {
    if unacked(sock) <= 0 {
        return None;
    }
    let info = crate::sys::tcp_info(sock.as_fd()).ok();
    Some(info.is_some_and(|i| i.tcpi_retransmits > 0 || i.tcpi_probes > 0))
}

/// Samples `leg` (`leg_waits`) into `since`: how long it has been
/// unanswered without a break (None: answered, or nothing held).
fn sample_leg(leg: Option<&TcpStream>, since: &mut Option<Instant>) -> Option<Duration> {
    if leg.and_then(leg_waits) == Some(true) {
        Some(since.get_or_insert_with(Instant::now).elapsed())
    } else {
        *since = None;
        None
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

    // ---- sending direction ------------------------------------------

    fn write(&self, buf: &[u8], nonblocking: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let _one_writer = lock(&self.write_lock);
        let mut tx = lock(&self.tx);
        loop {
            self.check_failed()?;
            if tx.path.is_finished() {
                return Err(io::Error::from_raw_os_error(libc::EPIPE));
            }
            let mut leg_events = NO_LEG;
            match tx.path.state() {
                TxState::Frozen { .. } => {}
                TxState::Ring { .. } => {
                    let Some(p) = tx.producer.as_mut() else {
                        return Err(self.breach(protocol_error("ring state without a ring")));
                    };
                    match p.send(buf).map_err(|e| self.breach(ring_error(e)))? {
                        Sent::ReaderReset => {
                            return Err(self.breach(io::ErrorKind::ConnectionReset.into()));
                        }
                        Sent::ReaderClosed => {
                            return Err(io::Error::from_raw_os_error(libc::EPIPE))
                        }
                        Sent::Bytes { n, kick } => {
                            tx.path
                                .record_sent(n as u64)
                                .map_err(|e| self.breach(switch_error(e)))?;
                            if kick {
                                self.kick();
                            }
                            return Ok(n);
                        }
                        Sent::Full => {}
                    }
                    let want = buf.len().min(p.capacity() as usize / 2).max(1) as u32;
                    if !p
                        .prepare_wait(want)
                        .map_err(|e| self.breach(ring_error(e)))?
                    {
                        continue;
                    }
                }
                TxState::Tcp => {
                    let t = &mut *tx;
                    if let Some(leg) = t.leg.as_ref() {
                        t.out.flush(leg).map_err(|e| self.breach(e))?;
                        if t.out.is_empty() {
                            // The run's bytes go as they are: one send, as
                            // on a plain TCP socket.
                            let n = send_raw(leg, buf).map_err(|e| self.breach(e))?;
                            if n > 0 {
                                t.path
                                    .record_sent(n as u64)
                                    .map_err(|e| self.breach(switch_error(e)))?;
                                return Ok(n);
                            }
                        }
                        leg_events = libc::POLLOUT;
                    }
                }
            }
            if nonblocking {
                // Under the lock: a notify after this sees the flag.
                tx.nb_waiting.store(true, Ordering::Release);
                if leg_events != NO_LEG {
                    // The driver polls the leg for us.
                    self.ctl.signal();
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            tx = self.wait_tx(tx, leg_events);
        }
    }

    fn wait_tx<'a>(&'a self, mut tx: MutexGuard<'a, Tx>, leg_events: i16) -> MutexGuard<'a, Tx> {
        let fd = match (&tx.leg, leg_events) {
            (Some(l), ev) if ev != NO_LEG => Some(l.as_raw_fd()),
            _ => None,
        };
        tx.waiting = true;
        tx.writer_polls = fd.is_some();
        drop(tx);
        // The leg is never closed while the switch lives, so `fd` stays ours.
        sleep_on(&self.tx_wake, fd, leg_events);
        let mut tx = lock(&self.tx);
        tx.waiting = false;
        tx.writer_polls = false;
        tx
    }

    fn shutdown_write(&self) -> io::Result<()> {
        self.check_failed()?;
        let mut tx = lock(&self.tx);
        if tx.path.is_finished() {
            return Ok(());
        }
        tx.path.finish();
        match tx.path.state() {
            TxState::Ring { .. } => {
                if let Some(p) = tx.producer.as_mut() {
                    p.finish();
                }
                self.kick();
            }
            TxState::Tcp => {
                self.send_ctl(&Message::Fin {
                    conn_id: self.cfg.peer_id,
                    offset: tx.path.sent(),
                });
            }
            // Sent after the resend.
            TxState::Frozen { .. } => {}
        }
        Ok(())
    }

    /// Queues a control frame for the peer (on our inbound leg) and writes
    /// what that leg takes now; the driver writes the rest, and all of it
    /// once the leg is up.
    fn send_ctl(&self, msg: &Message<'_>) {
        let mut c = lock(&self.ctl_out);
        c.out.push(msg);
        let c = &mut *c;
        if let Some(leg) = c.leg.as_deref() {
            if let Err(e) = c.out.flush(leg) {
                self.breach(e);
            }
        }
        if !c.out.is_empty() {
            self.ctl.signal();
        }
    }

    /// Our sending direction starts on TCP: tells the peer where our raw
    /// bytes start (a resend says the same for its own).
    fn open_run(&self, tx: &Tx) {
        self.send_ctl(&Message::RawFrom {
            conn_id: self.cfg.peer_id,
            offset: tx.path.sent(),
        });
    }

    /// Writes queued bytes if the leg is up; the driver finishes the rest.
    fn flush_tx(&self, tx: &mut Tx) {
        if let Some(leg) = tx.leg.as_ref() {
            if let Err(e) = tx.out.flush(leg) {
                self.breach(e);
            }
        }
        if !tx.out.is_empty() {
            self.ctl.signal();
        }
    }

    /// Stops producing into the ring in use, copies back what the receiver
    /// has not consumed and queues the `TxFreeze`.
    fn freeze_tx(&self, tx: &mut Tx) -> io::Result<()> {
        let mut unconsumed = 0;
        if let (TxState::Ring { .. }, Some(p)) = (tx.path.state(), tx.producer.as_mut()) {
            p.freeze();
            let mut copy = vec![0u8; p.capacity() as usize];
            let n = p.read_back(&mut copy).map_err(ring_error)?;
            copy.truncate(n);
            tx.resend = copy;
            unconsumed = n as u64;
            self.kick();
        }
        let notice = tx.path.freeze(unconsumed).map_err(switch_error)?;
        tx.producer = None;
        tx.ring = None;
        self.send_ctl(&Message::TxFreeze {
            conn_id: self.cfg.peer_id,
            epoch: notice.epoch,
            offset: notice.offset,
        });
        Ok(())
    }

    fn handle_consumed(&self, tx: &mut Tx, epoch: u32, offset: u64) -> io::Result<()> {
        let mut outcome = tx.path.on_consumed(epoch, offset).map_err(switch_error)?;
        if outcome == ConsumedOutcome::FreezeFirst {
            self.freeze_tx(tx)?;
            self.start_stall_clock();
            outcome = tx.path.on_consumed(epoch, offset).map_err(switch_error)?;
        }
        if let ConsumedOutcome::Resend(r) = outcome {
            let copy = std::mem::take(&mut tx.resend);
            let bytes = usize::try_from(r.skip)
                .ok()
                .zip(usize::try_from(r.skip + r.len).ok())
                .and_then(|(a, b)| copy.get(a..b))
                .ok_or_else(|| protocol_error("resend outside the copy"))?;
            self.send_ctl(&Message::RawFrom {
                conn_id: self.cfg.peer_id,
                offset: r.from,
            });
            tx.out.push_raw(bytes);
            if tx.path.is_finished() {
                self.send_ctl(&Message::Fin {
                    conn_id: self.cfg.peer_id,
                    offset: tx.path.sent(),
                });
            }
            self.counters.tx_to_tcp.fetch_add(1, Ordering::Relaxed);
            // An offer that overtook this Consumed can be taken now.
            if let Some((e, ring)) = tx.pending_offer.take() {
                self.apply_offer(tx, e, ring)?;
            }
            self.notify_tx(tx);
        }
        Ok(())
    }

    fn apply_offer(&self, tx: &mut Tx, epoch: u32, ring: SharedRing) -> io::Result<bool> {
        if tx.path.offer_waits_for_consumed(epoch) {
            // The offer overtook the Consumed for the ring we use: keep the
            // newest one and hand it in after the resend.
            if tx.pending_offer.as_ref().map_or(true, |(e, _)| *e < epoch) {
                tx.pending_offer = Some((epoch, ring));
            }
            return Ok(false);
        }
        match tx.path.on_ring_offer(epoch).map_err(switch_error)? {
            Some(marker) => {
                self.send_ctl(&Message::RingFrom {
                    conn_id: self.cfg.peer_id,
                    epoch,
                    offset: marker,
                });
                tx.producer = Some(Producer::new(ring.ring()));
                tx.ring = Some(ring);
                self.flush_tx(tx);
                self.counters.tx_to_ring.fetch_add(1, Ordering::Relaxed);
                self.notify_tx(tx);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn accept_ring_offer(&self, epoch: u32, ring: SharedRing) -> io::Result<bool> {
        self.check_failed()?;
        let mut tx = lock(&self.tx);
        self.apply_offer(&mut tx, epoch, ring)
            .map_err(|e| self.breach(e))
    }

    /// Wants our leg up: connects it when proto's dial says.
    fn ensure_tx_leg(&self, tx: &mut Tx) {
        tx.leg_wanted = true;
        self.dial_tx_leg(tx, false);
    }

    /// Follows the outbound leg's pending connect, and connects it (again)
    /// as proto's dial says; `peer_heard`: the peer reaches us on the
    /// other leg, so a connect of ours waiting for a backed-off SYN is made
    /// again.
    fn dial_tx_leg(&self, tx: &mut Tx, peer_heard: bool) {
        let now = now_ms();
        if let Some(sock) = tx.dialing.as_ref() {
            match connect_done(sock) {
                Ok(false) => {}
                Ok(true) => {
                    let sock = TcpStream::from(tx.dialing.take().expect("pending connect"));
                    if let Err(e) = set_leg_options(&sock) {
                        tracing::info!(conn = self.cfg.local_id, "outbound leg: {e}; retrying");
                        tx.dial.failed(now);
                        return;
                    }
                    tx.dial.connected();
                    tx.out.push_front(&Message::TcpHello {
                        conn_id: self.cfg.peer_id,
                        cookie: self.cfg.cookie,
                    });
                    tx.leg = Some(sock);
                    tracing::info!(conn = self.cfg.local_id, "outbound leg up");
                    self.flush_tx(tx);
                    self.notify_tx(tx);
                    return;
                }
                Err(e) => {
                    tracing::info!(conn = self.cfg.local_id, "outbound leg: {e}; retrying");
                    tx.dialing = None;
                    tx.dial.failed(now);
                }
            }
        }
        match tx
            .dial
            .step(tx.leg_wanted && tx.leg.is_none(), peer_heard, now)
        {
            DialStep::Idle | DialStep::WaitUntil(_) => return,
            DialStep::Connect => {}
            DialStep::ConnectAgain => {
                tracing::info!(
                    conn = self.cfg.local_id,
                    "outbound leg not up yet: connecting again"
                );
                tx.dialing = None;
            }
        }
        let Some(addr) = self.cfg.peer_tcp else {
            return;
        };
        match connect_start(addr) {
            Ok(sock) => {
                tx.dialing = Some(sock);
                tx.dial.connecting(now);
            }
            Err(e) => {
                tracing::info!(conn = self.cfg.local_id, "outbound leg: {e}; retrying");
                tx.dial.failed(now);
            }
        }
    }

    // ---- receiving direction ----------------------------------------

    fn read(&self, buf: &mut [u8], take: Take, nonblocking: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let peek = take == Take::Peek;
        let _one_reader = lock(&self.read_lock);
        let mut rx = lock(&self.rx);
        let mut got = 0;
        loop {
            if let Err(e) = self.check_failed() {
                if got > 0 {
                    break;
                }
                return Err(e);
            }
            if got == buf.len() {
                break;
            }
            // What the driver queued for us may switch carriers or end the
            // stream here.
            if let Err(e) = self.pump_rx(&mut rx) {
                if got > 0 {
                    break;
                }
                return Err(self.breach(e));
            }
            if rx.path.eof_at() == Some(rx.path.taken()) {
                break;
            }
            let mut leg_events = NO_LEG;
            if rx.path.reads_ring() {
                let r = &mut *rx;
                let Some(c) = r.consumer.as_mut() else {
                    return Err(self.breach(protocol_error("ring state without a ring")));
                };
                let limit = buf.len() - got;
                let step = if peek {
                    c.receive_peek(&mut buf[got..got + limit])
                } else {
                    c.receive(&mut buf[got..got + limit])
                };
                let step = step.map_err(|e| self.breach(ring_error(e)))?;
                let end = match step {
                    Received::Bytes { n, .. } if peek => {
                        got += n;
                        break;
                    }
                    Received::Bytes { n, kick } => {
                        got += n;
                        if kick {
                            self.kick();
                        }
                        r.path
                            .record_ring_taken(n as u64)
                            .map_err(|e| self.breach(switch_error(e)))?;
                        continue;
                    }
                    Received::Reset if got > 0 => break,
                    Received::Reset => {
                        return Err(self.breach(io::ErrorKind::ConnectionReset.into()))
                    }
                    Received::Empty(end) => end,
                };
                if got > 0 {
                    break;
                }
                if let RxState::Ring { .. } = r.path.state() {
                    if end.fin {
                        // FIN, then empty: the end of the stream
                        let taken = r.path.taken();
                        r.path
                            .on_fin(taken)
                            .map_err(|e| self.breach(switch_error(e)))?;
                        continue;
                    }
                    // A frozen ring: its TxFreeze is on the way over TCP.
                    if !end.frozen && !c.prepare_wait().map_err(|e| self.breach(ring_error(e)))? {
                        continue;
                    }
                }
            } else if got > 0 {
                // One read of the leg per call, as on a plain TCP socket.
                break;
            } else if rx.leg_drained && !nonblocking && rx.order.run_open() && !rx.leg_closed {
                // The last read emptied the leg: wait for it first rather
                // than read only to be told so (a system call costs tens
                // of microseconds in a PV guest under emulation).
                rx.leg_drained = false;
                leg_events = libc::POLLIN;
            } else {
                match self.read_run(&mut rx, &mut buf[got..], take) {
                    Ok(RunStep::Read(n)) if peek => {
                        got += n;
                        break;
                    }
                    Ok(RunStep::Read(n)) => {
                        got += n;
                        continue;
                    }
                    Ok(RunStep::Again) => continue,
                    Ok(RunStep::WaitLeg) => leg_events = libc::POLLIN,
                    Ok(RunStep::WaitControl) => {}
                    Err(e) => return Err(self.breach(e)),
                }
            }
            if nonblocking {
                rx.nb_waiting.store(true, Ordering::Release);
                // The driver polls the leg for us.
                self.ctl.signal();
                return Err(io::ErrorKind::WouldBlock.into());
            }
            rx = self.wait_rx(rx, leg_events);
        }
        if !peek {
            rx.delivered += got as u64;
        }
        Ok(got)
    }

    /// One read of the run the inbound leg carries, into `dst`: bounded by
    /// the end of stream and by a `RingFrom` already here (the bytes after
    /// it are not on this leg). The sender puts no byte past a run's end
    /// into it and starts its next run only after we answered a later
    /// `TxFreeze` (which comes after the `RingFrom` on the same control
    /// stream), so a read before the end is known cannot go past it,
    /// except into a run that continues at that very end (see
    /// [`Shared::pump_rx`]).
    fn read_run(&self, rx: &mut Rx, dst: &mut [u8], take: Take) -> io::Result<RunStep> {
        let Some(leg) = rx.leg.clone() else {
            return Ok(RunStep::WaitControl);
        };
        if rx.leg_closed || !rx.order.run_open() {
            // Nothing to read until a control frame says what comes next
            // (a run's `RawFrom`, its `RingFrom`, the `Fin`); without a
            // control stream, nothing will.
            if self.ctl_in_closed.load(Ordering::Acquire) && lock(&self.rx_ctl).is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            return Ok(RunStep::WaitControl);
        }
        let taken = rx.path.taken();
        let mut limit = dst.len() as u64;
        if let Some(eof) = rx.path.eof_at() {
            limit = limit.min(eof.saturating_sub(taken));
        }
        if let Some(end) = lock(&self.rx_ctl).run_end() {
            limit = limit.min(end.saturating_sub(taken));
        }
        if limit == 0 {
            return Ok(RunStep::WaitControl);
        }
        let want = limit as usize;
        let step = match take {
            Take::Consume => (&*leg).read(&mut dst[..want]),
            Take::Peek => leg.peek(&mut dst[..want]),
        };
        match step {
            Ok(0) => {
                rx.leg_closed = true;
                Ok(RunStep::Again)
            }
            Ok(n) if take == Take::Peek => Ok(RunStep::Read(n)),
            Ok(n) => {
                rx.path.on_data(taken, n as u64).map_err(switch_error)?;
                rx.leg_drained = n < want;
                Ok(RunStep::Read(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(RunStep::WaitLeg),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(RunStep::Again),
            Err(e) => Err(e),
        }
    }

    fn wait_rx<'a>(&'a self, mut rx: MutexGuard<'a, Rx>, leg_events: i16) -> MutexGuard<'a, Rx> {
        let fd = match (&rx.leg, leg_events) {
            (Some(l), ev) if ev != NO_LEG => Some(l.as_raw_fd()),
            _ => None,
        };
        rx.waiting = true;
        rx.reader_polls = fd.is_some();
        drop(rx);
        sleep_on(&self.rx_wake, fd, leg_events);
        let mut rx = lock(&self.rx);
        rx.waiting = false;
        rx.reader_polls = false;
        rx
    }

    fn queue_consumed(&self, epoch: u32, offset: u64) {
        self.send_ctl(&Message::Consumed {
            conn_id: self.cfg.peer_id,
            epoch,
            offset,
        });
    }

    /// Drops the ring(s) the receiving state no longer reads.
    fn settle_rx_rings(rx: &mut Rx) {
        if !rx.path.reads_ring() {
            rx.consumer = None;
            rx.ring = None;
        }
        if rx.path.state() == RxState::Tcp {
            rx.offered = None;
        }
    }

    /// Takes this direction's control frames (`rx_ctl`) in order, as far
    /// as they can be taken now: as on one ordered stream, a `RingFrom`
    /// waits until every byte before it was read off the leg, a `RawFrom`
    /// or `Fin` until the ring in use gave way, and what follows
    /// waits with them.
    fn pump_rx(&self, rx: &mut Rx) -> io::Result<()> {
        loop {
            let Some(frame) = lock(&self.rx_ctl).front() else {
                break;
            };
            let Some(taken) = rx.order.take(&mut rx.path, frame).map_err(|e| match e {
                RxControlError::Switch(e) => switch_error(e),
                e => protocol_error(e),
            })?
            else {
                return Ok(());
            };
            match taken {
                RxControlTaken::Run | RxControlTaken::Fin => {}
                RxControlTaken::RingFrom { outcome, .. } => {
                    if outcome == RingFromOutcome::Switch {
                        let ring = rx
                            .offered
                            .take()
                            .ok_or_else(|| protocol_error("RingFrom without an offered ring"))?;
                        rx.consumer = Some(Consumer::new(ring.ring()));
                        rx.ring = Some(ring);
                        self.counters.rx_to_ring.fetch_add(1, Ordering::Relaxed);
                    }
                }
                RxControlTaken::TxFreeze {
                    epoch, consumed, ..
                } => {
                    rx.clock.saw_freeze(epoch);
                    if let Some(c) = consumed {
                        self.queue_consumed(c.epoch, c.offset);
                    }
                    Self::settle_rx_rings(rx);
                }
            }
            lock(&self.rx_ctl).pop();
            self.notify_rx(rx);
        }
        Ok(())
    }

    fn offer_ring(&self) -> io::Result<Option<(u32, SharedRing)>> {
        self.check_failed()?;
        // Take the control frames already here first: a TxFreeze sent
        // before this offer must not be read as voiding it.
        let r = self.read_control(&mut lock(&self.tx));
        let ended = r.map_err(|e| self.breach(e))?;
        let mut rx = lock(&self.rx);
        self.service_rx(&mut rx, ended)
            .map_err(|e| self.breach(e))?;
        let now = now_ms();
        match rx.clock.step(&rx.path, true, true, now) {
            OfferStep::Offer => {}
            OfferStep::Abandon => {
                // unanswered: its epoch is declared dead; the next sweep
                // offers anew
                if let Some(n) = rx.path.freeze_local() {
                    self.queue_consumed(n.epoch, n.offset);
                }
                rx.offered = None;
                rx.clock.settled();
                return Ok(None);
            }
            OfferStep::Idle | OfferStep::WaitUntil(_) => return Ok(None),
        }
        let mut next = rx.path.clone();
        let epoch = next.offer_ring().map_err(switch_error)?;
        let ring = (self.alloc)(epoch)?;
        rx.path = next;
        rx.offered = Some(ring.local);
        rx.clock.offered(now);
        Ok(Some((epoch, ring.for_peer)))
    }

    // ---- both --------------------------------------------------------

    fn freeze(&self, trigger: Trigger) -> io::Result<()> {
        self.check_failed()?;
        {
            let mut tx = lock(&self.tx);
            self.freeze_tx(&mut tx).map_err(|e| self.breach(e))?;
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
            // either way what was taken is kept and nothing more of the
            // ring (proto's one trust rule); a peer gone leaves an offer
            // out standing (the link it went over answers for it)
            let notice = match trigger {
                Trigger::LocalMove => rx.path.freeze_local(),
                Trigger::PeerGone if left_ring.is_some() => rx.path.freeze_local(),
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

impl Shared {
    /// What the driver waits on now (see [`Driven::interest`]): the wake
    /// eventfd and the doorbell always, the legs while they are needed
    /// (first failure: tell the peer, then only those two).
    fn wait_set(&self, fds: &mut Vec<libc::pollfd>) -> Option<Instant> {
        let failed = self.failed.load(Ordering::SeqCst) != 0;
        if failed {
            self.propagate_failure_once();
        }
        fds.push(libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.push(libc::pollfd {
            fd: self.doorbell.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        if failed || self.stop.load(Ordering::SeqCst) {
            return None;
        }
        let mut wake_at: Option<Instant> = None;
        let mut has_leg;
        {
            let tx = lock(&self.tx);
            has_leg = tx.leg.is_some();
            if let Some(leg) = &tx.leg {
                // The peer's control frames come back on it (always
                // watched). A leg the peer closed has nothing more to read
                // (and would be readable for ever), but a non-blocking
                // writer still waits for it: its next send is what reports
                // the close.
                let mut events = if tx.leg_closed { 0 } else { libc::POLLIN };
                if (!tx.out.is_empty() || tx.nb_waiting.load(Ordering::Acquire)) && !tx.writer_polls
                {
                    events |= libc::POLLOUT;
                }
                if events != 0 {
                    fds.push(libc::pollfd {
                        fd: leg.as_raw_fd(),
                        events,
                        revents: 0,
                    });
                }
            }
            if let Some(sock) = &tx.dialing {
                // writable once the connect completed or failed
                fds.push(libc::pollfd {
                    fd: sock.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                });
            }
            let now = now_ms();
            if let DialStep::WaitUntil(t) =
                tx.dial.step(tx.leg_wanted && tx.leg.is_none(), false, now)
            {
                wake_at = earliest(
                    wake_at,
                    Some(Instant::now() + Duration::from_millis(t.saturating_sub(now))),
                );
            }
        }
        let ctl_pending = !lock(&self.ctl_out).out.is_empty();
        {
            let rx = lock(&self.rx);
            has_leg |= rx.leg.is_some();
            if let Some(leg) = &rx.leg {
                let mut events = 0;
                // Only a non-blocking reader needs the driver to watch the
                // peer's stream; control for it comes on the other leg.
                if rx.nb_waiting.load(Ordering::Acquire) && !rx.reader_polls && !rx.leg_closed {
                    events |= libc::POLLIN;
                }
                if ctl_pending {
                    events |= libc::POLLOUT;
                }
                if events != 0 {
                    let fd = leg.as_raw_fd();
                    fds.push(libc::pollfd {
                        fd,
                        events,
                        revents: 0,
                    });
                }
            }
        }
        let stall = *lock(&self.stall_since);
        let wake_at = earliest(wake_at, stall.map(|t| t + self.cfg.peer_lost_after));
        // the legs are looked at again within the bound (check_stall)
        let live = has_leg.then(|| *lock(&self.legs_sampled) + self.legs_look_every());
        earliest(wake_at, live)
    }

    /// After the poll (see [`Driven::step`]): whoever waits on a ring or
    /// leg that moved looks again; new legs, frames to answer, deadlines.
    fn on_ready(&self, fds: &[libc::pollfd]) {
        self.ctl.drain();
        let rang = fds.get(1).is_some_and(|f| f.revents != 0);
        let leg_moved = fds.iter().skip(2).any(|f| f.revents != 0);
        if rang || leg_moved {
            if rang {
                self.doorbell.0.drain();
            }
            // A ring or a leg moved: whoever waits on it looks again.
            self.notify_tx(&lock(&self.tx));
            self.notify_rx(&lock(&self.rx));
        }
        if self.stop.load(Ordering::SeqCst) || self.failed.load(Ordering::SeqCst) != 0 {
            return;
        }
        self.install_legs();
        let r = self.service_tx(&mut lock(&self.tx));
        let ended = match r {
            Ok(ended) => ended,
            Err(e) => {
                self.breach(e);
                return;
            }
        };
        let r = self.service_rx(&mut lock(&self.rx), ended);
        if let Err(e) = r {
            self.breach(e);
            return;
        }
        self.check_stall();
    }

    fn install_legs(&self) {
        let legs = std::mem::take(&mut *lock(&self.inbound));
        for sock in legs {
            {
                let mut rx = lock(&self.rx);
                // One leg per direction; a second one is not ours to trust.
                if rx.leg.is_some() || set_leg_options(&sock).is_err() {
                    continue;
                }
                let sock = Arc::new(sock);
                rx.leg = Some(sock.clone());
                tracing::info!(conn = self.cfg.local_id, "inbound leg up");
                let mut c = lock(&self.ctl_out);
                let c = &mut *c;
                if let Err(e) = c.out.flush(&sock) {
                    self.breach(e);
                }
                c.leg = Some(sock);
                self.notify_rx(&rx);
            }
            // The peer is on TCP: bring our leg up too, so its control
            // frames have a way to us.
            self.ensure_tx_leg(&mut lock(&self.tx));
        }
        let heard = lock(&self.rx).leg.is_some();
        let mut tx = lock(&self.tx);
        if tx.leg.is_none() && tx.leg_wanted {
            self.dial_tx_leg(&mut tx, heard);
        }
    }

    /// Takes the control frames the peer sent back on our outbound leg:
    /// answers for our sending direction are handled at once, frames for
    /// our receiving direction are queued (`rx_ctl`) for it, in order (the
    /// caller then takes them, `pump_rx`). Returns whether the control
    /// stream ended in this call.
    fn read_control(&self, tx: &mut Tx) -> io::Result<bool> {
        let mut ended = false;
        while !tx.leg_closed {
            let t = &mut *tx;
            let Some(leg) = t.leg.as_ref() else { break };
            match t.inbox.next(leg, self.cfg.local_id)? {
                Incoming::Frame(LegControl::Consumed { epoch, offset }) => {
                    self.handle_consumed(tx, epoch, offset)?;
                }
                Incoming::Frame(LegControl::Reset) => {
                    return Err(io::ErrorKind::ConnectionReset.into())
                }
                Incoming::Frame(LegControl::Receiving(frame)) => {
                    // Each frame waits for the receiving direction only
                    // while a RingFrom before it waits for the bytes ahead
                    // of it, and a sender sends few before it needs an
                    // answer; a peer that floods is in breach.
                    if lock(&self.rx_ctl).push(frame).is_err() {
                        return Err(protocol_error("control frames pile up unanswered"));
                    }
                }
                Incoming::WouldBlock => break,
                Incoming::Closed => {
                    // The peer closed our outbound leg: it reads nothing
                    // more from us (its side was closed, or it died), and
                    // sends no more control frames. What it sent us stays
                    // readable on the other leg, so this is not yet the
                    // connection's end: a write after it fails on the
                    // socket, and a peer that died mid-stream shows on the
                    // receiving side (no `Fin` will come). Only a frozen
                    // direction, which waits for the peer's `Consumed` on
                    // this leg, cannot go on without it.
                    tx.leg_closed = true;
                    self.ctl_in_closed.store(true, Ordering::Release);
                    ended = true;
                    if matches!(tx.path.state(), TxState::Frozen { .. }) {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
            }
        }
        Ok(ended)
    }

    /// Reads the control stream and writes our queued bytes; whether the
    /// control stream ended in this call.
    fn service_tx(&self, tx: &mut Tx) -> io::Result<bool> {
        if tx.leg.is_none() {
            if tx.leg_wanted {
                let heard = lock(&self.rx).leg.is_some();
                self.dial_tx_leg(tx, heard);
            }
            return Ok(false);
        }
        let ended = self.read_control(tx)?;
        if !tx.writer_polls && !tx.out.is_empty() {
            if let Some(leg) = tx.leg.as_ref() {
                tx.out.flush(leg)?;
            }
        }
        Ok(ended)
    }

    /// Takes what can be taken of the receiving direction's control
    /// frames and writes ours; `wake`: the control stream just ended, and
    /// a reader waiting for a frame must learn none will come.
    fn service_rx(&self, rx: &mut Rx, wake: bool) -> io::Result<()> {
        self.pump_rx(rx)?;
        if wake {
            self.notify_rx(rx);
        }
        let mut c = lock(&self.ctl_out);
        let c = &mut *c;
        if let (false, Some(leg)) = (c.out.is_empty(), c.leg.as_deref()) {
            c.out.flush(leg)?;
        }
        Ok(())
    }

    /// Fails the connection if the legs it needs did not come up in time,
    /// or if a leg waited longer than the bound for its peer to
    /// acknowledge what it holds (the peer died or stayed away with the
    /// legs up).
    fn check_stall(&self) {
        let up = lock(&self.tx).leg.is_some() && lock(&self.rx).leg.is_some();
        let mut since = lock(&self.stall_since);
        match *since {
            Some(_) if up => *since = None,
            Some(t) if t.elapsed() >= self.cfg.peer_lost_after => {
                drop(since);
                lock(&self.failure).get_or_insert_with(|| "peer not reachable on TCP".into());
                self.fail(libc::ECONNRESET, ResetReason::PeerLost);
                return;
            }
            _ => {}
        }
        drop(since);
        {
            let mut at = lock(&self.legs_sampled);
            if at.elapsed() < self.legs_look_every() {
                return;
            }
            *at = Instant::now();
        }
        let unanswered = self.sample_legs();
        if let Some(d) = unanswered.filter(|d| *d >= self.cfg.peer_lost_after) {
            tracing::warn!(
                conn = self.cfg.local_id,
                "peer stopped answering on TCP for {d:.1?}: connection fails"
            );
            lock(&self.failure).get_or_insert_with(|| "peer stopped answering on TCP".into());
            self.fail(libc::ECONNRESET, ResetReason::PeerLost);
        }
    }

    /// How often the legs are looked at for an unanswered peer.
    fn legs_look_every(&self) -> Duration {
        (self.cfg.peer_lost_after / 4).min(Duration::from_secs(1))
    }

    /// Samples both legs ([`sample_leg`]): the longer time either has been
    /// unanswered.
    fn sample_legs(&self) -> Option<Duration> {
        let tu = {
            let mut tx = lock(&self.tx);
            let t = &mut *tx;
            sample_leg(t.leg.as_ref(), &mut t.leg_unanswered)
        };
        let ru = {
            let mut rx = lock(&self.rx);
            let r = &mut *rx;
            sample_leg(r.leg.as_deref(), &mut r.leg_unanswered)
        };
        tu.max(ru)
    }

    /// [`Shared::propagate_failure`], the first time only.
    fn propagate_failure_once(&self) {
        if !self.propagated.swap(true, Ordering::SeqCst) {
            self.propagate_failure();
        }
    }

    /// Tells the peer, on every carrier we still have, that we are gone:
    /// RESET on the rings, `Reset` on the control stream, and the end of
    /// our raw stream (without its `Fin`).
    fn propagate_failure(&self) {
        let reason = *lock(&self.failure_reason);
        {
            let mut tx = lock(&self.tx);
            if let Some(p) = tx.producer.as_mut() {
                p.reset();
            }
            if let Some(leg) = tx.leg.as_ref() {
                let _ = leg.shutdown(std::net::Shutdown::Write);
            }
        }
        {
            let mut rx = lock(&self.rx);
            if let Some(c) = rx.consumer.as_mut() {
                c.reset();
            }
        }
        {
            let mut c = lock(&self.ctl_out);
            c.out.push(&Message::Reset {
                conn_id: self.cfg.peer_id,
                reason,
            });
            let c = &mut *c;
            if let Some(leg) = c.leg.as_deref() {
                let _ = c.out.flush(leg);
            }
        }
        self.kick();
        self.tx_wake.signal();
        self.rx_wake.signal();
    }
}

impl Driven for Shared {
    fn interest(&self, fds: &mut Vec<libc::pollfd>) -> Option<Instant> {
        self.wait_set(fds)
    }

    fn step(&self, fds: &[libc::pollfd]) {
        self.on_ready(fds)
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether a read consumes what it copies or leaves it (`MSG_PEEK`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Take {
    Consume,
    Peek,
}

/// What one read of the inbound leg's run gave ([`Shared::read_run`]).
#[derive(Debug, PartialEq, Eq)]
enum RunStep {
    /// Stream bytes, into the caller's buffer.
    Read(usize),
    /// Look again (a state changed).
    Again,
    /// Nothing on the leg now.
    WaitLeg,
    /// A control frame must come first.
    WaitControl,
}
