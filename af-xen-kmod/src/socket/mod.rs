// SPDX-License-Identifier: GPL-2.0
//! The socket core: AF_XEN sockets as the socket layer sees them (the
//! proto_ops callbacks, in safe Rust over the wrappers in `sys`), the port
//! table, bind/listen/connect/accept, the data calls over a
//! `carrier::Carrier`, poll, ioctls, socket options and /proc.

pub(crate) mod control;
pub(crate) mod inet;
pub(crate) mod seqpacket;

use crate::carrier::ring::Pipe;
use crate::carrier::{Inner, Link, Received, Sent, SocketCore, Stream, XenSock};
use crate::link::{self, LinkTable};
use crate::sock::{Addr, InetNames, State, DOMID_ANY, DOMID_SELF, PORT_ANY};
use crate::sys::{self, errno as e, poll::*, Line, Msg, Socket};
use kernel::bindings;
use kernel::ffi::{c_int, c_long};
use kernel::new_mutex;
use kernel::prelude::*;
use kernel::rbtree::RBTree;
use kernel::sync::{Arc, ArcBorrow, Mutex};

const EPHEMERAL_FIRST: u32 = 49152;

/// Module-wide state: the port table and the link table.
#[pin_data]
pub(crate) struct Globals {
    #[pin]
    pub(crate) ports: Mutex<Ports>,
    #[pin]
    pub(crate) links: Mutex<LinkTable<XenSock>>,
}

pub(crate) struct Ports {
    pub(crate) map: RBTree<u32, Arc<XenSock>>,
    /// SO_REUSEPORT: the sockets bound to a port besides `map`'s, which
    /// take its connections in turn (`listener`)
    reuse: RBTree<u32, KVec<Arc<XenSock>>>,
    /// the turn (`listener`)
    turn: u32,
    next_ephemeral: u32,
    /// every live socket, for /proc/net/af_xen (id -> socket)
    pub(crate) all: RBTree<usize, Arc<XenSock>>,
}

impl Ports {
    /// The listener a connection to `port` goes to: the port's socket, or
    /// with SO_REUSEPORT the next listening one of its group in turn.
    fn listener(&mut self, port: u32) -> Option<Arc<XenSock>> {
        let head = self.map.get(&port)?.clone();
        let Some(group) = self.reuse.get(&port) else {
            return Some(head);
        };
        let n = group.len() + 1;
        for k in 0..n {
            let at = (self.turn as usize).wrapping_add(k) % n;
            let cand = if at == 0 { &head } else { &group[at - 1] };
            if cand.inner.lock().state == State::Listening {
                let cand = cand.clone();
                self.turn = (at as u32).wrapping_add(1);
                return Some(cand);
            }
        }
        Some(head)
    }

    /// Every socket bound to `port`: the port's and its SO_REUSEPORT group.
    fn bound_to(&self, port: u32) -> KVec<Arc<XenSock>> {
        let mut all = KVec::new();
        let group = self.reuse.get(&port).into_iter().flatten();
        for xs in Iterator::chain(self.map.get(&port).into_iter(), group) {
            if all.push(xs.clone(), GFP_KERNEL).is_err() {
                break;
            }
        }
        all
    }

    /// Whether `xs` may join the sockets bound to `port` (XENSOCK_REUSEPORT
    /// on all of them, all of one user, as TCP's SO_REUSEPORT rule).
    fn may_share(&self, port: u32, xs: &XenSock) -> bool {
        let wants = |o: &XenSock| o.inner.lock().reuse_port;
        let uid = xs.sk.uid();
        wants(xs)
            && self
                .bound_to(port)
                .iter()
                .all(|o| wants(o) && o.sk.uid() == uid)
    }

    /// `xs` leaves the sockets bound to `port`; one of its SO_REUSEPORT
    /// group takes the port's place if it had it.
    fn unbind(&mut self, port: u32, xs: &Arc<XenSock>) {
        if let Some(group) = self.reuse.get_mut(&port) {
            if let Some(at) = group.iter().position(|o| Arc::ptr_eq(o, xs)) {
                drop(sys::vec_remove(group, at));
                if group.is_empty() {
                    self.reuse.remove(&port);
                }
                return;
            }
        }
        let mine = self.map.get(&port).is_some_and(|o| Arc::ptr_eq(o, xs));
        if !mine {
            return;
        }
        let next = self.reuse.get_mut(&port).map(|g| sys::vec_remove(g, 0));
        if self.reuse.get(&port).is_some_and(|g| g.is_empty()) {
            self.reuse.remove(&port);
        }
        match next {
            Some(n) => {
                // (the old entry's node is reused: no allocation)
                if let Some(slot) = self.map.get_mut(&port) {
                    *slot = n;
                }
            }
            None => {
                self.map.remove(&port);
            }
        }
    }
}

impl Globals {
    pub(crate) fn new() -> impl PinInit<Self, Error> {
        try_pin_init!(Globals {
            ports <- new_mutex!(Ports {
                map: RBTree::new(),
                reuse: RBTree::new(),
                turn: 0,
                next_ephemeral: EPHEMERAL_FIRST,
                all: RBTree::new(),
            }, "af_xen_ports"),
            links <- new_mutex!(LinkTable::new(), "af_xen_links"),
        })
    }
}

static GLOBALS: sys::Published<Globals> = sys::Published::new();
static OPS: sys::Published<sys::Ops> = sys::Published::new();

/// Publishes the module's globals and ops for the callbacks, before the
/// family is registered.
pub(crate) fn publish(g: Pin<KBox<Globals>>, ops: Pin<KBox<sys::Ops>>) -> Result {
    GLOBALS.publish(g).map_err(|_| EBUSY)?;
    OPS.publish(ops).map_err(|_| EBUSY)?;
    Ok(())
}

/// Module exit, after the family is unregistered and every socket gone.
pub(crate) fn unpublish() {
    drop(OPS.unpublish());
    drop(GLOBALS.unpublish());
}

pub(crate) fn globals() -> &'static Globals {
    // Callbacks only run between publish() and unpublish().
    match GLOBALS.get() {
        Some(g) => g,
        None => unreachable!("af_xen callback outside the module's lifetime"),
    }
}

fn ops() -> &'static sys::Ops {
    match OPS.get() {
        Some(o) => o,
        None => unreachable!("af_xen callback outside the module's lifetime"),
    }
}

/// The AF_XEN family's callbacks ([`sys::family`] calls them with safe
/// arguments).
pub(crate) struct XenFamily;

impl sys::family::Family for XenFamily {
    type Sock = XenSock;
    type Name = SockName;

    fn create(
        sock: &Socket,
        new: &sys::family::NewSock,
        protocol: i32,
    ) -> core::result::Result<Arc<XenSock>, i32> {
        xs_create(sock, new, protocol)
    }
    fn release(_sock: &Socket, state: Option<Arc<XenSock>>) {
        xs_release(state)
    }
    fn bind(s: ArcBorrow<'_, XenSock>, addr: &[u8]) -> c_int {
        xs_bind(s, addr)
    }
    fn listen(s: ArcBorrow<'_, XenSock>, backlog: i32) -> c_int {
        xs_listen(s, backlog)
    }
    fn getname(s: ArcBorrow<'_, XenSock>, peer: bool) -> core::result::Result<SockName, i32> {
        xs_getname(s, peer)
    }
    fn connect(sock: &Socket, s: ArcBorrow<'_, XenSock>, addr: &[u8], flags: i32) -> c_int {
        xs_connect(sock, s, addr, flags)
    }
    fn accept(s: ArcBorrow<'_, XenSock>, newsock: &Socket, flags: i32) -> c_int {
        xs_accept(s, newsock, flags)
    }
    fn poll(s: Option<ArcBorrow<'_, XenSock>>) -> u32 {
        xs_poll(s)
    }
    fn ioctl(sock: &Socket, s: Option<ArcBorrow<'_, XenSock>>, cmd: u32, arg: usize) -> c_int {
        xs_ioctl(sock, s, cmd, arg)
    }
    fn shutdown(s: ArcBorrow<'_, XenSock>, how: i32) -> c_int {
        xs_shutdown(s, how)
    }
    fn sendmsg(s: ArcBorrow<'_, XenSock>, msg: &mut Msg) -> c_int {
        xs_sendmsg(s, msg)
    }
    fn recvmsg(s: ArcBorrow<'_, XenSock>, msg: &mut Msg, flags: i32) -> c_int {
        xs_recvmsg(s, msg, flags)
    }
    fn setsockopt(
        s: ArcBorrow<'_, XenSock>,
        level: i32,
        optname: i32,
        value: &sys::family::SockoptValue,
    ) -> c_int {
        xs_setsockopt(s, level, optname, value)
    }
    fn getsockopt(
        s: ArcBorrow<'_, XenSock>,
        level: i32,
        optname: i32,
        out: &sys::family::SockoptOut,
    ) -> c_int {
        xs_getsockopt(s, level, optname, out)
    }
}

pub(crate) fn build_ops(module: &'static ThisModule, family: i32) -> sys::Ops {
    sys::family::build_ops::<XenFamily>(module, family)
}

