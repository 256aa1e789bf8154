// SPDX-License-Identifier: GPL-2.0
//! The migration switch of an inter-domain stream connection
//! (docs/migration.md, "Kernel switch"): every decision is proto's
//! `TxPath`/`RxPath`; this file moves the bytes and frames.
//!
//! Each connection carries a [`Switch`] from connect on. While both
//! directions run on rings it only counts bytes (`record_sent`,
//! `record_ring_taken`, under its two locks). A trigger (the link to the
//! peer going away: `peer_gone`) freezes both directions: the sender copies
//! the unconsumed bytes back out of the ring it writes and queues
//! `TxFreeze`; the receiver keeps what it took and queues `Consumed`. Both
//! legs are then connected (ours outbound, the peer's arrives through the
//! listener in leg.rs); the `Consumed` from the peer makes the sender
//! resend from there, and the stream continues on TCP. When the link is up
//! again each receiver offers a new ring (`RingOffer` on the link) and the
//! sender moves at a byte boundary (`RingFrom` on TCP).
//!
//! The legs (protocol version 2, the raw leg: docs/protocol.md 5.4): our
//! outbound leg carries our stream as it is, no frames, and back from the
//! peer the control frames of both directions (its `Consumed` for our
//! sending direction; `RawFrom`, `RingFrom`, `TxFreeze`, `Fin` for our
//! receiving one, queued in `Switch::rx_ctl` and taken in order under
//! `Switch::rx`). Our inbound leg carries the peer's stream, and back our
//! control frames (`Switch::ctl`, written by whoever holds `Switch::rx`).
//!
//! The receiver never drains a ring it leaves: it answers every freeze with
//! `Consumed{taken}` (what it holds), so unread ring bytes come again on
//! TCP from the sender's copy. proto allows that (it is the "trust less"
//! case), and it keeps TCP data from ever waiting behind a ring.
//!
//! Locks: `Switch::tx` before the tx pipe's producer; the rx pipe's
//! consumer before `Switch::rx` (a reader holds its consumer while it
//! records what it took); `Switch::rx` before the socket's lock. No path
//! takes a link's lock while holding either switch lock (offers are sent
//! after they are released). `Switch::ctl` and `Switch::rx_ctl` are
//! leaves: taken under either switch lock or none, nothing under them but
//! the inbound leg's socket (a send).
//!
//! On TCP the application's own calls move the data, one copy and one
//! call into TCP each way, as a TCP socket's: `sendmsg` sends straight
//! from its iovecs to the outbound leg (`send_locked`), `recvmsg` reads
//! from the inbound leg straight into its iovecs (`pull` into
//! `Sink::User`), and the legs' callbacks wake its socket directly (`own`,
//! `own_inbound`). The TCP work item (`work`) services every active switch
//! for the rest: leg connects, queue flushes, control frames both ways,
//! resends, deadlines, ring offers; it wakes the socket after each pass.

use crate::carrier::ring::{self, Pipe, Wrote};
use crate::carrier::{leg, Link, SocketCore, XenSock};
use crate::carrier::{Carrier, Readiness, Received, Sent};
use crate::proto::control_stream::{self, LegControl};
use crate::proto::ctrl::{self, Message, RingGrant};
use crate::proto::dial::{Dial, DialStep};
use crate::proto::offer::{OfferClock, OfferStep};
use crate::proto::switch::{
    ConsumedOutcome, Phase, RingFromOutcome, RxControlOrder, RxControlQueue, RxControlTaken,
    RxPath, RxState, TxPath, TxState,
};
use crate::sock::State as SockState;
use crate::sys::net::{self, TcpSock};
use crate::sys::{errno as e, poll::*, Msg};
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use kernel::ffi::c_long;
use kernel::new_mutex;
use kernel::prelude::*;
use kernel::sync::{Arc, Mutex};

/// Stream bytes waiting for the outbound leg (a resend, or writes before
/// the leg is up).
const TXQ_BYTES: usize = 256 * 1024;
/// Stream bytes taken off TCP that the application has not read yet.
const RXBUF_BYTES: usize = 256 * 1024;
/// Our control frames waiting for the inbound leg.
const CTLQ_BYTES: usize = 4096;
/// How often the work item looks again while legs connect or a bound runs.
const TICK_MS: u32 = 100;
/// While a leg holds bytes its peer has not acknowledged, the work item
/// looks at it this often (the bound for a peer that died with the legs
/// up, `leg_unanswered`).
const LIVE_TICK_MS: u32 = 1000;

/// Counters for /proc/net/af_xen_stats.
pub(crate) mod counters {
    use super::AtomicI64;
    pub(crate) static TO_TCP: AtomicI64 = AtomicI64::new(0);
    pub(crate) static TO_RING: AtomicI64 = AtomicI64::new(0);
    pub(crate) static TRIGGERS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static OFFERS_SENT: AtomicI64 = AtomicI64::new(0);
    pub(crate) static OFFERS_TAKEN: AtomicI64 = AtomicI64::new(0);
    pub(crate) static PEER_LOST: AtomicI64 = AtomicI64::new(0);
    pub(crate) static RESENT_BYTES: AtomicI64 = AtomicI64::new(0);
    pub(crate) static LEG_CONNECTS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static LEG_RETRIES: AtomicI64 = AtomicI64::new(0);
    /// ring offers for a connection from a domain not its peer's, kept
    /// (`on_candidate_offer`), and those domains that proved to be the peer
    pub(crate) static CANDIDATES: AtomicI64 = AtomicI64::new(0);
    pub(crate) static PEERS_PROVED: AtomicI64 = AtomicI64::new(0);
    /// connections that followed their peer to a new domid because the
    /// agent's table lists the peer's UUID there (`Link::adopt_moved`)
    pub(crate) static PEERS_FOLLOWED: AtomicI64 = AtomicI64::new(0);
    /// backed-off retransmissions of an outbound leg fired at once because
    /// the peer was heard from again (`kick_if_heard`)
    pub(crate) static LEG_KICKS: AtomicI64 = AtomicI64::new(0);
    /// passes of the TCP work item, and sleeps of readers and writers on
    /// TCP (what competes with a streaming reader for its vCPU)
    pub(crate) static TCP_WORK_PASSES: AtomicI64 = AtomicI64::new(0);
    pub(crate) static TCP_READ_WAITS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static TCP_WRITE_WAITS: AtomicI64 = AtomicI64::new(0);
    /// the application's bytes sent on TCP straight from its buffers, and
    /// those copied into the send queue first (a leg that took only part
    /// of a frame, or was not up): the second copy the writer pays
    pub(crate) static TX_DIRECT_BYTES: AtomicI64 = AtomicI64::new(0);
    pub(crate) static TX_QUEUED_BYTES: AtomicI64 = AtomicI64::new(0);
    /// the application's sendmsg/recvmsg steps on TCP (`send`, `recv`)
    pub(crate) static SEND_STEPS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static RECV_STEPS: AtomicI64 = AtomicI64::new(0);
}

fn inc(c: &AtomicI64, n: i64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A fixed-size byte FIFO (the kernel's Vec has no deque).
struct Fifo {
    buf: KVVec<u8>,
    /// buf.len(), never 0: the index arithmetic has no division panic
    /// (objtool saw `consume` fall through into the next function)
    cap: core::num::NonZeroUsize,
    head: usize,
    len: usize,
}

impl Fifo {
    fn new(cap: usize) -> core::result::Result<Fifo, i32> {
        let nz = core::num::NonZeroUsize::new(cap).ok_or(e::EINVAL)?;
        let buf = KVVec::from_elem(0u8, cap, GFP_KERNEL).map_err(|_| e::ENOMEM)?;
        Ok(Fifo {
            buf,
            cap: nz,
            head: 0,
            len: 0,
        })
    }
    fn len(&self) -> usize {
        self.len
    }
    fn room(&self) -> usize {
        self.buf.len() - self.len
    }
    fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The first contiguous run of queued bytes.
    fn front(&self) -> &[u8] {
        let end = (self.head + self.len).min(self.buf.len());
        &self.buf[self.head..end]
    }
    fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.head = (self.head + n) % self.cap;
        self.len -= n;
        if self.len == 0 {
            self.head = 0;
        }
    }
    /// The free bytes right after the queued ones, up to the buffer's end
    /// (a receive straight into the queue; `commit` then counts them).
    fn tail_room(&mut self) -> &mut [u8] {
        let cap = self.buf.len();
        if self.len == cap {
            return &mut [];
        }
        let tail = (self.head + self.len) % self.cap;
        let end = if tail >= self.head { cap } else { self.head };
        &mut self.buf[tail..end]
    }
    /// Counts `n` bytes written into `tail_room` as queued.
    fn commit(&mut self, n: usize) {
        self.len += n.min(self.room());
    }
    /// Appends `n` bytes copied straight from the user's iovecs (writes
    /// before the leg is up); returns the bytes copied (short on a fault),
    /// 0 when they do not fit.
    fn push_from(&mut self, msg: &mut Msg, n: usize) -> usize {
        if n == 0 || n > self.room() {
            return 0;
        }
        // the free space right after the queued bytes, wrapping at the end
        let cap = self.buf.len();
        let start = (self.head + self.len) % self.cap;
        let first = n.min(cap - start);
        let mut got = msg.copy_from(&mut self.buf[start..start + first]);
        if got == first && first < n {
            got += msg.copy_from(&mut self.buf[..n - first]);
        }
        self.len += got;
        got
    }
    /// Appends all of `b`, or nothing when it does not fit.
    fn push(&mut self, b: &[u8]) -> bool {
        if b.len() > self.room() {
            return false;
        }
        let cap = self.buf.len();
        let tail = (self.head + self.len) % self.cap;
        let first = b.len().min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&b[..first]);
        self.buf[..b.len() - first].copy_from_slice(&b[first..]);
        self.len += b.len();
        true
    }
}

/// Our sending direction.
struct TxSide {
    path: TxPath,
    /// outbound leg (ours): our stream out, raw; the peer's control
    /// frames back
    leg: Option<leg::HeldLeg>,
    leg_up: bool,
    /// the leg's `TcpHello`, sent before anything in `q`
    hello: [u8; leg::HELLO_LEN],
    hello_left: usize,
    /// stream bytes for the leg (raw)
    q: Option<Fifo>,
    /// the stream from the frozen ring's consumer on (read back)
    resend: KVVec<u8>,
    resend_pos: usize,
    resend_end: usize,
    resend_off: u64,
    fin_sent: bool,
    /// a ring the receiver offered, applied once this side is on TCP
    offer: Option<RingGrant>,
    /// a ring offered for this connection by a domain that is not the
    /// peer's, while the link to the peer is gone: the peer, moved (its
    /// domid changed), or another guest. Kept until that domain proves to
    /// be the peer (see `on_candidate_offer`).
    candidate: Option<(Arc<Link>, RingGrant)>,
    /// the peer's control frames on our outbound leg
    ib: [u8; 64],
    ib_got: usize,
    /// the outbound leg broke or the peer closed it: writes get EPIPE
    broken: bool,
    want_leg: bool,
    /// when to connect the outbound leg, and connect it again (proto's)
    dial: Dial,
    /// the ring this direction was on when the application closed (the
    /// socket lets go of it): read back if the receiver abandons it
    closed_ring: Option<Arc<Pipe>>,
    /// a blocking writer waits for room on the leg (`send` said Blocked)
    writer_waits: bool,
    /// what the outbound leg's owner flag says (`own_outbound`)
    owner_writes: bool,
    /// segments both legs had received at the last pass (`heard_from`)
    heard: u32,
    /// since when (now_ms, 0: not) the leg has been unanswered (`leg_unanswered`)
    unanswered_since: u64,
}

/// Our receiving direction.
struct RxSide {
    path: RxPath,
    /// inbound leg (the peer's): its stream in, raw; our control frames
    /// back (`Switch::ctl`)
    leg: Option<leg::HeldLeg>,
    buf: Option<Fifo>,
    /// the raw runs on the inbound leg, as the peer's control frames
    /// open and end them (`take_rx_ctl`)
    order: RxControlOrder,
    /// the inbound leg said EOF: nothing more comes on it
    data_eof: bool,
    /// what the leg's owner flag says now (`own_inbound`; None: not set)
    owner_pulls: Option<bool>,
    /// the new receive ring offered, read once its `RingFrom` arrives
    offered: Option<Arc<Pipe>>,
    /// the link `offered` went over when it went to a candidate for the
    /// moved peer (`TxSide::candidate`) rather than over the peer's link
    offered_via: Option<Arc<Link>>,
    /// a candidate proved to be the peer (the peer switched onto the ring
    /// granted to it, said so on its leg): the work item adopts its link
    adopt: Option<Arc<Link>>,
    /// when to offer a ring, when to give an offer up (proto's rule)
    clock: OfferClock,
    /// as `TxSide::unanswered_since`, for the inbound leg
    unanswered_since: u64,
}

