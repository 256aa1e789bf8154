// SPDX-License-Identifier: GPL-2.0
//! What the carriers ask of the socket core (`carrier::SocketCore`): a
//! connection that broke the protocol is reset, and a connection is found by
//! its id (a TCP leg's hello names it); the carrier a call goes through.

use super::table::globals;
use crate::carrier::{Inner, SocketCore, Stream, XenSock};
use crate::sock::State;
use crate::sys;
use crate::sys::errno as e;
use kernel::prelude::*;
use kernel::sync::Arc;

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

/// The carrier of the connection, as the socket holds it now.
pub(super) fn carrier_of(i: &Inner) -> Stream {
    Stream::new(i.tx.clone(), i.rx.clone(), i.sw.clone())
}