fn err(e: i32) -> c_int {
    -e
}

// ---- create / release ------------------------------------------------------

fn xs_create(
    sock: &Socket,
    new: &sys::family::NewSock,
    protocol: i32,
) -> core::result::Result<Arc<XenSock>, i32> {
    if protocol != 0 {
        return Err(e::EPROTONOSUPPORT);
    }
    let seqpacket = sock.type_() == bindings::sock_type_SOCK_SEQPACKET as i32;
    if sock.type_() != bindings::sock_type_SOCK_STREAM as i32 && !seqpacket {
        return Err(e::ESOCKTNOSUPPORT);
    }
    sock.set_ops(ops());
    let sk = match sock.alloc_sk(new) {
        Some(sk) => sk,
        None => return Err(e::ENOMEM),
    };
    let xs = match XenSock::new(sk) {
        Ok(x) => x,
        Err(_) => {
            sock.release_sk();
            return Err(e::ENOMEM);
        }
    };
    xs.inner.lock().seqpacket = seqpacket;
    if list_socket(&xs).is_err() {
        sock.release_sk();
        return Err(e::ENOMEM);
    }
    Ok(xs)
}

/// A socket's key in the listing of every socket (`Ports::all`).
fn all_key(xs: &XenSock) -> usize {
    xs as *const XenSock as usize
}

/// Lists a new socket among every socket (/proc, the TCP legs' lookup).
fn list_socket(xs: &Arc<XenSock>) -> core::result::Result<(), ()> {
    globals()
        .ports
        .lock()
        .all
        .try_create_and_insert(all_key(xs), xs.clone(), GFP_KERNEL)
        .map(|_| ())
        .map_err(|_| ())
}

/// Forgets a socket everywhere (port table, listing) and tears it down.
fn destroy(xs: &Arc<XenSock>) {
    let (children, mut stream, link, conn_id, peer_conn, was, reset, end_sent, lends_rx, held) = {
        let mut i = xs.inner.lock();
        i.released = true;
        let was = i.state;
        i.state = State::Closed;
        let end_sent = core::mem::replace(&mut i.end_sent, true);
        (
            core::mem::replace(&mut i.accept_q, KVec::new()),
            Stream::new(i.tx.take(), i.rx.take(), i.sw.clone()),
            i.link.take(),
            i.conn_id,
            i.peer_conn,
            was,
            i.reset,
            end_sent,
            i.lends_rx,
            i.tcp_listener.take(),
        )
    };
    // a dual listener's TCP listener closes with it (its pending
    // connections are refused, as any listener's)
    drop(held);
    // SO_LINGER with l_linger 0: abortive close, the peer sees
    // ECONNRESET (unread data is dropped), as TCP's RST.
    let abort = was == State::Connected && !reset && xs.sk.linger_abort();
    // Close: we read no more (the peer's writes get EPIPE); unsent data
    // is still delivered (FIN after it). The ring we read is kept for
    // lending (below) when the peer may not have mapped it yet.
    let rx = stream.carrier().release(xs, abort);
    let mut lend_rx = rx.filter(|_| lends_rx && link.is_some());
    // Over a link: every connection that was established ends with exactly
    // one Close (clean) or Reset (abort, reset) from each side, here unless
    // conn_reset sent it already; its rings already carry FIN/CLOSED or
    // RESET. Our ring's grant ends when the last reference to its pipe goes
    // (kept pending until the peer unmaps it: af_xen_glue.c), except that an
    // accepted connection closed cleanly lends it to the peer until the
    // peer's own Close or Reset: the peer may not have mapped it yet.
    if let Some(link) = link {
        let peer_ended = xs.inner.lock().peer_ended;
        let end = if was != State::Connected || end_sent {
            None
        } else if abort || reset {
            // a reset the peer told us of needs no answer
            (!peer_ended).then_some(crate::proto::ctrl::Message::Reset {
                conn_id: peer_conn,
                reason: if abort {
                    crate::proto::ctrl::ResetReason::Abort
                } else {
                    crate::proto::ctrl::ResetReason::ProtocolError
                },
            })
        } else {
            Some(crate::proto::ctrl::Message::Close { conn_id: peer_conn })
        };
        let clean = matches!(end, Some(crate::proto::ctrl::Message::Close { .. }));
        if let Some(m) = &end {
            let _ = link.send(m);
        }
        let gone = {
            let mut li = link.inner.lock();
            let gone = li.conns.remove(&conn_id);
            // read again under the link's lock, which the work item holds
            // while it handles the peer's Close/Reset (see link::lend)
            if clean && !xs.inner.lock().peer_ended {
                if let Some(rx) = lend_rx.take() {
                    link::lend(&mut li, conn_id, rx);
                }
            }
            gone
        };
        drop(gone);
    }
    drop(lend_rx);
    {
        let mut p = globals().ports.lock();
        let (port, bound) = {
            let i = xs.inner.lock();
            (i.local.port, i.bound)
        };
        if bound {
            p.unbind(port, xs);
        }
        p.all.remove(&all_key(xs));
    }
    // Children that were never accepted: close them too.
    for c in children.into_iter() {
        let sk = c.sk;
        drop(sk.detach::<XenFamily>());
        destroy(&c);
        sk.put();
    }
    xs.sk.wake(POLLIN | POLLOUT | POLLHUP | POLLERR);
}

fn xs_release(state: Option<Arc<XenSock>>) {
    if let Some(xs) = state {
        destroy(&xs);
        drop(xs);
    }
}

// ---- bind / listen / getname -------------------------------------------------

fn domid_ok(domid: u32) -> bool {
    domid == DOMID_ANY || domid == DOMID_SELF || domid == link::own_domid()
}

/// Binds `xs` to `port` (PORT_ANY: ephemeral). Caller checked the state.
fn do_bind(xs: &Arc<XenSock>, port: u32) -> core::result::Result<(), i32> {
    let mut p = globals().ports.lock();
    // Under the port table's lock: another thread's bind of this socket
    // (or its connect or listen, which bind it) may have come first; a
    // second port would stay in the table after the socket's close.
    if xs.inner.lock().bound {
        return Err(e::EINVAL);
    }
    let port = if port == PORT_ANY {
        let mut tries = 0u32;
        loop {
            let cand = p.next_ephemeral;
            p.next_ephemeral = if cand >= 0x7FFF_FFFF {
                EPHEMERAL_FIRST
            } else {
                cand + 1
            };
            if p.map.get(&cand).is_none() {
                break cand;
            }
            tries += 1;
            if tries > 1_000_000 {
                return Err(e::EADDRINUSE);
            }
        }
    } else {
        if p.map.get(&port).is_some() {
            if !p.may_share(port, xs) {
                return Err(e::EADDRINUSE);
            }
            // SO_REUSEPORT: one more socket on the port
            if p.reuse.get(&port).is_none() {
                p.reuse
                    .try_create_and_insert(port, KVec::new(), GFP_KERNEL)
                    .map_err(|_| e::ENOMEM)?;
            }
            if let Some(group) = p.reuse.get_mut(&port) {
                group.push(xs.clone(), GFP_KERNEL).map_err(|_| e::ENOMEM)?;
            }
            bound_at(xs, port);
            return Ok(());
        }
        port
    };
    p.map
        .try_create_and_insert(port, xs.clone(), GFP_KERNEL)
        .map_err(|_| e::ENOMEM)?;
    // still under the table's lock, so that no other bind sees it unbound
    bound_at(xs, port);
    Ok(())
}

/// The implicit bind of connect and listen (an ephemeral port), unless the
/// socket is bound, by its owner or by another thread meanwhile.
fn bind_if_unbound(xs: &Arc<XenSock>) -> core::result::Result<(), i32> {
    if xs.inner.lock().bound {
        return Ok(());
    }
    match do_bind(xs, PORT_ANY) {
        Err(x) if x == e::EINVAL && xs.inner.lock().bound => Ok(()),
        r => r,
    }
}

/// The socket's state once bound to `port`.
fn bound_at(xs: &XenSock, port: u32) {
    let mut i = xs.inner.lock();
    i.local = Addr {
        port,
        domid: link::own_domid(),
    };
    i.bound = true;
    if i.state == State::Unbound {
        i.state = State::Bound;
    }
}

