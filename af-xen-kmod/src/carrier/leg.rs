// SPDX-License-Identifier: GPL-2.0
//! The TCP carrier's first half (docs/migration.md, "Kernel TCP carrier"):
//! one TCP leg listener per module, its endpoint and a random cookie per
//! connection in `ConnectRequest`/`ConnectAccept`, and legs authenticated
//! by their first frame, `TcpHello{conn_id, cookie}`, the same wire as
//! libxensock's `LegListener`. An authenticated leg goes to its
//! connection's switch (`switch::work`, the TCP work item, which also
//! services every active switch).

use super::{SocketCore, XenSock};
use crate::proto::ctrl::{self, Channel, TcpEndpoint};
use crate::proto::leg::{admit, Admission, Refusal, HELLO_TIMEOUT_MS};
use crate::sys::net::{self, TcpSock};
use core::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use kernel::new_mutex;
use kernel::prelude::*;
use kernel::sync::{Arc, Mutex};

/// Bytes of a `TcpHello` frame (header + cookie).
pub(crate) use ctrl::HELLO_LEN;
/// Unauthenticated legs held at once; more are closed at once.
const MAX_PENDING: usize = 64;
/// How often a parked leg (complete hello, connection not known yet) is
/// decided again before its deadline.
const PARKED_RECHECK_MS: u64 = 50;

/// What travels with each stream connection for its TCP carrier.
#[derive(Clone, Copy)]
pub(crate) struct ConnTcp {
    /// 64 random bits made by the requester, echoed by the acceptor; the
    /// first frame of every leg of this connection must carry it.
    pub(crate) cookie: u64,
    /// Where the peer's leg listener is (from its ConnectRequest/Accept).
    pub(crate) peer: TcpEndpoint,
}

impl Default for ConnTcp {
    fn default() -> Self {
        ConnTcp {
            cookie: 0,
            peer: TcpEndpoint::NONE,
        }
    }
}

/// Counters for /proc/net/af_xen_stats.
mod counters {
    use super::AtomicI64;
    pub(super) static LEGS_IN: AtomicI64 = AtomicI64::new(0);
    pub(super) static LEGS_OUT: AtomicI64 = AtomicI64::new(0);
    pub(super) static BAD_COOKIE: AtomicI64 = AtomicI64::new(0);
    pub(super) static UNKNOWN_CONN: AtomicI64 = AtomicI64::new(0);
    pub(super) static MALFORMED: AtomicI64 = AtomicI64::new(0);
    pub(super) static DROPPED: AtomicI64 = AtomicI64::new(0);
    pub(super) static TIMED_OUT: AtomicI64 = AtomicI64::new(0);
    pub(super) static HELD: AtomicI64 = AtomicI64::new(0);
}
use counters::*;

