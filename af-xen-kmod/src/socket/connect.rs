// SPDX-License-Identifier: GPL-2.0
//! connect and accept: over a link (the ConnectRequest/ConnectAccept
//! handshake, the work item's half) and on loopback; a listener's children.

use super::bind::bind_if_unbound;
use super::lifecycle::{destroy, err, XenFamily};
use super::table::{globals, list_socket};
use crate::carrier::setup;
use crate::carrier::{Link, XenSock};
use crate::link;
use crate::sock::{Addr, State, DOMID_ANY, DOMID_SELF, PORT_ANY};
use crate::sys::{self, errno as e, poll::*, Socket};
use kernel::bindings;
use kernel::ffi::{c_int, c_long};
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

pub(super) fn xs_connect(
    sock: &Socket,
    xs: ArcBorrow<'_, XenSock>,
    addr: &[u8],
    flags: c_int,
) -> c_int {
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
    let offer = setup::offer(&xs.sk, &link, me, conn_id, stream)?;
    #[cfg(afx_test_hooks)]
    if xs.inner.lock().test_bad_directory {
        offer.rx.test_spoil_directory();
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
        i.tcp = offer.tcp;
        i.connect_deadline_ms = crate::sys::net::now_ms() + CONNECT_TIMEOUT_MS as u64;
        (
            i.rx.replace(offer.rx),
            i.link.replace(link.clone()),
            i.request.replace(offer.grant),
            core::mem::replace(&mut i.sw, offer.sw),
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
    let setup::Accepted {
        tx,
        rx,
        grant: rx_grant,
        sw,
    } = match setup::accept(&child.sk, link, me, my_id, rg, peer_conn, !seqpacket) {
        Ok(a) => a,
        Err(setup::NotAccepted::NoResources) => return Err(discard_child(&child, R::NoResources)),
        Err(setup::NotAccepted::BadRing) => return Err(discard_child(&child, R::BadRequest)),
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
pub(super) fn new_child(l: &XenSock) -> Option<Arc<XenSock>> {
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
pub(super) fn discard_child<T>(child: &Arc<XenSock>, why: T) -> T {
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
    match setup::peer_ring(link, me, rg, acceptor_id) {
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
    let (to_child, to_me) =
        setup::loopback(xs, &child, me, port).map_err(|x| discard_child(&child, x))?;
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

pub(super) fn xs_accept(xs: ArcBorrow<'_, XenSock>, newsock: &Socket, flags: i32) -> c_int {
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