/// The carrier switch of one stream connection.
#[pin_data]
pub(crate) struct Switch {
    #[pin]
    tx: Mutex<TxSide>,
    #[pin]
    rx: Mutex<RxSide>,
    /// a trigger or a leg made this connection use TCP (the work item
    /// services it)
    active: AtomicBool,
    /// the application closed the socket; finish sending, then release
    closed: AtomicBool,
    /// legs must be up by then (boot ms; 0: no bound running)
    deadline: AtomicU64,
    pub(crate) to_tcp: AtomicU32,
    pub(crate) to_ring: AtomicU32,
    /// receive ring size for offers (the connection's SO_RCVBUF at connect)
    rx_cap: usize,
    /// our control frames for the inbound leg (a leaf lock)
    #[pin]
    ctl: Mutex<Option<Fifo>>,
    /// the peer's control frames for our receiving direction, in order (a
    /// leaf lock)
    #[pin]
    rx_ctl: Mutex<RxControlQueue>,
    /// the peer closed its control stream (our outbound leg's way back)
    ctl_in_closed: AtomicBool,
}

impl Switch {
    /// A connection set up on rings (epoch 0 both ways) whose receive
    /// rings hold `rx_cap` bytes.
    pub(crate) fn new(rx_cap: usize) -> Result<Arc<Switch>> {
        Arc::pin_init(
            pin_init!(Switch {
                tx <- new_mutex!(TxSide {
                    path: TxPath::on_ring(),
                    leg: None,
                    leg_up: false,
                    hello: [0; leg::HELLO_LEN],
                    hello_left: 0,
                    q: None,
                    resend: KVVec::new(),
                    resend_pos: 0,
                    resend_end: 0,
                    resend_off: 0,
                    fin_sent: false,
                    offer: None,
                    candidate: None,
                    ib: [0; 64],
                    ib_got: 0,
                    broken: false,
                    want_leg: false,
                    dial: Dial::new(),
                    closed_ring: None,
                    writer_waits: false,
                    owner_writes: false,
                    heard: 0,
                    unanswered_since: 0,
                }, "af_xen_sw_tx"),
                rx <- new_mutex!(RxSide {
                    path: RxPath::on_ring(),
                    leg: None,
                    buf: None,
                    order: RxControlOrder::new(),
                    data_eof: false,
                    owner_pulls: None,
                    offered: None,
                    offered_via: None,
                    adopt: None,
                    clock: OfferClock::new(),
                    unanswered_since: 0,
                }, "af_xen_sw_rx"),
                active: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                deadline: AtomicU64::new(0),
                to_tcp: AtomicU32::new(0),
                to_ring: AtomicU32::new(0),
                rx_cap,
                ctl <- new_mutex!(None, "af_xen_sw_ctl"),
                rx_ctl <- new_mutex!(RxControlQueue::new(), "af_xen_sw_rx_ctl"),
                ctl_in_closed: AtomicBool::new(false),
            }),
            GFP_KERNEL,
        )
    }

    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The connection's phase (proto's), for /proc/net/af_xen.
    pub(crate) fn phase(&self) -> Phase {
        let c = crate::proto::switch::Connection {
            tx: self.tx.lock().path.clone(),
            rx: self.rx.lock().path.clone(),
        };
        c.phase()
    }

    /// Whether the sending direction writes the ring now.
    pub(crate) fn tx_on_ring(&self) -> bool {
        matches!(self.tx.lock().path.state(), TxState::Ring { .. })
    }
}

fn tx_activate(t: &mut TxSide) -> core::result::Result<(), i32> {
    if t.q.is_none() {
        t.q = Some(Fifo::new(TXQ_BYTES)?);
    }
    Ok(())
}

fn rx_activate(r: &mut RxSide) -> core::result::Result<(), i32> {
    if r.buf.is_none() {
        r.buf = Some(Fifo::new(RXBUF_BYTES)?);
    }
    Ok(())
}

/// Queues one of our control frames for the inbound leg (false: no room,
/// or no memory for the queue). Whoever holds `Switch::rx` next writes it
/// (`flush_ctl`); the work item is told.
fn push_ctl(sw: &Switch, m: &Message<'_>) -> bool {
    let mut b = [0u8; ctrl::MAX_CONTROL_FRAME];
    let Ok(n) = m.encode(&mut b) else {
        return false;
    };
    let mut q = sw.ctl.lock();
    if q.is_none() {
        match Fifo::new(CTLQ_BYTES) {
            Ok(f) => *q = Some(f),
            Err(_) => return false,
        }
    }
    let ok = q.as_mut().map(|q| q.push(&b[..n])).unwrap_or(false);
    drop(q);
    net::schedule();
    ok
}

/// Whether our control frames have all gone to the inbound leg.
fn ctl_flushed(sw: &Switch) -> bool {
    sw.ctl.lock().as_ref().map_or(true, |q| q.is_empty())
}

struct Ids {
    conn_id: u32,
    peer_conn: u32,
}

fn ids(xs: &XenSock) -> Ids {
    let i = xs.inner.lock();
    Ids {
        conn_id: i.conn_id,
        peer_conn: i.peer_conn,
    }
}

fn sw_of(xs: &XenSock) -> Option<Arc<Switch>> {
    xs.inner.lock().sw.clone()
}

fn activate(xs: &Arc<XenSock>, sw: &Switch) {
    if !sw.active.swap(true, Ordering::AcqRel) {
        leg::register(xs);
    }
}

fn start_bound(sw: &Switch) {
    let _ = sw.deadline.compare_exchange(
        0,
        net::now_ms() + net::peer_lost_ms(),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
}

/// Wakes the socket's waiters, unless the application released it (the
/// work item may still hold a closed connection; its struct sock is gone).
fn wake(xs: &XenSock, mask: u32) {
    xs.wake_live(mask);
}

fn fail(xs: &XenSock, why: &str) {
    pr_warn!(
        "connection {}: switch failed ({}): reset\n",
        xs.inner.lock().conn_id,
        why
    );
    let _ = xs.conn_reset(why);
    wake(
        xs,
        POLLIN | POLLOUT | POLLERR | POLLHUP | POLLRDNORM | POLLWRNORM,
    );
}

// ---- triggers ---------------------------------------------------------------

/// The link to the peer went away while the connection is up (the peer
/// left this host's co-residency, moved, or its link was retracted):
/// freeze both directions and continue on TCP. False when the connection
/// cannot switch (no switch, no TCP endpoint, not connected): the caller
/// resets it as before.
pub(crate) fn peer_gone(xs: &Arc<XenSock>) -> bool {
    let (sw, ok) = {
        let i = xs.inner.lock();
        (
            i.sw.clone(),
            i.state == SockState::Connected && !i.reset && !i.released && i.tcp.peer.port != 0,
        )
    };
    let Some(sw) = sw else { return false };
    if !ok || leg::legs_disabled() {
        return false;
    }
    inc(&counters::TRIGGERS, 1);
    pr_info!(
        "connection {}: peer's link gone, switching to TCP\n",
        xs.inner.lock().conn_id
    );
    leg::hold_hellos_for_peer_lost();
    activate(xs, &sw);
    start_bound(&sw);
    {
        let mut t = sw.tx.lock();
        if let Err(why) = freeze_tx_locked(xs, &sw, &mut t) {
            drop(t);
            fail(xs, why);
            return true;
        }
        t.want_leg = true;
    }
    if let Err(why) = freeze_rx(xs, &sw) {
        fail(xs, why);
        return true;
    }
    net::schedule();
    wake(xs, POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM);
    true
}

/// Stops writing the ring (if it is in use), keeps a copy of what the
/// receiver has not consumed, queues `TxFreeze`. Caller holds `sw.tx`.
fn freeze_tx_locked(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
) -> core::result::Result<(), &'static str> {
    tx_activate(t).map_err(|_| "no memory for the send queue")?;
    let ids = ids(xs);
    let mut copy = KVVec::new();
    let mut unconsumed = 0u64;
    let pipe = if let TxState::Ring { .. } = t.path.state() {
        // after close the socket no longer holds the ring: closing() kept it
        let pipe = xs.inner.lock().tx.take().or_else(|| t.closed_ring.take());
        if let Some(p) = &pipe {
            let mut prod = p.tx.lock();
            let n = prod.unconsumed().map_err(|_| "ring index out of range")? as usize;
            copy = KVVec::from_elem(0u8, n, GFP_KERNEL)
                .map_err(|_| "no memory for the resend copy")?;
            // the receiver may still be reading (a move it has not noticed
            // yet): what it consumed since the look above is its, and the
            // copy is the rest, the last `got` bytes written. Requiring
            // got == n reset such connections ("ring read back short",
            // once in 100 moves)
            let got = prod
                .read_back(&mut copy)
                .map_err(|_| "ring index out of range")?;
            if got < n {
                // (the kernel's Vec has no truncate in 6.12)
                let mut rest = KVVec::from_elem(0u8, got, GFP_KERNEL)
                    .map_err(|_| "no memory for the resend copy")?;
                rest.copy_from_slice(&copy[..got]);
                copy = rest;
            }
            unconsumed = got as u64;
        }
        pipe
    } else {
        None
    };
    let notice = t.path.freeze(unconsumed).map_err(|_| "freeze")?;
    if matches!(t.path.state(), TxState::Frozen { .. }) && pipe.is_some() {
        t.resend = copy;
        t.resend_pos = 0;
        t.resend_end = 0;
    }
    t.fin_sent = false;
    if !push_ctl(
        sw,
        &Message::TxFreeze {
            conn_id: ids.peer_conn,
            epoch: notice.epoch,
            offset: notice.offset,
        },
    ) {
        return Err("control queue full");
    }
    pr_info!(
        "connection {}: tx froze ring {} at {} ({} bytes to resend)\n",
        ids.conn_id,
        notice.epoch,
        notice.offset,
        unconsumed
    );
    // the mapping goes outside the switch lock's critical work
    drop(pipe);
    Ok(())
}

/// The receiving direction leaves its ring on its own: what was taken is
/// kept, the rest comes again from the sender (`Consumed{taken}`).
fn freeze_rx(xs: &XenSock, sw: &Switch) -> core::result::Result<(), &'static str> {
    loop {
        let pipe = xs.inner.lock().rx.clone();
        let c = pipe.as_ref().map(|p| p.rx.lock());
        let r = sw.rx.lock();
        // a RingFrom may have put a new ring in between: lock that one
        if !same_pipe(&xs.inner.lock().rx, &pipe) {
            continue;
        }
        return freeze_rx_locked(xs, sw, pipe.clone(), c, r);
    }
}

fn same_pipe(a: &Option<Arc<Pipe>>, b: &Option<Arc<Pipe>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

type ConsumerGuard<'a> = kernel::sync::lock::Guard<
    'a,
    crate::proto::ring::Consumer<crate::proto::mem::RawRing>,
    kernel::sync::lock::mutex::MutexBackend,
>;
type RxGuard<'a> = kernel::sync::lock::Guard<'a, RxSide, kernel::sync::lock::mutex::MutexBackend>;

fn freeze_rx_locked(
    xs: &XenSock,
    sw: &Switch,
    pipe: Option<Arc<Pipe>>,
    c: Option<ConsumerGuard<'_>>,
    mut r: RxGuard<'_>,
) -> core::result::Result<(), &'static str> {
    rx_activate(&mut r).map_err(|_| "no memory for the receive buffer")?;
    if let (RxState::Ring { .. }, Some(c)) = (r.path.state(), c.as_ref()) {
        // a FIN the ring showed with every byte taken: end of stream known
        if let (Ok(0), Ok(end)) = (c.readable(), c.peer_end()) {
            if end.fin {
                let taken = r.path.taken();
                let _ = r.path.on_fin(taken);
            }
        }
    }
    let was_ring = matches!(r.path.state(), RxState::Ring { .. });
    if let Some(n) = r.path.freeze_local() {
        let peer_conn = xs.inner.lock().peer_conn;
        if !push_ctl(
            sw,
            &Message::Consumed {
                conn_id: peer_conn,
                epoch: n.epoch,
                offset: n.offset,
            },
        ) {
            return Err("control queue full");
        }
        if was_ring {
            r.clock.left_ring(n.epoch, net::now_ms());
            sw.to_tcp.fetch_add(1, Ordering::Relaxed);
            inc(&counters::TO_TCP, 1);
        }
        pr_info!(
            "connection {}: rx left ring {} at {}\n",
            xs.inner.lock().conn_id,
            n.epoch,
            n.offset
        );
    }
    let dead_offer = if matches!(r.path.state(), RxState::Offered { .. }) {
        None
    } else {
        r.offered.take()
    };
    drop(r);
    drop(c);
    let old = xs.inner.lock().rx.take();
    drop((old, dead_offer, pipe));
    Ok(())
}

