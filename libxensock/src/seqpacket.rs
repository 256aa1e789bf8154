// SPDX-License-Identifier: MIT OR Apache-2.0
//! `SOCK_SEQPACKET` over the kernel family: connections that carry
//! messages with their boundaries, as AF_UNIX's and vsock's do. Each
//! `send` is one message, delivered whole to one `recv` or not at all;
//! a message larger than the peer's ring fails with `EMSGSIZE`; a `recv`
//! buffer shorter than the message gets its first bytes and the rest is
//! dropped.
//!
//! Only `af_xen.ko` carries them: without it, [`XenSeqPacket::connect`]
//! and [`XenSeqPacketListener::bind`] fail with
//! [`io::ErrorKind::Unsupported`], naming why.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use nix::sys::socket::MsgFlags;
use socket2::{Domain, Socket, Type};

use crate::addr::{SockAddrXen, ToXenAddr};
use crate::kernel::loaded_family;

/// Listener backlog (the stream listeners' default).
const BACKLOG: i32 = 128;

fn family() -> io::Result<i32> {
    loaded_family().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "SOCK_SEQPACKET needs the kernel family (af_xen.ko): {}",
                crate::backend::backend().why()
            ),
        )
    })
}

fn socket(family: i32) -> io::Result<Socket> {
    // socket2 sets SOCK_CLOEXEC (and sends with MSG_NOSIGNAL)
    Socket::new(Domain::from(family), Type::from(libc::SOCK_SEQPACKET), None)
}

/// A connected AF_XEN `SOCK_SEQPACKET` socket.
#[derive(Debug)]
pub struct XenSeqPacket {
    sock: Socket,
    family: i32,
}

impl XenSeqPacket {
    /// Connects to `addr` (`ECONNREFUSED` if nothing listens there for
    /// messages, `EHOSTUNREACH` if the domain cannot be reached).
    pub fn connect(addr: impl ToXenAddr) -> io::Result<XenSeqPacket> {
        let addr = addr.to_xen_addr()?;
        let family = family()?;
        let sock = socket(family)?;
        sock.connect(&addr.to_sock_addr(family)?)?;
        Ok(XenSeqPacket { sock, family })
    }

    /// Sends `msg` as one message: all of it, or an error (`EMSGSIZE` if
    /// it can never fit the peer's ring, `EAGAIN` when non-blocking and
    /// there is no room now, `EPIPE` once the peer stopped reading).
    pub fn send(&self, msg: &[u8]) -> io::Result<usize> {
        self.sock.send(msg)
    }

    /// Receives one message into `buf`: its length, or the first
    /// `buf.len()` bytes of a longer one (the rest is dropped); 0 at the
    /// end (the peer shut down writing or closed).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        nix::sys::socket::recv(self.sock.as_raw_fd(), buf, MsgFlags::empty())
            .map_err(io::Error::from)
    }

    /// The next message, as [`XenSeqPacket::recv`] would return it, left
    /// for the next `recv`.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        crate::kernel::peek_fd(self.sock.as_raw_fd(), buf)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SockAddrXen> {
        SockAddrXen::from_sock_addr(&self.sock.peer_addr()?, self.family)
    }

    /// This end's address.
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        SockAddrXen::from_sock_addr(&self.sock.local_addr()?, self.family)
    }

    /// `shutdown(2)`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.sock.shutdown(how)
    }

    /// `O_NONBLOCK`: `send` and `recv` return `WouldBlock` instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.sock.set_nonblocking(nonblocking)
    }

    /// `SO_RCVTIMEO` (`None`: wait for ever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }

    /// `SO_SNDTIMEO` (`None`: wait for ever).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_write_timeout(t)
    }

    /// `SO_ERROR`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.sock.take_error()
    }

    /// A second handle on the same connection (`dup`).
    pub fn try_clone(&self) -> io::Result<XenSeqPacket> {
        Ok(XenSeqPacket {
            sock: self.sock.try_clone()?,
            family: self.family,
        })
    }
}

impl AsRawFd for XenSeqPacket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for XenSeqPacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// A listening AF_XEN `SOCK_SEQPACKET` socket.
#[derive(Debug)]
pub struct XenSeqPacketListener {
    sock: Socket,
    family: i32,
}

impl XenSeqPacketListener {
    /// Listens on `addr` (its domid this domain, `self` or `any`; its port
    /// a port or `any`): `EADDRINUSE` if taken, `EADDRNOTAVAIL` for
    /// another domain's id.
    pub fn bind(addr: impl ToXenAddr) -> io::Result<XenSeqPacketListener> {
        let addr = addr.to_xen_addr()?;
        let family = family()?;
        let sock = socket(family)?;
        sock.bind(&addr.to_sock_addr(family)?)?;
        sock.listen(BACKLOG)?;
        Ok(XenSeqPacketListener { sock, family })
    }

    /// The next connection and its peer's address.
    pub fn accept(&self) -> io::Result<(XenSeqPacket, SockAddrXen)> {
        let (sock, sa) = self.sock.accept()?;
        let peer = SockAddrXen::from_sock_addr(&sa, self.family)?;
        Ok((
            XenSeqPacket {
                sock,
                family: self.family,
            },
            peer,
        ))
    }

    /// The address it listens on (the port it was given, if `any`).
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        SockAddrXen::from_sock_addr(&self.sock.local_addr()?, self.family)
    }

    /// `O_NONBLOCK`: `accept` returns `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.sock.set_nonblocking(nonblocking)
    }
}

impl AsRawFd for XenSeqPacketListener {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for XenSeqPacketListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the module the error says so and why; with it, a port
    /// nobody listens on is refused.
    #[test]
    fn connect_needs_the_kernel_family_and_says_so() {
        let e = XenSeqPacket::connect((crate::DOMID_SELF, 7)).unwrap_err();
        if loaded_family().is_some() {
            assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
        } else {
            assert_eq!(e.kind(), io::ErrorKind::Unsupported);
            assert!(e.to_string().contains("af_xen.ko"), "{e}");
            assert!(e.to_string().contains("kernel family: not loaded"), "{e}");
            let e = XenSeqPacketListener::bind("xen:self:7").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        }
    }
}
