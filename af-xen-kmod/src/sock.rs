// SPDX-License-Identifier: GPL-2.0
//! AF_XEN SOCK_STREAM sockets: the proto_ops callbacks. Safe Rust over the
//! wrappers in `sys`.

use crate::sys::{self, errno as e, poll::*, Msg, Sk, Socket};
use core::ffi::c_void;
use kernel::bindings;
use kernel::ffi::{c_int, c_long};
use kernel::prelude::*;
use kernel::rbtree::RBTree;
use kernel::sync::{Arc, ArcBorrow, Mutex, SpinLock};
use kernel::{new_mutex, new_spinlock};

/// `struct sockaddr_xen` (xensock.h), 16 bytes.
pub(crate) const SOCKADDR_XEN_LEN: usize = 16;
pub(crate) const PORT_ANY: u32 = u32::MAX;
pub(crate) const DOMID_ANY: u32 = u32::MAX;
pub(crate) const DOMID_SELF: u32 = 0x7FF0;
const EPHEMERAL_FIRST: u32 = 49152;

#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Addr {
    pub(crate) port: u32,
    pub(crate) domid: u32,
}

impl Addr {
    fn parse(p: *const bindings::sockaddr, len: c_int) -> core::result::Result<Addr, i32> {
        let mut b = [0u8; SOCKADDR_XEN_LEN];
        if len < 2 {
            return Err(e::EINVAL);
        }
        // family first: a short sockaddr of another family is e::EAFNOSUPPORT? no:
        // like vsock, any length short of ours is e::EINVAL.
        if !sys::read_sockaddr(p, len, &mut b) {
            return Err(e::EINVAL);
        }
        let fam = u16::from_ne_bytes([b[0], b[1]]);
        if fam as i32 != sys::family() {
            return Err(e::EAFNOSUPPORT);
        }
        let flags = u16::from_ne_bytes([b[2], b[3]]);
        if flags != 0 || b[12..16] != [0, 0, 0, 0] {
            return Err(e::EINVAL);
        }
        Ok(Addr {
            port: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            domid: u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
        })
    }
    pub(crate) fn bytes(&self) -> [u8; SOCKADDR_XEN_LEN] {
        let mut b = [0u8; SOCKADDR_XEN_LEN];
        b[0..2].copy_from_slice(&(sys::family() as u16).to_ne_bytes());
        b[4..8].copy_from_slice(&self.port.to_ne_bytes());
        b[8..12].copy_from_slice(&self.domid.to_ne_bytes());
        b
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Unbound,
    Bound,
    Listening,
    Connecting,
    Connected,
    Closed,
}

impl State {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            State::Unbound => "UNBOUND",
            State::Bound => "BOUND",
            State::Listening => "LISTEN",
            State::Connecting => "CONNECTING",
            State::Connected => "ESTABLISHED",
            State::Closed => "CLOSED",
        }
    }
}

pub(crate) struct Inner {
    pub(crate) state: State,
    pub(crate) local: Addr,
    pub(crate) peer: Addr,
    pub(crate) bound: bool,
    pub(crate) backlog: u32,
    pub(crate) accept_q: KVec<Arc<XenSock>>,
    pub(crate) shut_rd: bool,
    pub(crate) shut_wr: bool,
    pub(crate) released: bool,
}

#[pin_data]
pub(crate) struct XenSock {
    pub(crate) sk: Sk,
    #[pin]
    pub(crate) inner: SpinLock<Inner>,
}

impl XenSock {
    fn new(sk: Sk) -> Result<Arc<XenSock>> {
        Arc::pin_init(
            pin_init!(XenSock {
                sk,
                inner <- new_spinlock!(Inner {
                    state: State::Unbound,
                    local: Addr { port: PORT_ANY, domid: DOMID_ANY },
                    peer: Addr::default(),
                    bound: false,
                    backlog: 0,
                    accept_q: KVec::new(),
                    shut_rd: false,
                    shut_wr: false,
                    released: false,
                }, "af_xen_sock"),
            }),
            GFP_KERNEL,
        )
    }
}

/// Module-wide state: the port table and our domid.
#[pin_data]
pub(crate) struct Globals {
    pub(crate) own_domid: u32,
    #[pin]
    pub(crate) ports: Mutex<Ports>,
}

pub(crate) struct Ports {
    pub(crate) map: RBTree<u32, Arc<XenSock>>,
    next_ephemeral: u32,
    /// every live socket, for /proc/net/af_xen (id -> socket)
    pub(crate) all: RBTree<usize, Arc<XenSock>>,
}

