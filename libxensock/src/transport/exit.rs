// SPDX-License-Identifier: MIT OR Apache-2.0
//! The process's exit: every transport still alive ends its connections
//! as dropping it would.

use std::sync::{Arc, Mutex, Weak};

use super::{lock, sys, Inner, GLOBAL};

/// Every transport of the process, for the exit hook: a process may end
/// with `exit` (or return from `main` holding a transport in a static)
/// without dropping its transports.
static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Registers the exit hook once, the first time a transport starts.
static EXIT_HOOK: std::sync::Once = std::sync::Once::new();

/// Lists `inner` for the exit hook (registered with the first transport).
pub(super) fn end_at_process_exit(inner: &Arc<Inner>) {
    let mut live = lock(&LIVE);
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(inner));
    drop(live);
    EXIT_HOOK.call_once(|| {
        if !sys::at_exit(at_process_exit) {
            tracing::warn!("no exit hook: connections reset when the process exits");
        }
    });
}

/// `atexit` hook: the orderly part of dropping each transport still alive
/// (connections ended, links down, XenStore nodes withdrawn, the
/// process-wide transport's control socket removed).
extern "C" fn at_process_exit() {
    if let Some(t) = GLOBAL.get() {
        if let Ok(mut c) = t.owner.control.try_lock() {
            c.take();
        }
    }
    // (a thread starting a transport holds the list for a moment)
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    let live: Vec<Arc<Inner>> = match super::connections::lock_by(&LIVE, deadline) {
        Some(v) => v.iter().filter_map(Weak::upgrade).collect(),
        None => return,
    };
    for inner in live {
        inner.end_at_exit();
    }
}