fn xs_bind(xs: ArcBorrow<'_, XenSock>, addr: &[u8]) -> c_int {
    let a = match Addr::parse(addr) {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    if !domid_ok(a.domid) {
        return err(e::EADDRNOTAVAIL);
    }
    let xs: Arc<XenSock> = xs.into();
    if xs.inner.lock().state != State::Unbound {
        return err(e::EINVAL);
    }
    match do_bind(&xs, a.port) {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

fn xs_listen(xs: ArcBorrow<'_, XenSock>, backlog: c_int) -> c_int {
    let xs: Arc<XenSock> = xs.into();
    let st = xs.inner.lock().state;
    match st {
        State::Unbound => {
            if let Err(e) = bind_if_unbound(&xs) {
                return err(e);
            }
        }
        State::Bound | State::Listening => {}
        _ => return err(e::EINVAL),
    }
    let mut i = xs.inner.lock();
    // another thread's connect may have taken the socket meanwhile
    if !matches!(i.state, State::Bound | State::Listening) {
        return err(e::EINVAL);
    }
    i.backlog = backlog.clamp(1, 4096) as u32;
    i.state = State::Listening;
    drop(i);
    xs.sk.set_listening(true);
    0
}

/// A socket's local and peer address as of now: the local domid is this
/// domain's current one (the stored one is from bind/connect time, and a
/// restore or a migration gives the domain a new one), and so is a
/// loopback peer's (stored equal to the local one).
fn current_addrs(i: &Inner) -> (Addr, Addr) {
    let (mut local, mut peer) = (i.local, i.peer);
    if local.domid != DOMID_ANY {
        let own = link::own_domid();
        if peer.domid == local.domid {
            peer.domid = own;
        }
        local.domid = own;
    }
    (local, peer)
}

/// A socket's name as getsockname/getpeername return it: a sockaddr_xen,
/// or the sockaddr_in/sockaddr_in6 of a TCP program's connection.
pub(crate) struct SockName {
    buf: [u8; 28],
    len: usize,
}

impl SockName {
    fn of(b: &[u8]) -> SockName {
        let mut buf = [0u8; 28];
        let len = b.len().min(buf.len());
        buf[..len].copy_from_slice(&b[..len]);
        SockName { buf, len }
    }
}

impl AsRef<[u8]> for SockName {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn xs_getname(xs: ArcBorrow<'_, XenSock>, peer: bool) -> core::result::Result<SockName, i32> {
    let i = xs.inner.lock();
    if let Some(n) = &i.inet {
        // the program's own view of its connection, to its end
        return Ok(SockName::of(if peer { n.peer() } else { n.local() }));
    }
    let (local_now, peer_now) = current_addrs(&i);
    let a = if peer {
        if i.state != State::Connected {
            return Err(e::ENOTCONN);
        }
        peer_now
    } else if i.bound || i.state == State::Connected {
        // an accepted socket never bound, but has its listener's address
        local_now
    } else {
        Addr {
            port: PORT_ANY,
            domid: DOMID_ANY,
        }
    };
    drop(i);
    Ok(SockName::of(&a.bytes()))
}

// ---- connect / accept --------------------------------------------------------

fn xs_connect(sock: &Socket, xs: ArcBorrow<'_, XenSock>, addr: &[u8], flags: c_int) -> c_int {
    // a connected socket says so whatever the address (as TCP: a program
    // whose connection was taken over asks again with its AF_INET one)
    let st = xs.inner.lock().state;
    if st == State::Connected {
        return err(e::EISCONN);
    }
    let a = match Addr::parse(addr) {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    match st {
        State::Connected => return err(e::EISCONN),
        State::Connecting => return err(e::EALREADY),
        State::Listening | State::Closed => return err(e::EINVAL),
        _ => {}
    }
    if a.port == PORT_ANY || a.domid == DOMID_ANY {
        return err(e::EINVAL);
    }
    // A failed non-blocking connect whose error nobody fetched with
    // SO_ERROR: this call reports it (as TCP does), the next one starts over.
    let pending = xs.sk.take_error();
    if pending != 0 {
        return pending;
    }
    let nonblock = flags & bindings::O_NONBLOCK as c_int != 0;
    if a.domid == DOMID_SELF || a.domid == link::own_domid() {
        let xs: Arc<XenSock> = xs.into();
        return match connect_local(&xs, a.port) {
            Ok(()) => {
                sock.set_connected(true);
                0
            }
            Err(x) => err(x),
        };
    }
    let xs: Arc<XenSock> = xs.into();
    match connect_remote(&xs, a, nonblock) {
        Ok(()) => {
            sock.set_connected(true);
            0
        }
        Err(x) => err(x),
    }
}

/// Forgets a connect attempt over a link (failed, timed out, interrupted).
fn connect_abort(xs: &Arc<XenSock>, link: &Arc<Link>, conn_id: u32) {
    let gone = link.inner.lock().conns.remove(&conn_id);
    drop(gone);
    // dropped after the lock (ending grants and mappings sleeps)
    let parts = {
        let mut i = xs.inner.lock();
        if i.state == State::Connecting || i.state == State::Connected {
            i.state = State::Bound;
        }
        (i.link.take(), i.rx.take(), i.tx.take(), i.sw.take())
    };
    drop(parts);
}

/// A connect over a link gives up after this long (link setup plus the
/// peer's answer) with ETIMEDOUT: a blocking one returns it (unless
/// SO_SNDTIMEO is shorter: EINPROGRESS, and the connect goes on), one in
/// progress without a caller (non-blocking) reports it through POLLERR and
/// SO_ERROR, as a TCP connect whose SYNs go unanswered (link::reap).
pub(crate) const CONNECT_TIMEOUT_MS: u32 = 40_000;

/// Connect to a listener in another domain: ConnectRequest naming our
/// receive ring (sent now if the link is up, else by the work item once it
/// is), then ConnectAccept/ConnectReject completes it. Non-blocking:
/// EINPROGRESS, completion seen through POLLOUT and SO_ERROR. Blocking:
/// waits; SO_SNDTIMEO running out is EINPROGRESS and a signal EINTR (the
/// connect stays in progress, as TCP's), our own bound ETIMEDOUT (aborted).
fn connect_remote(xs: &Arc<XenSock>, a: Addr, nonblock: bool) -> core::result::Result<(), i32> {
    let me = link::own_domid();
    let link = link::get_or_create(a.domid)?;
    bind_if_unbound(xs)?;
    let conn_id = link::next_conn_id();
    let stream = !xs.inner.lock().seqpacket;
    let cap = crate::carrier::ring::remote_rx_ring_capacity(&xs.sk, stream);
    let (rx, rx_grant) = Pipe::new_granted(&link, me, conn_id, cap, 0).map_err(|_| e::ENOMEM)?;
    // a stream that could not follow its peer's moves is refused here
    // rather than left without its switch
    let sw = if stream {
        Some(crate::carrier::switch::Switch::new(cap).map_err(|_| e::ENOMEM)?)
    } else {
        None
    };
    if xs.inner.lock().test_bad_directory {
        rx.test_spoil_directory();
    }
    // What an earlier connect of this socket left (its ring, switch, link)
    // is dropped after the lock: ending a grant unmaps pages, which sleeps.
    let earlier = {
        let mut i = xs.inner.lock();
        // Another thread's connect of this socket may have started since
        // xs_connect looked: only one goes on (this one's ring and switch
        // are dropped after the lock, on return).
        match i.state {
            State::Connecting => return Err(e::EALREADY),
            State::Connected => return Err(e::EISCONN),
            State::Listening | State::Closed => return Err(e::EINVAL),
            State::Unbound | State::Bound => {}
        }
        i.state = State::Connecting;
        i.peer = a;
        i.conn_id = conn_id;
        i.connect_err = 0;
        i.reset = false;
        i.tcp = crate::carrier::leg::ConnTcp {
            cookie: crate::carrier::leg::new_cookie(),
            peer: crate::proto::ctrl::TcpEndpoint::NONE,
        };
        i.connect_deadline_ms = crate::sys::net::now_ms() + CONNECT_TIMEOUT_MS as u64;
        (
            i.rx.replace(rx),
            i.link.replace(link.clone()),
            i.request.replace(rx_grant),
            core::mem::replace(&mut i.sw, sw),
        )
    };
    drop(earlier);
    if link
        .inner
        .lock()
        .conns
        .try_create_and_insert(conn_id, xs.clone(), GFP_KERNEL)
        .is_err()
    {
        connect_abort(xs, &link, conn_id);
        return Err(e::ENOMEM);
    }
    // the bound of connects nobody waits for (non-blocking, or left in
    // progress by SO_SNDTIMEO or a signal): link::reap fails them
    sys::schedule_reap(CONNECT_TIMEOUT_MS + 100);
    link.send_requests();
    if nonblock {
        return Err(e::EINPROGRESS);
    }
    let user = xs.sk.sndtimeo(false);
    let limit = kernel::time::msecs_to_jiffies(CONNECT_TIMEOUT_MS) as c_long;
    let (mut t, user_bound) = if user < limit {
        (user, true)
    } else {
        (limit, false)
    };
    let r = xs
        .sk
        .wait(&mut t, || xs.inner.lock().state != State::Connecting);
    match r {
        Err(x) if x == e::EAGAIN => {
            if user_bound {
                return Err(e::EINPROGRESS);
            }
            connect_abort(xs, &link, conn_id);
            return Err(e::ETIMEDOUT);
        }
        Err(x) => return Err(x),
        Ok(()) => {}
    }
    let (st, cerr) = {
        let i = xs.inner.lock();
        (i.state, i.connect_err)
    };
    if st == State::Connected {
        return Ok(());
    }
    // reported here: SO_ERROR must not report it a second time
    let _ = xs.sk.take_error();
    Err(if cerr != 0 { cerr } else { e::ECONNREFUSED })
}

/// Work item: the ConnectRequest of a pending connect over `link`, if it
/// still has to go out: (our conn id, src port, dst port, our ring).
pub(crate) fn pending_request(
    xs: &XenSock,
) -> Option<(u32, u32, u32, crate::proto::ctrl::RingGrant)> {
    let i = xs.inner.lock();
    if i.state != State::Connecting {
        return None;
    }
    i.request
        .map(|rg| (i.conn_id, i.local.port, i.peer.port, rg))
}

/// Work item: the ConnectRequest went out.
pub(crate) fn request_sent(xs: &XenSock) {
    xs.inner.lock().request = None;
}

/// Whether `xs` is a SOCK_SEQPACKET socket (its ConnectRequest says so).
pub(crate) fn is_seqpacket(xs: &XenSock) -> bool {
    xs.inner.lock().seqpacket
}

/// Work item, ConnectRequest from `link`'s peer: a child of the listener on
/// `dst_port` with our receive ring granted and the requester's mapped.
/// The caller lists it on the link, answers, then calls `accepted_remote`.
pub(crate) fn accept_remote(
    link: &Arc<Link>,
    peer_conn: u32,
    src_port: u32,
    dst_port: u32,
    seqpacket: bool,
    rg: &crate::proto::ctrl::RingGrant,
) -> core::result::Result<
    (Arc<XenSock>, u32, crate::proto::ctrl::RingGrant),
    crate::proto::ctrl::RejectReason,
> {
    use crate::proto::ctrl::RejectReason as R;
    let me = link::own_domid();
    let l = globals().ports.lock().listener(dst_port);
    let sock_type = |seqpacket| {
        if seqpacket {
            crate::proto::ctrl::SockType::SeqPacket
        } else {
            crate::proto::ctrl::SockType::Stream
        }
    };
    let view = l.as_ref().and_then(|l| {
        let li = l.inner.lock();
        (li.state == State::Listening).then(|| crate::proto::ctrl::ListenerView {
            sock_type: sock_type(li.seqpacket),
            queued: li.accept_q.len(),
            backlog: li.backlog as usize,
        })
    });
    crate::proto::ctrl::admit(view, sock_type(seqpacket))?;
    let Some(l) = l else {
        return Err(R::NoListener);
    };
    let child = new_child(&l).ok_or(R::NoResources)?;
    let my_id = link::next_conn_id();
    let cap = crate::carrier::ring::remote_rx_ring_capacity(&child.sk, !seqpacket);
    let (rx, rx_grant) = match Pipe::new_granted(link, me, my_id, cap, 0) {
        Ok(v) => v,
        Err(_) => return Err(discard_child(&child, R::NoResources)),
    };
    let tx = match Pipe::new_mapped(link, me, rg, peer_conn, 0) {
        Ok(t) => t,
        Err(_) => return Err(discard_child(&child, R::BadRequest)),
    };
    // a stream that could not follow its peer's moves is refused, not
    // accepted without its switch
    let sw = if seqpacket {
        None
    } else {
        match crate::carrier::switch::Switch::new(cap) {
            Ok(sw) => Some(sw),
            Err(_) => return Err(discard_child(&child, R::NoResources)),
        }
    };
    {
        let mut c = child.inner.lock();
        c.state = State::Connected;
        c.seqpacket = seqpacket;
        c.local = Addr {
            port: dst_port,
            domid: me,
        };
        c.peer = Addr {
            port: src_port,
            domid: link.peer,
        };
        c.tx = Some(tx);
        c.rx = Some(rx);
        // before it is queued: accept() and close() may follow at once,
        // and that close must lend our ring (destroy)
        c.link = Some(link.clone());
        c.conn_id = my_id;
        c.peer_conn = peer_conn;
        c.sw = sw;
        c.lends_rx = true;
    }
    match queue_child(&l, &child) {
        Ok(()) => Ok((child, my_id, rx_grant)),
        Err(ChildNotQueued::NoMemory) => Err(R::NoResources),
        Err(ChildNotQueued::NotListening) => Err(R::BacklogFull),
    }
}

/// A new socket for a connection to listener `l`, for accept() to hand
/// out: its `struct sock` is made like the listener's (type, buffers,
/// timeouts) and, as every socket's, holds an Arc of it in its priv.
fn new_child(l: &XenSock) -> Option<Arc<XenSock>> {
    let child_sk = l.sk.alloc_child()?;
    let child = match XenSock::new(child_sk) {
        Ok(c) => c,
        Err(_) => {
            child_sk.put();
            return None;
        }
    };
    child_sk.attach::<XenFamily>(child.clone());
    Some(child)
}

/// Gives up a child in no table and no queue (its peer never learns of
/// it): its rings (breaking the Arc cycle through their ends) and its
/// `struct sock`. Returns `why`, for the caller's error.
fn discard_child<T>(child: &Arc<XenSock>, why: T) -> T {
    let (tx, rx) = {
        let mut c = child.inner.lock();
        (c.tx.take(), c.rx.take())
    };
    for p in [&tx, &rx].into_iter().flatten() {
        p.set_ends(None, None);
    }
    drop((tx, rx));
    let sk = child.sk;
    drop(sk.detach::<XenFamily>());
    sk.put();
    why
}

enum ChildNotQueued {
    NoMemory,
    /// the listener closed or its backlog filled meanwhile
    NotListening,
}

/// Lists a ready child (/proc, unload) and queues it for accept() on `l`.
/// A child that cannot be queued is torn down, telling its peer nothing.
fn queue_child(l: &XenSock, child: &Arc<XenSock>) -> core::result::Result<(), ChildNotQueued> {
    if list_socket(child).is_err() {
        return Err(discard_child(child, ChildNotQueued::NoMemory));
    }
    let queued = {
        let mut li = l.inner.lock();
        if li.state != State::Listening || li.accept_q.len() >= li.backlog as usize {
            false
        } else {
            // GFP_ATOMIC: we hold a spinlock
            li.accept_q.push(child.clone(), GFP_ATOMIC).is_ok()
        }
    };
    if !queued {
        // The peer never hears of it: no Close, no lending; and without
        // its link destroy() never takes the link's lock, which the work
        // item may hold while it calls us.
        {
            let mut c = child.inner.lock();
            c.link = None;
            c.end_sent = true;
            c.lends_rx = false;
        }
        destroy(child);
        return Err(discard_child(child, ChildNotQueued::NotListening));
    }
    Ok(())
}

/// Work item: the ConnectAccept went out; let accept() see the child.
pub(crate) fn accepted_remote(child: &Arc<XenSock>) {
    let l = {
        let i = child.inner.lock();
        i.local.port
    };
    // (the one whose queue holds it, and with SO_REUSEPORT the others of
    // its group: a wake that finds nothing is harmless)
    let listeners = globals().ports.lock().bound_to(l);
    for l in listeners.iter() {
        l.wake_live(POLLIN | POLLRDNORM);
    }
}

/// Work item, ConnectAccept for our connect: map the acceptor's ring.
pub(crate) fn connect_accepted(
    xs: &Arc<XenSock>,
    link: &Arc<Link>,
    acceptor_id: u32,
    rg: &crate::proto::ctrl::RingGrant,
) -> core::result::Result<(), ()> {
    let me = link::own_domid();
    if xs.inner.lock().state != State::Connecting {
        return Err(());
    }
    match Pipe::new_mapped(link, me, rg, acceptor_id, 0) {
        Ok(tx) => {
            {
                let mut i = xs.inner.lock();
                i.tx = Some(tx);
                i.peer_conn = acceptor_id;
                i.state = State::Connected;
            }
            xs.wake_live(POLLOUT | POLLWRNORM);
            Ok(())
        }
        Err(_) => {
            connect_failed(xs, e::ECONNREFUSED);
            Err(())
        }
    }
}

/// Work item: our connect was refused (or could not complete). The
/// socket is unconnected again, its ring given back; the error is pending
/// for SO_ERROR (a non-blocking connect) or returned by the waiting connect.
pub(crate) fn connect_failed(xs: &Arc<XenSock>, errno: i32) {
    let (rx, link) = {
        let mut i = xs.inner.lock();
        if i.state != State::Connecting {
            return;
        }
        i.connect_err = errno;
        // The error is pending before the state says "not connecting": a
        // poll in between must not see the socket unconnected without it
        // (POLLOUT|POLLHUP with SO_ERROR 0 while the failed connect's
        // large ring was being released).
        // sk_error_report only wakes: fine under the spinlock.
        xs.sk.set_err(errno);
        i.state = State::Bound;
        i.request = None;
        (i.rx.take(), i.link.take())
    };
    xs.wake_live(POLLOUT | POLLWRNORM | POLLERR | POLLHUP);
    // outside the spinlock: ending a grant may sleep
    drop((rx, link));
}

/// Work item (link locked): the peer's Close or Reset for this connection
/// arrived; it will not map or write our ring any more.
pub(crate) fn peer_ended(xs: &XenSock) {
    xs.inner.lock().peer_ended = true;
}

/// Work item: our ConnectAccept for `child` could not be sent. The
/// requester never learns of the connection: reset it, and tell nobody.
pub(crate) fn answer_lost(child: &Arc<XenSock>) {
    {
        let mut i = child.inner.lock();
        i.end_sent = true;
        i.lends_rx = false;
    }
    // Not accepted yet: it never existed for the requester, so accept()
    // must not hand it out (it stayed ESTABLISHED, reset, in the queue).
    let port = child.inner.lock().local.port;
    let listeners = globals().ports.lock().bound_to(port);
    let unqueued = listeners.iter().find_map(|l| {
        let mut li = l.inner.lock();
        let at = li.accept_q.iter().position(|c| Arc::ptr_eq(c, child))?;
        Some(sys::vec_remove(&mut li.accept_q, at))
    });
    if unqueued.is_some() {
        drop(unqueued);
        // as queue_child's refusal: no link, so destroy() never takes the
        // link's lock, which the work item holds while it calls us
        child.inner.lock().link = None;
        destroy(child);
        discard_child(child, ());
        return;
    }
    // accept() took it already: the application sees a reset
    link_lost(child);
}

/// Work item: the link died or the peer reset the connection.
pub(crate) fn link_lost(xs: &Arc<XenSock>) {
    if xs.inner.lock().state == State::Connecting {
        connect_failed(xs, e::ECONNRESET);
        return;
    }
    let rings = {
        let mut i = xs.inner.lock();
        i.reset = true;
        // nobody to tell: the peer reset it, or the link (and with it the
        // peer's incarnation that knew this connection id) is gone
        i.end_sent = true;
        // A reset connection never touches its rings again, so they go
        // now rather than at its close: a mapping of the peer's ring must
        // not outlive the link, or a save of this guest carries it over,
        // which a PV guest does not survive (docs/lab.md, "Known limits").
        // A call in progress holds the rings it uses until it returns.
        (i.tx.take(), i.rx.take())
    };
    for p in [&rings.0, &rings.1].into_iter().flatten() {
        p.detach(xs);
    }
    xs.wake_live(POLLIN | POLLOUT | POLLERR | POLLHUP);
    // after the lock: ending grants and mappings sleeps
    drop(rings);
}

/// Loopback connection to a listener of this domain: the accepted child and
/// both rings are made at once, so connect() completes immediately.
fn connect_local(xs: &Arc<XenSock>, port: u32) -> core::result::Result<(), i32> {
    // One connect of a socket at a time: another thread's, begun since
    // xs_connect looked, would set this socket's rings over ours.
    {
        let mut i = xs.inner.lock();
        match i.state {
            State::Connecting => return Err(e::EALREADY),
            State::Connected => return Err(e::EISCONN),
            State::Listening | State::Closed => return Err(e::EINVAL),
            State::Unbound | State::Bound => i.state = State::Connecting,
        }
    }
    let r = connect_local_claimed(xs, port);
    if r.is_err() {
        let mut i = xs.inner.lock();
        if i.state == State::Connecting {
            i.state = if i.bound {
                State::Bound
            } else {
                State::Unbound
            };
        }
    }
    r
}

/// connect_local, once this thread has claimed the socket (Connecting).
fn connect_local_claimed(xs: &Arc<XenSock>, port: u32) -> core::result::Result<(), i32> {
    let me = link::own_domid();
    let listener = globals().ports.lock().listener(port);
    let Some(l) = listener else {
        return Err(e::ECONNREFUSED);
    };
    if Arc::ptr_eq(&l, xs) {
        return Err(e::ECONNREFUSED);
    }
    // a stream cannot connect to a seqpacket listener nor back (WrongType)
    let seqpacket = xs.inner.lock().seqpacket;
    if l.inner.lock().seqpacket != seqpacket {
        return Err(e::ECONNREFUSED);
    }
    bind_if_unbound(xs)?;
    let child = new_child(&l).ok_or(e::ENOMEM)?;
    // to_child is read by the child (its SO_RCVBUF), to_me by us.
    let to_child = Pipe::new_local(crate::carrier::ring::rx_ring_capacity(&child.sk), me, port)
        .map_err(|_| discard_child(&child, e::ENOMEM))?;
    let to_me = Pipe::new_local(crate::carrier::ring::rx_ring_capacity(&xs.sk), me, port)
        .map_err(|_| discard_child(&child, e::ENOMEM))?;
    to_child.set_ends(Some(child.clone()), Some(xs.clone()));
    to_me.set_ends(Some(xs.clone()), Some(child.clone()));
    let my_addr = xs.inner.lock().local;
    {
        let mut c = child.inner.lock();
        c.state = State::Connected;
        c.seqpacket = seqpacket;
        c.local = Addr { port, domid: me };
        c.peer = Addr {
            port: my_addr.port,
            domid: me,
        };
        c.tx = Some(to_me.clone());
        c.rx = Some(to_child.clone());
    }
    if let Err(why) = queue_child(&l, &child) {
        // the child's rings are gone; ours never were set: nothing of
        // them may keep us (their ends) alive
        to_child.set_ends(None, None);
        to_me.set_ends(None, None);
        return Err(match why {
            ChildNotQueued::NoMemory => e::ENOMEM,
            ChildNotQueued::NotListening => e::ECONNREFUSED,
        });
    }
    {
        let mut i = xs.inner.lock();
        i.state = State::Connected;
        i.peer = Addr { port, domid: me };
        i.tx = Some(to_child);
        i.rx = Some(to_me);
    }
    l.sk.wake(POLLIN | POLLRDNORM);
    Ok(())
}

fn xs_accept(xs: ArcBorrow<'_, XenSock>, newsock: &Socket, flags: i32) -> c_int {
    let (held, names) = {
        let i = xs.inner.lock();
        if i.state != State::Listening {
            return err(e::EINVAL);
        }
        (i.tcp_listener.clone(), i.inet)
    };
    let nonblock = flags & (bindings::O_NONBLOCK as i32) != 0;
    let mut timeo: c_long = xs.sk.rcvtimeo(nonblock);
    let mut child: Option<Arc<XenSock>> = None;
    loop {
        let r = xs.sk.wait(&mut timeo, || {
            let mut i = xs.inner.lock();
            if i.state != State::Listening {
                return true;
            }
            if !i.accept_q.is_empty() {
                child = Some(sys::vec_remove(&mut i.accept_q, 0));
                return true;
            }
            drop(i);
            held.as_ref().is_some_and(|h| h.ready())
        });
        if let Err(e) = r {
            return err(e);
        }
        if child.is_some() {
            break;
        }
        let Some(h) = held.as_ref() else {
            return err(e::EINVAL);
        };
        if xs.inner.lock().state != State::Listening {
            return err(e::EINVAL);
        }
        // a TCP client of the dual listener: `newsock` becomes its
        // connection, TCP's own; another accepter may have taken it first
        match h.accept_into(newsock) {
            Ok(()) => return 0,
            Err(x) if x == e::EAGAIN && !nonblock => continue,
            Err(x) => return err(x),
        }
    }
    let Some(child) = child else {
        return err(e::EINVAL);
    };
    if let Some(n) = names {
        // a co-resident client of a TCP program: named as TCP would name
        // it, by its guest's address (its TCP leg's) and its port
        let mut ci = child.inner.lock();
        let ip = ci.tcp.peer.ipv4();
        ci.inet = Some(n.accepted(ip, ci.peer.port));
    }
    newsock.graft(child.sk);
    newsock.set_connected(true);
    // The child's sk already carries its Arc in priv (see the connection code).
    drop(child);
    0
}

// ---- poll / shutdown / data --------------------------------------------------

fn xs_poll(xs: Option<ArcBorrow<'_, XenSock>>) -> u32 {
    let Some(xs) = xs else { return POLLERR };
    let (state, qlen, shut_rd, shut_wr, reset, seqpacket, mut stream, held) = {
        let i = xs.inner.lock();
        (
            i.state,
            i.accept_q.len(),
            i.shut_rd,
            i.shut_wr,
            i.reset,
            i.seqpacket,
            carrier_of(&i),
            i.tcp_listener.clone(),
        )
    };
    let mut mask = 0;
    match state {
        State::Listening => {
            if qlen > 0 || held.is_some_and(|h| h.ready()) {
                mask |= POLLIN | POLLRDNORM;
            }
        }
        State::Unbound | State::Bound => {
            mask |= POLLOUT | POLLWRNORM | POLLHUP;
            // a failed non-blocking connect
            if xs.sk.err_pending() {
                mask |= POLLERR;
            }
        }
        State::Closed => mask |= POLLHUP | POLLIN | POLLRDNORM | POLLRDHUP,
        State::Connecting => {}
        State::Connected => {
            let r = match &stream {
                // seqpacket: readable once a whole record is there, writable
                // once one fits
                Stream::Rings(rings) if seqpacket => {
                    rings
                        .readiness_with(
                            &xs,
                            1,
                            |rx, _| seqpacket::rx_ready(rx).map_err(|_| ()),
                            seqpacket::tx_writable,
                        )
                        .0
                }
                // stream: readable once SO_RCVLOWAT bytes are there (as
                // TCP), on the ring and TCP together
                _ => stream.carrier().readiness(&xs, xs.sk.rcvlowat()),
            };
            if r.readable {
                mask |= POLLIN | POLLRDNORM;
            }
            if r.writable && !shut_wr {
                mask |= POLLOUT | POLLWRNORM;
            }
            let rd_hup = shut_rd || r.read_hup;
            let wr_hup = shut_wr || r.write_hup;
            if rd_hup {
                mask |= POLLIN | POLLRDNORM | POLLRDHUP;
            }
            if rd_hup && wr_hup {
                mask |= POLLHUP;
            }
            if reset || r.error {
                mask |= POLLERR | POLLHUP | POLLIN | POLLRDNORM;
            }
        }
    }
    mask
}

/// `SIOCINQ` (`FIONREAD`): bytes ready to read; `SIOCOUTQ`: bytes written
/// but not yet delivered to the peer, as TCP (unacknowledged) and vsock
/// (unsent) count them. A ring is the peer's receive buffer, so bytes in it
/// are delivered whether or not the peer read them: only bytes the TCP
/// carrier still queues count. Both as TCP: `EINVAL` on a listener, 0 on a
/// socket with no connection. Every other command goes on to the generic
/// socket ioctls (`-ENOIOCTLCMD`), as AF_UNIX does.
/// `XENSOCK_IOC_LOCAL_DOMID` (xensock.h): `_IOR('X', 0x12, uint32_t)`,
/// this guest's domid, on any AF_XEN socket (as vsock's
/// `IOCTL_VM_SOCKETS_GET_LOCAL_CID`).
const IOC_LOCAL_DOMID: u32 = 0x8004_5812;

fn xs_ioctl(sock: &Socket, xs: Option<ArcBorrow<'_, XenSock>>, cmd: u32, arg: usize) -> c_int {
    const SIOCINQ: u32 = 0x541B;
    const SIOCOUTQ: u32 = 0x5411;
    if cmd == IOC_LOCAL_DOMID {
        let domid: u32 = link::own_domid();
        let mut w = kernel::uaccess::UserSlice::new(arg, core::mem::size_of::<u32>()).writer();
        return match w.write(&domid) {
            Ok(()) => 0,
            Err(_) => err(e::EFAULT),
        };
    }
    if cmd == inet::IOC_RESOLVE {
        return match inet::resolve_ioctl(link::own_domid(), arg) {
            Ok(()) => 0,
            Err(x) => err(x),
        };
    }
    if cmd == inet::IOC_GRAFT {
        let Some(xs) = xs else {
            return err(e::EINVAL);
        };
        return match graft(sock, &xs, arg) {
            Ok(()) => 0,
            Err(x) => err(x),
        };
    }
    if cmd != SIOCINQ && cmd != SIOCOUTQ {
        return -(bindings::ENOIOCTLCMD as c_int);
    }
    let Some(xs) = xs else {
        return err(e::EINVAL);
    };
    // (the socket's lock is let go first: the carrier takes it after its own)
    let (state, seqpacket, mut stream) = {
        let i = xs.inner.lock();
        (i.state, i.seqpacket, carrier_of(&i))
    };
    if state == State::Listening {
        return err(e::EINVAL);
    }
    let value = match &stream {
        Stream::Rings(rings) if cmd == SIOCINQ && seqpacket => {
            rings.rx().map_or(0, |rx| seqpacket::next_len(rx) as usize)
        }
        _ if cmd == SIOCINQ => stream.carrier().readable_bytes(&xs),
        _ => stream.carrier().unsent_bytes(),
    };
    let value = c_int::try_from(value).unwrap_or(c_int::MAX);
    let mut w = kernel::uaccess::UserSlice::new(arg, core::mem::size_of::<c_int>()).writer();
    match w.write(&value) {
        Ok(()) => 0,
        Err(_) => err(e::EFAULT),
    }
}

/// `XENSOCK_IOC_GRAFT`: this connected stream moves into the calling
/// program's unconnected TCP socket (the preload library connected it to
/// the twin of the TCP port the program asked for); see `afx_graft_tcp`.
/// ENOTCONN: this socket is not a connected stream; EISCONN: it already
/// carries a TCP program's connection.
fn graft(sock: &Socket, xs: &XenSock, arg: usize) -> core::result::Result<(), i32> {
    let req = inet::GraftRequest::read(arg)?;
    if xs.inner.lock().state == State::Listening {
        return graft_listener(sock, xs, &req);
    }
    {
        let mut i = xs.inner.lock();
        if i.state != State::Connected || i.seqpacket {
            return Err(e::ENOTCONN);
        }
        if i.inet.is_some() {
            return Err(e::EISCONN);
        }
        // set before the swap: the program may ask the moment it has it
        i.inet = Some(req.peer.with_local(sys::net::local_ipv4(), i.local.port));
    }
    sock.graft_into_tcp(req.fd, req.peer.family())
        .inspect_err(|_| xs.inner.lock().inet = None)
}

/// `XENSOCK_IOC_GRAFT` on a listener: the dual listener. The calling
/// program's listening TCP socket (`req.fd`) becomes this AF_XEN listener
/// (bound to the twin of its port), which holds the TCP listener and hands
/// out its connections too: co-resident clients over AF_XEN, everyone else
/// over TCP, from one descriptor. EISCONN: this listener holds one already.
fn graft_listener(
    sock: &Socket,
    xs: &XenSock,
    req: &inet::GraftRequest,
) -> core::result::Result<(), i32> {
    if xs.inner.lock().tcp_listener.is_some() {
        return Err(e::EISCONN);
    }
    // its home first: once the swap is done nothing may fail (the
    // program's socket is the AF_XEN listener from then on)
    let slot = kernel::sync::UniqueArc::new_uninit(GFP_KERNEL).map_err(|_| e::ENOMEM)?;
    // what this socket holds once its sock has gone to the program's: a
    // new unbound one (another thread's call on it must find a sock)
    let spare = new_child(xs).ok_or(e::ENOMEM)?;
    if list_socket(&spare).is_err() {
        return Err(discard_child(&spare, e::ENOMEM));
    }
    let held = match sock.graft_listener(req.fd, req.peer.family(), &spare.sk) {
        Ok(h) => h,
        Err(x) => {
            let gone = globals().ports.lock().all.remove(&all_key(&spare));
            drop(gone);
            return Err(discard_child(&spare, x));
        }
    };
    let names = match held.name() {
        Ok((b, n)) => InetNames::listening(req.peer.family(), &b[..n]),
        Err(_) => InetNames::listening(req.peer.family(), req.peer.peer()),
    };
    let held: Arc<sys::net::HeldListener> = slot.write(held).into();
    let mut i = xs.inner.lock();
    i.inet = Some(names);
    i.tcp_listener = Some(held);
    Ok(())
}

fn xs_shutdown(xs: ArcBorrow<'_, XenSock>, how: c_int) -> c_int {
    // how is SHUT_RD (0), SHUT_WR (1), SHUT_RDWR (2)
    if !(0..=2).contains(&how) {
        return err(e::EINVAL);
    }
    let mut i = xs.inner.lock();
    if i.state != State::Connected {
        return err(e::ENOTCONN);
    }
    let mut stream = carrier_of(&i);
    let read = how == 0 || how == 2;
    let write = how == 1 || how == 2;
    i.shut_rd |= read;
    i.shut_wr |= write;
    drop(i);
    stream.carrier().shutdown(&xs, read, write);
    xs.sk.wake(POLLIN | POLLOUT | POLLRDHUP);
    0
}

impl SocketCore for XenSock {
    fn conn_reset(&self, why: impl core::fmt::Display) -> i32 {
        conn_reset(self, why)
    }

    fn find_connected(conn_id: u32) -> Option<(Arc<XenSock>, u64)> {
        let p = globals().ports.lock();
        for (_, xs) in p.all.iter() {
            let i = xs.inner.lock();
            if i.conn_id == conn_id
                && i.link.is_some()
                && i.state == State::Connected
                && !i.released
            {
                return Some((xs.clone(), i.tcp.cookie));
            }
        }
        None
    }
}

/// A proto ring (or record) violation: the connection is reset (never a panic).
pub(crate) fn conn_reset(xs: &XenSock, why: impl core::fmt::Display) -> i32 {
    pr_warn!("connection reset: {}\n", why);
    sys::counters::add(&sys::counters::PROTO_RESETS, 1);
    let (mut stream, tell) = {
        let mut i = xs.inner.lock();
        i.reset = true;
        // over a link the peer hears of it now (its one end message from
        // us, so that it need not lend its ring: see destroy)
        let tell = match &i.link {
            Some(l) if i.state == State::Connected && !i.end_sent && !i.peer_ended => {
                Some((l.clone(), i.peer_conn))
            }
            _ => None,
        };
        if tell.is_some() {
            i.end_sent = true;
        }
        (carrier_of(&i), tell)
    };
    if let Some((link, peer_conn)) = tell {
        let _ = link.send(&crate::proto::ctrl::Message::Reset {
            conn_id: peer_conn,
            reason: crate::proto::ctrl::ResetReason::ProtocolError,
        });
    }
    stream.carrier().reset(xs);
    e::ECONNRESET
}

const MSG_NOSIGNAL: i32 = 0x4000;

/// sendmsg, counted and timed for the data path's cost counters (sys.rs).
fn xs_sendmsg(xs: ArcBorrow<'_, XenSock>, msg: &mut Msg) -> c_int {
    let t = sys::Timer::start();
    let r = xs_sendmsg_untimed(xs, msg);
    sys::counters::add(&sys::counters::SEND_CALLS, 1);
    t.stop(&sys::counters::SEND_NS);
    r
}

fn xs_sendmsg_untimed(xs: ArcBorrow<'_, XenSock>, msg: &mut Msg) -> c_int {
    let flags = msg.flags();
    let epipe = |copied: usize| -> c_int {
        if copied > 0 {
            return copied as c_int;
        }
        if flags & MSG_NOSIGNAL == 0 {
            sys::send_sigpipe();
        }
        err(e::EPIPE)
    };
    let (state, shut_wr, reset, seqpacket, mut stream) = {
        let i = xs.inner.lock();
        (i.state, i.shut_wr, i.reset, i.seqpacket, carrier_of(&i))
    };
    if reset {
        return err(e::ECONNRESET);
    }
    if state != State::Connected {
        return if state == State::Closed {
            epipe(0)
        } else {
            err(e::ENOTCONN)
        };
    }
    if shut_wr {
        return epipe(0);
    }
    if seqpacket {
        let Some(tx) = xs.inner.lock().tx.clone() else {
            return err(e::ENOTCONN);
        };
        tx.set_owner(&xs.sk);
        return seqpacket::sendmsg(&xs, msg, &tx);
    }
    let carrier = stream.carrier();
    let nonblock = flags & bindings::MSG_DONTWAIT as i32 != 0;
    let mut timeo: c_long = xs.sk.sndtimeo(nonblock);
    let total = msg.left();
    let mut copied = 0usize;
    // what went out, or else why nothing did
    let partial = |copied: usize, errno: i32| -> c_int {
        if copied > 0 {
            copied as c_int
        } else {
            err(errno)
        }
    };
    while copied < total {
        // another thread's shutdown(SHUT_WR) ends a blocked write, as TCP's
        if xs.inner.lock().shut_wr {
            return epipe(copied);
        }
        match carrier.send(&xs, msg, total - copied, nonblock) {
            Sent::Bytes(n) => copied += n,
            Sent::Full => {
                if nonblock && copied > 0 {
                    break;
                }
                // non-blocking too: the wait's first look asks the peer to
                // kick once there is room (an edge-triggered poller is
                // woken by nothing else), then says EAGAIN
                if let Err(x) = carrier.wait_writable(&xs, &mut timeo) {
                    return partial(copied, x);
                }
            }
            Sent::Closed => return epipe(copied),
            Sent::Reset => return partial(copied, e::ECONNRESET),
            Sent::Fault => return partial(copied, e::EFAULT),
            Sent::Failed(x) => return partial(copied, x),
        }
    }
    xs.inner.lock().bytes_out += copied as u64;
    copied as c_int
}

/// recvmsg, counted and timed for the data path's cost counters (sys.rs).
fn xs_recvmsg(xs: ArcBorrow<'_, XenSock>, msg: &mut Msg, flags: c_int) -> c_int {
    let t = sys::Timer::start();
    let r = xs_recvmsg_untimed(xs, msg, flags);
    sys::counters::add(&sys::counters::RECV_CALLS, 1);
    t.stop(&sys::counters::RECV_NS);
    r
}

fn xs_recvmsg_untimed(xs: ArcBorrow<'_, XenSock>, msg: &mut Msg, flags: c_int) -> c_int {
    // We queue no socket errors (no timestamps, no zerocopy completions):
    // the error queue is always empty, which recvmsg reports as EAGAIN on
    // every family, rather than reading nothing.
    if flags & bindings::MSG_ERRQUEUE as i32 != 0 {
        return err(e::EAGAIN);
    }
    let (state, reset, peer, seqpacket, mut stream) = {
        let i = xs.inner.lock();
        (i.state, i.reset, i.peer, i.seqpacket, carrier_of(&i))
    };
    if reset {
        return err(e::ECONNRESET);
    }
    match state {
        State::Connected => {}
        State::Closed => return 0,
        _ => return err(e::ENOTCONN),
    }
    if seqpacket {
        let Some(rx) = xs.inner.lock().rx.clone() else {
            return err(e::ENOTCONN);
        };
        rx.set_owner(&xs.sk);
        return seqpacket::recvmsg(&xs, msg, &rx, flags, peer);
    }
    let carrier = stream.carrier();
    let peek = flags & bindings::MSG_PEEK as i32 != 0;
    let waitall = flags & bindings::MSG_WAITALL as i32 != 0 && !peek;
    let nonblock = flags & bindings::MSG_DONTWAIT as i32 != 0;
    let mut timeo: c_long = xs.sk.rcvtimeo(nonblock);
    let total = msg.left();
    // As TCP: a blocking read returns once SO_RCVLOWAT bytes (at most the
    // buffer) are there, MSG_WAITALL once the buffer is full; a
    // non-blocking one returns what there is.
    let target = if waitall {
        total
    } else {
        xs.sk.rcvlowat().clamp(1, total.max(1))
    };
    let partial = |copied: usize, errno: i32| -> c_int {
        if copied > 0 {
            copied as c_int
        } else {
            err(errno)
        }
    };
    let mut copied = 0usize;
    while copied < total {
        if xs.inner.lock().reset {
            return partial(copied, e::ECONNRESET);
        }
        match carrier.recv(&xs, msg, total - copied, peek) {
            Received::Bytes { n, short } => {
                copied += n;
                if peek || short {
                    // MSG_PEEK: what is readable now, never consumed
                    break;
                }
            }
            Received::Empty { eof } => {
                // shut_rd as it is now: another thread's shutdown(SHUT_RD)
                // ends the wait below, and must end this loop too (looked
                // at once before it, the two spun: a soft lockup)
                if eof || copied >= target || xs.inner.lock().shut_rd {
                    break;
                }
                if let Err(x) = carrier.wait_readable(&xs, &mut timeo) {
                    return partial(copied, x);
                }
            }
            Received::Reset => return partial(copied, e::ECONNRESET),
            Received::Fault => return partial(copied, e::EFAULT),
            Received::Failed(x) => return partial(copied, x),
        }
    }
    msg.set_name(&peer.bytes());
    if !peek {
        xs.inner.lock().bytes_in += copied as u64;
    }
    copied as c_int
}

/// The carrier of the connection, as the socket holds it now.
fn carrier_of(i: &Inner) -> Stream {
    Stream::new(i.tx.clone(), i.rx.clone(), i.sw.clone())
}

/// setsockopt() option names at level `family` (xensock.h).
const XENSOCK_TEST_CORRUPT: c_int = 0x7e57;
/// test mode: open this connection's outbound TCP leg (1: right cookie, 2: wrong)
const XENSOCK_TEST_OPEN_LEG: c_int = 0x7e58;
/// test mode: this socket's close sends no Close or Reset, as a peer that
/// never answers (the acceptor's lent ring is then left to the bound)
const XENSOCK_TEST_SILENT_CLOSE: c_int = 0x7e60;
/// benchmark knob: how this connection's ring writes copy (sys::CopyRoutine)
const XENSOCK_COPY_ROUTINE: c_int = 0x7e61;
const XENSOCK_REUSEPORT: c_int = 0x7e62;

fn xs_setsockopt(
    xs: ArcBorrow<'_, XenSock>,
    level: c_int,
    optname: c_int,
    value: &sys::family::SockoptValue,
) -> c_int {
    if level != sys::family() {
        let held = xs.inner.lock().tcp_listener.clone();
        if let Some(held) = held {
            // a dual listener's TCP and IP options are its TCP listener's
            return value.set_on(&held, level, optname);
        }
        return inet_setsockopt(&xs, level, value);
    }
    match optname {
        XENSOCK_TEST_CORRUPT => {
            if !sys::hostile_test() {
                return err(e::EPERM);
            }
            match value.int() {
                Ok(mode) => match corrupt(&xs, mode) {
                    Ok(()) => 0,
                    Err(x) => err(x),
                },
                Err(x) => err(x),
            }
        }
        XENSOCK_TEST_SILENT_CLOSE => {
            if !sys::hostile_test() {
                return err(e::EPERM);
            }
            match value.int() {
                Ok(1) => {
                    xs.inner.lock().end_sent = true;
                    0
                }
                Ok(_) => err(e::EINVAL),
                Err(x) => err(x),
            }
        }
        XENSOCK_TEST_OPEN_LEG => {
            if !sys::hostile_test() {
                return err(e::EPERM);
            }
            match value.int() {
                Ok(m @ (1 | 2)) => {
                    match crate::carrier::switch::test_open_leg(&Arc::from(xs), m == 2) {
                        Ok(()) => 0,
                        Err(x) => err(x),
                    }
                }
                Ok(_) => err(e::EINVAL),
                Err(x) => err(x),
            }
        }
        XENSOCK_REUSEPORT => match value.int() {
            Ok(v) => {
                let mut i = xs.inner.lock();
                if i.bound {
                    // as SO_REUSEPORT: it counts at bind
                    return err(e::EINVAL);
                }
                i.reuse_port = v != 0;
                0
            }
            Err(x) => err(x),
        },
        XENSOCK_COPY_ROUTINE => match value.int().map(sys::CopyRoutine::from_int) {
            Ok(Some(how)) => {
                let (tx, rx) = {
                    let i = xs.inner.lock();
                    (i.tx.clone(), i.rx.clone())
                };
                if tx.is_none() && rx.is_none() {
                    return err(e::ENOTCONN);
                }
                for p in [tx, rx].into_iter().flatten() {
                    p.set_copy_routine(how);
                }
                0
            }
            Ok(None) => err(e::EINVAL),
            Err(x) => err(x),
        },
        _ => err(e::ENOPROTOOPT),
    }
}

const SOL_IP: c_int = 0;
const SOL_TCP: c_int = 6;
const SOL_IPV6: c_int = 41;

/// The TCP and IP options a TCP program sets on its connection
/// (TCP_NODELAY, TCP_KEEPIDLE/INTVL/CNT, IP_TOS, ...) once it rides
/// AF_XEN: accepted, with nothing to do (a ring delays no write, and the
/// switch watches the peer itself); a value too short or unreadable fails
/// as TCP's would.
fn inet_setsockopt(xs: &XenSock, level: c_int, value: &sys::family::SockoptValue) -> c_int {
    if xs.inner.lock().inet.is_none() || !matches!(level, SOL_IP | SOL_TCP | SOL_IPV6) {
        return err(e::ENOPROTOOPT);
    }
    match value.int() {
        Ok(_) => 0,
        Err(x) => err(x),
    }
}

fn xs_getsockopt(
    xs: ArcBorrow<'_, XenSock>,
    level: c_int,
    optname: c_int,
    out: &sys::family::SockoptOut,
) -> c_int {
    if xs.inner.lock().inet.is_none() {
        return err(e::EOPNOTSUPP);
    }
    match out.inet(level, optname) {
        Ok(()) => 0,
        Err(x) => err(x),
    }
}

/// Test mode (hostile_test=1): behave as a hostile peer on this one
/// connection by writing garbage into its shared ring header, then kick.
fn corrupt(xs: &XenSock, mode: i32) -> core::result::Result<(), i32> {
    use crate::proto::ring::{Field, RingMemory};
    use core::sync::atomic::Ordering;
    if mode == 4 {
        // before connect: our ring's directory will name a bogus grant, so
        // the peer's map of our data pages fails
        let mut i = xs.inner.lock();
        if i.state != State::Unbound && i.state != State::Bound {
            return Err(e::EISCONN);
        }
        i.test_bad_directory = true;
        return Ok(());
    }
    let (st, tx, rx) = {
        let i = xs.inner.lock();
        (i.state, i.tx.clone(), i.rx.clone())
    };
    if st != State::Connected {
        return Err(e::ENOTCONN);
    }
    let (Some(tx), Some(rx)) = (tx, rx) else {
        return Err(e::ENOTCONN);
    };
    match mode {
        1 => {
            // the peer reads this ring: a producer index far past its consumer
            let p = tx.tx.lock();
            let m = p.memory();
            let v = m
                .load(Field::Prod, Ordering::Relaxed)
                .wrapping_add(0x4000_0000);
            m.store(Field::Prod, v, Ordering::Release);
            drop(p);
            tx.kick();
        }
        2 => {
            // the peer writes this ring: a consumer index it never produced
            let c = rx.rx.lock();
            let m = c.memory();
            let v = m
                .load(Field::Cons, Ordering::Relaxed)
                .wrapping_sub(0x4000_0000);
            m.store(Field::Cons, v, Ordering::Release);
            drop(c);
            rx.kick();
        }
        3 => {
            let p = tx.tx.lock();
            let m = p.memory();
            let v = m.load(Field::ProdFlags, Ordering::Relaxed) | 0x8000_0000;
            m.store(Field::ProdFlags, v, Ordering::Release);
            drop(p);
            tx.kick();
        }
        5 => {
            // a peer that moves: the ring we write frozen, as before a
            // save, and nothing after it
            let p = tx.tx.lock();
            let m = p.memory();
            let v = m.load(Field::ProdFlags, Ordering::Relaxed)
                | crate::proto::layout::PROD_FLAG_FROZEN;
            m.store(Field::ProdFlags, v, Ordering::Release);
            drop(p);
            tx.kick();
        }
        _ => return Err(e::EINVAL),
    }
    pr_info!(
        "test mode: corrupted the shared ring header of a connection (mode {})\n",
        mode
    );
    Ok(())
}

/// /proc/net/af_xen_tcp: the carrier switch of each connection that has
/// one (`carrier::tcp_show`), taken outside the port table's lock.
pub(crate) fn tcp_show(seq: &mut sys::Seq) {
    seq.write(b"conn dir state ... leg (unacked, wmem, sndbuf: bytes; nospace, writeable: 0/1; owner: AFX_OWNER_* flags, -1 none)\n");
    let mut conns: KVec<(u32, Arc<crate::carrier::switch::Switch>)> = KVec::new();
    {
        let p = globals().ports.lock();
        for (_, xs) in p.all.iter() {
            // taken under the socket's spinlock, pushed after it: the push
            // may allocate, which sleeps
            let entry = {
                let i = xs.inner.lock();
                i.sw.clone().map(|sw| (i.conn_id, sw))
            };
            if let Some(entry) = entry {
                if conns.push(entry, GFP_KERNEL).is_err() {
                    break;
                }
            }
        }
    }
    for (conn, sw) in conns.iter() {
        crate::carrier::switch::tcp_show(*conn, sw, seq);
    }
}

/// /proc/net/af_xen: one line per socket.
pub(crate) fn proc_show(seq: &mut sys::Seq) {
    use core::fmt::Write;
    seq.write(b"state       local            peer             rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier    to_tcp to_ring inet\n");
    let p = globals().ports.lock();
    for (_, xs) in p.all.iter() {
        let (st, local, peer, bound, tx, rx, bin, bout, reset, sw, names) = {
            let i = xs.inner.lock();
            let (local, peer) = current_addrs(&i);
            (
                i.state,
                local,
                peer,
                i.bound,
                i.tx.clone(),
                i.rx.clone(),
                i.bytes_in,
                i.bytes_out,
                i.reset,
                i.sw.clone(),
                i.inet,
            )
        };
        let mut l = Line::new();
        let _ = write!(l, "{:<11} ", st.name());
        if bound || st == State::Connected {
            let _ = write!(l, "{:>5}:{:<10} ", local.domid, local.port);
        } else {
            let _ = write!(l, "{:>5}:{:<10} ", "*", "*");
        }
        if st == State::Connected {
            let _ = write!(l, "{:>5}:{:<10} ", peer.domid, peer.port);
        } else {
            let _ = write!(l, "{:>5}:{:<10} ", "-", "-");
        }
        let (rxs, rxf) = match &rx {
            Some(r) => (r.capacity(), r.rx_state().map(|(n, _)| n).unwrap_or(0)),
            None => (0, 0),
        };
        let (txs, txf) = match &tx {
            Some(t) => (
                t.capacity(),
                t.tx_state()
                    .map(|(free, _)| t.capacity() - free.min(t.capacity()))
                    .unwrap_or(0),
            ),
            None => (0, 0),
        };
        let phase = sw.as_ref().filter(|s| s.is_active()).map(|s| s.phase());
        let carrier = if reset {
            "reset"
        } else if let Some(p) = phase {
            use crate::proto::switch::Phase;
            match p {
                Phase::Ring => "ring-xen",
                Phase::Draining => "draining",
                Phase::Tcp => "tcp",
                Phase::Upgrading => "upgrading",
            }
        } else if tx.as_ref().map(|t| t.is_remote()).unwrap_or(false) {
            "ring-xen"
        } else if tx.is_some() {
            "ring-local"
        } else {
            "-"
        };
        let (to_tcp, to_ring) = sw
            .as_ref()
            .map(|s| {
                (
                    s.to_tcp.load(core::sync::atomic::Ordering::Relaxed),
                    s.to_ring.load(core::sync::atomic::Ordering::Relaxed),
                )
            })
            .unwrap_or((0, 0));
        let _ = write!(
            l,
            "{:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:<10} {:>6} {:>7} ",
            rxs, rxf, txs, txf, bin, bout, carrier, to_tcp, to_ring
        );
        // a TCP program's connection: the peer it asked for (its listener:
        // the address it listens on)
        let _ = match &names {
            Some(n) => writeln!(l, "{}", n.display(st != State::Listening)),
            None => writeln!(l, "-"),
        };
        seq.write(l.bytes());
    }
}
