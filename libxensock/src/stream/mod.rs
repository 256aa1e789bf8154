// SPDX-License-Identifier: MIT OR Apache-2.0
//! `XenStream`: a connected xensock stream, in the shape of
//! `std::net::TcpStream`, over the kernel family or the user-space
//! transport.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::addr::{SockAddrXen, ToXenAddr};
use crate::backend::BackendKind;
use crate::conn::Conn;
use crate::error::errno;
use crate::kernel::{loaded_family, KernelStream};
use crate::options::SocketOptions;
use crate::relay::RelayStream;
use crate::transport::Transport;

#[cfg(test)]
mod tests;
mod user;

use user::UserStream;

enum StreamImpl {
    User(UserStream),
    Kernel(KernelStream),
    /// A connection of the guest's `xensock daemon` ([`crate::daemon`]).
    Relay(RelayStream),
}

/// A connected xensock stream.
///
/// Made by [`XenStream::connect`] (or a listener's `accept`) on the
/// backend [`crate::backend()`] picks: an AF_XEN socket of the kernel
/// family where `af_xen.ko` is loaded, else the user-space transport.
/// Both behave as a `TcpStream`: `Read`/`Write` block unless non-blocking
/// mode is set, errors carry the errno of the socket calls, `try_clone`
/// shares the connection (closed when the last handle goes).
///
/// **Readiness** ([`AsRawFd`]). Kernel family: the socket itself, with
/// the usual `POLLIN`/`POLLOUT`/`POLLRDHUP`/`POLLHUP`/`POLLERR`.
/// User-space transport: an eventfd for poll/epoll/mio/tokio; poll it for
/// `POLLIN`/`EPOLLIN`. It becomes readable whenever something a caller
/// waited for may have happened -- data or end of stream to read, space to
/// write (after a write returned `WouldBlock`), a reset -- and it gets a
/// new edge on every such change, so edge-triggered users work. After a
/// `WouldBlock` the descriptor is reset; poll again. As with mio and
/// tokio, an edge-triggered user must retry an operation until it returns
/// `WouldBlock` before waiting for the next edge. (The eventfd's `POLLOUT`
/// carries no meaning.) Code that treats every readiness as "retry, then
/// wait for the next edge" (mio, tokio's `AsyncFd`) works with both.
pub struct XenStream {
    imp: StreamImpl,
}

impl std::fmt::Debug for XenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XenStream")
            .field("backend", &self.backend_kind())
            .field("local", &self.local_addr().ok())
            .field("peer", &self.peer_addr().ok())
            .finish()
    }
}

/// The user-space transport's connects: from a given [`Transport`] (one
/// per domain of a simulated host, or the process-wide one).
impl Transport {
    /// Connects to `addr` with the default timeout.
    pub fn connect(&self, addr: impl ToXenAddr) -> io::Result<XenStream> {
        self.connect_with(addr, None, SocketOptions::default())
    }

    /// Connects to `addr`, failing with `ETIMEDOUT` after `timeout`
    /// (`EHOSTUNREACH` if the link to the domain does not come up).
    pub fn connect_timeout(
        &self,
        addr: impl ToXenAddr,
        timeout: Duration,
    ) -> io::Result<XenStream> {
        if timeout.is_zero() {
            return Err(errno(libc::EINVAL));
        }
        self.connect_with(addr, Some(timeout), SocketOptions::default())
    }

    /// Connects with a receive-ring size (`SO_RCVBUF` equivalent) and a
    /// timeout (`None`: the transport's default).
    pub fn connect_with(
        &self,
        addr: impl ToXenAddr,
        timeout: Option<Duration>,
        opts: SocketOptions,
    ) -> io::Result<XenStream> {
        let conn = self.open_stream(addr, timeout, opts)?;
        Ok(XenStream::new(self.clone(), conn))
    }

