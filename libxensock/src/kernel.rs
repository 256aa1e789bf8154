// SPDX-License-Identifier: MIT OR Apache-2.0
//! The AF_XEN kernel family (`af_xen.ko`) as a libxensock backend: a
//! stream or listener is a plain socket descriptor ([`socket2::Socket`]),
//! and every method maps onto the BSD call a C program would make with
//! `xensock.h`.
//!
//! The family number is not a constant: an out-of-tree module reuses a
//! number no mainline kernel implements (default 19) and publishes it in
//! `/sys/module/af_xen/parameters/family` (see `af-xen-kmod/README.md`).

use std::io;
use std::mem::MaybeUninit;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use socket2::{Domain, SockAddr, Socket, Type};

use crate::addr::SockAddrXen;
use crate::error::errno;
use crate::options::SocketOptions;

/// The family parameter, relative to the sysfs root.
pub(crate) const FAMILY_PARAM_IN_SYSFS: &str = "module/af_xen/parameters/family";

/// Families `sock_register` accepts are `1..AF_MAX`; AF_MAX is 46 in
/// Linux 6.12 and has only grown. Anything outside `1..=255` is not a
/// family number the module could have registered.
const FAMILY_MAX: i32 = 255;

/// Listener backlog when [`SocketOptions::backlog`] is not given (the
/// user-space transport's default).
const DEFAULT_BACKLOG: i32 = 128;

/// Why the kernel family cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FamilyProbe {
    /// Loaded, with this family number.
    Loaded(i32),
    /// The parameter file does not exist: the module is not loaded.
    Absent,
    /// The file exists but says something that is not a family number.
    Invalid(String),
}

/// Reads the family number the module published under `sysfs_root`
/// (normally `/sys`).
pub(crate) fn probe_family(sysfs_root: &Path) -> FamilyProbe {
    let path = sysfs_root.join(FAMILY_PARAM_IN_SYSFS);
    match std::fs::read_to_string(&path) {
        Ok(s) => match s.trim().parse::<i32>() {
            Ok(f) if (1..=FAMILY_MAX).contains(&f) => FamilyProbe::Loaded(f),
            _ => FamilyProbe::Invalid(format!(
                "{}: {:?} is not a family number",
                path.display(),
                s.trim()
            )),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => FamilyProbe::Absent,
        Err(e) => FamilyProbe::Invalid(format!("{}: {e}", path.display())),
    }
}

/// The family the module registers unless its `family` parameter says
/// otherwise, and the one its alias names (`net-pf-19`).
pub(crate) const FAMILY_DEFAULT: i32 = 19;

/// The family number if `af_xen` is loaded in this kernel. Not loaded, but
/// installed: the first call of the process loads it by its alias, as the
/// kernel does for a socket of a family nobody registered (a socket of
/// [`FAMILY_DEFAULT`]; loaded with another `family` from modprobe's
/// options, the module is still loaded by it, and sysfs says which).
pub(crate) fn loaded_family() -> Option<i32> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static TRIED: AtomicBool = AtomicBool::new(false);
    let sys = Path::new("/sys");
    match probe_family(sys) {
        FamilyProbe::Loaded(f) => Some(f),
        FamilyProbe::Absent if !TRIED.swap(true, Ordering::AcqRel) => {
            // the socket itself is of no use: it fails where the module
            // is not installed, or sits at another number
            drop(Socket::new(
                Domain::from(FAMILY_DEFAULT),
                Type::STREAM,
                None,
            ));
            match probe_family(sys) {
                FamilyProbe::Loaded(f) => Some(f),
                _ => None,
            }
        }
        _ => None,
    }
}

fn to_sockaddr(family: i32, addr: SockAddrXen) -> io::Result<SockAddr> {
    addr.to_sock_addr(family)
}

fn from_sockaddr(family: i32, sa: &SockAddr) -> io::Result<SockAddrXen> {
    SockAddrXen::from_sock_addr(sa, family)
}