impl Globals {
    pub(crate) fn new(own_domid: u32) -> impl PinInit<Self, Error> {
        try_pin_init!(Globals {
            own_domid,
            ports <- new_mutex!(Ports {
                map: RBTree::new(),
                next_ephemeral: EPHEMERAL_FIRST,
                all: RBTree::new(),
            }, "af_xen_ports"),
        })
    }
}

static GLOBALS: core::sync::atomic::AtomicPtr<Globals> = core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());
static OPS: core::sync::atomic::AtomicPtr<sys::Ops> = core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());

/// Publishes the module's globals and ops for the callbacks. They live in
/// the module object, which outlives every socket (each socket holds a
/// module reference).
pub(crate) fn publish(g: &Globals, ops: &sys::Ops) {
    use core::sync::atomic::Ordering;
    GLOBALS.store(g as *const _ as *mut _, Ordering::Release);
    OPS.store(ops as *const _ as *mut _, Ordering::Release);
}
pub(crate) fn unpublish() {
    use core::sync::atomic::Ordering;
    GLOBALS.store(core::ptr::null_mut(), Ordering::Release);
    OPS.store(core::ptr::null_mut(), Ordering::Release);
}

fn globals() -> &'static Globals {
    // Callbacks only run between publish() and unpublish().
    sys::static_ref(GLOBALS.load(core::sync::atomic::Ordering::Acquire))
}

fn ops() -> &'static sys::Ops {
    sys::static_ref(OPS.load(core::sync::atomic::Ordering::Acquire))
}

pub(crate) fn build_ops(module: &'static ThisModule, family: i32) -> sys::Ops {
    let mut o = bindings::proto_ops::default();
    o.family = family;
    o.owner = module.as_ptr();
    o.release = Some(xs_release);
    o.bind = Some(xs_bind);
    o.connect = Some(xs_connect);
    o.socketpair = Some(xs_socketpair);
    o.accept = Some(xs_accept);
    o.getname = Some(xs_getname);
    o.poll = Some(xs_poll);
    o.listen = Some(xs_listen);
    o.shutdown = Some(xs_shutdown);
    o.sendmsg = Some(xs_sendmsg);
    o.recvmsg = Some(xs_recvmsg);
    sys::Ops(o)
}

fn err(e: i32) -> c_int {
    -e
}

/// The XenSock attached to a socket for the duration of a callback.
fn xsock(sock: Socket) -> Option<ArcBorrow<'static, XenSock>> {
    let sk = sock.sk()?;
    sys::arc_borrow::<XenSock>(sk.privp())
}

// ---- create / release ------------------------------------------------------

pub(crate) unsafe extern "C" fn xs_create(
    net: *mut bindings::net,
    sock: *mut bindings::socket,
    protocol: c_int,
    kern: c_int,
) -> c_int {
    // SAFETY: called by __sock_create with a live socket.
    let sock = unsafe { Socket::from_raw(sock) };
    if protocol != 0 {
        return err(e::EPROTONOSUPPORT);
    }
    if sock.type_() != bindings::sock_type_SOCK_STREAM as i32 {
        return err(e::ESOCKTNOSUPPORT);
    }
    sock.set_ops(ops());
    let sk = match sock.alloc_sk(net, kern, core::ptr::null()) {
        Some(sk) => sk,
        None => return err(e::ENOMEM),
    };
    let xs = match XenSock::new(sk) {
        Ok(x) => x,
        Err(_) => {
            sock.release_sk();
            return err(e::ENOMEM);
        }
    };
    {
        let mut p = globals().ports.lock();
        let key = &*xs as *const XenSock as usize;
        if p.all.try_create_and_insert(key, xs.clone(), GFP_KERNEL).is_err() {
            drop(p);
            sock.release_sk();
            return err(e::ENOMEM);
        }
    }
    sk.set_privp(Arc::into_raw(xs) as *const c_void);
    0
}

