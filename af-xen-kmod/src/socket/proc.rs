// SPDX-License-Identifier: GPL-2.0
//! /proc/net/af_xen and /proc/net/af_xen_tcp.

use super::bind::current_addrs;
use super::table::globals;
use crate::carrier::show;
use crate::sock::State;
use crate::sys::{self, Line};
use kernel::prelude::*;

/// /proc/net/af_xen_tcp: the carrier switch of each connection that has
/// one (`carrier::show`), taken outside the port table's lock.
pub(crate) fn tcp_show(seq: &mut sys::Seq) {
    seq.write(b"conn dir state ... leg (unacked, wmem, sndbuf: bytes; nospace, writeable: 0/1; owner: AFX_OWNER_* flags, -1 none)\n");
    let mut conns: KVec<(u32, show::Shows)> = KVec::new();
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
        show::show_tcp(*conn, sw, seq);
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
        let c = show::show(tx.as_ref(), rx.as_ref(), sw.as_ref(), reset);
        let _ = write!(
            l,
            "{:>7} {:>7} {:>7} {:>7} {:>8} {:>9} {:<10} {:>6} {:>7} ",
            c.rx_size, c.rx_fill, c.tx_size, c.tx_fill, bin, bout, c.name, c.to_tcp, c.to_ring
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