/// A `RingOffer` from the link (under the link's lock: only recorded; the
/// work item maps and applies it).
pub(crate) fn on_ring_offer(xs: &Arc<XenSock>, grant: RingGrant) {
    let Some(sw) = sw_of(xs) else { return };
    if !sw.is_active() {
        return;
    }
    sw.tx.lock().offer = Some(grant);
    net::schedule();
}

/// A `RingOffer` naming this connection over `link`, from a domain that
/// is not its peer's, while the link to the peer is gone (under `link`'s
/// lock). The peer may have moved and come back under a new domid; but a
/// `RingOffer` carries no secret, and connection ids are small numbers, so
/// any guest on this host could send one: taken at its word, our sending
/// direction would move onto that guest's ring, and it would read the
/// stream. So the offer is only kept, and the work item offers our own
/// receive ring over `link` (granted to that domain alone). Only the peer
/// can answer that with `RingFrom` on its inbound leg, which its cookie
/// authenticated; then the link is adopted and the kept offer taken
/// (`adopt_proven`). A later candidate replaces an earlier one.
pub(crate) fn on_candidate_offer(xs: &Arc<XenSock>, link: Arc<Link>, grant: RingGrant) {
    let Some(sw) = sw_of(xs) else { return };
    if !sw.is_active() {
        return;
    }
    pr_info!("connection {}: ring offer from dom{}, not the peer's domain: kept until it proves to be the peer\n", xs.inner.lock().conn_id, link.peer);
    inc(&counters::CANDIDATES, 1);
    let earlier = sw.tx.lock().candidate.replace((link, grant));
    drop(earlier);
    net::schedule();
}

/// The work item's half of `on_candidate_offer`: a candidate that proved
/// to be the peer becomes the connection's link, and its kept offer is
/// taken as the peer's own would be.
fn adopt_proven(xs: &Arc<XenSock>, sw: &Switch) {
    let Some(link) = sw.rx.lock().adopt.take() else {
        return;
    };
    if !adopt(&link, xs) {
        return;
    }
    inc(&counters::PEERS_PROVED, 1);
    take_kept_offer(xs, sw, &link);
}

/// Makes `link` the connection's, its peer proved to be the link's
/// domain (`adopt_proven`). Returns whether it did: not if
/// the link went down since, or the connection ended or has a live
/// link again.
fn adopt(link: &Arc<Link>, xs: &Arc<XenSock>) -> bool {
    let mut i = link.inner.lock();
    if !link.is_up() {
        return false;
    }
    let (conn_id, old) = {
        let mut inner = xs.inner.lock();
        let stale = inner
            .link
            .as_ref()
            .map(|l| !Arc::ptr_eq(l, link) && !l.is_up())
            .unwrap_or(false);
        if inner.state != SockState::Connected || inner.released || !stale {
            return false;
        }
        let was = inner.peer.domid;
        inner.peer.domid = link.peer;
        pr_info!(
            "connection {}: peer dom{} is now dom{}\n",
            inner.conn_id,
            was,
            link.peer
        );
        (inner.conn_id, inner.link.replace(link.clone()))
    };
    drop(old);
    let _ = i
        .conns
        .try_create_and_insert(conn_id, xs.clone(), GFP_KERNEL);
    true
}

/// `link` became the connection's (its domain proved to be the peer, or
/// the agent lists the peer there): an offer it made while it was only a
/// candidate is taken now as the peer's own. An offer kept from another
/// domain is dropped; the peer offers again over its link, now ours (its
/// offer times out).
fn take_kept_offer(xs: &Arc<XenSock>, sw: &Switch, link: &Arc<Link>) {
    let kept = {
        let mut t = sw.tx.lock();
        match t.candidate.take() {
            Some((l, grant)) if Arc::ptr_eq(&l, link) => Some(grant),
            other => {
                drop(other);
                None
            }
        }
    };
    if let Some(grant) = kept {
        on_ring_offer(xs, grant);
    }
}

/// The connection followed its peer to `link` by the agent's table
/// (`Link::adopt_moved`): the offer that link's domain made before, kept
/// as a candidate's, is the peer's.
pub(crate) fn followed_peer(xs: &Arc<XenSock>, link: &Arc<Link>) {
    inc(&counters::PEERS_FOLLOWED, 1);
    if let Some(sw) = sw_of(xs) {
        take_kept_offer(xs, &sw, link);
    }
}

/// This guest is back from a save (or the save was cancelled): the clock
/// may have jumped by the time it was away, so the peer-lost bounds
/// running start again from now.
pub(crate) fn resumed() {
    leg::resumed();
    let now = net::now_ms();
    for xs in leg::active_snapshot().iter() {
        if let Some(sw) = sw_of(xs) {
            if sw.deadline.load(Ordering::Acquire) != 0 {
                sw.deadline
                    .store(now + net::peer_lost_ms(), Ordering::Release);
            }
        }
    }
    net::schedule();
}

/// The link to the peer is up again: let the work item offer rings.
pub(crate) fn link_up() {
    net::schedule();
}

