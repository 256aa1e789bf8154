// SPDX-License-Identifier: GPL-2.0
//! ioctls: FIONREAD/SIOCOUTQ, this guest's domid, and taking over a TCP
//! program's connection or listener (the preload library).

use super::connect::{discard_child, new_child};
use super::for_carriers::carrier_of;
use super::inet;
use super::lifecycle::err;
use super::table::{all_key, globals, list_socket};
use crate::carrier::{Stream, XenSock};
use crate::link;
use crate::sock::{InetNames, State};
use crate::sys::{self, errno as e, Socket};
use kernel::bindings;
use kernel::ffi::c_int;
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

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

pub(super) fn xs_ioctl(
    sock: &Socket,
    xs: Option<ArcBorrow<'_, XenSock>>,
    cmd: u32,
    arg: usize,
) -> c_int {
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
        Stream::Rings(rings) if cmd == SIOCINQ && seqpacket => rings.next_record_len() as usize,
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
