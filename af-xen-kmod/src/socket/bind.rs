// SPDX-License-Identifier: GPL-2.0
//! bind, listen, getsockname/getpeername: a socket's own address and
//! the port table's part in it.

use super::lifecycle::err;
use super::table::{globals, EPHEMERAL_FIRST};
use crate::carrier::{Inner, XenSock};
use crate::link;
use crate::sock::{Addr, State, DOMID_ANY, DOMID_SELF, PORT_ANY};
use crate::sys::errno as e;
use kernel::ffi::c_int;
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

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
pub(super) fn bind_if_unbound(xs: &Arc<XenSock>) -> core::result::Result<(), i32> {
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

pub(super) fn xs_bind(xs: ArcBorrow<'_, XenSock>, addr: &[u8]) -> c_int {
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

pub(super) fn xs_listen(xs: ArcBorrow<'_, XenSock>, backlog: c_int) -> c_int {
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
pub(super) fn current_addrs(i: &Inner) -> (Addr, Addr) {
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

pub(super) fn xs_getname(
    xs: ArcBorrow<'_, XenSock>,
    peer: bool,
) -> core::result::Result<SockName, i32> {
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
