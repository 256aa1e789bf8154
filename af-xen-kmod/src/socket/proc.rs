// SPDX-License-Identifier: GPL-2.0
//! /proc/net/af_xen and /proc/net/af_xen_tcp.

use super::bind::current_addrs;
use super::table::globals;
use crate::sock::State;
use crate::sys::{self, Line};
use kernel::prelude::*;
use kernel::sync::Arc;

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