fn inc(c: &AtomicI64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A leg whose hello has not fully arrived.
struct Pending {
    sock: TcpSock,
    hello: [u8; HELLO_LEN],
    got: usize,
    deadline_ms: u64,
}

/// A connection's leg (inbound or outbound), counted in `tcp_legs_held`
/// while it lives.
pub(crate) struct HeldLeg(TcpSock);

impl HeldLeg {
    pub(crate) fn new(s: TcpSock) -> HeldLeg {
        HELD.fetch_add(1, Ordering::Relaxed);
        HeldLeg(s)
    }
    pub(crate) fn sock(&self) -> &TcpSock {
        &self.0
    }
}

impl Drop for HeldLeg {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Legs {
    listener: Option<TcpSock>,
    pending: KVec<Pending>,
    /// connections whose switch is active: the TCP work item
    /// (`switch::work`) services them
    active: KVec<Arc<XenSock>>,
}

static STATE: crate::sys::Published<Mutex<Legs>> = crate::sys::Published::new();
/// The listener is up (read without the state's lock).
static LISTENING: AtomicBool = AtomicBool::new(false);

fn state() -> Option<&'static Mutex<Legs>> {
    // published by start(), taken back by the LegService's drop after the
    // work item was flushed
    STATE.get()
}

/// The TCP leg listener and the legs, while the module object holds this.
pub(crate) struct LegService(());

/// Module init: listens on `tcp_port` (0: no TCP carrier). A listener
/// that cannot be made is logged and leaves connections without a TCP
/// endpoint.
pub(crate) fn start() -> Result<LegService> {
    let port = net::tcp_port();
    let listener = if port == 0 {
        None
    } else {
        match TcpSock::listen(port) {
            Ok(l) => Some(l),
            Err(x) => {
                pr_warn!(
                    "TCP leg listener on port {}: error {}; no TCP carrier\n",
                    port,
                    x
                );
                None
            }
        }
    };
    let has = listener.is_some();
    let b = KBox::pin_init(
        new_mutex!(
            Legs {
                listener,
                pending: KVec::new(),
                active: KVec::new()
            },
            "af_xen_tcp"
        ),
        GFP_KERNEL,
    )?;
    STATE.publish(b).map_err(|_| EBUSY)?;
    LISTENING.store(has, Ordering::Release);
    if has {
        pr_info!("TCP leg listener on port {}\n", port);
        // connections that arrived before the state was published
        net::schedule();
    }
    Ok(LegService(()))
}

impl Drop for LegService {
    /// Module exit (no socket of ours is left): release every leg and the
    /// listener (our callbacks go with them), flush the work, unpublish.
    fn drop(&mut self) {
        LISTENING.store(false, Ordering::Release);
        if let Some(legs) = state() {
            let mut g = legs.lock();
            g.listener = None;
            g.pending = KVec::new();
            g.active = KVec::new();
        }
        net::flush();
        drop(STATE.unpublish());
    }
}

/// Our endpoint for ConnectRequest/ConnectAccept (IPv4-mapped), or NONE.
pub(crate) fn local_endpoint() -> TcpEndpoint {
    // no lock: the link work calls this holding its link's lock
    match (LISTENING.load(Ordering::Acquire), net::local_ipv4()) {
        (true, Some(a)) => {
            let mut addr = [0u8; 16];
            addr[10] = 0xff;
            addr[11] = 0xff;
            addr[12..].copy_from_slice(&a);
            TcpEndpoint {
                addr,
                port: net::tcp_port(),
            }
        }
        _ => TcpEndpoint::NONE,
    }
}

/// A fresh cookie for a connection we request.
pub(crate) fn new_cookie() -> u64 {
    net::random_u64()
}

/// proto's admission step for a complete hello: the connection it names
/// when accepted, `None` to park it, or the counter of its refusal.
fn check_hello(
    hello: &[u8],
    deadline_ms: u64,
) -> Option<core::result::Result<Arc<XenSock>, &'static AtomicI64>> {
    let mut found = None;
    let verdict = admit(
        hello,
        |id| {
            let (xs, cookie) = XenSock::find_connected(id)?;
            found = Some(xs);
            Some(cookie)
        },
        net::now_ms(),
        deadline_ms,
    );
    match verdict {
        Admission::Accept { .. } => found.map(Ok),
        Admission::Park { .. } => None,
        Admission::Refuse(Refusal::Malformed) => Some(Err(&MALFORMED)),
        Admission::Refuse(Refusal::BadCookie) => Some(Err(&BAD_COOKIE)),
        Admission::Refuse(Refusal::UnknownConn) => Some(Err(&UNKNOWN_CONN)),
    }
}