/// The socket was closed: finish sending what is queued, then let go.
/// `tx` is the ring it wrote (the socket lets go of it now), kept while the
/// switch is active until the receiver has taken it all (see
/// `ring_all_taken`).
fn closing(sw: &Switch, tx: Option<&Arc<Pipe>>) {
    {
        let mut t = sw.tx.lock();
        t.path.finish();
        if sw.is_active() && matches!(t.path.state(), TxState::Ring { .. }) {
            t.closed_ring = tx.cloned();
        }
    }
    sw.closed.store(true, Ordering::Release);
    if sw.is_active() {
        let _ = sw.deadline.compare_exchange(
            0,
            net::now_ms() + net::peer_lost_ms(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        net::schedule();
    }
}

/// A leg of `xs`'s connection wakes its socket's waiters straight from its
/// callbacks (af_xen_net.c, afx_leg_wake) while the application holds the
/// socket. Caller holds the switch lock of the leg's direction, which
/// `disown` takes after `closed`: either this sees `closed` or `disown`
/// clears what this set.
fn own(xs: &XenSock, sw: &Switch, leg: &leg::HeldLeg) {
    if !sw.closed.load(Ordering::Acquire) {
        leg.sock().set_owner(Some(&xs.sk), false, false);
    }
}

/// Whether the application's writer, when it writes or is woken, sends
/// everything this direction has for its leg: the hello is out and no
/// resend, ring offer or failure waits for the work item (it sends the
/// queue's frames itself, `flush_tx` in `send`).
fn writer_flushes(t: &TxSide) -> bool {
    t.leg_up
        && !t.broken
        && t.hello_left == 0
        && t.resend_pos >= t.resend_end
        && t.offer.is_none()
        && matches!(t.path.state(), TxState::Tcp)
}

/// Tells the outbound leg whether a drain (`write_space`) must run the
/// work item: not while the writer covers the leg, i.e. it waits for room
/// (and flushes when woken) or nothing is queued behind it. A drain that
/// ran the work item every time competed with the writer it woke, on the
/// same vCPU. Caller holds
/// `sw.tx`; called wherever the answer may have changed.
fn own_outbound(xs: &XenSock, sw: &Switch, t: &mut TxSide) {
    let queued = t.q.as_ref().is_some_and(|q| !q.is_empty());
    let writes = writer_flushes(t) && (t.writer_waits || !queued);
    if writes == t.owner_writes || sw.closed.load(Ordering::Acquire) {
        return;
    }
    let Some(leg) = t.leg.as_ref() else { return };
    leg.sock().set_owner(Some(&xs.sk), false, writes);
    t.owner_writes = writes;
    // a drain before this found the flag still set and left the queue
    if !writes && leg.sock().writable() {
        net::schedule();
    }
}

/// A writer that waited for room leaves `sendmsg` without writing again
/// (a signal, its timeout): what it left queued is the work item's again.
fn writer_gone(xs: &XenSock, sw: &Switch) {
    let mut t = sw.tx.lock();
    t.writer_waits = false;
    own_outbound(xs, sw, &mut t);
}

/// The inbound leg's owner, and who reads it: the application's recvmsg
/// while this direction is on TCP (the leg's data then wakes only it), the
/// work item while it is on a ring (a TxFreeze comes there). Called with
/// `sw.rx` held wherever the direction may have changed; a flag that lags
/// behind a move off the ring only schedules the work item once more.
fn own_inbound(xs: &XenSock, sw: &Switch, r: &mut RxSide) {
    let Some(leg) = r.leg.as_ref() else { return };
    if sw.closed.load(Ordering::Acquire) {
        return;
    }
    let pulls = !r.path.reads_ring();
    if r.owner_pulls != Some(pulls) {
        leg.sock().set_owner(Some(&xs.sk), pulls, false);
        r.owner_pulls = Some(pulls);
    }
}

/// The application releases the socket: its legs (which may outlive it
/// until what it sent is out) wake nobody from now on.
fn disown(sw: &Switch) {
    sw.closed.store(true, Ordering::Release);
    {
        let t = sw.tx.lock();
        if let Some(l) = t.leg.as_ref() {
            l.sock().set_owner(None, false, false);
        }
    }
    let r = sw.rx.lock();
    if let Some(l) = r.leg.as_ref() {
        l.sock().set_owner(None, false, false);
    }
}

/// An authenticated inbound leg for `xs` (`work`). Err: refused (a second
/// leg, or no switch).
pub(crate) fn attach_inbound(
    xs: &Arc<XenSock>,
    leg: leg::HeldLeg,
) -> core::result::Result<(), leg::HeldLeg> {
    let Some(sw) = sw_of(xs) else { return Err(leg) };
    {
        let mut r = sw.rx.lock();
        if r.leg.is_some() || rx_activate(&mut r).is_err() {
            return Err(leg);
        }
        r.leg = Some(leg);
        r.owner_pulls = None;
        own_inbound(xs, &sw, &mut r);
    }
    {
        // the peer uses TCP now: so do we, for what we send
        let mut t = sw.tx.lock();
        if tx_activate(&mut t).is_err() {
            return Ok(());
        }
        // (the pass that follows hears the peer on this leg: an attempt
        // of ours waiting for a backed-off SYN starts over, `leg_tx`)
        t.want_leg = true;
    }
    activate(xs, &sw);
    net::schedule();
    Ok(())
}

/// Test trigger (XENSOCK_TEST_OPEN_LEG 1): connect this connection's
/// outbound leg now, without a switch.
pub(crate) fn open_leg(xs: &Arc<XenSock>) -> core::result::Result<(), i32> {
    let Some(sw) = sw_of(xs) else {
        return Err(e::EOPNOTSUPP);
    };
    {
        let mut t = sw.tx.lock();
        tx_activate(&mut t)?;
        t.want_leg = true;
    }
    {
        let mut r = sw.rx.lock();
        rx_activate(&mut r)?;
    }
    activate(xs, &sw);
    net::schedule();
    Ok(())
}

// ---- the application's reads and writes --------------------------------------

enum Write {
    /// the ring carries this direction: use it
    Ring,
    Sent(usize),
    /// no room (or frozen): wait for `tx_ready`
    Blocked,
    /// the peer closed (or the leg broke)
    Pipe,
    Fault,
}

/// One step of `sendmsg` on TCP: as much of the message as the outbound
/// leg takes now, straight from the user's iovecs, under one take of the
/// switch lock (before the leg is up, into the send queue). `waits`: the
/// caller, told Blocked, waits for room and calls again when woken (a
/// blocking writer; `writer_gone` if it leaves instead), so it flushes
/// what is queued and the leg's drains need not run the work item.
fn send(xs: &XenSock, sw: &Switch, msg: &mut Msg, left: usize, waits: bool) -> Write {
    inc(&counters::SEND_STEPS, 1);
    let mut t = sw.tx.lock();
    t.writer_waits = false;
    let res = send_locked(&mut t, msg, left);
    // a blocking writer told Blocked waits for room and flushes when woken
    t.writer_waits = waits && matches!(res, Write::Blocked);
    own_outbound(xs, sw, &mut t);
    res
}

/// `send` under the switch's lock. On the raw leg a write is the user's
/// bytes and nothing else: one `sock_sendmsg` from its iovecs, as TCP's
/// own writer makes (with `Data` frames each write cost a second call for
/// the frame's prefix, ~47 us of the ~55 us the carrier's writer spent
/// over TCP's per 64 KiB). What the leg does
/// not take stays the writer's, as on a TCP socket.
fn send_locked(t: &mut TxSide, msg: &mut Msg, left: usize) -> Write {
    match t.path.state() {
        TxState::Ring { .. } => return Write::Ring,
        TxState::Frozen { .. } => return Write::Blocked,
        TxState::Tcp => {}
    }
    // what is queued goes first, from here: a writer woken by the leg's
    // write_space (afx_leg_wake) makes its own room, no work item between
    flush_tx(t);
    if t.broken {
        return Write::Pipe;
    }
    if t.resend_pos < t.resend_end || t.offer.is_some() {
        return Write::Blocked;
    }
    let queued = t.q.as_ref().is_some_and(|q| !q.is_empty());
    if leg_ready(t) {
        if queued {
            return Write::Blocked;
        }
        let Some(leg) = t.leg.as_ref() else {
            return Write::Blocked;
        };
        return match leg.sock().send_from_user(msg, left, false) {
            Ok(n) if n > 0 => {
                let n = n.min(left);
                let _ = t.path.record_sent(n as u64);
                inc(&counters::TX_DIRECT_BYTES, n as i64);
                Write::Sent(n)
            }
            Ok(_) => Write::Blocked,
            Err(x) if x == e::EAGAIN => Write::Blocked,
            // TCP refuses a chunk that faults part way; the bytes before
            // the fault are the writer's to send, as with the ring (they
            // go through the queue, which is empty here)
            Err(x) if x == e::EFAULT => queue_from_user(t, msg, left),
            Err(_) => {
                t.broken = true;
                Write::Pipe
            }
        };
    }
    queue_from_user(t, msg, left)
}

/// Copies what the user's iovecs hold of the next `left` bytes (short on
/// a fault) into the send queue, behind what is queued: while the leg
/// connects, or for a write whose buffer faults part way.
fn queue_from_user(t: &mut TxSide, msg: &mut Msg, left: usize) -> Write {
    let room = t.q.as_ref().map(|q| q.room()).unwrap_or(0);
    if room == 0 {
        return Write::Blocked;
    }
    let Some(q) = t.q.as_mut() else {
        return Write::Blocked;
    };
    let got = q.push_from(msg, left.min(room));
    if got == 0 {
        return Write::Fault;
    }
    let _ = t.path.record_sent(got as u64);
    inc(&counters::TX_QUEUED_BYTES, got as i64);
    Write::Sent(got)
}

/// SIOCOUTQ on TCP: stream bytes we hold that have not gone out on the
/// outbound leg yet (queued, or read back from a frozen ring to resend).
fn tx_unsent(sw: &Switch) -> usize {
    if !sw.is_active() {
        return 0;
    }
    let t = sw.tx.lock();
    t.q.as_ref().map_or(0, |q| q.len()) + t.resend_end.saturating_sub(t.resend_pos)
}

/// Whether a writer waiting on TCP should look again.
fn tx_ready(sw: &Switch) -> bool {
    let t = sw.tx.lock();
    match t.path.state() {
        TxState::Ring { .. } => true,
        TxState::Frozen { .. } => false,
        TxState::Tcp => t.broken || tcp_writable(&t),
    }
}

/// The outbound leg is up and its hello out: frames go on it.
fn leg_ready(t: &TxSide) -> bool {
    t.leg_up && t.hello_left == 0 && t.leg.is_some()
}

/// A write on TCP would take bytes now: nothing to resend or offer first,
/// and a leg that takes bytes (the writer flushes what is queued itself,
/// `send`), or, while the leg connects, room in the queue.
fn tcp_writable(t: &TxSide) -> bool {
    if t.resend_pos < t.resend_end || t.offer.is_some() {
        return false;
    }
    if leg_ready(t) {
        return t.leg.as_ref().is_some_and(|l| l.sock().writable());
    }
    t.q.as_ref().is_some_and(|q| q.room() > 0)
}

enum Read {
    /// the ring carries this direction and no TCP bytes are ahead of it
    Ring,
    Got(usize),
    /// nothing to read; `eof`: the stream ended here
    Empty {
        eof: bool,
    },
    Fault,
    /// the connection was reset
    Reset,
}

/// How long a reader waits for the switch and its socket to agree on the
/// ring to read before it ends the connection (`Switched::recv`).
const RING_DISAGREEMENT_MS: u32 = 2000;

/// One step of `recvmsg` on TCP: bytes taken off TCP come before the ring.
fn recv(xs: &XenSock, sw: &Switch, msg: &mut Msg, left: usize, peek: bool) -> Read {
    inc(&counters::RECV_STEPS, 1);
    let mut r = sw.rx.lock();
    let pending = r.buf.as_ref().map(|b| b.len()).unwrap_or(0);
    if pending == 0 {
        if r.path.reads_ring() {
            return Read::Ring;
        }
        // pull what the leg has now (process context; the work item takes
        // control frames only). No ring pipe is in use here, so no consumer
        // lock first. A read takes the bytes straight into the user's
        // buffers; a peek goes through the buffer (it must not consume).
        if xs.inner.lock().rx.is_none() {
            let ids = ids(xs);
            let mut sink = if peek {
                Sink::Buffer
            } else {
                Sink::User {
                    msg: &mut *msg,
                    left,
                    got: 0,
                    fault: false,
                }
            };
            let res = pull(xs, sw, &mut r, &ids, &mut sink);
            let (got, fault) = match sink {
                Sink::User { got, fault, .. } => (got, fault),
                Sink::Buffer | Sink::Control => (0, false),
            };
            if let Err(why) = res {
                drop(r);
                fail(xs, why);
                // what arrived before the failure was the stream's
                return if got > 0 { Read::Got(got) } else { Read::Reset };
            }
            if got > 0 {
                return Read::Got(got);
            }
            if fault {
                return Read::Fault;
            }
        }
        let pending = r.buf.as_ref().map(|b| b.len()).unwrap_or(0);
        if pending == 0 {
            if r.path.reads_ring() {
                return Read::Ring;
            }
            let eof = r.path.eof_at() == Some(r.path.taken());
            return Read::Empty { eof };
        }
    }
    let Some(buf) = r.buf.as_mut() else {
        return Read::Fault;
    };
    let front = buf.front();
    let n = front.len().min(left);
    let out = msg.copy_to(&front[..n]);
    if out == 0 && n > 0 {
        return Read::Fault;
    }
    if !peek {
        let was_full = buf.room() == 0;
        buf.consume(out);
        if was_full {
            // the work item stopped reading the leg for want of room
            net::schedule();
        }
    }
    Read::Got(out)
}

/// This direction reads its inbound leg now: off every ring and none in
/// use (caller holds `sw.rx`, which comes before the socket's lock).
fn reads_leg(xs: &XenSock, r: &RxSide) -> bool {
    !r.path.reads_ring() && xs.inner.lock().rx.is_none()
}

/// Bytes on the TCP carrier that the application has not read (FIONREAD
/// adds the ring's): what the leg has is taken into the buffer first (the
/// work item leaves it to the reader), so it is what a read returns now.
fn tcp_readable(xs: &XenSock, sw: &Switch) -> usize {
    let mut r = sw.rx.lock();
    if reads_leg(xs, &r) {
        let ids = ids(xs);
        if let Err(why) = pull_frames(xs, sw, &mut r, &ids) {
            drop(r);
            fail(xs, why);
            return 0;
        }
    }
    r.buf.as_ref().map_or(0, |b| b.len())
}

/// Whether a reader waiting on TCP should look again: bytes buffered, the
/// leg has bytes of an open run (the reader pulls them itself, see
/// `service`), the end, back on a ring, or a failure to report.
fn rx_ready(xs: &XenSock, sw: &Switch) -> bool {
    let r = sw.rx.lock();
    r.path.reads_ring()
        || r.buf.as_ref().map(|b| !b.is_empty()).unwrap_or(false)
        || r.path.eof_at() == Some(r.path.taken())
        || (run_room(sw, &r) > 0
            && !r.data_eof
            && r.leg.as_ref().is_some_and(|l| l.sock().readable())
            && reads_leg(xs, &r))
        || (r.data_eof && leg_ended(sw, &r, false).is_err())
}

/// poll() bits of the directions on TCP: (readable, read hangup, writable, write hangup).
/// While the leg is this direction's carrier, poll takes the queued control
/// frames (never bytes, `Sink::Control`), so that readable means bytes of
/// an open run are there or the stream ended, as TCP's poll says. A
/// `RingFrom` taken here says readable once: the reader's next call moves
/// to the ring (and its interrupts wake it).
fn poll_bits(xs: &XenSock, sw: &Switch) -> (bool, bool, bool, bool) {
    let (readable, rd_hup) = {
        let mut r = sw.rx.lock();
        let mut to_ring = false;
        if r.leg.is_some() && reads_leg(xs, &r) {
            let ids = ids(xs);
            if let Err(why) = pull(xs, sw, &mut r, &ids, &mut Sink::Control) {
                drop(r);
                fail(xs, why);
                return (true, true, false, true);
            }
            to_ring = r.path.reads_ring();
        }
        let pending = r.buf.as_ref().map(|b| !b.is_empty()).unwrap_or(false);
        let eof = !r.path.reads_ring() && r.path.eof_at() == Some(r.path.taken());
        let bytes = run_room(sw, &r) > 0
            && !r.data_eof
            && r.leg.as_ref().is_some_and(|l| l.sock().readable());
        let failed = r.data_eof && leg_ended(sw, &r, false).is_err();
        (pending || eof || bytes || to_ring || failed, eof || failed)
    };
    let (writable, wr_hup) = {
        let t = sw.tx.lock();
        match t.path.state() {
            TxState::Tcp => (!t.broken && tcp_writable(&t), t.broken),
            _ => (false, false),
        }
    };
    (readable, rd_hup, writable, wr_hup)
}

/// A ring read of `n` bytes (caller holds the rx pipe's consumer). False:
/// this direction has left the ring (or TCP bytes come first): the reader
/// must not consume from it.
fn ring_read_ok(sw: &Switch) -> bool {
    let r = sw.rx.lock();
    r.path.reads_ring() && r.buf.as_ref().map(|b| b.is_empty()).unwrap_or(true)
}

/// Locks the receiving direction for one ring read (caller holds the
/// consumer of the ring of `epoch`): Some only if this direction reads that
/// very ring and no TCP bytes come first. One take of the lock for the
/// check and the count of what was taken (the ring data path's fast path:
/// ring_read_ok and a second take for the count cost a lock each per step).
fn ring_reader(sw: &Switch, epoch: u32) -> Option<RingReader<'_>> {
    let g = sw.rx.lock();
    let this_ring = match g.path.state() {
        RxState::Ring { epoch: e, .. } => e == epoch,
        _ => false,
    };
    if this_ring && g.buf.as_ref().map(|b| b.is_empty()).unwrap_or(true) {
        Some(RingReader(g))
    } else {
        None
    }
}

/// The receiving direction, held on its ring for one read.
struct RingReader<'a>(
    kernel::sync::lock::Guard<'a, RxSide, kernel::sync::lock::mutex::MutexBackend>,
);

impl ring::TakenCount for RingReader<'_> {
    /// Records `n` bytes taken off the ring; Err: the switch refuses the
    /// count (the direction has left the ring).
    fn taken(&mut self, n: usize) -> core::result::Result<(), ()> {
        self.0.path.record_ring_taken(n as u64).map_err(|_| ())
    }
}

/// Locks the sending direction for a ring write; None: it is not on the ring.
fn ring_writer(sw: &Switch) -> Option<RingWriter<'_>> {
    let g = sw.tx.lock();
    if matches!(g.path.state(), TxState::Ring { .. }) {
        Some(RingWriter(g))
    } else {
        None
    }
}

/// The sending direction, held on the ring for one write.
struct RingWriter<'a>(
    kernel::sync::lock::Guard<'a, TxSide, kernel::sync::lock::mutex::MutexBackend>,
);

impl RingWriter<'_> {
    /// The epoch of the ring it holds (Pipe::epoch names the same).
    fn epoch(&self) -> u32 {
        match self.0.path.state() {
            TxState::Ring { epoch, .. } => epoch,
            // (ring_writer hands out a guard on a ring only)
            _ => u32::MAX,
        }
    }

    fn sent(&mut self, n: usize) {
        let _ = self.0.path.record_sent(n as u64);
    }
}

// ---- the carrier --------------------------------------------------------------

/// Which carrier a step found full or empty: the waiter waits on that one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    Ring,
    Tcp,
}

