// SPDX-License-Identifier: GPL-2.0
//! shutdown and the stream data calls over the connection's carrier;
//! a connection reset.

use super::for_carriers::carrier_of;
use super::lifecycle::err;
use super::seqpacket;
use crate::carrier::{Received, Sent, Stream, XenSock};
use crate::sock::State;
use crate::sys::{self, errno as e, poll::*, Msg};
use kernel::bindings;
use kernel::ffi::{c_int, c_long};
use kernel::sync::ArcBorrow;

pub(super) fn xs_shutdown(xs: ArcBorrow<'_, XenSock>, how: c_int) -> c_int {
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

const MSG_NOSIGNAL: i32 = 0x4000;

/// sendmsg, counted and timed for the data path's cost counters (sys/counters.rs).
pub(super) fn xs_sendmsg(xs: ArcBorrow<'_, XenSock>, msg: &mut Msg) -> c_int {
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
        let Stream::Rings(rings) = &mut stream else {
            return err(e::ENOTCONN);
        };
        return seqpacket::sendmsg(&xs, msg, rings);
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

/// recvmsg, counted and timed for the data path's cost counters (sys/counters.rs).
pub(super) fn xs_recvmsg(xs: ArcBorrow<'_, XenSock>, msg: &mut Msg, flags: c_int) -> c_int {
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
        let Stream::Rings(rings) = &mut stream else {
            return err(e::ENOTCONN);
        };
        return seqpacket::recvmsg(&xs, msg, rings, flags, peer);
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