    /// Starts a connect and returns at once, as a non-blocking `connect`
    /// returning `EINPROGRESS`: the stream is in non-blocking mode and
    /// still connecting. Its descriptor becomes readable when the answer
    /// comes; [`XenStream::finish_connect`] then reports the outcome
    /// (`WouldBlock` while still in progress), and
    /// [`XenStream::take_error`] the failure. Reads and writes return
    /// `WouldBlock` until the connection is open. There is no timeout:
    /// drop the stream to abandon the attempt.
    ///
    /// The only blocking part is bringing up the link to a domain this
    /// transport has no link with yet (XenStore, up to
    /// `Config::link_timeout`); an async caller runs
    /// [`Transport::prepare_link`] on a thread that may block first when
    /// [`Transport::link_ready`] is false.
    pub fn connect_nonblocking(
        &self,
        addr: impl ToXenAddr,
        opts: SocketOptions,
    ) -> io::Result<XenStream> {
        let conn = self.open_stream_nonblocking(addr, opts)?;
        Ok(XenStream::new(self.clone(), conn))
    }
}

/// An option the daemon's relay cannot carry.
fn relay_unsupported(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{what} is not available through the guest's xensock daemon"),
    )
}

/// Connects through the guest's `xensock daemon` if one answers
/// ([`crate::daemon`]); `None` otherwise.
fn via_daemon(addr: SockAddrXen, timeout: Option<Duration>) -> io::Result<Option<XenStream>> {
    let Some(path) = crate::relay::present() else {
        return Ok(None);
    };
    Ok(crate::relay::connect_via(&path, addr, timeout)?.map(XenStream::from_relay))
}

impl XenStream {
    pub(crate) fn from_relay(r: RelayStream) -> XenStream {
        XenStream {
            imp: StreamImpl::Relay(r),
        }
    }

    pub(crate) fn new(transport: Transport, conn: Arc<Conn>) -> XenStream {
        XenStream {
            imp: StreamImpl::User(UserStream::new(transport, conn)),
        }
    }

    pub(crate) fn from_kernel(k: KernelStream) -> XenStream {
        XenStream {
            imp: StreamImpl::Kernel(k),
        }
    }

    /// Connects with the backend [`crate::backend()`] picks: the kernel
    /// family if loaded, else the process-wide user-space transport
    /// ([`Transport::global`]). `ECONNREFUSED` when nothing listens,
    /// `EHOSTUNREACH` when no link to the domain can be set up, `EINVAL`
    /// for a bad address; with no backend available, an
    /// [`io::ErrorKind::Unsupported`] error that says why.
    pub fn connect(addr: impl ToXenAddr) -> io::Result<XenStream> {
        let addr = addr.to_xen_addr()?;
        match loaded_family() {
            Some(f) => KernelStream::connect(f, addr, None, SocketOptions::default())
                .map(Self::from_kernel),
            None => match via_daemon(addr, None)? {
                Some(s) => Ok(s),
                None => Transport::global()?.connect(addr),
            },
        }
    }

    /// [`XenStream::connect`] with a timeout (`ETIMEDOUT`; zero is
    /// `EINVAL`). Kernel family: a non-blocking connect completed through
    /// `POLLOUT`/`SO_ERROR`; a module without non-blocking connect blocks
    /// until its own limits (10 s for the link, 30 s for the answer)
    /// instead.
    pub fn connect_timeout(addr: &SockAddrXen, timeout: Duration) -> io::Result<XenStream> {
        match loaded_family() {
            Some(f) => KernelStream::connect(f, *addr, Some(timeout), SocketOptions::default())
                .map(Self::from_kernel),
            None if timeout.is_zero() => Err(io::Error::from_raw_os_error(libc::EINVAL)),
            None => match via_daemon(*addr, Some(timeout))? {
                Some(s) => Ok(s),
                None => Transport::global()?.connect_timeout(*addr, timeout),
            },
        }
    }

