// SPDX-License-Identifier: MIT OR Apache-2.0
//! `SockAddrXen`: a domain and a port, the address of an AF_XEN socket.

use std::fmt;
use std::io;
use std::str::FromStr;

/// "This domain" (`XEN_DOMID_SELF`, Xen's `DOMID_SELF`). [`crate::XenListener::bind`]
/// accepts it; [`crate::XenStream::connect`] refuses it (`EINVAL`: connecting to
/// one's own domain is not supported by the user-space transport).
pub const DOMID_SELF: u32 = 0x7FF0;
/// "Any domain" (`XEN_DOMID_ANY`), the wildcard for a listener, as
/// `VMADDR_CID_ANY` in vsock.
pub const DOMID_ANY: u32 = u32::MAX;
/// "Any port" (`XEN_PORT_ANY`): `bind` picks a free port; `connect` picks
/// an ephemeral local port.
pub const PORT_ANY: u32 = u32::MAX;
/// Smallest real domain id that is reserved by Xen (`DOMID_FIRST_RESERVED`).
pub const DOMID_FIRST_RESERVED: u32 = 0x7FF0;

/// The address of a xensock endpoint: a domain id and a port
/// (`struct sockaddr_xen`). Written `xen:<domid>:<port>`; `self`, `any`
/// stand for [`DOMID_SELF`], [`DOMID_ANY`] and [`PORT_ANY`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockAddrXen {
    /// Domain id (`sxen_domid`).
    pub domid: u32,
    /// Port (`sxen_port`).
    pub port: u32,
}

impl SockAddrXen {
    /// An address.
    pub const fn new(domid: u32, port: u32) -> SockAddrXen {
        SockAddrXen { domid, port }
    }

    /// Whether `domid` names a real domain (not `self`/`any`/reserved).
    pub fn is_concrete_domain(&self) -> bool {
        self.domid < DOMID_FIRST_RESERVED
    }

    /// As a `socket2::SockAddr`: a `struct sockaddr_xen` of the AF_XEN
    /// family number `family` (the loaded module's, which
    /// [`crate::backend()`] reports), for programs that make their own
    /// sockets with socket2.
    pub fn to_sock_addr(&self, family: i32) -> io::Result<socket2::SockAddr> {
        crate::sys::sockaddr::from_bytes(&encode_sockaddr(family, *self))
    }

    /// The address in a `socket2::SockAddr` that holds a `struct
    /// sockaddr_xen` of family `family`; `EINVAL` for any other.
    pub fn from_sock_addr(addr: &socket2::SockAddr, family: i32) -> io::Result<SockAddrXen> {
        decode_sockaddr(family, crate::sys::sockaddr::bytes(addr))
    }
}

/// `sizeof(struct sockaddr_xen)`.
pub const SOCKADDR_XEN_LEN: usize = 16;

/// `struct sockaddr_xen` (`af-xen-kmod/include/xensock.h`), byte for byte
/// in native endianness: `sa_family_t sxen_family; u16 sxen_flags;
/// u32 sxen_port; u32 sxen_domid; u8 sxen_zero[4];`.
pub fn encode_sockaddr(family: i32, addr: SockAddrXen) -> [u8; SOCKADDR_XEN_LEN] {
    let mut b = [0u8; SOCKADDR_XEN_LEN];
    // sa_family_t is an unsigned short; valid families fit (FAMILY_MAX).
    b[0..2].copy_from_slice(&(family as u16).to_ne_bytes());
    // sxen_flags (2..4) and sxen_zero (12..16) stay zero: the module
    // refuses anything else with EINVAL.
    b[4..8].copy_from_slice(&addr.port.to_ne_bytes());
    b[8..12].copy_from_slice(&addr.domid.to_ne_bytes());
    b
}

