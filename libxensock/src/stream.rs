// SPDX-License-Identifier: MIT OR Apache-2.0
//! `XenStream`: a connected xensock stream, in the shape of
//! `std::net::TcpStream`, over the kernel family or the user-space
//! transport.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::addr::{SockAddrXen, ToXenAddr};
use crate::backend::BackendKind;
use crate::carrier::Switch;
use crate::conn::{is_carried, lock, Conn, ConnPhase, WANT_READ, WANT_WRITE};
use crate::error::errno;
use crate::kernel::{loaded_family, KernelStream};
use crate::options::SocketOptions;
use crate::relay::RelayStream;
use crate::transport::Transport;

/// Closes the connection when the last clone goes.
struct Guard {
    transport: Transport,
    conn: Arc<Conn>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.transport.owner.inner.close_conn(&self.conn);
    }
}

/// The per-stream options every handle shares.
#[derive(Default)]
struct StreamOptions {
    read: Option<Duration>,
    write: Option<Duration>,
    linger: Option<Duration>,
}

/// A stream of the user-space transport: the connection's shared rings,
/// with an eventfd for readiness.
struct UserStream {
    guard: Arc<Guard>,
    options: Arc<Mutex<StreamOptions>>,
}

impl UserStream {
    fn new(transport: Transport, conn: Arc<Conn>) -> UserStream {
        UserStream {
            guard: Arc::new(Guard { transport, conn }),
            options: Arc::new(Mutex::new(StreamOptions::default())),
        }
    }