/// The carrier of an inter-domain stream: each step goes to the ring or
/// to the TCP leg, whichever carries that direction now. A ring step holds
/// the direction on that very ring (`ring_writer`, `ring_reader`) for the
/// step, one take of the switch's lock: the bytes are counted before a
/// freeze can look, and the ring is named by its epoch.
pub(crate) struct Switched {
    sw: Arc<Switch>,
    /// the rings this call writes and reads, as the socket held them (a
    /// step moves on to the ring the switch came back to)
    rings: ring::Rings,
    /// where the last send step stopped for want of room
    tx_wait: On,
    /// where the last receive step found nothing
    rx_wait: On,
    /// the last send step was MSG_DONTWAIT (or on an O_NONBLOCK socket)
    nonblock: bool,
}

impl Switched {
    pub(crate) fn new(sw: Arc<Switch>, tx: Option<Arc<Pipe>>, rx: Option<Arc<Pipe>>) -> Switched {
        Switched {
            sw,
            rings: ring::Rings::new(tx, rx),
            tx_wait: On::Ring,
            rx_wait: On::Ring,
            nonblock: false,
        }
    }

    /// One send step on TCP (the direction is off its ring).
    fn send_on_tcp(
        &mut self,
        xs: &XenSock,
        msg: &mut Msg,
        left: usize,
        nonblock: bool,
    ) -> Option<Sent> {
        if xs.inner.lock().reset {
            return Some(Sent::Reset);
        }
        match send(xs, &self.sw, msg, left, !nonblock) {
            // back on a ring meanwhile: take the guard again
            Write::Ring => None,
            Write::Sent(n) => Some(Sent::Bytes(n)),
            Write::Blocked => {
                self.tx_wait = On::Tcp;
                Some(Sent::Full)
            }
            Write::Pipe => Some(Sent::Closed),
            Write::Fault => Some(Sent::Fault),
        }
    }
}

impl Carrier for Switched {
    fn send(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, nonblock: bool) -> Sent {
        self.nonblock = nonblock;
        loop {
            let Some(mut on_ring) = ring_writer(&self.sw) else {
                match self.send_on_tcp(xs, msg, left, nonblock) {
                    Some(s) => return s,
                    None => continue,
                }
            };
            // one look at the socket: reset, and, when the guard names
            // another ring than ours (the switch came back to a new one),
            // that ring (the switch replaces it under the lock the guard
            // holds)
            let (reset, newer) = {
                let i = xs.inner.lock();
                let stale = self
                    .rings
                    .tx
                    .as_ref()
                    .map_or(true, |t| on_ring.epoch() != t.epoch);
                (i.reset, stale.then(|| i.tx.clone()))
            };
            if reset {
                return Sent::Reset;
            }
            if let Some(now) = newer {
                self.rings.tx = now;
            }
            let Some(tx) = self.rings.tx.clone() else {
                return Sent::Failed(e::ENOTCONN);
            };
            // the event-channel interrupt wakes us when the peer frees space
            tx.set_owner(&xs.sk);
            if on_ring.epoch() != tx.epoch {
                // the switch replaces the ring and its epoch under one lock
                drop(on_ring);
                return Sent::Failed(SocketCore::conn_reset(
                    xs,
                    "the switch's ring is not the socket's",
                ));
            }
            let step = tx.write_msg(msg, left);
            if let Ok(Wrote::Bytes(n)) = &step {
                on_ring.sent(*n);
            }
            drop(on_ring);
            self.tx_wait = On::Ring;
            return ring::sent(xs, step);
        }
    }

    fn wait_writable(&mut self, xs: &XenSock, timeo: &mut c_long) -> core::result::Result<(), i32> {
        let sw = &self.sw;
        if self.tx_wait == On::Tcp {
            // the legs' callbacks wake the socket when the outbound leg
            // takes bytes again: nothing to ask for first
            if self.nonblock {
                return Err(e::EAGAIN);
            }
            inc(&counters::TCP_WRITE_WAITS, 1);
            let r = xs.sk.wait(timeo, || {
                let i = xs.inner.lock();
                let stop = i.reset || i.shut_wr;
                drop(i);
                stop || tx_ready(sw)
            });
            if r.is_err() {
                writer_gone(xs, sw);
            }
            return r;
        }
        match &self.rings.tx {
            // the switch leaving the ring ends the wait as well
            Some(tx) => ring::wait_for_space(xs, tx, timeo, || !sw.tx_on_ring()),
            None => Ok(()),
        }
    }

    fn recv(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, peek: bool) -> Received {
        let mut disagreed_ms = 0u32;
        loop {
            // the ring first: the read holds the switch on this very ring
            // for the step, copied straight from the ring to the user's
            // iovecs
            let step = match &self.rings.rx {
                Some(rx) => {
                    rx.set_owner(&xs.sk);
                    let sw = &self.sw;
                    rx.read_msg(msg, left, peek, |epoch| match ring_reader(sw, epoch) {
                        Some(g) => ring::Counted::By(g),
                        None => ring::Counted::Elsewhere,
                    })
                }
                None => Ok(ring::Read::OffRing),
            };
            if !matches!(step, Ok(ring::Read::OffRing)) {
                self.rx_wait = On::Ring;
                return ring::received(xs, step);
            }
            // not this ring: TCP bytes come first, or the switch reads TCP
            // or a newer ring
            match recv(xs, &self.sw, msg, left, peek) {
                Read::Ring => {
                    let Some(now) = xs.inner.lock().rx.clone() else {
                        return Received::Failed(e::ENOTCONN);
                    };
                    // The switch reads a ring and the socket holds no other
                    // than the one just refused as not the switch's: the
                    // two disagree. For a moment while a ring is being
                    // adopted; should it last, this loop would hold the CPU
                    // for good (a soft lockup after moves was read so once;
                    // docs/lab.md, Known limits). Wait a little for the
                    // adoption, then end the connection: an error on both
                    // ends, no byte lost.
                    if self.rings.rx.as_ref().is_some_and(|r| Arc::ptr_eq(r, &now)) {
                        if disagreed_ms >= RING_DISAGREEMENT_MS {
                            // what disagrees, for the log: no case of it
                            // is known
                            let (state, epoch, buffered, offered) = {
                                let r = self.sw.rx.lock();
                                let (state, epoch) = match r.path.state() {
                                    RxState::Ring { epoch, .. } => ("ring", epoch as i64),
                                    RxState::Tcp => ("tcp", -1),
                                    RxState::Offered { .. } => ("offered", -1),
                                };
                                let buffered = r.buf.as_ref().map(|b| b.len()).unwrap_or(0);
                                let offered =
                                    r.offered.as_ref().map(|p| p.epoch as i64).unwrap_or(-1);
                                (state, epoch, buffered, offered)
                            };
                            let _ = xs.conn_reset(format_args!(
                                "the switch reads a ring the socket does not hold (switch rx {} epoch {}, {} bytes buffered, offered epoch {}; socket's ring epoch {})",
                                state, epoch, buffered, offered, now.epoch
                            ));
                            return Received::Reset;
                        }
                        crate::sys::sleep_ms(1);
                        disagreed_ms += 1;
                    }
                    // a ring the switch came back to: its interrupts wake
                    // us too (`set_owner` above)
                    self.rings.rx = Some(now);
                }
                Read::Got(n) => return Received::Bytes { n, short: false },
                Read::Empty { eof } => {
                    self.rx_wait = On::Tcp;
                    return Received::Empty { eof };
                }
                Read::Fault => return Received::Fault,
                Read::Reset => return Received::Reset,
            }
        }
    }

    fn wait_readable(&mut self, xs: &XenSock, timeo: &mut c_long) -> core::result::Result<(), i32> {
        let sw = &self.sw;
        if self.rx_wait == On::Tcp {
            inc(&counters::TCP_READ_WAITS, 1);
            return xs.sk.wait(timeo, || {
                let i = xs.inner.lock();
                let stop = i.shut_rd || i.reset;
                drop(i);
                stop || rx_ready(xs, sw)
            });
        }
        match &self.rings.rx {
            // the switch leaving the ring ends the wait as well
            Some(rx) => ring::wait_for_data(xs, rx, timeo, || !ring_read_ok(sw)),
            None => Ok(()),
        }
    }

    fn readiness(&mut self, xs: &XenSock, lowat: usize) -> Readiness {
        let want = self.rings.rx_lowat(lowat);
        let (mut r, ring_bytes) =
            self.rings
                .readiness_with(xs, want, |_, n| Ok(n >= want), |free| free > 0);
        // a direction on TCP
        if self.sw.is_active() {
            let (readable, read_hup, writable, write_hup) = poll_bits(xs, &self.sw);
            if readable && (lowat <= 1 || ring_bytes + tcp_readable(xs, &self.sw) >= lowat) {
                r.readable = true;
            }
            r.read_hup |= read_hup;
            r.writable |= writable;
            r.write_hup |= write_hup;
        }
        r
    }

    fn readable_bytes(&self, xs: &XenSock) -> usize {
        // bytes taken off TCP come first
        let on_tcp = tcp_readable(xs, &self.sw);
        let on_ring = self.rings.readable_bytes(xs);
        on_tcp + on_ring
    }

    fn unsent_bytes(&self) -> usize {
        tx_unsent(&self.sw)
    }

    fn shutdown(&mut self, xs: &XenSock, read: bool, write: bool) {
        if write {
            self.sw.tx.lock().path.finish();
            if self.sw.is_active() {
                net::schedule();
            }
        }
        self.rings.shutdown(xs, read, write);
    }

    fn reset(&mut self, xs: &XenSock) {
        self.rings.reset(xs);
    }

    fn release(&mut self, xs: &XenSock, abort: bool) -> Option<Arc<Pipe>> {
        // before the struct sock can go: its TCP legs' callbacks stop
        // waking it
        disown(&self.sw);
        // its TCP legs go once what it sent is out
        closing(&self.sw, self.rings.tx.as_ref());
        leg::connection_ended();
        self.rings.release(xs, abort)
    }
}

// ---- the work item -----------------------------------------------------------

/// Sends what the outbound leg takes without blocking.
fn flush_tx(t: &mut TxSide) {
    if !t.leg_up {
        return;
    }
    let Some(leg) = t.leg.as_ref() else { return };
    while t.hello_left > 0 {
        let start = leg::HELLO_LEN - t.hello_left;
        match leg.sock().send_nb(&t.hello[start..], false) {
            Ok(n) if n > 0 => t.hello_left -= n.min(t.hello_left),
            Ok(_) => return,
            Err(x) if x == e::EAGAIN => return,
            Err(_) => {
                t.broken = true;
                return;
            }
        }
    }
    let Some(q) = t.q.as_mut() else { return };
    while !q.is_empty() {
        match leg.sock().send_nb(q.front(), false) {
            Ok(n) if n > 0 => q.consume(n),
            Ok(_) => return,
            Err(x) if x == e::EAGAIN => return,
            Err(_) => {
                t.broken = true;
                return;
            }
        }
    }
}

/// Resend copy into the queue (raw: its run's `RawFrom` went with the
/// `Consumed` that started it), then `Fin`, then a pending ring offer.
fn pump_tx(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    let Some(q) = t.q.as_mut() else { return Ok(()) };
    while t.resend_pos < t.resend_end && q.room() > 0 {
        let n = (t.resend_end - t.resend_pos).min(q.room());
        q.push(&t.resend[t.resend_pos..t.resend_pos + n]);
        t.resend_pos += n;
        t.resend_off += n as u64;
        inc(&counters::RESENT_BYTES, n as i64);
    }
    if t.resend_pos < t.resend_end {
        return Ok(());
    }
    if !t.resend.is_empty() && !matches!(t.path.state(), TxState::Frozen { .. }) {
        t.resend = KVVec::new();
        t.resend_pos = 0;
        t.resend_end = 0;
    }
    if t.path.state() != TxState::Tcp {
        return Ok(());
    }
    if t.path.is_finished() && !t.fin_sent {
        if !push_ctl(
            sw,
            &Message::Fin {
                conn_id: ids.peer_conn,
                offset: t.path.sent(),
            },
        ) {
            return Ok(());
        }
        t.fin_sent = true;
    }
    if let Some(grant) = t.offer {
        if t.path.offer_waits_for_consumed(grant.epoch) {
            return Ok(());
        }
        t.offer = None;
        take_offer(xs, sw, t, ids, &grant)?;
    }
    Ok(())
}