/// The TCP work item's first step: accepts legs and reads their hellos;
/// the legs whose hello named a connection of ours with its cookie, each
/// with its connection (`switch::work` hands them over).
pub(crate) fn take_authenticated() -> KVec<(Arc<XenSock>, TcpSock)> {
    let mut authenticated: KVec<(Arc<XenSock>, TcpSock)> = KVec::new();
    let Some(s) = state() else {
        return authenticated;
    };
    {
        let mut g = s.lock();
        // new connections
        while let Some(l) = g.listener.as_ref() {
            let Ok(c) = l.accept() else { break };
            if g.pending.len() >= MAX_PENDING {
                inc(&DROPPED);
                continue;
            }
            let deadline_ms = (net::now_ms() + HELLO_TIMEOUT_MS)
                .max(HELLO_GRACE_UNTIL_MS.load(Ordering::Acquire));
            if g.pending
                .push(
                    Pending {
                        sock: c,
                        hello: [0; HELLO_LEN],
                        got: 0,
                        deadline_ms,
                    },
                    GFP_KERNEL,
                )
                .is_err()
            {
                inc(&DROPPED);
            }
        }
        // hellos: read at most HELLO_LEN bytes from each, never past it
        let old = core::mem::replace(&mut g.pending, KVec::new());
        let mut next: Option<u64> = None;
        for mut p in old.into_iter() {
            let verdict = if p.got == HELLO_LEN {
                // complete and parked: decide again
                check_hello(&p.hello, p.deadline_ms)
            } else {
                match p.sock.recv(&mut p.hello[p.got..]) {
                    Ok(0) => Some(Err(&MALFORMED)),
                    Ok(n) => {
                        p.got += n;
                        // a header that is not a TcpHello is refused at once
                        if p.got >= ctrl::HEADER_LEN
                            && !is_hello_header(&p.hello[..ctrl::HEADER_LEN])
                        {
                            Some(Err(&MALFORMED))
                        } else if p.got == HELLO_LEN {
                            check_hello(&p.hello, p.deadline_ms)
                        } else {
                            None
                        }
                    }
                    Err(x) if x == crate::sys::errno::EAGAIN => None,
                    Err(_) => Some(Err(&MALFORMED)),
                }
            };
            let now = net::now_ms();
            match verdict {
                None if now >= p.deadline_ms => inc(&TIMED_OUT),
                None => {
                    // a parked leg is looked at again soon: its connection
                    // may become known without a pass of its own
                    let due = if p.got == HELLO_LEN {
                        p.deadline_ms.min(now + PARKED_RECHECK_MS)
                    } else {
                        p.deadline_ms
                    };
                    next = Some(next.map_or(due, |d: u64| d.min(due)));
                    if g.pending.push(p, GFP_KERNEL).is_err() {
                        inc(&DROPPED);
                    }
                }
                Some(Ok(xs)) => {
                    inc(&LEGS_IN);
                    if authenticated.push((xs, p.sock), GFP_KERNEL).is_err() {
                        inc(&DROPPED);
                    }
                }
                // refused: closed (dropping releases it) and counted
                Some(Err(c)) => inc(c),
            }
        }
        // come back at the earliest hello deadline (or parked leg's check)
        if let Some(d) = next {
            let wait = d.saturating_sub(net::now_ms()).clamp(10, HELLO_TIMEOUT_MS);
            net::schedule_after_ms(wait as u32);
        }
    }
    authenticated
}

/// A leg that authenticated but that its connection could not take (a
/// second one, or no switch): closed, counted.
pub(crate) fn refused() {
    inc(&DROPPED);
}

/// Connections whose switch went inactive (`done`) are not serviced any
/// more.
pub(crate) fn retire(done: &[Arc<XenSock>]) {
    if done.is_empty() {
        return;
    }
    let Some(s) = state() else { return };
    let mut g = s.lock();
    let old = core::mem::replace(&mut g.active, KVec::new());
    for x in old.into_iter() {
        let finished = done.iter().any(|d| Arc::ptr_eq(d, &x));
        if !finished {
            let _ = g.active.push(x, GFP_KERNEL);
        }
    }
}

