// SPDX-License-Identifier: GPL-2.0
//! A socket's life: created, listed, and destroyed at release (or when a
//! connection it was to become never completes).

use super::table::{all_key, globals, list_socket, ops};
use crate::carrier::{Stream, XenSock};
use crate::link;
use crate::sock::State;
use crate::sys::{self, errno as e, poll::*, Socket};
use kernel::bindings;
use kernel::ffi::c_int;
use kernel::prelude::*;
use kernel::sync::Arc;

/// The AF_XEN family (`sys::family::Family`): its callbacks are in
/// `socket/mod.rs`; a socket's `struct sock` carries an `Arc<XenSock>` for it.
pub(crate) struct XenFamily;

pub(super) fn err(e: i32) -> c_int {
    -e
}

pub(super) fn xs_create(
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

/// Forgets a socket everywhere (port table, listing) and tears it down.
pub(super) fn destroy(xs: &Arc<XenSock>) {
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
    // (kept pending until the peer unmaps it: af_xen_xen.c), except that an
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

pub(super) fn xs_release(state: Option<Arc<XenSock>>) {
    if let Some(xs) = state {
        destroy(&xs);
        drop(xs);
    }
}
