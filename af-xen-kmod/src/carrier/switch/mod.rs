// SPDX-License-Identifier: GPL-2.0
//! The migration switch of an inter-domain stream connection
//! (docs/migration.md, "Kernel switch"): every decision is proto's
//! `TxPath`/`RxPath`; these files move the bytes and frames.
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
use crate::carrier::rings;
use crate::carrier::{leg, Link, SocketCore, XenSock};
use crate::carrier::{Carrier, Readiness, Received, Sent};
use crate::proto::control_stream::{self, LegControl};
use crate::proto::ctrl::{self, Message, RingGrant};
use crate::proto::dial::{Dial, DialStep};
use crate::proto::liveness::{self, Unanswered};
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

mod app;
mod fifo;
mod freeze;
mod offers;
mod owners;
mod proc;
mod rx_leg;
mod switched;
#[cfg(afx_test_hooks)]
mod test_leg;
mod tx_leg;
mod work;

use app::*;
use fifo::*;
use rx_leg::*;
use tx_leg::*;

pub(crate) use freeze::*;
pub(crate) use offers::*;
pub(crate) use owners::*;
pub(crate) use proc::*;
pub(crate) use switched::*;
#[cfg(afx_test_hooks)]
pub(crate) use test_leg::*;
pub(crate) use work::*;

/// Stream bytes waiting for the outbound leg (a resend, or writes before
/// the leg is up).
const TXQ_BYTES: usize = 256 * 1024;

/// Stream bytes taken off TCP that the application has not read yet.
const RXBUF_BYTES: usize = 256 * 1024;

/// Our control frames waiting for the inbound leg.
const CTLQ_BYTES: usize = 4096;

/// How often the work item looks again while legs connect or a bound runs.
const TICK_MS: u32 = 100;

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
    /// how long the outbound leg has been unanswered (proto's liveness clock, `leg_unanswered`)
    unanswered: Unanswered,
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
    /// as `TxSide::unanswered`, for the inbound leg
    unanswered: Unanswered,
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
                    unanswered: Unanswered::new(),
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
                    unanswered: Unanswered::new(),
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