/// Forgets a socket everywhere (port table, listing) and tears it down.
fn destroy(xs: &Arc<XenSock>) {
    let children = {
        let mut i = xs.inner.lock();
        i.released = true;
        i.state = State::Closed;
        core::mem::replace(&mut i.accept_q, KVec::new())
    };
    {
        let mut p = globals().ports.lock();
        let (port, bound) = {
            let i = xs.inner.lock();
            (i.local.port, i.bound)
        };
        if bound {
            let mine = p.map.get(&port).map(|o| Arc::ptr_eq(o, xs)).unwrap_or(false);
            if mine {
                p.map.remove(&port);
            }
        }
        p.all.remove(&(&**xs as *const XenSock as usize));
    }
    // Children that were never accepted: close them too.
    for c in children.into_iter() {
        let sk = c.sk;
        let p = sk.privp();
        sk.set_privp(core::ptr::null());
        drop(sys::arc_take::<XenSock>(p));
        destroy(&c);
        sk.put();
    }
    xs.sk.wake(POLLIN | POLLOUT | POLLHUP | POLLERR);
}

unsafe extern "C" fn xs_release(sock: *mut bindings::socket) -> c_int {
    // SAFETY: live socket in release().
    let sock = unsafe { Socket::from_raw(sock) };
    let sk = match sock.sk() {
        Some(sk) => sk,
        None => return 0,
    };
    let p = sk.privp();
    sk.set_privp(core::ptr::null());
    if let Some(xs) = sys::arc_take::<XenSock>(p) {
        destroy(&xs);
        drop(xs);
    }
    sock.release_sk();
    0
}

// ---- bind / listen / getname -------------------------------------------------

fn domid_ok(domid: u32) -> bool {
    domid == DOMID_ANY || domid == DOMID_SELF || domid == globals().own_domid
}

/// Binds `xs` to `port` (PORT_ANY: ephemeral). Caller checked the state.
fn do_bind(xs: &Arc<XenSock>, port: u32) -> core::result::Result<(), i32> {
    let mut p = globals().ports.lock();
    let port = if port == PORT_ANY {
        let mut tries = 0u32;
        loop {
            let cand = p.next_ephemeral;
            p.next_ephemeral = if cand >= 0x7FFF_FFFF { EPHEMERAL_FIRST } else { cand + 1 };
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
            return Err(e::EADDRINUSE);
        }
        port
    };
    p.map.try_create_and_insert(port, xs.clone(), GFP_KERNEL).map_err(|_| e::ENOMEM)?;
    let mut i = xs.inner.lock();
    i.local = Addr { port, domid: globals().own_domid };
    i.bound = true;
    if i.state == State::Unbound {
        i.state = State::Bound;
    }
    Ok(())
}

unsafe extern "C" fn xs_bind(sock: *mut bindings::socket, addr: *mut bindings::sockaddr, len: c_int) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    let a = match Addr::parse(addr, len) {
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

unsafe extern "C" fn xs_listen(sock: *mut bindings::socket, backlog: c_int) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    let xs: Arc<XenSock> = xs.into();
    let st = xs.inner.lock().state;
    match st {
        State::Unbound => {
            if let Err(e) = do_bind(&xs, PORT_ANY) {
                return err(e);
            }
        }
        State::Bound | State::Listening => {}
        _ => return err(e::EINVAL),
    }
    let mut i = xs.inner.lock();
    i.backlog = backlog.clamp(1, 4096) as u32;
    i.state = State::Listening;
    0
}

unsafe extern "C" fn xs_getname(sock: *mut bindings::socket, addr: *mut bindings::sockaddr, peer: c_int) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    let i = xs.inner.lock();
    let a = if peer != 0 {
        if i.state != State::Connected {
            return err(e::ENOTCONN);
        }
        i.peer
    } else if i.bound {
        i.local
    } else {
        Addr { port: PORT_ANY, domid: DOMID_ANY }
    };
    drop(i);
    sys::write_sockaddr(addr, &a.bytes());
    SOCKADDR_XEN_LEN as c_int
}

// ---- connect / accept --------------------------------------------------------

unsafe extern "C" fn xs_connect(
    sock: *mut bindings::socket,
    addr: *mut bindings::sockaddr,
    len: c_int,
    _flags: c_int,
) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    let a = match Addr::parse(addr, len) {
        Ok(a) => a,
        Err(e) => return err(e),
    };
    let st = xs.inner.lock().state;
    match st {
        State::Connected => return err(e::EISCONN),
        State::Connecting => return err(e::EALREADY),
        State::Listening | State::Closed => return err(e::EINVAL),
        _ => {}
    }
    if a.port == PORT_ANY || a.domid == DOMID_ANY {
        return err(e::EINVAL);
    }
    if a.domid == DOMID_SELF || a.domid == globals().own_domid {
        // No loopback carrier yet: nobody can be listening on a link to us.
        return err(e::ECONNREFUSED);
    }
    // The inter-domain link is not implemented yet.
    err(e::EHOSTUNREACH)
}