fn new_socket(family: i32) -> io::Result<Socket> {
    // socket2 sets SOCK_CLOEXEC.
    Socket::new(Domain::from(family), Type::STREAM, None)
}

/// `recv(fd, buf, MSG_PEEK)`: the next bytes, left in the socket.
pub(crate) fn peek_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    nix::sys::socket::recv(fd, buf, nix::sys::socket::MsgFlags::MSG_PEEK).map_err(io::Error::from)
}

fn check_timeout(t: Option<Duration>) -> io::Result<()> {
    if t.is_some_and(|t| t.is_zero()) {
        Err(errno(libc::EINVAL))
    } else {
        Ok(())
    }
}

/// `fd` as a socket of the loaded AF_XEN family, of `SOCK_STREAM` type,
/// listening or not as `listening` says; else an `InvalidInput` error
/// that says what it is instead.
fn adopt_fd(fd: std::os::fd::OwnedFd, listening: bool) -> io::Result<(Socket, i32)> {
    let family = loaded_family().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an AF_XEN socket: af_xen.ko is not loaded",
        )
    })?;
    let sock = Socket::from(fd);
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    let domain = sock
        .domain()
        .map_err(|e| bad(format!("not a socket: {e}")))?;
    if domain != Domain::from(family) {
        return Err(bad(format!(
            "not an AF_XEN socket: family {domain:?}, AF_XEN is {family}"
        )));
    }
    if sock.r#type()? != Type::STREAM {
        return Err(bad("not a SOCK_STREAM AF_XEN socket".into()));
    }
    let accepts = sock.is_listener()?;
    if accepts != listening {
        return Err(bad(if accepts {
            "a listening AF_XEN socket, not a stream".into()
        } else {
            "an AF_XEN stream, not a listening socket".into()
        }));
    }
    Ok((sock, family))
}

/// A connected AF_XEN stream socket.
#[derive(Debug)]
pub(crate) struct KernelStream {
    sock: Socket,
    family: i32,
}

impl KernelStream {
    /// A stream socket of the family made elsewhere (inherited, passed
    /// over a Unix socket, made by C code).
    pub(crate) fn from_fd(fd: std::os::fd::OwnedFd) -> io::Result<KernelStream> {
        let (sock, family) = adopt_fd(fd, false)?;
        Ok(KernelStream { sock, family })
    }

    pub(crate) fn into_fd(self) -> std::os::fd::OwnedFd {
        self.sock.into()
    }

    /// `socket` + (`SO_RCVBUF`) + `connect`. With a timeout: a
    /// non-blocking connect completed through `POLLOUT` and `SO_ERROR`;
    /// `SO_SNDTIMEO` is set as well for modules whose connect ignores
    /// `O_NONBLOCK` (af_xen before non-blocking connect: its connect then
    /// blocks for up to its own limits, 10 s for the link and 30 s for the
    /// answer).
    pub(crate) fn connect(
        family: i32,
        addr: SockAddrXen,
        timeout: Option<Duration>,
        opts: SocketOptions,
    ) -> io::Result<KernelStream> {
        check_timeout(timeout)?;
        let sock = new_socket(family)?;
        if let Some(n) = opts.recv_buffer {
            sock.set_recv_buffer_size(n)?;
        }
        let sa = to_sockaddr(family, addr)?;
        match timeout {
            None => sock.connect(&sa)?,
            Some(t) => {
                sock.set_write_timeout(Some(t))?;
                match sock.connect_timeout(&sa, t) {
                    Ok(()) => {}
                    // socket2 reports its own poll timeout without an errno
                    Err(e) if e.kind() == io::ErrorKind::TimedOut && e.raw_os_error().is_none() => {
                        return Err(errno(libc::ETIMEDOUT))
                    }
                    Err(e) => return Err(e),
                }
                sock.set_nonblocking(false)?;
                sock.set_write_timeout(None)?;
            }
        }
        Ok(KernelStream { sock, family })
    }

