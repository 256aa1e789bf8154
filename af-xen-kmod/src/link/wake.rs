// SPDX-License-Identifier: GPL-2.0
//! The event-channel interrupt's fast path: wake the sockets whose data
//! rings moved, straight from the handler.
//!
//! A link has one event channel each way, shared by all its connections
//! and its control ring, so an interrupt does not say what moved. The
//! handler looks at every data ring of the link (two atomic loads each)
//! and wakes only the socket of a ring whose peer-written counter or flags
//! changed since the last interrupt; it schedules the work item only when
//! the control ring has frames, a control frame waits for room, or the
//! link is not up yet. Before this, every interrupt went interrupt -> work
//! item -> wake every socket of the link: a scheduler hop more per round
//! trip and a wakeup per socket per kick (docs/design.md, "The lab
//! benchmark").

use crate::proto::mem::RawRing;
use crate::proto::ring::{has_unread, peer_line};
use crate::sys::{self, counters, IrqSpinLock, Sk, SkRef};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use kernel::prelude::*;
use kernel::sync::Arc;

/// Every readiness bit: the handler knows that a ring moved, not what the
/// waiter waits for (data, space, FIN, reset); poll's entries filter.
const WAKE_ALL: u32 = sys::poll::POLLIN
    | sys::poll::POLLOUT
    | sys::poll::POLLRDNORM
    | sys::poll::POLLWRNORM
    | sys::poll::POLLRDHUP
    | sys::poll::POLLHUP
    | sys::poll::POLLERR;

/// One data ring of a link as the interrupt sees it.
#[pin_data]
pub(crate) struct PipeWake {
    ring: RawRing,
    /// our receive ring (we consume; the peer moves `prod`) or the peer's
    /// (we produce; the peer moves `cons`)
    consumer: bool,
    /// the peer-written counter and flags at the last interrupt
    seen: AtomicU32,
    seen_flags: AtomicU32,
    /// the peer's ring (we produce): a writer or poller waits for space
    /// (set before it publishes its event index, cleared by the wake). The
    /// peer's reads move `cons` on most interrupts of a busy connection,
    /// and each such move woke the owner a second time (besides the wake
    /// for the reply's data on its receive ring): 1.95 wakes per
    /// interrupt in ping-pong
    space_wanted: AtomicBool,
    /// `owner`'s sock (its address), read without the lock: the socket's
    /// calls set the owner once, then only compare
    owner_id: AtomicUsize,
    /// the socket to wake, set by the socket's own calls (sendmsg, recvmsg,
    /// poll) and cleared when it lets go of the pipe
    #[pin]
    owner: IrqSpinLock<Option<SkRef>>,
}

impl PipeWake {
    pub(crate) fn new(ring: RawRing, consumer: bool) -> Result<Arc<PipeWake>> {
        Arc::pin_init(
            pin_init!(PipeWake {
                ring,
                consumer,
                seen: AtomicU32::new(0),
                seen_flags: AtomicU32::new(0),
                space_wanted: AtomicBool::new(false),
                owner_id: AtomicUsize::new(0),
                owner <- IrqSpinLock::new(None, kernel::c_str!("af_xen_pipe_owner"), kernel::static_lock_class!()),
            }),
            GFP_KERNEL,
        )
    }

    /// `sk` is the socket to wake for this ring (idempotent; cheap when set).
    pub(crate) fn set_owner(&self, sk: &Sk) {
        if self.owner_id.load(Ordering::Acquire) == sk.id() {
            return;
        }
        let mut o = self.owner.lock();
        if o.as_ref().map(|r| r.is(sk)).unwrap_or(false) {
            return;
        }
        let old = o.replace(SkRef::new(sk));
        self.owner_id.store(sk.id(), Ordering::Release);
        drop(o);
        // sock_put outside the irq-safe lock
        drop(old);
    }

    /// The socket lets go of the pipe (closing): no more wakes for it.
    pub(crate) fn clear_owner(&self, sk: &Sk) {
        let mut o = self.owner.lock();
        let old = if o.as_ref().map(|r| r.is(sk)).unwrap_or(false) {
            self.owner_id.store(0, Ordering::Release);
            o.take()
        } else {
            None
        };
        drop(o);
        drop(old);
    }