/// Moves the sending direction onto the ring the receiver offered.
fn take_offer(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
    grant: &RingGrant,
) -> core::result::Result<(), &'static str> {
    if t.path.is_finished() {
        // after FIN a ring is pointless: decline (the receiver keeps reading TCP)
        return Ok(());
    }
    // the link need not be up from our side yet: the mapping names the
    // peer's domain, and the pipe kicks through the link once it is
    let link = xs.inner.lock().link.clone();
    let Some(link) = link else { return Ok(()) };
    let me = crate::link::own_domid();
    let pipe = match Pipe::new_mapped(&link, me, grant, ids.peer_conn, grant.epoch) {
        Ok(p) => p,
        Err(_) => {
            pr_warn!(
                "connection {}: offered ring {} cannot be mapped; staying on TCP\n",
                ids.conn_id,
                grant.epoch
            );
            return Ok(());
        }
    };
    match t
        .path
        .on_ring_offer(grant.epoch)
        .map_err(|_| "ring offer")?
    {
        Some(m) => {
            // ends the run at m: nothing after it goes on the leg
            if !push_ctl(
                sw,
                &Message::RingFrom {
                    conn_id: ids.peer_conn,
                    epoch: grant.epoch,
                    offset: m,
                },
            ) {
                return Err("control queue full");
            }
            let old = xs.inner.lock().tx.replace(pipe);
            drop(old);
            inc(&counters::OFFERS_TAKEN, 1);
            inc(&counters::TO_RING, 1);
            sw.to_ring.fetch_add(1, Ordering::Relaxed);
            pr_info!(
                "connection {}: tx back on a ring (epoch {}) from {}\n",
                ids.conn_id,
                grant.epoch,
                m
            );
            Ok(())
        }
        None => Ok(()),
    }
}

/// Connects the outbound leg when it is wanted, and follows its connect,
/// as proto's dial says.
fn leg_tx(xs: &XenSock, t: &mut TxSide, ids: &Ids, peer_heard: bool) {
    let now = net::now_ms();
    if let Some(leg) = t.leg.as_ref().filter(|_| !t.leg_up) {
        match leg.sock().state() {
            Ok(true) => {
                t.leg_up = true;
                t.dial.connected();
                // from here the carrier's own bound (leg_unanswered):
                // TCP_USER_TIMEOUT also ends a live peer's zero window
                leg.sock().set_user_timeout(0);
                leg::leg_out();
            }
            Ok(false) => {}
            Err(_) => {
                // refused or unreachable: try again until the bound
                t.leg = None;
                t.dial.failed(now);
            }
        }
    }
    match t.dial.step(t.want_leg && !t.broken, peer_heard, now) {
        DialStep::Idle | DialStep::WaitUntil(_) => return,
        DialStep::Connect => {}
        DialStep::ConnectAgain => {
            pr_info!(
                "connection {}: leg to the peer not up yet, connecting again\n",
                ids.conn_id
            );
            t.leg = None;
            inc(&counters::LEG_RETRIES, 1);
        }
    }
    let peer = xs.inner.lock().tcp;
    let a = &peer.peer.addr;
    if peer.peer.port == 0 || a[..10].iter().any(|b| *b != 0) || a[10] != 0xff || a[11] != 0xff {
        t.broken = true;
        return;
    }
    match TcpSock::connect_start(
        [a[12], a[13], a[14], a[15]],
        peer.peer.port,
        net::peer_lost_ms() as u32,
    ) {
        Ok(s) => {
            let n = Message::TcpHello {
                conn_id: ids.peer_conn,
                cookie: peer.cookie,
            }
            .encode(&mut t.hello)
            .unwrap_or(0);
            t.hello_left = n;
            let leg = leg::HeldLeg::new(s);
            if let Some(sw) = sw_of(xs) {
                own(xs, &sw, &leg);
            }
            t.owner_writes = false;
            t.leg = Some(leg);
            t.leg_up = false;
            t.dial.connecting(now);
            inc(&counters::LEG_CONNECTS, 1);
        }
        Err(x) => {
            pr_info!(
                "connection {}: leg to the peer: error {}, retrying\n",
                ids.conn_id,
                x
            );
            t.dial.failed(now);
        }
    }
}

/// Reads the peer's control frames off our outbound leg: `Consumed` (and
/// `Reset`) are handled here, the receiving direction's are queued for it
/// (`Switch::rx_ctl`, taken under `Switch::rx` by `take_rx_ctl`).
fn read_tx_leg(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    if !t.leg_up {
        return Ok(());
    }
    loop {
        let Some(leg) = t.leg.as_ref() else {
            return Ok(());
        };
        let need = if t.ib_got < ctrl::HEADER_LEN {
            ctrl::HEADER_LEN
        } else {
            control_stream::frame_len(&t.ib[..ctrl::HEADER_LEN], ids.conn_id)
                .map_err(|_| "breach of the control stream")?
        };
        if t.ib_got < need {
            let got = t.ib_got;
            match leg.sock().recv(&mut t.ib[got..need]) {
                Ok(0) => {
                    // the peer closed its end: fine once we are done (its
                    // control frames end too: a reader still waiting for
                    // one learns none comes)
                    t.broken = true;
                    t.leg = None;
                    sw.ctl_in_closed.store(true, Ordering::Release);
                    if matches!(t.path.state(), TxState::Frozen { .. }) {
                        return Err("outbound leg closed while frozen");
                    }
                    return Ok(());
                }
                Ok(n) => t.ib_got += n,
                Err(x) if x == e::EAGAIN => return Ok(()),
                Err(_) => {
                    t.broken = true;
                    t.leg = None;
                    sw.ctl_in_closed.store(true, Ordering::Release);
                    if matches!(t.path.state(), TxState::Frozen { .. }) {
                        return Err("outbound leg failed while frozen");
                    }
                    return Ok(());
                }
            }
            continue;
        }
        let frame = t.ib;
        t.ib_got = 0;
        let for_rx = match control_stream::decode_frame(&frame[..need], ids.conn_id)
            .map_err(|_| "breach of the control stream")?
        {
            LegControl::Consumed { epoch, offset } => {
                on_consumed(xs, sw, t, ids, epoch, offset)?;
                None
            }
            LegControl::Reset => return Err("peer reset"),
            LegControl::Receiving(f) => Some(f),
        };
        if let Some(f) = for_rx {
            if sw.rx_ctl.lock().push(f).is_err() {
                return Err("control frames pile up unanswered");
            }
        }
    }
}

fn on_consumed(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
    epoch: u32,
    offset: u64,
) -> core::result::Result<(), &'static str> {
    let mut out = t
        .path
        .on_consumed(epoch, offset)
        .map_err(|_| "bad Consumed")?;
    if out == ConsumedOutcome::FreezeFirst {
        freeze_tx_locked(xs, sw, t)?;
        out = t
            .path
            .on_consumed(epoch, offset)
            .map_err(|_| "bad Consumed")?;
    }
    if let ConsumedOutcome::Resend(r) = out {
        let skip = r.skip as usize;
        let len = r.len as usize;
        if skip + len > t.resend.len() {
            return Err("resend beyond the copy");
        }
        // a run from r.from on the leg: its bytes (the resend, then the
        // application's) follow whatever of the last run is still queued
        // for the leg, in order
        if !push_ctl(
            sw,
            &Message::RawFrom {
                conn_id: ids.peer_conn,
                offset: r.from,
            },
        ) {
            return Err("control queue full");
        }
        t.resend_pos = skip;
        t.resend_end = skip + len;
        t.resend_off = r.from;
        t.fin_sent = false;
        sw.to_tcp.fetch_add(1, Ordering::Relaxed);
        inc(&counters::TO_TCP, 1);
        pr_info!(
            "connection {}: tx on TCP, resending {} bytes from {}\n",
            ids.conn_id,
            len,
            r.from
        );
    }
    Ok(())
}

/// Where the stream's bytes go as they come off the inbound leg.
enum Sink<'m> {
    /// the receive buffer (a peeking reader, FIONREAD)
    Buffer,
    /// none: control frames only (the work item, poll), which leave the
    /// bytes to the application's recvmsg
    Control,
    /// straight into the user buffers of the recvmsg being served, at
    /// most `left` bytes in all: one copy and one `tcp_recvmsg`, as TCP's
    /// own recvmsg
    User {
        msg: &'m mut Msg,
        left: usize,
        got: usize,
        fault: bool,
    },
}

/// Takes the queued control frames, then reads the inbound leg into
/// `sink`. Caller holds the rx pipe's consumer (if a ring is in use) and
/// `sw.rx`; on Err it resets the connection after releasing them (the
/// reset takes the rings' locks).
fn pull_frames(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    pull(xs, sw, r, ids, &mut Sink::Buffer)
}

fn pull(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
    sink: &mut Sink<'_>,
) -> core::result::Result<(), &'static str> {
    let res = pull_inner(xs, sw, r, ids, sink);
    if res.is_err() {
        r.leg = None;
    }
    res
}

/// How many bytes of the run the inbound leg carries may be read now:
/// up to the end of stream, and up to a `RingFrom` already here (the bytes
/// after it are not on this leg); 0 when no run is open.
fn run_room(sw: &Switch, r: &RxSide) -> u64 {
    if !r.order.run_open() || r.path.reads_ring() {
        return 0;
    }
    let taken = r.path.taken();
    let mut room = u64::MAX;
    if let Some(eof) = r.path.eof_at() {
        room = room.min(eof.saturating_sub(taken));
    }
    if let Some(end) = sw.rx_ctl.lock().run_end() {
        room = room.min(end.saturating_sub(taken));
    }
    room
}

/// The inbound leg ended (EOF, `failed`: an error) with the stream not
/// done: an error once no control frame can say otherwise (the peer's
/// `Fin` and `RingFrom` come on the other leg, and may come after).
fn leg_ended(sw: &Switch, r: &RxSide, failed: bool) -> core::result::Result<(), &'static str> {
    let done = r.path.eof_at() == Some(r.path.taken());
    if done || r.path.reads_ring() {
        return Ok(());
    }
    if failed {
        return Err("inbound leg failed");
    }
    if sw.ctl_in_closed.load(Ordering::Acquire) && sw.rx_ctl.lock().front().is_none() {
        return Err("inbound leg closed mid-stream");
    }
    Ok(())
}

fn pull_inner(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
    sink: &mut Sink<'_>,
) -> core::result::Result<(), &'static str> {
    loop {
        take_rx_ctl(xs, sw, r, ids)?;
        own_inbound(xs, sw, r);
        if r.data_eof {
            return leg_ended(sw, r, false);
        }
        let room = usize::try_from(run_room(sw, r)).unwrap_or(usize::MAX);
        if room == 0 {
            return Ok(());
        }
        let Some(leg) = r.leg.as_ref() else {
            return Ok(());
        };
        // an empty leg is seen without a call: a reader that caught up
        // with the stream made one more that said EAGAIN per recvmsg
        if !leg.sock().readable() {
            return Ok(());
        }
        let res = match sink {
            Sink::User { msg, left, got, .. } => {
                let want = room.min(*left - *got);
                if want == 0 {
                    return Ok(());
                }
                leg.sock().recv_to_user(msg, want).inspect(|n| *got += n)
            }
            Sink::Buffer => {
                let Some(b) = r.buf.as_mut() else {
                    return Ok(());
                };
                let tail = b.tail_room();
                let want = room.min(tail.len());
                if want == 0 {
                    // full: the leg waits (TCP's window closes) until the reader takes some
                    return Ok(());
                }
                leg.sock().recv(&mut tail[..want]).inspect(|n| b.commit(*n))
            }
            Sink::Control => return Ok(()),
        };
        match res {
            Ok(0) => r.data_eof = true,
            Ok(n) => {
                let taken = r.path.taken();
                r.path
                    .on_data(taken, n as u64)
                    .map_err(|_| "stream bytes past their end")?;
            }
            Err(x) if x == e::EAGAIN => return Ok(()),
            Err(x) if x == e::EFAULT => {
                // the user's buffer, not the leg: the bytes stay queued
                if let Sink::User { fault, .. } = sink {
                    *fault = true;
                }
                return Ok(());
            }
            Err(_) => {
                r.data_eof = true;
                return leg_ended(sw, r, true);
            }
        }
    }
}

