// SPDX-License-Identifier: GPL-2.0
//! The lab's test modes as socket options (xensock-lab.h), built only with
//! the test hooks (cfg `afx_test_hooks`) and refused with EPERM unless the
//! module was loaded with `hostile_test=1`: a socket plays a hostile peer
//! on its own connection.

use super::lifecycle::err;
use crate::carrier::XenSock;
use crate::sock::State;
use crate::sys::{self, errno as e};
use kernel::ffi::c_int;
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

/// test mode: write garbage into this connection's shared ring header
const XENSOCK_TEST_CORRUPT: c_int = 0x7e57;
/// test mode: open this connection's outbound TCP leg (1: right cookie, 2: wrong)
const XENSOCK_TEST_OPEN_LEG: c_int = 0x7e58;
/// test mode: this socket's close sends no Close or Reset, as a peer that
/// never answers (the acceptor's lent ring is then left to the bound)
const XENSOCK_TEST_SILENT_CLOSE: c_int = 0x7e60;

/// A test mode's setsockopt at the AF_XEN level, or None for any other
/// option.
pub(super) fn setsockopt(
    xs: ArcBorrow<'_, XenSock>,
    optname: c_int,
    value: &sys::family::SockoptValue,
) -> Option<c_int> {
    Some(match optname {
        XENSOCK_TEST_CORRUPT => {
            if !sys::test_hooks::hostile_test() {
                return Some(err(e::EPERM));
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
            if !sys::test_hooks::hostile_test() {
                return Some(err(e::EPERM));
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
            if !sys::test_hooks::hostile_test() {
                return Some(err(e::EPERM));
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
        _ => return None,
    })
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