    /// A writer or poller of the peer's ring is about to publish its event
    /// index and re-check the free space: the next move of `cons` wakes
    /// it. Must come before that re-check (see `poll`).
    pub(crate) fn want_space(&self) {
        self.space_wanted.store(true, Ordering::SeqCst);
    }

    /// Hard irq: wake the owner if the peer moved this ring or set flags.
    fn poll(&self) {
        let (counter, flags) = peer_line(&self.ring, self.consumer);
        // a change only: flags stay set (FIN, CLOSED), and waking on every
        // interrupt of the link for them woke each half-closed connection
        // again and again (about 14 wakes per interrupt with 1000
        // connections on one link); whoever missed the change (no owner
        // yet) checks the ring itself before it sleeps
        let moved = self.seen.swap(counter, Ordering::AcqRel) != counter;
        let flagged = self.seen_flags.swap(flags, Ordering::AcqRel) != flags;
        if !moved && !flagged {
            return;
        }
        // the peer's ring moved without a flag change: only a writer or
        // poller that asked for space wants to know. One that asks after
        // this look re-checks the ring after asking (its event index is
        // published first), and the peer kicks again when it crosses it.
        if !self.consumer && !flagged && !self.space_wanted.swap(false, Ordering::SeqCst) {
            return;
        }
        if let Some(o) = self.owner.lock().as_ref() {
            counters::add(&counters::IRQ_WAKES, 1);
            o.wake(WAKE_ALL);
        }
    }
}

struct WakeInner {
    pipes: KVec<Arc<PipeWake>>,
    /// our control receive ring, while its page is granted (Half's drop
    /// clears it before the grant ends)
    ctrl: Option<RawRing>,
}

/// A link's wake table: the interrupt handlers' argument.
#[pin_data]
pub(crate) struct LinkWake {
    #[pin]
    inner: IrqSpinLock<WakeInner>,
    /// the link is up (else every interrupt runs the work item)
    up: AtomicBool,
    /// control frames wait for room in the peer's control ring
    backlog: AtomicBool,
}

impl LinkWake {
    pub(crate) fn new() -> Result<Arc<LinkWake>> {
        Arc::pin_init(
            pin_init!(LinkWake {
                inner <- IrqSpinLock::new(
                    WakeInner { pipes: KVec::new(), ctrl: None },
                    kernel::c_str!("af_xen_link_wake"),
                    kernel::static_lock_class!()
                ),
                up: AtomicBool::new(false),
                backlog: AtomicBool::new(false),
            }),
            GFP_KERNEL,
        )
    }

    pub(crate) fn set_ctrl(&self, ring: Option<RawRing>) {
        self.inner.lock().ctrl = ring;
    }

    pub(crate) fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
    }

    pub(crate) fn set_backlog(&self, waiting: bool) {
        self.backlog.store(waiting, Ordering::Release);
    }

    pub(crate) fn add(&self, p: &Arc<PipeWake>) -> Result {
        // GFP_ATOMIC: under a spinlock with interrupts off
        self.inner.lock().pipes.push(p.clone(), GFP_ATOMIC)?;
        Ok(())
    }

    pub(crate) fn remove(&self, p: &PipeWake) {
        let gone = {
            let mut i = self.inner.lock();
            match i.pipes.iter().position(|x| core::ptr::eq(&**x, p)) {
                Some(at) => Some(sys::vec_remove(&mut i.pipes, at)),
                None => None,
            }
        };
        // the last reference may hold a sock reference: put outside the lock
        drop(gone);
    }
}

impl sys::IrqTarget for LinkWake {
    fn irq(&self) {
        irq(self)
    }
}

/// The event-channel interrupt of a link (hard irq context).
fn irq(w: &LinkWake) {
    let t = sys::Timer::start();
    counters::add(&counters::IRQS, 1);
    let ctrl_pending = {
        let i = w.inner.lock();
        for p in i.pipes.iter() {
            p.poll();
        }
        match &i.ctrl {
            Some(r) => has_unread(r),
            None => true,
        }
    };
    if ctrl_pending || !w.up.load(Ordering::Acquire) || w.backlog.load(Ordering::Acquire) {
        counters::add(&counters::IRQ_WORK, 1);
        sys::schedule_work();
    }
    t.stop(&counters::IRQ_NS);
}