/// Takes the receiving direction's control frames (`Switch::rx_ctl`) in
/// order, as far as they can be taken now: as on one ordered stream, a
/// `RingFrom` waits until every byte before it was read off the leg, and
/// what follows it waits with it. Caller holds `sw.rx` (and the rx pipe's
/// consumer, if a ring is in use).
fn take_rx_ctl(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    loop {
        let Some(f) = sw.rx_ctl.lock().front() else {
            return Ok(());
        };
        let was_ring = matches!(r.path.state(), RxState::Ring { .. });
        // a TxFreeze: we keep what we took, the sender resends the rest
        let Some(taken) = r.order.take(&mut r.path, f).map_err(|e| e.what())? else {
            return Ok(());
        };
        match taken {
            RxControlTaken::Run | RxControlTaken::Fin => {}
            RxControlTaken::RingFrom {
                epoch,
                offset,
                outcome,
            } => {
                if outcome == RingFromOutcome::Switch {
                    let Some(p) = r.offered.take() else {
                        return Err("RingFrom without a ring");
                    };
                    let old = xs.inner.lock().rx.replace(p);
                    drop(old);
                    if let Some(l) = r.offered_via.take() {
                        // only the domain the ring was granted to could
                        // have mapped it, and only the peer writes on our
                        // outbound leg's way back
                        pr_info!("connection {}: dom{} proved to be the peer (switched onto the ring granted to it)\n", ids.conn_id, l.peer);
                        r.adopt = Some(l);
                        net::schedule();
                    }
                    sw.to_ring.fetch_add(1, Ordering::Relaxed);
                    inc(&counters::TO_RING, 1);
                    pr_info!(
                        "connection {}: rx back on a ring (epoch {}) from {}\n",
                        ids.conn_id,
                        epoch,
                        offset
                    );
                }
            }
            RxControlTaken::TxFreeze {
                epoch,
                offset,
                consumed,
            } => {
                r.clock.saw_freeze(epoch);
                if let Some(n) = consumed {
                    if !push_ctl(
                        sw,
                        &Message::Consumed {
                            conn_id: ids.peer_conn,
                            epoch: n.epoch,
                            offset: n.offset,
                        },
                    ) {
                        return Err("control queue full");
                    }
                    if was_ring {
                        sw.to_tcp.fetch_add(1, Ordering::Relaxed);
                        inc(&counters::TO_TCP, 1);
                        // no one reads that ring again (the caller holds its consumer)
                        let old = xs.inner.lock().rx.take();
                        drop(old);
                    }
                    if !matches!(r.path.state(), RxState::Offered { .. }) {
                        let dead = r.offered.take();
                        drop(dead);
                    }
                    pr_info!(
                        "connection {}: rx: sender froze ring {} at {}; on TCP from {}\n",
                        ids.conn_id,
                        epoch,
                        offset,
                        n.offset
                    );
                }
            }
        }
        sw.rx_ctl.lock().pop();
    }
}

/// Sends our queued control frames on the inbound leg (caller holds
/// `sw.rx`, which holds the leg).
fn flush_ctl(sw: &Switch, r: &mut RxSide) {
    let Some(leg) = r.leg.as_ref() else { return };
    let mut q = sw.ctl.lock();
    let Some(q) = q.as_mut() else { return };
    while !q.is_empty() {
        match leg.sock().send_nb(q.front(), false) {
            Ok(n) if n > 0 => q.consume(n),
            Ok(_) => return,
            Err(x) if x == e::EAGAIN => return,
            Err(_) => {
                // the leg is gone (the peer closed it): nothing queued
                // here can reach the peer any more, and a close must not
                // wait for it (`service`'s tx_done)
                let n = q.len();
                q.consume(n);
                return;
            }
        }
    }
}

/// The work item's pass over one active connection. Returns false once
/// it is done with it (closed and flushed, or reset).
pub(crate) fn service(xs: &Arc<XenSock>, heard: &[[u8; 4]]) -> bool {
    let Some(sw) = sw_of(xs) else { return false };
    let ids = ids(xs);
    // the peer's address answered on some leg since the last pass
    let peer_heard = !heard.is_empty() && peer_ip(xs).is_some_and(|ip| heard.contains(&ip));
    let (reset, state) = {
        let i = xs.inner.lock();
        (i.reset, i.state)
    };
    let now = net::now_ms();
    if reset {
        release_legs(&sw);
        return false;
    }
    let closed = sw.closed.load(Ordering::Acquire) || state != SockState::Connected;
    adopt_proven(xs, &sw);
    // sending direction
    let tx_err = {
        let mut t = sw.tx.lock();
        leg_tx(xs, &mut t, &ids, peer_heard);
        let r = read_tx_leg(xs, &sw, &mut t, &ids).and_then(|_| loop {
            let before = t.resend_pos;
            pump_tx(xs, &sw, &mut t, &ids)?;
            flush_tx(&mut t);
            // a resend bigger than the queue goes on while the leg takes
            // it: a leg that drains the queue without filling up raises no
            // write_space, and the rest waited for the next tick (256 KiB
            // per 100 ms while the link was down, forever without ticks)
            if t.resend_pos == before || t.resend_pos >= t.resend_end || t.broken {
                break Ok(());
            }
        });
        flush_tx(&mut t);
        own_outbound(xs, &sw, &mut t);
        r
    };
    if let Err(why) = tx_err {
        fail(xs, why);
        release_legs(&sw);
        return false;
    }
    // receiving direction (the ring's consumer first, see the lock order)
    {
        let pipe = xs.inner.lock().rx.clone();
        let c = pipe.as_ref().map(|p| p.rx.lock());
        let mut r = sw.rx.lock();
        // a ring put in by a reader's own pull in between: next pass. On
        // TCP the application's recvmsg pulls for itself, one copy straight
        // into its buffers (the leg's callbacks wake it, poll says readable
        // when the leg is); the work item pulled into the buffer and the
        // reader copied it out again, preempted by it 5-6 times per MiB.
        // Bytes the application does not read wait in the leg, as in a
        // TCP socket; the control frames
        // (which come on the other leg) are taken here.
        let res = if closed || !same_pipe(&xs.inner.lock().rx, &pipe) {
            Ok(())
        } else {
            pull(xs, &sw, &mut r, &ids, &mut Sink::Control)
        };
        own_inbound(xs, &sw, &mut r);
        flush_ctl(&sw, &mut r);
        drop(r);
        drop(c);
        if let Err(why) = res {
            fail(xs, why);
        }
    }
    if xs.inner.lock().reset {
        release_legs(&sw);
        wake(
            xs,
            POLLIN | POLLOUT | POLLERR | POLLHUP | POLLRDNORM | POLLWRNORM,
        );
        return false;
    }
    kick_if_heard(&sw, peer_heard);
    // a leg unanswered at every look for the bound: the peer died (or is
    // away for longer than peer_lost_ms) with the legs up
    let (holds, unanswered) = leg_unanswered(&sw, now);
    if unanswered.is_some_and(|ms| ms >= net::peer_lost_ms()) {
        inc(&counters::PEER_LOST, 1);
        if !closed {
            fail(xs, "peer lost: a leg unanswered for peer_lost_ms");
        }
        release_legs(&sw);
        return false;
    }
    if holds {
        net::live_after_ms(LIVE_TICK_MS);
    }
    // both legs up: the bound stops (leg_unanswered covers the rest)
    let (out_up, tx_done, connecting) = {
        let t = sw.tx.lock();
        let on_ring = matches!(t.path.state(), TxState::Ring { .. });
        // off the ring, a broken outbound leg (never made again, leg_tx)
        // leaves a closed connection nothing to send: it held the socket
        // until peer_lost_ms when the peer closed first and let go of the
        // leg before our Fin (three in four rounds)
        // (our control frames too: the Fin or RingFrom that ends the stream
        // on TCP goes on the inbound leg, which release_legs closes)
        let done = (t.broken && !on_ring)
            || (t.q.as_ref().map(|q| q.is_empty()).unwrap_or(true)
                && t.hello_left == 0
                && t.resend_pos >= t.resend_end
                && (t.fin_sent || (on_ring && ring_all_taken(xs, &t)))
                && ctl_flushed(&sw));
        let connecting = !t.leg_up && t.want_leg && !t.broken;
        (t.leg_up, done, connecting)
    };
    let in_up = sw.rx.lock().leg.is_some();
    if !closed && out_up && in_up {
        sw.deadline.store(0, Ordering::Release);
    }
    if closed && tx_done {
        release_legs(&sw);
        return false;
    }
    let d = sw.deadline.load(Ordering::Acquire);
    if d != 0 && now > d {
        if closed {
            release_legs(&sw);
            return false;
        }
        inc(&counters::PEER_LOST, 1);
        fail(xs, "peer lost: legs not up within peer_lost_ms");
        release_legs(&sw);
        return false;
    }
    let waits = !closed && maybe_offer(xs, &sw, &ids, now);
    if d != 0 || connecting || waits {
        net::tick_after_ms(TICK_MS);
    }
    wake(xs, POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM | POLLRDHUP);
    true
}

/// Whether the receiver took every byte written into the ring this
/// direction is on (caller holds `Switch::tx`, which comes before the
/// pipe's producer). A closed connection keeps its legs until then: the
/// receiver may still abandon the ring it offered (an offer it thought
/// unanswered, behind a TCP retransmission), and its `Consumed` then makes
/// us resend the ring's bytes on TCP (seen: the sender
/// closed on a ring the receiver had abandoned, its legs went with the
/// close, and the receiver reset without the stream's last 131072 bytes).
fn ring_all_taken(xs: &XenSock, t: &TxSide) -> bool {
    let pipe = xs.inner.lock().tx.clone().or_else(|| t.closed_ring.clone());
    let Some(p) = pipe else { return true };
    let mut prod = p.tx.lock();
    // a reader that closed or reset takes nothing more: nothing to wait for
    let gone = prod
        .reader_end()
        .map(|r| r.closed || r.reset)
        .unwrap_or(true);
    gone || matches!(prod.unconsumed(), Ok(0))
}

/// The IPv4 address of the peer's end of the legs, if it has one.
fn peer_ip(xs: &XenSock) -> Option<[u8; 4]> {
    let a = xs.inner.lock().tcp.peer.addr;
    let v4 = a[..10].iter().all(|b| *b == 0) && a[10] == 0xff && a[11] == 0xff;
    v4.then(|| [a[12], a[13], a[14], a[15]])
}

/// Whether a segment arrived on either leg of `xs`'s connection since the
/// TCP work item last looked (a leg put in since counts too): its peer's
/// address, which is reachable then. The work item asks every active
/// connection before its pass and hands the addresses to `service`.
pub(crate) fn heard_from(xs: &XenSock) -> Option<[u8; 4]> {
    let sw = sw_of(xs)?;
    let inbound = sw
        .rx
        .lock()
        .leg
        .as_ref()
        .map(|l| l.sock().segs_in())
        .unwrap_or(0);
    let mut t = sw.tx.lock();
    let heard = inbound.wrapping_add(t.leg.as_ref().map(|l| l.sock().segs_in()).unwrap_or(0));
    if heard == t.heard {
        return None;
    }
    t.heard = heard;
    drop(t);
    peer_ip(xs)
}

/// After a save, the peer's bytes sent to us while we were away, and ours
/// to a peer that was away, come with the sender's next TCP retransmission,
/// backed off by then (1, 3, 7, 15, 31 s ...): the pause after a restore
/// could last about as long again as the suspension (docs/migration.md,
/// "Around a save"). Once the peer's address is heard from again, on a leg
/// of this connection or of any other (`heard_from`), a backed-off
/// retransmission on either leg fires now (sys_net kick_retransmit): the
/// outbound one carries our data and `TxFreeze`, the inbound one our
/// `Consumed`. A connection whose frames all went out before the save
/// hears nothing on its own legs, and its `TxFreeze` (or the peer's
/// `Consumed`) waited out the back-off while its sibling streamed
/// (7 s after the restore). Evidence of
/// reception only: a kick into a path still down would double the back-off
/// again.
fn kick_if_heard(sw: &Switch, peer_heard: bool) {
    if !peer_heard {
        return;
    }
    let mut kicked = 0;
    {
        let t = sw.tx.lock();
        if let (true, Some(leg)) = (t.leg_up, t.leg.as_ref()) {
            kicked += i64::from(leg.sock().kick_retransmit());
        }
    }
    if let Some(leg) = sw.rx.lock().leg.as_ref() {
        kicked += i64::from(leg.sock().kick_retransmit());
    }
    if kicked > 0 {
        inc(&counters::LEG_KICKS, kicked);
    }
}

/// Looks at both legs (`TcpSock::waits`) at `now`: whether either holds
/// bytes its peer has not acknowledged, and for how long (ms) either has
/// been unanswered at every look without a break. A live peer answers a
/// retransmission or probe within a round trip, so one look that finds it
/// answered starts the count over.
fn leg_unanswered(sw: &Switch, now: u64) -> (bool, Option<u64>) {
    fn look(leg: Option<&leg::HeldLeg>, since: &mut u64, now: u64) -> (bool, Option<u64>) {
        match leg.and_then(|l| l.sock().waits()) {
            Some(true) => {
                if *since == 0 {
                    *since = now.max(1);
                }
                (true, Some(now.saturating_sub(*since)))
            }
            w => {
                *since = 0;
                (w.is_some(), None)
            }
        }
    }
    let (th, tu) = {
        let mut t = sw.tx.lock();
        let t = &mut *t;
        let leg = if t.leg_up { t.leg.as_ref() } else { None };
        look(leg, &mut t.unanswered_since, now)
    };
    let (rh, ru) = {
        let mut r = sw.rx.lock();
        let r = &mut *r;
        look(r.leg.as_ref(), &mut r.unanswered_since, now)
    };
    (th || rh, tu.max(ru))
}

