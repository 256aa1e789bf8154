// SPDX-License-Identifier: MIT OR Apache-2.0
//! The carrier switches' driver threads: a small fixed pool, shared by every
//! switch of the process, instead of one thread per moved connection.
//!
//! Each pool thread serves the switches attached to it with one `poll(2)`
//! over all their descriptors (wake eventfd, ring doorbell, TCP legs) and
//! the earliest of their deadlines. After the poll it steps only the
//! switches that had an event or whose deadline passed. A switch's step
//! never blocks on I/O (the legs are non-blocking); it takes the switch's
//! own direction locks, which applications hold only briefly.

use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::Instant;

use super::leg::lock;
use crate::sys::eventfd::EventFd;

/// At most this many driver threads per process (fewer on fewer CPUs).
pub(crate) const MAX_DRIVER_THREADS: usize = 4;

/// What a pool thread needs from a switch.
pub(crate) trait Driven: Send + Sync {
    /// Appends the descriptors to wait on now (with their events) to
    /// `fds`; returns the switch's next deadline, if any.
    fn interest(&self, fds: &mut Vec<libc::pollfd>) -> Option<Instant>;
    /// After the poll: `fds` are the entries `interest` appended, with
    /// their `revents`.
    fn step(&self, fds: &[libc::pollfd]);
}

struct Entry {
    switch: Arc<dyn Driven>,
    /// Detached: never called again.
    retired: AtomicBool,
    /// Held by the pool thread across each call into the switch, so that
    /// a detach can wait for a call in progress.
    busy: Mutex<()>,
}

struct Worker {
    wake: EventFd,
    entries: Mutex<Vec<Arc<Entry>>>,
    attached: AtomicUsize,
    thread: OnceLock<ThreadId>,
}

struct Pool {
    workers: Mutex<Vec<Arc<Worker>>>,
    size: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        workers: Mutex::new(Vec::new()),
        size: std::thread::available_parallelism()
            .map_or(2, usize::from)
            .clamp(1, MAX_DRIVER_THREADS),
    })
}

/// A switch's place in the pool; `detach` (or drop) takes it out.
pub(crate) struct Attachment {
    worker: Arc<Worker>,
    entry: Arc<Entry>,
}

/// Serves `switch` from the pool (starting a pool thread if the pool is
/// not full yet) until the returned attachment is detached.
pub(crate) fn attach(switch: Arc<dyn Driven>) -> io::Result<Attachment> {
    let p = pool();
    let worker = {
        let mut ws = lock(&p.workers);
        let least = ws
            .iter()
            .min_by_key(|w| w.attached.load(Ordering::Relaxed))
            .cloned();
        match least {
            Some(w) if ws.len() >= p.size || w.attached.load(Ordering::Relaxed) == 0 => w,
            _ => {
                let w = Arc::new(Worker {
                    wake: EventFd::new()?,
                    entries: Mutex::new(Vec::new()),
                    attached: AtomicUsize::new(0),
                    thread: OnceLock::new(),
                });
                let run = w.clone();
                std::thread::Builder::new()
                    .name("xensock-carrier".into())
                    .spawn(move || run.run())?;
                ws.push(w.clone());
                w
            }
        }
    };
    let entry = Arc::new(Entry {
        switch,
        retired: AtomicBool::new(false),
        busy: Mutex::new(()),
    });
    worker.attached.fetch_add(1, Ordering::Relaxed);
    lock(&worker.entries).push(entry.clone());
    worker.wake.signal();
    Ok(Attachment { worker, entry })
}

/// Dropping the attachment takes the switch out of the pool: once the drop
/// returns, the pool never calls into it again (when dropped from the
/// switch's own step, on the pool thread, after that call).
impl Drop for Attachment {
    fn drop(&mut self) {
        if self.entry.retired.swap(true, Ordering::SeqCst) {
            return;
        }
        lock(&self.worker.entries).retain(|e| !Arc::ptr_eq(e, &self.entry));
        self.worker.attached.fetch_sub(1, Ordering::Relaxed);
        self.worker.wake.signal();
        if self.worker.thread.get() != Some(&std::thread::current().id()) {
            // A call in progress finishes first; later ones see `retired`.
            drop(lock(&self.entry.busy));
        }
    }
}

impl Worker {
    fn run(self: Arc<Self>) {
        let _ = self.thread.set(std::thread::current().id());
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut spans: Vec<Option<(Range<usize>, Option<Instant>)>> = Vec::new();
        loop {
            let entries: Vec<Arc<Entry>> = lock(&self.entries).clone();
            fds.clear();
            spans.clear();
            fds.push(libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            let mut wake_at: Option<Instant> = None;
            for e in &entries {
                let _busy = lock(&e.busy);
                if e.retired.load(Ordering::SeqCst) {
                    spans.push(None);
                    continue;
                }
                let start = fds.len();
                let due = e.switch.interest(&mut fds);
                wake_at = match (wake_at, due) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                spans.push(Some((start..fds.len(), due)));
            }
            let timeout = wake_at.map_or(-1, |t| {
                let d = t.saturating_duration_since(Instant::now());
                (d.as_millis() + 1).min(i32::MAX as u128) as i32
            });
            crate::sys::poll(&mut fds, timeout);
            if fds[0].revents != 0 {
                self.wake.drain();
            }
            // Only when something is due: a clock read is a system call
            // in a PV guest (no vDSO clock), tens of microseconds under
            // emulation, and this runs on every wake-up.
            let now = wake_at.map(|_| Instant::now());
            for (e, span) in entries.iter().zip(&spans) {
                let Some((range, due)) = span else { continue };
                let moved = fds[range.clone()].iter().any(|f| f.revents != 0);
                let is_due = matches!((due, now), (Some(t), Some(now)) if *t <= now);
                if !moved && !is_due {
                    continue;
                }
                let _busy = lock(&e.busy);
                if !e.retired.load(Ordering::SeqCst) {
                    e.switch.step(&fds[range.clone()]);
                }
            }
        }
    }
}