    /// `socket` + (`SO_RCVBUF`) + a non-blocking `connect`: the stream
    /// comes back at once, in non-blocking mode, still connecting
    /// (`EINPROGRESS`) or already connected (a loopback connect);
    /// [`KernelStream::finish_connect`] completes it once the socket is
    /// writable. Errors the module reports at once (`ECONNREFUSED` for a
    /// loopback port nobody listens on, `EHOSTUNREACH`, `EINVAL`) are
    /// returned here.
    pub(crate) fn connect_nonblocking(
        family: i32,
        addr: SockAddrXen,
        opts: SocketOptions,
    ) -> io::Result<KernelStream> {
        let sock = new_socket(family)?;
        if let Some(n) = opts.recv_buffer {
            sock.set_recv_buffer_size(n)?;
        }
        sock.set_nonblocking(true)?;
        match sock.connect(&to_sockaddr(family, addr)?) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        Ok(KernelStream { sock, family })
    }

    /// Completes a non-blocking connect, as a TCP client does after
    /// `POLLOUT`: the connect's error (`SO_ERROR`, reported once) if it
    /// failed, `WouldBlock` while it is in progress (`getpeername`:
    /// `ENOTCONN`), `Ok` once connected (and on every later call).
    pub(crate) fn finish_connect(&self) -> io::Result<()> {
        if let Some(e) = self.sock.take_error()? {
            return Err(e);
        }
        match self.sock.peer_addr() {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                Err(io::Error::from(io::ErrorKind::WouldBlock))
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn peer_addr(&self) -> io::Result<SockAddrXen> {
        from_sockaddr(self.family, &self.sock.peer_addr()?)
    }

    pub(crate) fn local_addr(&self) -> io::Result<SockAddrXen> {
        from_sockaddr(self.family, &self.sock.local_addr()?)
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.sock.shutdown(how)
    }

    /// `SO_ERROR`.
    pub(crate) fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.sock.take_error()
    }

    pub(crate) fn try_clone(&self) -> io::Result<KernelStream> {
        Ok(KernelStream {
            sock: self.sock.try_clone()?,
            family: self.family,
        })
    }

    pub(crate) fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.sock.set_nonblocking(nb)
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.sock.set_read_timeout(t)
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.sock.set_write_timeout(t)
    }

    pub(crate) fn read_timeout(&self) -> io::Result<Option<Duration>> {
        self.sock.read_timeout()
    }

    pub(crate) fn write_timeout(&self) -> io::Result<Option<Duration>> {
        self.sock.write_timeout()
    }

    pub(crate) fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.sock.set_linger(linger)
    }

    pub(crate) fn linger(&self) -> io::Result<Option<Duration>> {
        self.sock.linger()
    }

    /// `SO_RCVBUF` as set (Linux reports twice the requested value, for
    /// its bookkeeping; the module sizes the ring from half of it, capped
    /// at what it can map).
    pub(crate) fn recv_buffer_size(&self) -> usize {
        self.sock.recv_buffer_size().map_or(0, |n| n / 2)
    }

    /// `SO_SNDBUF`, halved as [`KernelStream::recv_buffer_size`].
    pub(crate) fn send_buffer_size(&self) -> usize {
        self.sock.send_buffer_size().map_or(0, |n| n / 2)
    }

    /// A non-consuming `MSG_PEEK | MSG_DONTWAIT` of up to 64 KiB. Not
    /// `FIONREAD`: early af_xen builds left `proto_ops.ioctl` NULL, which
    /// the kernel calls unchecked (any ioctl on their sockets oopses the
    /// guest); a peek works on every build.
    pub(crate) fn bytes_readable(&self) -> usize {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        self.sock
            .recv_with_flags(&mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT)
            .unwrap_or(0)
    }

    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(&mut &self.sock, buf)
    }

    /// `recv(MSG_PEEK)`.
    pub(crate) fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        peek_fd(self.sock.as_raw_fd(), buf)
    }

    /// `send` with `MSG_NOSIGNAL`: a closed peer is `EPIPE`, never a
    /// signal, as with the user-space transport.
    pub(crate) fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.sock.send_with_flags(buf, libc::MSG_NOSIGNAL)
    }

    pub(crate) fn write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.sock.send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }
}