fn release_legs(sw: &Switch) {
    let (a, b, ring) = {
        let mut t = sw.tx.lock();
        t.leg_up = false;
        let a = t.leg.take();
        let ring = t.closed_ring.take();
        let mut r = sw.rx.lock();
        (a, r.leg.take(), ring)
    };
    drop((a, b, ring));
}

/// Offers a new receive ring when the link to the peer is up and this
/// direction is on TCP, and gives an unanswered offer up, as proto's offer
/// clock says (`proto::offer`). Returns whether it waits for time to pass
/// (the work item then ticks).
fn maybe_offer(xs: &XenSock, sw: &Switch, ids: &Ids, now: u64) -> bool {
    let own = xs.inner.lock().link.clone().filter(|l| l.is_up());
    // without the peer's link: a domain that may be the peer, moved
    // (`on_candidate_offer`)
    let candidate = || {
        sw.tx
            .lock()
            .candidate
            .as_ref()
            .map(|(l, _)| l.clone())
            .filter(|l| l.is_up())
    };
    let (link, via) = match own {
        Some(l) => (l, None),
        None => match candidate() {
            Some(l) => (l.clone(), Some(l)),
            // nothing to offer on: the link's coming up schedules the work
            // item (link_up). Ticking every 100 ms here woke a connection
            // on TCP ten times a second for as long as its peer stayed away
            // (30-40 passes per bench round, each waking the socket's
            // waiters)
            None => return false,
        },
    };
    let mut r = sw.rx.lock();
    let leg_up = r.leg.is_some();
    match r.clock.step(&r.path, true, leg_up, now) {
        OfferStep::Idle => false,
        OfferStep::WaitUntil(_) => true,
        OfferStep::Abandon => {
            abandon_offer(sw, ids, r, "unanswered");
            true
        }
        OfferStep::Offer => {
            let mut probe = r.path.clone();
            let Ok(epoch) = probe.offer_ring() else {
                return false;
            };
            let me = crate::link::own_domid();
            let Ok((pipe, grant)) = Pipe::new_granted(&link, me, ids.conn_id, sw.rx_cap, epoch)
            else {
                return true;
            };
            r.path = probe;
            r.offered = Some(pipe);
            r.offered_via = via;
            r.clock.offered(now);
            drop(r);
            match link.send(&Message::RingOffer {
                conn_id: ids.peer_conn,
                rx: grant,
            }) {
                Ok(()) => {
                    inc(&counters::OFFERS_SENT, 1);
                    pr_info!(
                        "connection {}: offered ring {} to the peer\n",
                        ids.conn_id,
                        grant.epoch
                    );
                }
                // not sent: abandoned as a move would (Consumed says so);
                // a candidate stays one (the link failed, not the domain)
                Err(_) => {
                    let mut r = sw.rx.lock();
                    r.offered_via = None;
                    abandon_offer(sw, ids, r, "not sent");
                }
            }
            true
        }
    }
}

/// Gives the outstanding offer up: its `Consumed` declares the epoch dead,
/// the ring goes, and a candidate it went to that never answered is not
/// the peer (its offer, kept, would block the peer's).
fn abandon_offer(sw: &Switch, ids: &Ids, mut r: RxGuard<'_>, why: &str) {
    if !matches!(r.path.state(), RxState::Offered { .. }) {
        return;
    }
    if let Some(n) = r.path.freeze_local() {
        let _ = push_ctl(
            sw,
            &Message::Consumed {
                conn_id: ids.peer_conn,
                epoch: n.epoch,
                offset: n.offset,
            },
        );
        pr_info!(
            "connection {}: offer of ring {} {}, abandoned\n",
            ids.conn_id,
            n.epoch,
            why
        );
    }
    r.clock.settled();
    let dead = r.offered.take();
    let via = r.offered_via.take();
    drop(r);
    drop(dead);
    let Some(l) = via else { return };
    let mut t = sw.tx.lock();
    if t.candidate
        .as_ref()
        .is_some_and(|(c, _)| Arc::ptr_eq(c, &l))
    {
        pr_info!(
            "connection {}: dom{} did not prove to be the peer; its offer is dropped\n",
            ids.conn_id,
            l.peer
        );
        let dead = t.candidate.take();
        drop(t);
        drop(dead);
    }
}

/// The TCP work item (the legs' socket callbacks, deadlines): legs that
/// authenticated go to their connections' switches, then every active
/// switch is serviced.
pub(crate) fn work() {
    let t0 = net::now_ms();
    counters::TCP_WORK_PASSES.fetch_add(1, Ordering::Relaxed);
    work_pass();
    // a pass that blocks holds up every leg's frames and every wake of a
    // socket on TCP (an epoll reader waits for those): shown in the stats
    crate::sys::counters::note_work_ms(&crate::sys::counters::TCP_WORK_MAX_MS, net::now_ms() - t0);
}

fn work_pass() {
    // outside the legs' lock: the switch takes its own locks
    for (xs, sock) in leg::take_authenticated().into_iter() {
        // no TCP_USER_TIMEOUT on an established leg: leg_unanswered
        if attach_inbound(&xs, leg::HeldLeg::new(sock)).is_err() {
            // a second leg for one connection, or no switch: closed
            leg::refused();
        }
    }
    let active = leg::active_snapshot();
    // peers' addresses that answered on some leg since the last pass: every
    // connection to them kicks its backed-off legs (kick_if_heard)
    let mut heard: KVec<[u8; 4]> = KVec::new();
    for xs in active.iter() {
        if let Some(ip) = heard_from(xs) {
            if !heard.contains(&ip) {
                let _ = heard.push(ip, GFP_KERNEL);
            }
        }
    }
    let mut done: KVec<Arc<XenSock>> = KVec::new();
    for xs in active.iter() {
        if !service(xs, &heard) {
            let _ = done.push(xs.clone(), GFP_KERNEL);
        }
    }
    if !active.is_empty() {
        // connections on TCP wait for their link: do not rely on watches alone
        crate::link::poll_down_links::<XenSock>();
    }
    leg::retire(&done);
}

/// Test trigger (hostile_test=1, setsockopt XENSOCK_TEST_OPEN_LEG): open
/// this connection's outbound leg (the switch connects it and sends
/// `TcpHello{peer's conn id, cookie}`; the peer connects its own in turn);
/// `wrong_cookie` instead sends, on a separate socket, a hello whose cookie
/// differs in one bit (the peer must refuse and count it). Process context
/// (that connect blocks).
pub(crate) fn test_open_leg(
    xs: &Arc<XenSock>,
    wrong_cookie: bool,
) -> core::result::Result<(), i32> {
    use crate::sys::errno as e;
    let (st, peer_conn, t) = {
        let i = xs.inner.lock();
        (i.state, i.peer_conn, i.tcp)
    };
    if st != SockState::Connected || xs.inner.lock().link.is_none() {
        return Err(e::ENOTCONN);
    }
    let a = &t.peer.addr;
    if t.peer.port == 0 || a[..10].iter().any(|b| *b != 0) || a[10] != 0xff || a[11] != 0xff {
        return Err(e::ENETUNREACH);
    }
    if !wrong_cookie {
        return open_leg(xs);
    }
    let sock = TcpSock::connect([a[12], a[13], a[14], a[15]], t.peer.port)?;
    let mut b = [0u8; leg::HELLO_LEN];
    let n = Message::TcpHello {
        conn_id: peer_conn,
        cookie: t.cookie ^ 1,
    }
    .encode(&mut b)
    .map_err(|_| e::EINVAL)?;
    sock.send_all(&b[..n])?;
    leg::leg_out();
    Ok(())
}

/// /proc/net/af_xen_stats lines of the switch: its moves, the offers from
/// a moved peer's new domain, the work items and the waits on TCP, and
/// the application's calls on TCP and theirs into the legs.
pub(crate) fn stats(seq: &mut crate::sys::Seq) {
    use counters::*;
    use net::leg_calls;
    let g = |c: &AtomicI64| c.load(Ordering::Relaxed);
    seq.counters(&[
        ("switch_triggers", g(&TRIGGERS)),
        ("switch_to_tcp", g(&TO_TCP)),
        ("switch_to_ring", g(&TO_RING)),
        ("switch_offers_sent", g(&OFFERS_SENT)),
        ("switch_offers_taken", g(&OFFERS_TAKEN)),
        ("switch_peer_lost", g(&PEER_LOST)),
        ("switch_resent_bytes", g(&RESENT_BYTES)),
        ("switch_leg_connects", g(&LEG_CONNECTS)),
        ("switch_leg_retries", g(&LEG_RETRIES)),
        ("switch_peer_candidates", g(&CANDIDATES)),
        ("switch_peers_proved", g(&PEERS_PROVED)),
        ("switch_peers_followed", g(&PEERS_FOLLOWED)),
        ("switch_leg_kicks", g(&LEG_KICKS)),
        ("tcp_work_max_ms", g(&crate::sys::counters::TCP_WORK_MAX_MS)),
        (
            "link_work_max_ms",
            g(&crate::sys::counters::LINK_WORK_MAX_MS),
        ),
        ("tcp_work_passes", g(&TCP_WORK_PASSES)),
        ("tcp_read_waits", g(&TCP_READ_WAITS)),
        ("tcp_write_waits", g(&TCP_WRITE_WAITS)),
        ("tcp_tx_direct_bytes", g(&TX_DIRECT_BYTES)),
        ("tcp_tx_queued_bytes", g(&TX_QUEUED_BYTES)),
        ("tcp_send_steps", g(&SEND_STEPS)),
        ("tcp_recv_steps", g(&RECV_STEPS)),
        ("tcp_leg_sends", leg_calls::get(&leg_calls::SENDS)),
        ("tcp_leg_recvs", leg_calls::get(&leg_calls::RECVS)),
        ("tcp_nospace_armed", leg_calls::nospace_armed()),
    ]);
}

/// /proc/net/af_xen_tcp's lines of one connection on a switch: what each
/// direction's carrier holds and what its leg's socket says (a stream
/// that stands still shows who waits for what; bench's stall_watch).
pub(crate) fn tcp_show(conn: u32, sw: &Switch, seq: &mut crate::sys::Seq) {
    use core::fmt::Write;
    let leg = |l: Option<&leg::HeldLeg>| l.map(|l| l.sock().info());
    let mut l = crate::sys::Line::new();
    {
        let t = sw.tx.lock();
        let state = match t.path.state() {
            TxState::Ring { .. } => "ring",
            TxState::Frozen { .. } => "frozen",
            TxState::Tcp => "tcp",
        };
        let _ = write!(
            l,
            "{conn} tx {state} sent {} queued {} up {} hello {} broken {} resend {} offer {} waits {} owner_writes {}",
            t.path.sent(),
            t.q.as_ref().map(|q| q.len()).unwrap_or(0),
            t.leg_up as u8,
            t.hello_left,
            t.broken as u8,
            t.resend_end - t.resend_pos.min(t.resend_end),
            t.offer.is_some() as u8,
            t.writer_waits as u8,
            t.owner_writes as u8
        );
        let _ = match leg(t.leg.as_ref()) {
            Some(i) => writeln!(
                l,
                " leg unacked {} wmem {} sndbuf {} nospace {} writeable {} unread {} owner {}",
                i[0], i[1], i[2], i[3], i[4], i[5], i[6]
            ),
            None => writeln!(l, " leg -"),
        };
    }
    seq.write(l.bytes());
    let mut l = crate::sys::Line::new();
    {
        let r = sw.rx.lock();
        let state = match r.path.state() {
            RxState::Ring { .. } => "ring",
            RxState::Tcp => "tcp",
            RxState::Offered { .. } => "offered",
        };
        let _ = write!(
            l,
            "{conn} rx {state} taken {} buffered {} run {} join {} eof_leg {} control_queued {} control_out {} owner_pulls {}",
            r.path.taken(),
            r.buf.as_ref().map(|b| b.len()).unwrap_or(0),
            r.order.run_open() as u8,
            r.order.join_at().map(|j| j as i64).unwrap_or(-1),
            r.data_eof as u8,
            sw.rx_ctl.lock().len(),
            sw.ctl.lock().as_ref().map(|q| q.len()).unwrap_or(0),
            r.owner_pulls.map(|p| p as i8).unwrap_or(-1)
        );
        let _ = match leg(r.leg.as_ref()) {
            Some(i) => writeln!(l, " leg unacked {} unread {} owner {}", i[0], i[5], i[6]),
            None => writeln!(l, " leg -"),
        };
    }
    seq.write(l.bytes());
}
