// SPDX-License-Identifier: GPL-2.0
//! The module's globals: the port table (bound ports, listeners, the
//! SO_REUSEPORT groups, ephemeral ports, every socket's listing) and the
//! link table, published for the callbacks.

use crate::carrier::XenSock;
use crate::link::LinkTable;
use crate::sock::State;
use crate::sys;
use kernel::new_mutex;
use kernel::prelude::*;
use kernel::rbtree::RBTree;
use kernel::sync::{Arc, Mutex};

pub(super) const EPHEMERAL_FIRST: u32 = 49152;

/// Module-wide state: the port table and the link table.
#[pin_data]
pub(crate) struct Globals {
    #[pin]
    pub(crate) ports: Mutex<Ports>,
    #[pin]
    pub(crate) links: Mutex<LinkTable<XenSock>>,
}

pub(crate) struct Ports {
    pub(crate) map: RBTree<u32, Arc<XenSock>>,
    /// SO_REUSEPORT: the sockets bound to a port besides `map`'s, which
    /// take its connections in turn (`listener`)
    pub(super) reuse: RBTree<u32, KVec<Arc<XenSock>>>,
    /// the turn (`listener`)
    pub(super) turn: u32,
    pub(super) next_ephemeral: u32,
    /// every live socket, for /proc/net/af_xen (id -> socket)
    pub(crate) all: RBTree<usize, Arc<XenSock>>,
}

impl Ports {
    /// The listener a connection to `port` goes to: the port's socket, or
    /// with SO_REUSEPORT the next listening one of its group in turn.
    pub(super) fn listener(&mut self, port: u32) -> Option<Arc<XenSock>> {
        let head = self.map.get(&port)?.clone();
        let Some(group) = self.reuse.get(&port) else {
            return Some(head);
        };
        let n = group.len() + 1;
        for k in 0..n {
            let at = (self.turn as usize).wrapping_add(k) % n;
            let cand = if at == 0 { &head } else { &group[at - 1] };
            if cand.inner.lock().state == State::Listening {
                let cand = cand.clone();
                self.turn = (at as u32).wrapping_add(1);
                return Some(cand);
            }
        }
        Some(head)
    }

    /// Every socket bound to `port`: the port's and its SO_REUSEPORT group.
    pub(super) fn bound_to(&self, port: u32) -> KVec<Arc<XenSock>> {
        let mut all = KVec::new();
        let group = self.reuse.get(&port).into_iter().flatten();
        for xs in Iterator::chain(self.map.get(&port).into_iter(), group) {
            if all.push(xs.clone(), GFP_KERNEL).is_err() {
                break;
            }
        }
        all
    }

    /// Whether `xs` may join the sockets bound to `port` (XENSOCK_REUSEPORT
    /// on all of them, all of one user, as TCP's SO_REUSEPORT rule).
    pub(super) fn may_share(&self, port: u32, xs: &XenSock) -> bool {
        let wants = |o: &XenSock| o.inner.lock().reuse_port;
        let uid = xs.sk.uid();
        wants(xs)
            && self
                .bound_to(port)
                .iter()
                .all(|o| wants(o) && o.sk.uid() == uid)
    }

    /// `xs` leaves the sockets bound to `port`; one of its SO_REUSEPORT
    /// group takes the port's place if it had it.
    pub(super) fn unbind(&mut self, port: u32, xs: &Arc<XenSock>) {
        if let Some(group) = self.reuse.get_mut(&port) {
            if let Some(at) = group.iter().position(|o| Arc::ptr_eq(o, xs)) {
                drop(sys::vec_remove(group, at));
                if group.is_empty() {
                    self.reuse.remove(&port);
                }
                return;
            }
        }
        let mine = self.map.get(&port).is_some_and(|o| Arc::ptr_eq(o, xs));
        if !mine {
            return;
        }
        let next = self.reuse.get_mut(&port).map(|g| sys::vec_remove(g, 0));
        if self.reuse.get(&port).is_some_and(|g| g.is_empty()) {
            self.reuse.remove(&port);
        }
        match next {
            Some(n) => {
                // (the old entry's node is reused: no allocation)
                if let Some(slot) = self.map.get_mut(&port) {
                    *slot = n;
                }
            }
            None => {
                self.map.remove(&port);
            }
        }
    }
}

impl Globals {
    pub(crate) fn new() -> impl PinInit<Self, Error> {
        try_pin_init!(Globals {
            ports <- new_mutex!(Ports {
                map: RBTree::new(),
                reuse: RBTree::new(),
                turn: 0,
                next_ephemeral: EPHEMERAL_FIRST,
                all: RBTree::new(),
            }, "af_xen_ports"),
            links <- new_mutex!(LinkTable::new(), "af_xen_links"),
        })
    }
}

static GLOBALS: sys::Published<Globals> = sys::Published::new();
static OPS: sys::Published<sys::Ops> = sys::Published::new();

/// Publishes the module's globals and ops for the callbacks, before the
/// family is registered.
pub(crate) fn publish(g: Pin<KBox<Globals>>, ops: Pin<KBox<sys::Ops>>) -> Result {
    GLOBALS.publish(g).map_err(|_| EBUSY)?;
    OPS.publish(ops).map_err(|_| EBUSY)?;
    Ok(())
}

/// Module exit, after the family is unregistered and every socket gone.
pub(crate) fn unpublish() {
    drop(OPS.unpublish());
    drop(GLOBALS.unpublish());
}

pub(crate) fn globals() -> &'static Globals {
    // Callbacks only run between publish() and unpublish().
    match GLOBALS.get() {
        Some(g) => g,
        None => unreachable!("af_xen callback outside the module's lifetime"),
    }
}

pub(super) fn ops() -> &'static sys::Ops {
    match OPS.get() {
        Some(o) => o,
        None => unreachable!("af_xen callback outside the module's lifetime"),
    }
}

/// A socket's key in the listing of every socket (`Ports::all`).
pub(super) fn all_key(xs: &XenSock) -> usize {
    xs as *const XenSock as usize
}

/// Lists a new socket among every socket (/proc, the TCP legs' lookup).
pub(super) fn list_socket(xs: &Arc<XenSock>) -> core::result::Result<(), ()> {
    globals()
        .ports
        .lock()
        .all
        .try_create_and_insert(all_key(xs), xs.clone(), GFP_KERNEL)
        .map(|_| ())
        .map_err(|_| ())
}