    /// [`XenStream::connect`] with socket options (receive-ring size:
    /// `SO_RCVBUF` for the kernel family).
    pub fn connect_with(addr: impl ToXenAddr, opts: SocketOptions) -> io::Result<XenStream> {
        let addr = addr.to_xen_addr()?;
        match loaded_family() {
            Some(f) => KernelStream::connect(f, addr, None, opts).map(Self::from_kernel),
            None => match via_daemon(addr, None)? {
                Some(s) => Ok(s),
                None => Transport::global()?.connect_with(addr, None, opts),
            },
        }
    }

    /// Starts a connect that does not wait for the peer's answer, as a
    /// non-blocking TCP connect (`EINPROGRESS`): the stream comes back in
    /// non-blocking mode while the connect is in progress; once its
    /// descriptor is writable (kernel family) or readable (user-space
    /// transport), [`XenStream::finish_connect`] says how it ended.
    /// Kernel family: a non-blocking `connect` on the AF_XEN socket.
    /// User-space transport: [`Transport::connect_nonblocking`] on the
    /// process-wide transport (which blocks while it brings up the first
    /// link to a domain). Errors known at once (`EINVAL`, `EHOSTUNREACH`,
    /// a loopback `ECONNREFUSED`) are returned here.
    pub fn connect_nonblocking(addr: impl ToXenAddr, opts: SocketOptions) -> io::Result<XenStream> {
        let addr = addr.to_xen_addr()?;
        match loaded_family() {
            Some(f) => KernelStream::connect_nonblocking(f, addr, opts).map(Self::from_kernel),
            None => match via_daemon(addr, None)? {
                // the daemon answers once the connect ended
                Some(s) => s.set_nonblocking(true).map(|()| s),
                None => Transport::global()?.connect_nonblocking(addr, opts),
            },
        }
    }

    /// Which backend carries this stream ([`BackendKind::Kernel`], or the
    /// user-space transport's).
    pub fn backend_kind(&self) -> BackendKind {
        match &self.imp {
            StreamImpl::User(u) => u.transport().backend_kind(),
            StreamImpl::Kernel(_) => BackendKind::Kernel,
            StreamImpl::Relay(_) => BackendKind::Daemon,
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SockAddrXen> {
        match &self.imp {
            StreamImpl::User(u) => u.peer_addr(),
            StreamImpl::Kernel(k) => k.peer_addr(),
            StreamImpl::Relay(r) => Ok(r.peer),
        }
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        match &self.imp {
            StreamImpl::User(u) => u.local_addr(),
            StreamImpl::Kernel(k) => k.local_addr(),
            StreamImpl::Relay(r) => Ok(r.local),
        }
    }

    /// Completes a connect started with [`Transport::connect_nonblocking`]:
    /// `Ok` once the connection is open (and on every later call), the
    /// connect's error if it failed (`ECONNREFUSED`, ...), `WouldBlock`
    /// while the answer has not come. After `WouldBlock` the descriptor is
    /// reset and becomes readable when the answer arrives. Kernel family
    /// (a non-blocking connect, [`XenStream::connect_nonblocking`]): the
    /// socket's pending error (`SO_ERROR`) if the connect failed,
    /// `WouldBlock` while it is in progress (the socket becomes writable
    /// when it ends), else `Ok`.
    pub fn finish_connect(&self) -> io::Result<()> {
        match &self.imp {
            StreamImpl::User(u) => u.finish_connect(),
            StreamImpl::Kernel(k) => k.finish_connect(),
            StreamImpl::Relay(_) => Ok(()),
        }
    }

    /// The error of a failed connect (`SO_ERROR`), `None` while connecting
    /// or once connected.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        match &self.imp {
            StreamImpl::User(u) => u.take_error(),
            StreamImpl::Kernel(k) => k.take_error(),
            StreamImpl::Relay(r) => r.sock.take_error(),
        }
    }

