// SPDX-License-Identifier: GPL-2.0
//! socket options at the AF_XEN level (xensock.h) and the TCP levels a
//! taken-over connection answers.

use super::lifecycle::err;
use crate::carrier::XenSock;
use crate::sock::State;
use crate::sys::{self, errno as e};
use kernel::ffi::c_int;
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

/// setsockopt() option names at level `family` (xensock.h).
const XENSOCK_TEST_CORRUPT: c_int = 0x7e57;
/// test mode: open this connection's outbound TCP leg (1: right cookie, 2: wrong)
const XENSOCK_TEST_OPEN_LEG: c_int = 0x7e58;
/// test mode: this socket's close sends no Close or Reset, as a peer that
/// never answers (the acceptor's lent ring is then left to the bound)
const XENSOCK_TEST_SILENT_CLOSE: c_int = 0x7e60;
/// benchmark knob: how this connection's ring writes copy (sys::CopyRoutine)
const XENSOCK_COPY_ROUTINE: c_int = 0x7e61;
const XENSOCK_REUSEPORT: c_int = 0x7e62;

pub(super) fn xs_setsockopt(
    xs: ArcBorrow<'_, XenSock>,
    level: c_int,
    optname: c_int,
    value: &sys::family::SockoptValue,
) -> c_int {
    if level != sys::family() {
        let held = xs.inner.lock().tcp_listener.clone();
        if let Some(held) = held {
            // a dual listener's TCP and IP options are its TCP listener's
            return value.set_on(&held, level, optname);
        }
        return inet_setsockopt(&xs, level, value);
    }
    match optname {
        XENSOCK_TEST_CORRUPT => {
            if !sys::hostile_test() {
                return err(e::EPERM);
            }
            match value.int() {
                Ok(mode) => match corrupt(&xs, mode) {
                    Ok(()) => 0,
                    Err(x) => err(x),
                },
                Err(x) => err(x),
            }
        }
        XENSOCK_TEST_SILENT_CLOSE => {
            if !sys::hostile_test() {
                return err(e::EPERM);
            }
            match value.int() {
                Ok(1) => {
                    xs.inner.lock().end_sent = true;
                    0
                }
                Ok(_) => err(e::EINVAL),
                Err(x) => err(x),
            }
        }
        XENSOCK_TEST_OPEN_LEG => {
            if !sys::hostile_test() {
                return err(e::EPERM);
            }
            match value.int() {
                Ok(m @ (1 | 2)) => {
                    match crate::carrier::switch::test_open_leg(&Arc::from(xs), m == 2) {
                        Ok(()) => 0,
                        Err(x) => err(x),
                    }
                }
                Ok(_) => err(e::EINVAL),
                Err(x) => err(x),
            }
        }
        XENSOCK_REUSEPORT => match value.int() {
            Ok(v) => {
                let mut i = xs.inner.lock();
                if i.bound {
                    // as SO_REUSEPORT: it counts at bind
                    return err(e::EINVAL);
                }
                i.reuse_port = v != 0;
                0
            }
            Err(x) => err(x),
        },
        XENSOCK_COPY_ROUTINE => match value.int().map(sys::CopyRoutine::from_int) {
            Ok(Some(how)) => {
                let (tx, rx) = {
                    let i = xs.inner.lock();
                    (i.tx.clone(), i.rx.clone())
                };
                if tx.is_none() && rx.is_none() {
                    return err(e::ENOTCONN);
                }
                for p in [tx, rx].into_iter().flatten() {
                    p.set_copy_routine(how);
                }
                0
            }
            Ok(None) => err(e::EINVAL),
            Err(x) => err(x),
        },
        _ => err(e::ENOPROTOOPT),
    }
}

const SOL_IP: c_int = 0;
const SOL_TCP: c_int = 6;
const SOL_IPV6: c_int = 41;

/// The TCP and IP options a TCP program sets on its connection
/// (TCP_NODELAY, TCP_KEEPIDLE/INTVL/CNT, IP_TOS, ...) once it rides
/// AF_XEN: accepted, with nothing to do (a ring delays no write, and the
/// switch watches the peer itself); a value too short or unreadable fails
/// as TCP's would.
fn inet_setsockopt(xs: &XenSock, level: c_int, value: &sys::family::SockoptValue) -> c_int {
    if xs.inner.lock().inet.is_none() || !matches!(level, SOL_IP | SOL_TCP | SOL_IPV6) {
        return err(e::ENOPROTOOPT);
    }
    match value.int() {
        Ok(_) => 0,
        Err(x) => err(x),
    }
}

pub(super) fn xs_getsockopt(
    xs: ArcBorrow<'_, XenSock>,
    level: c_int,
    optname: c_int,
    out: &sys::family::SockoptOut,
) -> c_int {
    if xs.inner.lock().inet.is_none() {
        return err(e::EOPNOTSUPP);
    }
    match out.inet(level, optname) {
        Ok(()) => 0,
        Err(x) => err(x),
    }
}

/// Test mode (hostile_test=1): behave as a hostile peer on this one
/// connection by writing garbage into its shared ring header, then kick.
fn corrupt(xs: &XenSock, mode: i32) -> core::result::Result<(), i32> {
    use crate::proto::ring::{Field, RingMemory};
    use core::sync::atomic::Ordering;
    if mode == 4 {
        // before connect: our ring's directory will name a bogus grant, so
        // the peer's map of our data pages fails
        let mut i = xs.inner.lock();
        if i.state != State::Unbound && i.state != State::Bound {
            return Err(e::EISCONN);
        }
        i.test_bad_directory = true;
        return Ok(());
    }
    let (st, tx, rx) = {
        let i = xs.inner.lock();
        (i.state, i.tx.clone(), i.rx.clone())
    };
    if st != State::Connected {
        return Err(e::ENOTCONN);
    }
    let (Some(tx), Some(rx)) = (tx, rx) else {
        return Err(e::ENOTCONN);
    };
    match mode {
        1 => {
            // the peer reads this ring: a producer index far past its consumer
            let p = tx.tx.lock();
            let m = p.memory();
            let v = m
                .load(Field::Prod, Ordering::Relaxed)
                .wrapping_add(0x4000_0000);
            m.store(Field::Prod, v, Ordering::Release);
            drop(p);
            tx.kick();
        }
        2 => {
            // the peer writes this ring: a consumer index it never produced
            let c = rx.rx.lock();
            let m = c.memory();
            let v = m
                .load(Field::Cons, Ordering::Relaxed)
                .wrapping_sub(0x4000_0000);
            m.store(Field::Cons, v, Ordering::Release);
            drop(c);
            rx.kick();
        }
        3 => {
            let p = tx.tx.lock();
            let m = p.memory();
            let v = m.load(Field::ProdFlags, Ordering::Relaxed) | 0x8000_0000;
            m.store(Field::ProdFlags, v, Ordering::Release);
            drop(p);
            tx.kick();
        }
        5 => {
            // a peer that moves: the ring we write frozen, as before a
            // save, and nothing after it
            let p = tx.tx.lock();
            let m = p.memory();
            let v = m.load(Field::ProdFlags, Ordering::Relaxed)
                | crate::proto::layout::PROD_FLAG_FROZEN;
            m.store(Field::ProdFlags, v, Ordering::Release);
            drop(p);
            tx.kick();
        }
        _ => return Err(e::EINVAL),
    }
    pr_info!(
        "test mode: corrupted the shared ring header of a connection (mode {})\n",
        mode
    );
    Ok(())
}
