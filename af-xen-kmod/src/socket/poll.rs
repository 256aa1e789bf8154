// SPDX-License-Identifier: GPL-2.0
//! poll: a socket's readiness from its state and its carrier.

use super::for_carriers::carrier_of;
use crate::carrier::{Stream, XenSock};
use crate::sock::State;
use crate::sys::poll::*;
use kernel::sync::ArcBorrow;

pub(super) fn xs_poll(xs: Option<ArcBorrow<'_, XenSock>>) -> u32 {
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
                Stream::Rings(rings) if seqpacket => rings.record_readiness(&xs),
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