impl AsRawFd for KernelStream {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for KernelStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// A listening AF_XEN socket.
#[derive(Debug)]
pub(crate) struct KernelListener {
    sock: Socket,
    family: i32,
}

impl KernelListener {
    /// A listening socket of the family made elsewhere.
    pub(crate) fn from_fd(fd: std::os::fd::OwnedFd) -> io::Result<KernelListener> {
        let (sock, family) = adopt_fd(fd, true)?;
        Ok(KernelListener { sock, family })
    }

    pub(crate) fn into_fd(self) -> std::os::fd::OwnedFd {
        self.sock.into()
    }

    /// `socket` + (`SO_RCVBUF`) + `bind` + `listen`.
    pub(crate) fn bind(
        family: i32,
        addr: SockAddrXen,
        opts: SocketOptions,
    ) -> io::Result<KernelListener> {
        let sock = new_socket(family)?;
        if let Some(n) = opts.recv_buffer {
            sock.set_recv_buffer_size(n)?;
        }
        sock.bind(&to_sockaddr(family, addr)?)?;
        let backlog = opts
            .backlog
            .map_or(DEFAULT_BACKLOG, |b| b.clamp(1, i32::MAX as usize) as i32);
        sock.listen(backlog)?;
        Ok(KernelListener { sock, family })
    }

    fn wrap(&self, (sock, sa): (Socket, SockAddr)) -> io::Result<(KernelStream, SockAddrXen)> {
        let peer = from_sockaddr(self.family, &sa)?;
        Ok((
            KernelStream {
                sock,
                family: self.family,
            },
            peer,
        ))
    }

    pub(crate) fn accept(&self) -> io::Result<(KernelStream, SockAddrXen)> {
        let r = self.sock.accept()?;
        self.wrap(r)
    }

    /// `poll(POLLIN)` for up to `timeout`, then a non-blocking accept
    /// (another thread may have taken the connection: poll again). The
    /// listener is switched to `O_NONBLOCK` for that one call; a blocking
    /// `accept` on the same listener in another thread at that instant
    /// may see `WouldBlock`.
    pub(crate) fn accept_timeout(
        &self,
        timeout: Duration,
    ) -> io::Result<(KernelStream, SockAddrXen)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(errno(libc::ETIMEDOUT));
            }
            let mut pfd = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, libc::c_int::MAX as u128) as libc::c_int;
            let r = crate::sys::poll(std::slice::from_mut(&mut pfd), ms);
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                continue;
            }
            // accept4(SOCK_NONBLOCK) would change the new socket's mode;
            // MSG_DONTWAIT does not exist for accept, so use the raw
            // descriptor's flags only for this call.
            let fl = crate::sys::status_flags(self.sock.as_fd()).unwrap_or(0);
            let was_nb = fl & libc::O_NONBLOCK != 0;
            if !was_nb {
                self.sock.set_nonblocking(true)?;
            }
            let r = self.sock.accept();
            if !was_nb {
                self.sock.set_nonblocking(false)?;
            }
            match r {
                Ok(r) => return self.wrap(r),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn local_addr(&self) -> io::Result<SockAddrXen> {
        from_sockaddr(self.family, &self.sock.local_addr()?)
    }

    pub(crate) fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.sock.set_nonblocking(nb)
    }

    /// A second descriptor of the same listening socket (`dup`).
    pub(crate) fn try_clone(&self) -> io::Result<KernelListener> {
        Ok(KernelListener {
            sock: self.sock.try_clone()?,
            family: self.family,
        })
    }

    /// `SO_ERROR`, taken.
    pub(crate) fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.sock.take_error()
    }
}

