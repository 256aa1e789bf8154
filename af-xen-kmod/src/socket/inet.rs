// SPDX-License-Identifier: GPL-2.0
//! What the socket core knows of TCP peers, for unmodified TCP programs
//! (the preload library, `preload/`): which co-resident guest has an IP
//! address. Unprivileged programs cannot read XenStore; the module reads
//! the co-residency table dom0's agent keeps for this guest.

use crate::proto::link::addrs_list;
use crate::proto::store::{peer_node, InHome, PEERS_DIR};
use crate::sock::{InetNames, AF_INET, AF_INET6, SOCKADDR_IN6_LEN, SOCKADDR_IN_LEN};
use crate::sys::{errno as e, xs};
use kernel::ffi::c_int;
use kernel::fmt;
use kernel::str::CString;

/// `XENSOCK_IOC_RESOLVE` (xensock.h): `_IOWR('X', 0x10, struct
/// xensock_resolve)`.
pub(crate) const IOC_RESOLVE: u32 = 0xC018_5810;

/// `struct xensock_resolve`: `u16 family` (AF_INET or AF_INET6), `u16`
/// zero, `u32 domid` (out), `u8 addr[16]` (an IPv4 address in the first 4).
const RESOLVE_LEN: usize = 24;

/// The co-resident guest that has `ip`, from this guest's table.
pub(crate) fn resolve(me: u32, ip: core::net::IpAddr) -> Option<u32> {
    let table_home = InHome {
        domid: me,
        rel: PEERS_DIR,
    };
    let table = CString::try_from_fmt(fmt!("{}", table_home)).ok()?;
    let mut ids = [0u32; 64];
    let n = xs::dir_ids(&table, &mut ids);
    ids[..n].iter().copied().find(|&peer| {
        // the whole path, read as a directory's own value (empty node)
        CString::try_from_fmt(fmt!("{}/{}/{}", table_home, peer, peer_node::ADDRS))
            .ok()
            .and_then(|addrs| xs::read_value(&addrs, c"", |v| addrs_list(v, ip)))
            .unwrap_or(false)
    })
}

/// The resolve ioctl: reads the request at `arg`, writes the domid back.
/// `EINVAL` for a request that is not an IPv4 or IPv6 address;
/// `EHOSTUNREACH` when no co-resident guest has the address.
pub(crate) fn resolve_ioctl(me: u32, arg: usize) -> core::result::Result<(), c_int> {
    let (mut r, mut w) = kernel::uaccess::UserSlice::new(arg, RESOLVE_LEN).reader_writer();
    let mut req = [0u8; RESOLVE_LEN];
    r.read_slice(&mut req).map_err(|_| e::EFAULT)?;
    let family = u16::from_ne_bytes([req[0], req[1]]);
    if req[2..4] != [0, 0] {
        return Err(e::EINVAL);
    }
    let ip = match family {
        AF_INET => core::net::IpAddr::from([req[8], req[9], req[10], req[11]]),
        AF_INET6 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&req[8..24]);
            core::net::IpAddr::from(a)
        }
        _ => return Err(e::EINVAL),
    };
    let domid = resolve(me, ip).ok_or(e::EHOSTUNREACH)?;
    req[4..8].copy_from_slice(&domid.to_ne_bytes());
    w.write_slice(&req).map_err(|_| e::EFAULT)
}

/// `XENSOCK_IOC_GRAFT` (xensock.h): `_IOW('X', 0x11, struct
/// xensock_graft)`.
pub(crate) const IOC_GRAFT: u32 = 0x4024_5811;

/// `struct xensock_graft`: `s32 fd`, `u32 addrlen`, `u8 addr[28]` (the
/// sockaddr_in or sockaddr_in6 the program passed to connect).
const GRAFT_LEN: usize = 36;

/// What the preload library asks for: the program's socket and its peer.
pub(crate) struct GraftRequest {
    pub(crate) fd: i32,
    pub(crate) peer: InetNames,
}

impl GraftRequest {
    /// Reads the request at `arg`. `EINVAL`: a sockaddr that is not a
    /// whole sockaddr_in or sockaddr_in6 with a port.
    pub(crate) fn read(arg: usize) -> core::result::Result<GraftRequest, c_int> {
        let mut req = [0u8; GRAFT_LEN];
        kernel::uaccess::UserSlice::new(arg, GRAFT_LEN)
            .reader()
            .read_slice(&mut req)
            .map_err(|_| e::EFAULT)?;
        let fd = i32::from_ne_bytes([req[0], req[1], req[2], req[3]]);
        let len = u32::from_ne_bytes([req[4], req[5], req[6], req[7]]) as usize;
        let addr = &req[8..];
        let family = u16::from_ne_bytes([addr[0], addr[1]]);
        let need = match family {
            AF_INET => SOCKADDR_IN_LEN,
            AF_INET6 => SOCKADDR_IN6_LEN,
            _ => return Err(e::EINVAL),
        };
        if len < need || len > SOCKADDR_IN6_LEN || addr[2..4] == [0, 0] {
            return Err(e::EINVAL);
        }
        let mut peer = [0u8; SOCKADDR_IN6_LEN];
        peer[..need].copy_from_slice(&addr[..need]);
        Ok(GraftRequest {
            fd,
            peer: InetNames::connected_to(family, peer),
        })
    }
}
