// SPDX-License-Identifier: GPL-2.0
//! af_xen: the AF_XEN socket family for co-resident Xen guests.
//!
//! # Layers
//!
//! From the top; each imports only what is below it.
//!
//! - `socket/`: the socket core. The family as the socket layer sees it
//!   (`XenFamily`: the proto_ops callbacks in safe Rust), the port table,
//!   bind/listen/connect/accept, the data calls, socket options, ioctls,
//!   /proc; `socket/control.rs` says what the link's control frames and
//!   events mean for sockets (`link::LinkConn`); `socket/seqpacket.rs` is
//!   SOCK_SEQPACKET's record framing.
//! - `carrier/`: how a connection's bytes travel, behind one interface
//!   (`carrier::Carrier`): `ring.rs` (a `Pipe`, one direction over a
//!   shared ring; `Rings`, the carrier of a connection that only uses its
//!   two rings), `switch.rs` (`Switched`, the carrier of an inter-domain
//!   stream, moving it between its rings and TCP legs; the TCP work
//!   item), `leg.rs` (the TCP legs' listener and their hellos). What a
//!   carrier asks of the socket core is the `carrier::SocketCore` trait.
//! - `link/`: one link per peer domain (XenStore handshake, control ring,
//!   event channel, control frames, the work item); `link/wake.rs` is the
//!   event-channel interrupt. It names no socket and no carrier.
//! - `sock.rs`: one socket's state (`XenSock`), shared by the socket core
//!   and the carriers; the parts the layers above define come in as the
//!   types of `sock::Parts` (`carrier::Carriers` fills them in).
//! - `proto`: the wire format, ring layout and decisions, proto's own
//!   source (`xensock-proto`), shared with user space.
//! - `sys/`: the floor. Every `unsafe` block, each with its `// SAFETY:`
//!   comment: wrappers over `kernel::bindings`, the module-private Xen
//!   bindings and the C glue (`glue/`). It calls nothing above it: the
//!   glue's entry points reach the layers through [`ENTRY_POINTS`], and
//!   the socket callbacks through the `sys::family::Family` trait.
//!
//! # Lifecycle
//!
//! `init` installs the entry points, publishes the globals (port table,
//! link table) and the ops table, registers the protocol and the family,
//! creates /proc, starts the TCP leg listener, the links and the PM hooks.
//! `Drop` undoes it in reverse: no new sockets once the family is
//! unregistered, and every socket holds a module reference, so none is
//! left when it runs; links and legs go, then the pending grants are
//! handed to Linux's deferred list, and the globals are unpublished last.
//!
//! # References
//!
//! A socket's sock carries one `Arc<XenSock>` in its private field from
//! create (or, for an accepted socket, from when its listener made it) to
//! release; the port table holds one per socket for listing and one per
//! bound port. A connected socket holds its `Arc<Link>`, and the link one
//! `Arc<XenSock>` per connection on it (`LinkInner::conns`), dropped when
//! the connection ends or the link goes. A link's wake table holds a
//! sock reference (`SkRef`) for each ring's owner, put outside its lock.
//!
//! # Locking order
//!
//! The link table, then a link's lock, then the port table, then a
//! socket's lock (a spinlock, held only for short field updates). A
//! switch: `Switch::tx` before the tx pipe's producer; the rx pipe's
//! consumer before `Switch::rx`; `Switch::rx` before the socket's lock;
//! no link lock under either switch lock (carrier/switch/). The wake
//! table and a pipe's `ends` are leaf spinlocks.
//!
//! # Contexts
//!
//! Hard irq: `link/wake.rs` only (irq-safe spinlocks; it wakes the socket
//! whose ring the peer moved and schedules the link work item when there
//! is control work). Softirq: the TCP legs' socket callbacks, C only
//! (`glue/af_xen_net.c`): they wake the leg's owning socket and schedule
//! the TCP work item. Everything else runs in process context: the
//! socket calls, the link work item and the reaper, the TCP work item
//! (`carrier::switch::work`),
//! the XenStore watch callbacks and the PM freeze/thaw/restore hooks.

// Every unsafe block is in `sys` (the floor); the compiler holds the rest
// to it. (Not a crate-wide deny: `module!`'s expansion is unsafe code.)
#[deny(unsafe_code)]
mod carrier;
#[deny(unsafe_code)]
mod link;
#[deny(unsafe_code)]
mod proto;
#[deny(unsafe_code)]
mod sock;
#[deny(unsafe_code)]
mod socket;
mod sys;

