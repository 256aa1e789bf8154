// SPDX-License-Identifier: GPL-2.0
//! socket options at the AF_XEN level (xensock.h) and the TCP levels a
//! taken-over connection answers.

use super::lifecycle::err;
use crate::carrier::XenSock;
use crate::sys::{self, errno as e};
use kernel::ffi::c_int;
use kernel::sync::ArcBorrow;

/// setsockopt() option names at level `family` (xensock.h; the test modes'
/// are in `test_modes.rs`, only in the lab's build).
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
    #[cfg(afx_test_hooks)]
    if let Some(r) = super::test_modes::setsockopt(xs, optname, value) {
        return r;
    }
    match optname {
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
