// SPDX-License-Identifier: GPL-2.0
//! The socket core: AF_XEN sockets as the socket layer sees them (the
//! proto_ops callbacks, in safe Rust over the wrappers in `sys`). Here the
//! callbacks' dispatch; from the top: `control.rs` what the link's frames
//! mean for sockets, `ioctl.rs`, `connect.rs` connect/accept (over a link
//! and on loopback), `data.rs` shutdown and the data calls over a
//! `carrier::Carrier`, `poll.rs`, `proc.rs` /proc, `bind.rs`
//! bind/listen/getname, `options.rs` socket options, `seqpacket.rs`
//! SOCK_SEQPACKET's data path, `lifecycle.rs` create and destroy,
//! `for_carriers.rs` what the carriers ask of the socket core, `table.rs`
//! the port table and the module's globals, `inet.rs` TCP programs' names.

mod bind;
mod connect;
pub(crate) mod control;
mod data;
mod for_carriers;
pub(crate) mod inet;
mod ioctl;
mod lifecycle;
mod options;
mod poll;
mod proc;
pub(crate) mod seqpacket;
mod table;
#[cfg(afx_test_hooks)]
mod test_modes;

pub(crate) use lifecycle::XenFamily;
pub(crate) use proc::{proc_show, tcp_show};
pub(crate) use table::{publish, unpublish, Globals};

use self::bind::{xs_bind, xs_getname, xs_listen, SockName};
use self::connect::{xs_accept, xs_connect};
use self::data::{xs_recvmsg, xs_sendmsg, xs_shutdown};
use self::ioctl::xs_ioctl;
use self::lifecycle::{xs_create, xs_release};
use self::options::{xs_getsockopt, xs_setsockopt};
use self::poll::xs_poll;
use crate::carrier::XenSock;
use crate::sys::{self, Msg, Socket};
use kernel::ffi::c_int;
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

impl sys::family::Family for XenFamily {
    type Sock = XenSock;
    type Name = SockName;

    fn create(
        sock: &Socket,
        new: &sys::family::NewSock,
        protocol: i32,
    ) -> core::result::Result<Arc<XenSock>, i32> {
        xs_create(sock, new, protocol)
    }
    fn release(_sock: &Socket, state: Option<Arc<XenSock>>) {
        xs_release(state)
    }
    fn bind(s: ArcBorrow<'_, XenSock>, addr: &[u8]) -> c_int {
        xs_bind(s, addr)
    }
    fn listen(s: ArcBorrow<'_, XenSock>, backlog: i32) -> c_int {
        xs_listen(s, backlog)
    }
    fn getname(s: ArcBorrow<'_, XenSock>, peer: bool) -> core::result::Result<SockName, i32> {
        xs_getname(s, peer)
    }
    fn connect(sock: &Socket, s: ArcBorrow<'_, XenSock>, addr: &[u8], flags: i32) -> c_int {
        xs_connect(sock, s, addr, flags)
    }
    fn accept(s: ArcBorrow<'_, XenSock>, newsock: &Socket, flags: i32) -> c_int {
        xs_accept(s, newsock, flags)
    }
    fn poll(s: Option<ArcBorrow<'_, XenSock>>) -> u32 {
        xs_poll(s)
    }
    fn ioctl(sock: &Socket, s: Option<ArcBorrow<'_, XenSock>>, cmd: u32, arg: usize) -> c_int {
        xs_ioctl(sock, s, cmd, arg)
    }
    fn shutdown(s: ArcBorrow<'_, XenSock>, how: i32) -> c_int {
        xs_shutdown(s, how)
    }
    fn sendmsg(s: ArcBorrow<'_, XenSock>, msg: &mut Msg) -> c_int {
        xs_sendmsg(s, msg)
    }
    fn recvmsg(s: ArcBorrow<'_, XenSock>, msg: &mut Msg, flags: i32) -> c_int {
        xs_recvmsg(s, msg, flags)
    }
    fn setsockopt(
        s: ArcBorrow<'_, XenSock>,
        level: i32,
        optname: i32,
        value: &sys::family::SockoptValue,
    ) -> c_int {
        xs_setsockopt(s, level, optname, value)
    }
    fn getsockopt(
        s: ArcBorrow<'_, XenSock>,
        level: i32,
        optname: i32,
        out: &sys::family::SockoptOut,
    ) -> c_int {
        xs_getsockopt(s, level, optname, out)
    }
}

pub(crate) fn build_ops(module: &'static ThisModule, family: i32) -> sys::Ops {
    sys::family::build_ops::<XenFamily>(module, family)
}