    fn conn(&self) -> &Arc<Conn> {
        &self.guard.conn
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SockAddrXen> {
        let c = self.conn();
        Ok(SockAddrXen::new(u32::from(c.peer()), c.peer_port))
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        let c = self.conn();
        Ok(SockAddrXen::new(
            u32::from(self.guard.transport.domid()),
            c.local_port,
        ))
    }

    /// Completes a connect started with [`Transport::connect_nonblocking`]:
    /// `Ok` once the connection is open (and on every later call), the
    /// connect's error if it failed (`ECONNREFUSED`, ...), `WouldBlock`
    /// while the answer has not come. After `WouldBlock` the descriptor is
    /// reset and becomes readable when the answer arrives.
    pub fn finish_connect(&self) -> io::Result<()> {
        let c = self.conn();
        let check = || match c.io().phase {
            ConnPhase::Connecting => Err(io::Error::from(io::ErrorKind::WouldBlock)),
            ConnPhase::Failed(e) => Err(errno(e)),
            _ => Ok(()),
        };
        match check() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        // The manager sets the phase, then signals: a signal after this
        // drain is a new edge; one before it left a phase we see below.
        c.evfd.drain();
        check()
    }

    /// The error of a failed non-blocking connect (`SO_ERROR`), `None`
    /// while connecting or once connected. The stream stays failed.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(match self.conn().io().phase {
            ConnPhase::Failed(e) => Some(errno(e)),
            _ => None,
        })
    }

    /// Shuts down one or both directions: `Write` sends end-of-stream
    /// after the bytes written so far; `Read` makes reads return 0 and the
    /// peer's writes fail with `EPIPE`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let c = self.conn();
        if let Some(e) = c.switch() {
            if matches!(how, Shutdown::Write | Shutdown::Both) {
                e.shutdown_write()?;
            }
            if matches!(how, Shutdown::Read | Shutdown::Both) {
                // No TCP counterpart of the ring's CLOSED flag in version
                // 1: reads end here, the peer's writes are not refused.
                c.io().shut_rd = true;
            }
            c.signal();
            return Ok(());
        }
        {
            let mut io = c.io();
            match io.phase {
                ConnPhase::Open => {}
                ConnPhase::Reset { .. } | ConnPhase::Closed => return Ok(()),
                _ => return Err(errno(libc::ENOTCONN)),
            }
            if matches!(how, Shutdown::Write | Shutdown::Both) {
                io.shutdown_write();
            }
            if matches!(how, Shutdown::Read | Shutdown::Both) {
                io.shutdown_read();
            }
        }
        c.signal();
        Ok(())
    }

    /// Another handle on the same connection (shares options and mode).
    pub fn try_clone(&self) -> io::Result<UserStream> {
        Ok(UserStream {
            guard: self.guard.clone(),
            options: self.options.clone(),
        })
    }

    /// Non-blocking mode: reads and writes return `WouldBlock` instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.conn()
            .nonblocking
            .store(nonblocking, Ordering::Release);
        Ok(())
    }

    /// Read timeout (`None`: wait forever; zero is `EINVAL`, as in std).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t.is_some_and(|t| t.is_zero()) {
            return Err(errno(libc::EINVAL));
        }
        lock(&self.options).read = t;
        Ok(())
    }

    /// Write timeout (`None`: wait forever; zero is `EINVAL`).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t.is_some_and(|t| t.is_zero()) {
            return Err(errno(libc::EINVAL));
        }
        lock(&self.options).write = t;
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(lock(&self.options).read)
    }

    /// `SO_LINGER`: `Some(0)` makes the close reset the connection; any
    /// other value leaves the close as it is (what was written is
    /// delivered; a connection on its TCP carrier lingers until the peer
    /// acknowledged it).
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        lock(&self.options).linger = linger;
        self.conn().io().abort_on_close = linger == Some(Duration::ZERO);
        Ok(())
    }

    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(lock(&self.options).linger)
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(lock(&self.options).write)
    }

    /// Size of our receive ring (`SO_RCVBUF`).
    pub fn recv_buffer_size(&self) -> usize {
        self.conn()
            .io()
            .rx
            .as_ref()
            .map_or(0, |r| r.c.capacity() as usize)
    }

    /// Size of the peer's receive ring that we write into (`SO_SNDBUF`).
    pub fn send_buffer_size(&self) -> usize {
        self.conn()
            .io()
            .tx
            .as_ref()
            .map_or(0, |t| t.p.capacity() as usize)
    }

    /// Bytes readable right now without blocking.
    pub fn bytes_readable(&self) -> usize {
        self.conn()
            .io()
            .rx
            .as_ref()
            .and_then(|r| r.c.readable().ok())
            .unwrap_or(0) as usize
    }

    /// The transport this stream belongs to.
    pub fn transport(&self) -> &Transport {
        &self.guard.transport
    }

    /// Test hook for the hostile-peer tests: stores `value` at byte
    /// `offset` of the *peer's* receive ring that this stream writes into
    /// (header included), as a scribbling domain would. Returns false when
    /// the ring is not mapped. Not part of the API.
    #[doc(hidden)]
    pub fn debug_scribble_peer_ring(&self, offset: usize, value: u32) -> bool {
        let io = self.conn().io();
        let Some(tx) = io.tx.as_ref() else {
            return false;
        };
        let region = &tx.mapped.region;
        let Some(cell) = crate::sys::shared::word_at(&**region, offset) else {
            return false;
        };
        cell.store(value, Ordering::Release);
        if let Some(k) = &io.kicker {
            let _ = k.notify();
        }
        true
    }

    fn finish_err(&self, e: io::Error) -> io::Error {
        if e.raw_os_error() == Some(libc::ECONNRESET) {
            self.guard
                .transport
                .owner
                .inner
                .report_violation(self.conn());
        }
        e
    }

    /// An operation on the carrier switch: blocking calls block in the
    /// switch (no timeout) or wait for its ready hook (timeout);
    /// non-blocking ones return `WouldBlock` with the descriptor reset, as
    /// on the fast path.
    fn engine_op<T>(
        &self,
        switch: &Switch,
        want: u8,
        timeout: Option<Duration>,
        mut f: impl FnMut(&Switch, bool) -> io::Result<T>,
    ) -> io::Result<T> {
        let c = self.conn();
        let nonblocking = c.nonblocking.load(Ordering::Acquire);
        if !nonblocking && timeout.is_none() {
            return f(switch, false);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let g0 = c.generation();
            match f(switch, true) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
                Ok(v) => {
                    c.waiting.fetch_and(!want, Ordering::AcqRel);
                    return Ok(v);
                }
            }
            if nonblocking {
                c.waiting.fetch_or(want, Ordering::AcqRel);
                // Reset the descriptor, then look again: the switch's hook
                // signals it anew for anything after the drain.
                c.evfd.drain();
                match f(switch, true) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                    Ok(v) => {
                        c.waiting.fetch_and(!want, Ordering::AcqRel);
                        return Ok(v);
                    }
                }
                // The drain may have taken the other direction's edge:
                // give it back unless its hook call is still to come.
                let other = (WANT_READ | WANT_WRITE) & !want;
                if c.waiting.load(Ordering::Acquire) & other != 0
                    && !switch.nb_pending(other == WANT_READ)
                {
                    c.evfd.signal();
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if !c.wait_since(g0, deadline) {
                return Err(errno(libc::EAGAIN));
            }
        }
    }

    /// A read, or with `peek` what a read would return now (waiting as a
    /// read waits), left for the next read.
    fn read_impl(&self, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        let t = lock(&self.options).read;
        let c = self.conn();
        if let Some(e) = c.switch() {
            if c.io().shut_rd {
                return Ok(0);
            }
            return self.engine_op(&e, WANT_READ, t, |e, nb| match (peek, nb) {
                (true, _) => e.peek(buf, nb),
                (false, true) => e.try_read(buf),
                (false, false) => e.read(buf),
            });
        }
        let step = |io: &mut crate::conn::ConnIo| {
            if peek {
                io.try_peek(buf)
            } else {
                io.try_read(buf)
            }
        };
        match self.op(WANT_READ, 1, t, step) {
            Err(e) if is_carried(&e) => self.read_impl(buf, peek),
            r => r,
        }
    }

    /// What a read would return now (waiting as a read waits), left for
    /// the next read.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf, true)
    }

    fn write_impl(&self, buf: &[u8]) -> io::Result<usize> {
        let t = lock(&self.options).write;
        if let Some(e) = self.conn().switch() {
            return self.engine_op(&e, WANT_WRITE, t, |e, nb| {
                if nb {
                    e.try_write(buf)
                } else {
                    e.write(buf)
                }
            });
        }
        let cap = self.send_buffer_size().max(1) as u32;
        let want = (buf.len().min(u32::MAX as usize) as u32).clamp(1, (cap / 4).max(1));
        match self.op(WANT_WRITE, want, t, |io| io.try_write(buf)) {
            Err(e) if is_carried(&e) => self.write_impl(buf),
            r => r,
        }
    }

    fn op<T>(
        &self,
        want: u8,
        write_want: u32,
        timeout: Option<Duration>,
        mut f: impl FnMut(&mut crate::conn::ConnIo) -> io::Result<T>,
    ) -> io::Result<T> {
        let c = self.conn();
        let busy = self.guard.transport.owner.inner.cfg.busy_poll;
        let mut spin_until: Option<Instant> = None;
        let mut deadline: Option<Instant> = None;
        loop {
            let r = f(&mut c.io());
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(self.finish_err(e)),
                Ok(v) => {
                    c.waiting.fetch_and(!want, Ordering::AcqRel);
                    return Ok(v);
                }
            }
            if c.nonblocking.load(Ordering::Acquire) {
                c.rearm_nonblocking(want, write_want);
                // The re-check may have found what we wanted.
                let r = f(&mut c.io());
                match r {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Err(io::ErrorKind::WouldBlock.into())
                    }
                    Err(e) => return Err(self.finish_err(e)),
                    Ok(v) => {
                        c.waiting.fetch_and(!want, Ordering::AcqRel);
                        return Ok(v);
                    }
                }
            }
            let now = Instant::now();
            if deadline.is_none() {
                deadline = timeout.map(|t| now + t);
            }
            let spin_end = *spin_until.get_or_insert(now + busy);
            if now < spin_end {
                // Yield rather than burn the core: on a busy machine the
                // peer we wait for may need it.
                std::thread::yield_now();
                continue;
            }
            if !c.wait(want, write_want, deadline) {
                return Err(errno(libc::EAGAIN));
            }
            spin_until = Some(Instant::now() + busy);
        }
    }
}