impl AsRawFd for KernelListener {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for KernelListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{decode_sockaddr, encode_sockaddr, SOCKADDR_XEN_LEN};
    use crate::addr::{DOMID_ANY, DOMID_SELF, PORT_ANY};

    #[test]
    fn sockaddr_layout_matches_xensock_h() {
        let b = encode_sockaddr(19, SockAddrXen::new(7, 0x0102_0304));
        assert_eq!(&b[0..2], &19u16.to_ne_bytes(), "sxen_family");
        assert_eq!(&b[2..4], &[0, 0], "sxen_flags");
        assert_eq!(&b[4..8], &0x0102_0304u32.to_ne_bytes(), "sxen_port");
        assert_eq!(&b[8..12], &7u32.to_ne_bytes(), "sxen_domid");
        assert_eq!(&b[12..16], &[0; 4], "sxen_zero");
    }

    #[test]
    fn sockaddr_round_trips_special_values() {
        for a in [
            SockAddrXen::new(DOMID_SELF, PORT_ANY),
            SockAddrXen::new(DOMID_ANY, 80),
            SockAddrXen::new(1, 49152),
            SockAddrXen::new(0x7fef, 0),
        ] {
            let b = encode_sockaddr(23, a);
            assert_eq!(decode_sockaddr(23, &b).unwrap(), a);
            // through socket2's storage too, as connect/bind see it
            let sa = to_sockaddr(23, a).unwrap();
            assert_eq!(sa.len() as usize, SOCKADDR_XEN_LEN);
            assert_eq!(sa.family(), 23);
            assert_eq!(from_sockaddr(23, &sa).unwrap(), a);
        }
    }

    #[test]
    fn decode_refuses_short_or_foreign_addresses() {
        let b = encode_sockaddr(19, SockAddrXen::new(1, 2));
        let e = decode_sockaddr(19, &b[..15]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        let e = decode_sockaddr(libc::AF_UNIX, &b).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    fn fake_sysfs(content: Option<&str>) -> tempdir::Dir {
        let d = tempdir::Dir::new();
        if let Some(c) = content {
            let p = d.path().join(FAMILY_PARAM_IN_SYSFS);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        d
    }

    #[test]
    fn probe_reads_the_published_family() {
        let d = fake_sysfs(Some("19\n"));
        assert_eq!(probe_family(d.path()), FamilyProbe::Loaded(19));
        let d = fake_sysfs(Some("27"));
        assert_eq!(probe_family(d.path()), FamilyProbe::Loaded(27));
    }

    #[test]
    fn probe_tells_absent_from_garbage() {
        let d = fake_sysfs(None);
        assert_eq!(probe_family(d.path()), FamilyProbe::Absent);
        for bad in ["", "x", "0", "-3", "65536"] {
            let d = fake_sysfs(Some(bad));
            assert!(
                matches!(probe_family(d.path()), FamilyProbe::Invalid(_)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sockets_of_a_family_the_kernel_lacks_fail_with_its_errno() {
        // 13 (NetBEUI) was never implemented by Linux: the wrappers must
        // hand the kernel's errno through, not invent one.
        const NEVER_IMPLEMENTED: i32 = 13;
        let e = KernelStream::connect(
            NEVER_IMPLEMENTED,
            SockAddrXen::new(1, 1),
            None,
            SocketOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAFNOSUPPORT));
        let e = KernelListener::bind(
            NEVER_IMPLEMENTED,
            SockAddrXen::new(DOMID_SELF, 1),
            SocketOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAFNOSUPPORT));
        // a zero timeout is refused before any socket exists, as in std
        let e = KernelStream::connect(
            NEVER_IMPLEMENTED,
            SockAddrXen::new(1, 1),
            Some(Duration::ZERO),
            SocketOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    /// A temporary directory, removed on drop (no tempfile dependency).
    mod tempdir {
        use std::path::{Path, PathBuf};
        use std::sync::atomic::{AtomicU32, Ordering};

        pub struct Dir(PathBuf);

        impl Dir {
            pub fn new() -> Dir {
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "libxensock-sysfs-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
