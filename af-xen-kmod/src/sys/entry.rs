// SPDX-License-Identifier: GPL-2.0
//! What the C glue calls into: work items, /proc files and the PM hooks.
//!
//! The floor calls nothing above it. The layers above hand it their entry
//! points once, at load ([`install`], before anything that can call them
//! is registered); the glue's `afx_rs_*` symbols reach them through that
//! table.

use super::{show_counters, Seq};
use core::sync::atomic::{AtomicPtr, Ordering};
use kernel::bindings;
use kernel::ffi::c_int;

/// The module's entry points, one per `afx_rs_*` symbol of the glue.
pub(crate) struct EntryPoints {
    /// The link work item: control rings, handshakes, waking sockets.
    pub(crate) link_work: fn(),
    /// The delayed work item that ends grants a dead peer never released.
    pub(crate) link_reap: fn(),
    /// The TCP legs' work item: socket events and deadlines.
    pub(crate) leg_work: fn(),
    /// This guest is about to be saved (PM freeze).
    pub(crate) suspend: fn(),
    /// This guest runs again: `true` after a restore, `false` after a thaw.
    pub(crate) resume: fn(bool),
    /// `/proc/net/af_xen`.
    pub(crate) proc_show: fn(&mut Seq),
    /// `/proc/net/af_xen_tcp`.
    pub(crate) tcp_show: fn(&mut Seq),
    /// The layers' lines of `/proc/net/af_xen_stats`, after the floor's.
    pub(crate) stats_show: fn(&mut Seq),
}

static ENTRY: AtomicPtr<EntryPoints> = AtomicPtr::new(core::ptr::null_mut());

/// Hands the floor the module's entry points (module init, first).
pub(crate) fn install(entry: &'static EntryPoints) {
    ENTRY.store(
        entry as *const EntryPoints as *mut EntryPoints,
        Ordering::Release,
    );
}

fn entry() -> Option<&'static EntryPoints> {
    let p = ENTRY.load(Ordering::Acquire);
    // SAFETY: `ENTRY` only ever holds null or the `&'static EntryPoints`
    // given to `install`, which is never written through.
    unsafe { p.cast_const().as_ref() }
}

#[no_mangle]
extern "C" fn afx_rs_work() {
    if let Some(e) = entry() {
        (e.link_work)();
    }
}

#[no_mangle]
extern "C" fn afx_rs_reap() {
    if let Some(e) = entry() {
        (e.link_reap)();
    }
}

#[no_mangle]
extern "C" fn afx_rs_tcp_work() {
    if let Some(e) = entry() {
        (e.leg_work)();
    }
}

#[no_mangle]
extern "C" fn afx_rs_suspend() {
    if let Some(e) = entry() {
        (e.suspend)();
    }
}

#[no_mangle]
extern "C" fn afx_rs_resume(restored: c_int) {
    if let Some(e) = entry() {
        (e.resume)(restored != 0);
    }
}

#[no_mangle]
extern "C" fn afx_rs_proc_show(m: *mut bindings::seq_file) -> c_int {
    if let Some(e) = entry() {
        (e.proc_show)(&mut Seq(m));
    }
    0
}

#[no_mangle]
extern "C" fn afx_rs_tcp_show(m: *mut bindings::seq_file) -> c_int {
    if let Some(e) = entry() {
        (e.tcp_show)(&mut Seq(m));
    }
    0
}

#[no_mangle]
extern "C" fn afx_rs_stats_show(m: *mut bindings::seq_file) -> c_int {
    let mut seq = Seq(m);
    show_counters(&mut seq);
    if let Some(e) = entry() {
        (e.stats_show)(&mut seq);
    }
    0
}