impl Read for &UserStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf, false)
    }
}

impl Write for &UserStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_impl(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if self.conn().switch().is_some() {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.write_impl(first);
        }
        let t = lock(&self.options).write;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let cap = self.send_buffer_size().max(1) as u32;
        let want = (len.min(u32::MAX as usize) as u32).clamp(1, (cap / 4).max(1));
        self.op(WANT_WRITE, want, t, |io| {
            let mut total = 0;
            for b in bufs.iter().filter(|b| !b.is_empty()) {
                match io.try_write(b) {
                    Ok(n) => {
                        total += n;
                        if n < b.len() {
                            break;
                        }
                    }
                    Err(e) if total == 0 => return Err(e),
                    Err(_) => break,
                }
            }
            Ok(total)
        })
        .or_else(|e| {
            if is_carried(&e) {
                let first = bufs
                    .iter()
                    .find(|b| !b.is_empty())
                    .map_or(&[][..], |b| &b[..]);
                self.write_impl(first)
            } else {
                Err(e)
            }
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for UserStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn().evfd.as_fd()
    }
}

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

    /// Test hook for the hostile-peer tests: stores `value` at byte
    /// `offset` of the *peer's* receive ring that this stream writes into
    /// (header included), as a scribbling domain would. Returns false when
    /// the ring is not mapped (always, for the kernel family: its rings
    /// are kernel memory). Not part of the API.
    #[doc(hidden)]
    pub fn debug_scribble_peer_ring(&self, offset: usize, value: u32) -> bool {
        match &self.imp {
            StreamImpl::User(u) => u.debug_scribble_peer_ring(offset, value),
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