use kernel::prelude::*;

module! {
    type: AfXen,
    name: "af_xen",
    author: "xensock",
    description: "AF_XEN sockets between co-resident Xen guests over grant-mapped rings",
    license: "GPL",
}

struct AfXen {
    reg: Option<sys::Registration>,
    proc_: Option<sys::ProcEntry>,
    legs: Option<carrier::leg::LegService>,
    pm: Option<sys::net::PmHooks>,
}

/// What the C glue reaches through the `sys` floor.
static ENTRY_POINTS: sys::entry::EntryPoints = sys::entry::EntryPoints {
    link_work: link::work::<carrier::XenSock>,
    link_reap: link::reap::<carrier::XenSock>,
    leg_work: carrier::switch::work,
    suspend: link::suspend_all::<carrier::XenSock>,
    resume: link::resumed::<carrier::XenSock>,
    proc_show: socket::proc_show,
    tcp_show: socket::tcp_show,
    stats_show: stats_show,
};

/// The layers' lines of /proc/net/af_xen_stats.
fn stats_show(seq: &mut sys::Seq) {
    carrier::leg::stats(seq);
    carrier::switch::stats(seq);
}

impl kernel::Module for AfXen {
    fn init(module: &'static ThisModule) -> Result<Self> {
        sys::entry::install(&ENTRY_POINTS);
        let family = sys::family();
        if !(1..46).contains(&family) {
            pr_err!("family={} is not a valid address family (1..45)\n", family);
            return Err(EINVAL);
        }
        if !sys::running_on_xen() {
            pr_err!("not running on Xen\n");
            return Err(ENODEV);
        }
        let own = link::read_own_domid().unwrap_or(0);
        if own == 0 {
            pr_warn!("cannot read our domid from XenStore\n");
        }
        if let Some(peer) = link::user_space_link(own) {
            pr_err!(
                "a user-space xensock transport (libxensock) holds this domain's link to dom{}: stop it before loading af_xen; if it died, remove {} (xenstore-rm)\n",
                peer,
                proto::link::HalfPath { owner: own, peer }
            );
            return Err(EBUSY);
        }
        // Ring geometry sanity: proto's smallest ring must exist.
        if proto::layout::RingGeometry::new(11).is_err() {
            return Err(EINVAL);
        }
        link::set_own_domid(own);
        let globals = KBox::pin_init(socket::Globals::new(), GFP_KERNEL)?;
        let ops = KBox::pin(socket::build_ops(module, family), GFP_KERNEL)?;
        if let Err(e) = socket::publish(globals, ops).and_then(|()| sys::proto_register()) {
            socket::unpublish();
            return Err(e);
        }
        let reg = match sys::Registration::register(
            module,
            family,
            sys::family::create_fn::<socket::XenFamily>(),
        ) {
            Ok(r) => r,
            Err(e) => {
                pr_err!("sock_register(family={}) failed: {:?}\n", family, e);
                sys::proto_unregister();
                socket::unpublish();
                return Err(e);
            }
        };
        let proc_ = match sys::ProcEntry::create() {
            Ok(p) => Some(p),
            Err(_) => {
                pr_warn!("cannot create /proc/net/af_xen\n");
                None
            }
        };
        // before the links: their handshakes advertise its endpoint
        let legs = carrier::leg::start().ok();
        link::start::<carrier::XenSock>();
        // this guest's own save/restore moves its connections (carrier/switch/)
        let pm = sys::net::PmHooks::register();
        if pm.is_none() {
            pr_warn!("no save/restore hooks: connections will not survive this guest's save\n");
        }
        pr_info!("AF_XEN registered as family {} (domid {})\n", family, own);
        Ok(AfXen {
            reg: Some(reg),
            proc_,
            legs,
            pm,
        })
    }
}

impl Drop for AfXen {
    fn drop(&mut self) {
        // sock_unregister first (no new sockets; every socket held a module
        // reference, so none is left), then the struct proto, then the globals.
        drop(self.pm.take());
        drop(self.proc_.take());
        drop(self.reg.take());
        link::shutdown_all::<carrier::XenSock>();
        drop(self.legs.take());
        sys::pending_grants_exit();
        sys::proto_unregister();
        socket::unpublish();
        pr_info!("AF_XEN (family {}) unloaded\n", sys::family());
    }
}