/// The inverse of [`encode_sockaddr`]: `EINVAL` for a short buffer or
/// another family (what `getsockname` on a foreign socket would give).
pub fn decode_sockaddr(family: i32, bytes: &[u8]) -> io::Result<SockAddrXen> {
    if bytes.len() < SOCKADDR_XEN_LEN {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let word = |i: usize| u32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    if i32::from(u16::from_ne_bytes([bytes[0], bytes[1]])) != family {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(SockAddrXen::new(word(8), word(4)))
}

/// `(domid, port)`, as `SocketAddr` takes `(ip, port)`.
impl From<(u32, u32)> for SockAddrXen {
    fn from((domid, port): (u32, u32)) -> SockAddrXen {
        SockAddrXen::new(domid, port)
    }
}

/// A string that is not `xen:<domid>:<port>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid xensock address: {0}")]
pub struct AddrParseError(pub String);

impl FromStr for SockAddrXen {
    type Err = AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AddrParseError(format!("{s:?} (expected xen:<domid>:<port>)"));
        let rest = s.strip_prefix("xen:").ok_or_else(bad)?;
        let (d, p) = rest.split_once(':').ok_or_else(bad)?;
        let domid = match d {
            "self" => DOMID_SELF,
            "any" => DOMID_ANY,
            _ => {
                let v: u32 = d.parse().map_err(|_| bad())?;
                if v >= DOMID_FIRST_RESERVED {
                    return Err(bad());
                }
                v
            }
        };
        let port = match p {
            "any" => PORT_ANY,
            _ => p.parse().map_err(|_| bad())?,
        };
        Ok(SockAddrXen { domid, port })
    }
}

impl fmt::Display for SockAddrXen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("xen:")?;
        match self.domid {
            DOMID_SELF => f.write_str("self")?,
            DOMID_ANY => f.write_str("any")?,
            d => write!(f, "{d}")?,
        }
        f.write_str(":")?;
        match self.port {
            PORT_ANY => f.write_str("any"),
            p => write!(f, "{p}"),
        }
    }
}

/// Conversion into a [`SockAddrXen`], like `std::net::ToSocketAddrs`:
/// a `SockAddrXen`, a `(domid, port)` pair or a `xen:<domid>:<port>` string.
/// Bad strings give `EINVAL`.
pub trait ToXenAddr {
    /// The address.
    fn to_xen_addr(&self) -> io::Result<SockAddrXen>;
}

impl ToXenAddr for SockAddrXen {
    fn to_xen_addr(&self) -> io::Result<SockAddrXen> {
        Ok(*self)
    }
}

impl ToXenAddr for (u32, u32) {
    fn to_xen_addr(&self) -> io::Result<SockAddrXen> {
        Ok(SockAddrXen::new(self.0, self.1))
    }
}

impl ToXenAddr for (u16, u32) {
    fn to_xen_addr(&self) -> io::Result<SockAddrXen> {
        Ok(SockAddrXen::new(u32::from(self.0), self.1))
    }
}

impl ToXenAddr for str {
    /// A string that does not parse fails with `ErrorKind::InvalidInput`
    /// (the kind of `EINVAL`) carrying the [`AddrParseError`], which says
    /// what is wrong.
    fn to_xen_addr(&self) -> io::Result<SockAddrXen> {
        self.parse()
            .map_err(|e: AddrParseError| io::Error::new(io::ErrorKind::InvalidInput, e))
    }
}

impl ToXenAddr for String {
    fn to_xen_addr(&self) -> io::Result<SockAddrXen> {
        self.as_str().to_xen_addr()
    }
}

impl<T: ToXenAddr + ?Sized> ToXenAddr for &T {
    fn to_xen_addr(&self) -> io::Result<SockAddrXen> {
        (**self).to_xen_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_domid_and_port_pair_is_an_address() {
        let a: SockAddrXen = (7, 80).into();
        assert_eq!(a, SockAddrXen::new(7, 80));
        assert_eq!((7u32, 80u32).to_xen_addr().unwrap(), a);
    }

    #[test]
    fn socket2_addresses_round_trip_and_other_families_are_refused() {
        let a = SockAddrXen::new(7, 80);
        let sa = a.to_sock_addr(19).unwrap();
        assert_eq!(sa.family(), 19);
        assert_eq!(SockAddrXen::from_sock_addr(&sa, 19).unwrap(), a);
        let e = SockAddrXen::from_sock_addr(&sa, 20).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let inet = socket2::SockAddr::from("10.0.0.1:80".parse::<std::net::SocketAddr>().unwrap());
        assert!(SockAddrXen::from_sock_addr(&inet, 19).is_err());
    }

    #[test]
    fn parse_and_display_round_trip() {
        for s in [
            "xen:1:80",
            "xen:self:any",
            "xen:any:7",
            "xen:32751:4294967294",
        ] {
            let a: SockAddrXen = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
        assert_eq!(
            "xen:3:9".parse::<SockAddrXen>().unwrap(),
            SockAddrXen::new(3, 9)
        );
    }

    #[test]
    fn bad_addresses_are_einval() {
        for s in [
            "",
            "xen:",
            "xen:1",
            "vsock:1:2",
            "xen:-1:2",
            "xen:1:x",
            "xen:32752:1",
            "xen:1:2:3",
        ] {
            assert!(s.parse::<SockAddrXen>().is_err(), "{s}");
            let e = s.to_xen_addr().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{s}");
            assert!(
                e.to_string()
                    .contains(&format!("invalid xensock address: {s:?}")),
                "{e}"
            );
        }
    }
}