    /// Shuts down one or both directions: `Write` sends end-of-stream
    /// after the bytes written so far; `Read` makes reads return 0 and the
    /// peer's writes fail with `EPIPE`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match &self.imp {
            StreamImpl::User(u) => u.shutdown(how),
            StreamImpl::Kernel(k) => k.shutdown(how),
            StreamImpl::Relay(r) => r.sock.shutdown(how),
        }
    }

    /// Another handle on the same connection (shares options and mode;
    /// for the kernel family, a `dup` of the socket).
    pub fn try_clone(&self) -> io::Result<XenStream> {
        Ok(XenStream {
            imp: match &self.imp {
                StreamImpl::User(u) => StreamImpl::User(u.try_clone()?),
                StreamImpl::Kernel(k) => StreamImpl::Kernel(k.try_clone()?),
                StreamImpl::Relay(r) => StreamImpl::Relay(r.try_clone()?),
            },
        })
    }

    /// Non-blocking mode: reads and writes return `WouldBlock` instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match &self.imp {
            StreamImpl::User(u) => u.set_nonblocking(nonblocking),
            StreamImpl::Kernel(k) => k.set_nonblocking(nonblocking),
            StreamImpl::Relay(r) => r.sock.set_nonblocking(nonblocking),
        }
    }

    /// Read timeout (`None`: wait forever; zero is `EINVAL`, as in std).
    /// A read that times out fails with `WouldBlock` (`EAGAIN`).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.imp {
            StreamImpl::User(u) => u.set_read_timeout(t),
            StreamImpl::Kernel(k) => k.set_read_timeout(t),
            StreamImpl::Relay(r) => r.sock.set_read_timeout(t),
        }
    }

    /// Write timeout (`None`: wait forever; zero is `EINVAL`).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.imp {
            StreamImpl::User(u) => u.set_write_timeout(t),
            StreamImpl::Kernel(k) => k.set_write_timeout(t),
            StreamImpl::Relay(r) => r.sock.set_write_timeout(t),
        }
    }

    /// `SO_LINGER`, as on a TCP socket: `Some(0)` makes the close abortive
    /// (the peer's next read or write gets `ECONNRESET`, and what it had
    /// not read is dropped); `None` or another time, the usual close (what
    /// was written is delivered). Not through the guest's daemon
    /// (`Unsupported`): its relay cannot reset the connection.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        match &self.imp {
            StreamImpl::User(u) => u.set_linger(linger),
            StreamImpl::Kernel(k) => k.set_linger(linger),
            StreamImpl::Relay(_) => Err(relay_unsupported("SO_LINGER")),
        }
    }

    /// The `SO_LINGER` value set.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        match &self.imp {
            StreamImpl::User(u) => u.linger(),
            StreamImpl::Kernel(k) => k.linger(),
            StreamImpl::Relay(_) => Ok(None),
        }
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        match &self.imp {
            StreamImpl::User(u) => u.read_timeout(),
            StreamImpl::Kernel(k) => k.read_timeout(),
            StreamImpl::Relay(r) => r.sock.read_timeout(),
        }
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        match &self.imp {
            StreamImpl::User(u) => u.write_timeout(),
            StreamImpl::Kernel(k) => k.write_timeout(),
            StreamImpl::Relay(r) => r.sock.write_timeout(),
        }
    }

    /// Size of our receive ring (`SO_RCVBUF`). Kernel family: the
    /// `SO_RCVBUF` the socket asked for (the module caps its ring at what
    /// it can map, 64 KiB today).
    pub fn recv_buffer_size(&self) -> usize {
        match &self.imp {
            StreamImpl::User(u) => u.recv_buffer_size(),
            StreamImpl::Kernel(k) => k.recv_buffer_size(),
            StreamImpl::Relay(r) => r.recv_buffer_size(),
        }
    }

    /// Size of the peer's receive ring that we write into (`SO_SNDBUF`;
    /// kernel family: the socket's `SO_SNDBUF`).
    pub fn send_buffer_size(&self) -> usize {
        match &self.imp {
            StreamImpl::User(u) => u.send_buffer_size(),
            StreamImpl::Kernel(k) => k.send_buffer_size(),
            StreamImpl::Relay(r) => r.send_buffer_size(),
        }
    }

    /// Bytes readable right now without blocking.
    pub fn bytes_readable(&self) -> usize {
        match &self.imp {
            StreamImpl::User(u) => u.bytes_readable(),
            StreamImpl::Kernel(k) => k.bytes_readable(),
            StreamImpl::Relay(r) => r.bytes_readable(),
        }
    }

    /// The user-space transport this stream belongs to; `None` for a
    /// socket of the kernel family.
    pub fn transport(&self) -> Option<&Transport> {
        match &self.imp {
            StreamImpl::User(u) => Some(u.transport()),
            StreamImpl::Kernel(_) => None,
            StreamImpl::Relay(_) => None,
        }
    }

    /// For the hostile-peer test: stores `value` at byte `offset` of the
    /// *peer's* receive ring that this stream writes into (header
    /// included), as a scribbling domain would. Returns false when the ring
    /// is not mapped (always, for the kernel family: its rings are kernel
    /// memory).
    #[cfg(test)]
    fn scribble_peer_ring(&self, offset: usize, value: u32) -> bool {
        match &self.imp {
            StreamImpl::User(u) => u.scribble_peer_ring(offset, value),
            StreamImpl::Kernel(_) => false,
            StreamImpl::Relay(_) => false,
        }
    }
}

