// SPDX-License-Identifier: GPL-2.0
//! af_xen: the AF_XEN socket family for co-resident Xen guests.
//!
//! Protocol logic is proto's (`xensock-proto`) source, included below, not
//! re-implemented. `sys` holds every `unsafe` wrapper; `sock` is the socket
//! family in safe Rust.

mod carrier;
mod link;
mod proto;
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
    tcp: Option<carrier::leg::TcpCarrier>,
    pm: Option<sys::net::PmHooks>,
}

/// What the C glue reaches through the `sys` floor.
static ENTRY_POINTS: sys::entry::EntryPoints = sys::entry::EntryPoints {
    link_work: link::work,
    link_reap: link::reap,
    leg_work: carrier::leg::work,
    suspend: link::suspend_all,
    resume: link::resumed,
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
        // "domid" relative to our home (an empty node name would make xenbus
        // join it into the absolute path "/domid").
        let own = sys::xenstore_read_u32(c"domid", c"").unwrap_or(0);
        if own == 0 {
            pr_warn!("cannot read our domid from XenStore\n");
        }
        if let Some(peer) = link::user_space_link(own) {
            pr_err!(
                "a user-space xensock transport (libxensock) holds this domain's link to dom{}: stop it before loading af_xen; if it died, remove /local/domain/{}/data/xensock/link/{} (xenstore-rm)\n",
                peer,
                own,
                peer
            );
            return Err(EBUSY);
        }
        // Ring geometry sanity: proto's smallest ring must exist.
        if proto::layout::RingGeometry::new(11).is_err() {
            return Err(EINVAL);
        }
        let globals = KBox::pin_init(socket::Globals::new(own), GFP_KERNEL)?;
        let ops = KBox::pin(socket::build_ops(module, family), GFP_KERNEL)?;
        socket::publish(globals, ops)?;
        sys::proto_register()?;
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
        let tcp = carrier::leg::start().ok();
        link::start();
        // this guest's own save/restore moves its connections (carrier.rs)
        let pm = sys::net::PmHooks::register();
        if pm.is_none() {
            pr_warn!("no save/restore hooks: connections will not survive this guest's save\n");
        }
        pr_info!("AF_XEN registered as family {} (domid {})\n", family, own);
        Ok(AfXen {
            reg: Some(reg),
            proc_,
            tcp,
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
        link::shutdown_all();
        drop(self.tcp.take());
        sys::pending_grants_exit();
        sys::proto_unregister();
        socket::unpublish();
        pr_info!("AF_XEN (family {}) unloaded\n", sys::family());
    }
}