/// This guest is back from a save (or the save was cancelled). The clock
/// (boot time) jumped by the time it was away, which expired every
/// pending leg's hello deadline at once, and the peer's copy of a hello it
/// sent us while we were away comes only with its next retransmission,
/// backed off to tens of seconds by then: a leg connected just before the
/// save was closed as "timed out" before its hello arrived, and its
/// connection reset ("outbound leg closed while frozen" on the peer).
/// Pending legs, and legs accepted in
/// the next peer-lost bound, wait that long for their hello (the clock no
/// longer jumps, net::now_ms, but a hello from the peer's backoff still
/// comes tens of seconds late).
pub(crate) fn resumed() {
    hold_hellos_for_peer_lost();
}

/// A peer's link went away: the peer may be being saved. A leg it
/// connected just before its save is complete in our kernel, but its hello
/// comes only after its restore, tens of seconds later: with the 5 s
/// deadline we closed that leg as timed out and the restored peer reset
/// the connection ("outbound leg failed while frozen", `tcp_timed_out`
/// on the domain that stayed). Pending legs, and legs accepted in the next peer-lost bound,
/// wait that long for their hello, as after our own resume.
pub(crate) fn hold_hellos_for_peer_lost() {
    let deadline_ms = net::now_ms() + net::peer_lost_ms().max(HELLO_TIMEOUT_MS);
    // legs the kernel completed before the save but we accept only now
    HELLO_GRACE_UNTIL_MS.store(deadline_ms, Ordering::Release);
    if let Some(s) = state() {
        let mut g = s.lock();
        for p in g.pending.iter_mut() {
            p.deadline_ms = p.deadline_ms.max(deadline_ms);
        }
    }
    net::schedule();
}

/// Until then (net::now_ms), a leg accepted after a resume waits for
/// its hello as long as the peer-lost bound (see `resumed`).
static HELLO_GRACE_UNTIL_MS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// A connection's switch became active: the work item services it from now on.
pub(crate) fn register(xs: &Arc<XenSock>) {
    if let Some(s) = state() {
        let mut g = s.lock();
        if !g.active.iter().any(|x| Arc::ptr_eq(x, xs)) {
            let _ = g.active.push(xs.clone(), GFP_KERNEL);
        }
    }
    net::schedule();
}

/// The connections whose switch is active, now.
pub(crate) fn active_snapshot() -> KVec<Arc<XenSock>> {
    let mut v = KVec::new();
    if let Some(s) = state() {
        let g = s.lock();
        for x in g.active.iter() {
            if v.push(x.clone(), GFP_KERNEL).is_err() {
                break;
            }
        }
    }
    v
}

/// No TCP carrier (tcp_port=0 or no listener): connections cannot switch.
pub(crate) fn legs_disabled() -> bool {
    !LISTENING.load(Ordering::Acquire)
}

/// An outbound leg connected.
pub(crate) fn leg_out() {
    inc(&LEGS_OUT);
}

fn is_hello_header(h: &[u8]) -> bool {
    matches!(ctrl::decode_header(h, Channel::Tcp), Ok(hd) if hd.kind == ctrl::Kind::TcpHello)
}

/// A connection ended: the work item releases its legs.
pub(crate) fn connection_ended() {
    net::schedule();
}

/// /proc/net/af_xen_stats lines of the TCP carrier.
pub(crate) fn stats(seq: &mut crate::sys::Seq) {
    let g = |c: &AtomicI64| c.load(Ordering::Relaxed);
    let port = if LISTENING.load(Ordering::Relaxed) {
        net::tcp_port()
    } else {
        0
    };
    seq.counters(&[
        ("tcp_port", i64::from(port)),
        ("tcp_legs_in", g(&LEGS_IN)),
        ("tcp_legs_out", g(&LEGS_OUT)),
        ("tcp_legs_held", g(&HELD)),
        ("tcp_bad_cookie", g(&BAD_COOKIE)),
        ("tcp_unknown_conn", g(&UNKNOWN_CONN)),
        ("tcp_malformed", g(&MALFORMED)),
        ("tcp_timed_out", g(&TIMED_OUT)),
        ("tcp_dropped", g(&DROPPED)),
    ]);
}