impl XenStream {
    /// Reads without consuming (`recv(MSG_PEEK)`): the bytes a read would
    /// return now, waiting as a read waits (not in non-blocking mode:
    /// `WouldBlock`), left for the next read; 0 at end of stream.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.imp {
            StreamImpl::User(u) => u.peek(buf),
            StreamImpl::Kernel(k) => k.peek(buf),
            StreamImpl::Relay(r) => crate::kernel::peek_fd(r.sock.as_raw_fd(), buf),
        }
    }
}

/// An AF_XEN stream socket of the kernel family made elsewhere (inherited,
/// received over a Unix socket, made by C code): `InvalidInput` for a
/// descriptor that is not one, saying what it is.
impl TryFrom<OwnedFd> for XenStream {
    type Error = io::Error;

    fn try_from(fd: OwnedFd) -> io::Result<XenStream> {
        Ok(XenStream::from_kernel(KernelStream::from_fd(fd)?))
    }
}

impl XenStream {
    /// The socket descriptor, for the kernel family and the daemon's
    /// relay (a Unix stream socket); a stream of this process's
    /// user-space transport has none (its descriptor only signals
    /// readiness) and comes back as the error.
    pub fn into_fd(self) -> Result<OwnedFd, XenStream> {
        match self.imp {
            StreamImpl::Kernel(k) => Ok(k.into_fd()),
            StreamImpl::Relay(r) => Ok(OwnedFd::from(r.sock)),
            imp @ StreamImpl::User(_) => Err(XenStream { imp }),
        }
    }
}

impl Read for &XenStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.imp {
            StreamImpl::User(u) => (&*u).read(buf),
            StreamImpl::Kernel(k) => k.read(buf),
            StreamImpl::Relay(r) => (&r.sock).read(buf),
        }
    }
}

impl Write for &XenStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.imp {
            StreamImpl::User(u) => (&*u).write(buf),
            StreamImpl::Kernel(k) => k.write(buf),
            StreamImpl::Relay(r) => r.send(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match &self.imp {
            StreamImpl::User(u) => (&*u).write_vectored(bufs),
            StreamImpl::Kernel(k) => k.write_vectored(bufs),
            StreamImpl::Relay(r) => r.send_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for XenStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for XenStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for XenStream {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl AsFd for XenStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.imp {
            StreamImpl::User(u) => u.as_fd(),
            StreamImpl::Kernel(k) => k.as_fd(),
            StreamImpl::Relay(r) => r.sock.as_fd(),
        }
    }
}