unsafe extern "C" fn xs_accept(
    sock: *mut bindings::socket,
    newsock: *mut bindings::socket,
    arg: *mut bindings::proto_accept_arg,
) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    // SAFETY: live socket (freshly allocated by the core).
    let newsock = unsafe { Socket::from_raw(newsock) };
    let flags = sys::accept_flags(arg);
    if xs.inner.lock().state != State::Listening {
        return err(e::EINVAL);
    }
    let nonblock = flags & (bindings::O_NONBLOCK as i32) != 0;
    let mut timeo: c_long = xs.sk.rcvtimeo(nonblock);
    let mut child: Option<Arc<XenSock>> = None;
    let r = xs.sk.wait(&mut timeo, || {
        let mut i = xs.inner.lock();
        if i.state != State::Listening {
            return true;
        }
        if !i.accept_q.is_empty() {
            child = Some(sys::vec_remove(&mut i.accept_q, 0));
            return true;
        }
        false
    });
    if let Err(e) = r {
        return err(e);
    }
    let Some(child) = child else { return err(e::EINVAL) };
    newsock.graft(child.sk);
    newsock.set_connected(true);
    // The child's sk already carries its Arc in priv (see the connection code).
    drop(child);
    0
}

unsafe extern "C" fn xs_socketpair(_a: *mut bindings::socket, _b: *mut bindings::socket) -> c_int {
    err(e::EOPNOTSUPP)
}

// ---- poll / shutdown / data --------------------------------------------------

unsafe extern "C" fn xs_poll(
    file: *mut bindings::file,
    sock: *mut bindings::socket,
    wait: *mut bindings::poll_table_struct,
) -> bindings::__poll_t {
    // SAFETY: live socket.
    let s = unsafe { Socket::from_raw(sock) };
    s.poll_wait(file, wait);
    let Some(xs) = xsock(s) else { return POLLERR };
    let i = xs.inner.lock();
    let mut mask = 0;
    match i.state {
        State::Listening => {
            if !i.accept_q.is_empty() {
                mask |= POLLIN | POLLRDNORM;
            }
        }
        State::Unbound | State::Bound => mask |= POLLOUT | POLLWRNORM | POLLHUP,
        State::Closed => mask |= POLLHUP | POLLIN | POLLRDNORM | POLLRDHUP,
        State::Connecting => {}
        State::Connected => {
            if i.shut_rd {
                mask |= POLLIN | POLLRDNORM | POLLRDHUP;
            }
            if i.shut_rd && i.shut_wr {
                mask |= POLLHUP;
            }
        }
    }
    mask
}

unsafe extern "C" fn xs_shutdown(sock: *mut bindings::socket, how: c_int) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    // how is SHUT_RD (0), SHUT_WR (1), SHUT_RDWR (2)
    if !(0..=2).contains(&how) {
        return err(e::EINVAL);
    }
    let mut i = xs.inner.lock();
    if i.state != State::Connected {
        return err(e::ENOTCONN);
    }
    if how == 0 || how == 2 {
        i.shut_rd = true;
    }
    if how == 1 || how == 2 {
        i.shut_wr = true;
    }
    drop(i);
    xs.sk.wake(POLLIN | POLLOUT | POLLRDHUP);
    0
}

unsafe extern "C" fn xs_sendmsg(sock: *mut bindings::socket, msg: *mut bindings::msghdr, _len: usize) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    // SAFETY: live msghdr of this call.
    let _msg = unsafe { Msg::from_raw(msg) };
    let st = xs.inner.lock().state;
    match st {
        State::Connected => err(e::EPIPE),
        _ => err(e::ENOTCONN),
    }
}

unsafe extern "C" fn xs_recvmsg(
    sock: *mut bindings::socket,
    msg: *mut bindings::msghdr,
    _len: usize,
    _flags: c_int,
) -> c_int {
    // SAFETY: live socket.
    let Some(xs) = xsock(unsafe { Socket::from_raw(sock) }) else { return err(e::EINVAL) };
    // SAFETY: live msghdr of this call.
    let _msg = unsafe { Msg::from_raw(msg) };
    let st = xs.inner.lock().state;
    match st {
        State::Connected | State::Closed => 0,
        _ => err(e::ENOTCONN),
    }
}
