// SPDX-License-Identifier: MIT OR Apache-2.0
//! # tokio-xensock
//!
//! Async xensock sockets for tokio, in the shape of tokio's
//! `TcpListener`/`TcpStream` and tokio-vsock: [`XenListener::bind`],
//! [`XenListener::accept`], [`XenStream::connect`], `AsyncRead`/`AsyncWrite`
//! (with vectored writes), [`XenStream::split`] / [`XenStream::into_split`],
//! and a `Stream` of incoming connections. Works with
//! `tokio_util::codec::Framed`, hyper and tonic.
//!
//! ```no_run
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use tokio_xensock::{XenListener, XenStream};
//!
//! # async fn f() -> std::io::Result<()> {
//! let listener = XenListener::bind("xen:self:5000")?;
//! tokio::spawn(async move {
//!     let (mut s, _peer) = listener.accept().await?;
//!     let mut buf = [0u8; 1024];
//!     let n = s.read(&mut buf).await?;
//!     s.write_all(&buf[..n]).await?;
//!     Ok::<_, std::io::Error>(())
//! });
//! let mut s = XenStream::connect("xen:1:5000").await?;
//! s.write_all(b"hello").await?;
//! # Ok(()) }
//! ```
//!
//! The same on two domains of a simulated host, in one process (it runs
//! anywhere, as this example does under `cargo test`), with one
//! [`libxensock::Transport`] per domain:
//!
//! ```
//! use libxensock::Transport;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use tokio_xensock::{XenListener, XenStream};
//! use xensock_sim::{DomainConfig, SimHost};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let host = SimHost::start().map_err(std::io::Error::other)?;
//! let one = host.create_domain(DomainConfig::new("one")).map_err(std::io::Error::other)?;
//! let two = host.create_domain(DomainConfig::new("two")).map_err(std::io::Error::other)?;
//! let (t1, t2) = (Transport::sim(host.dir(), one.domid)?, Transport::sim(host.dir(), two.domid)?);
//!
//! let listener = XenListener::bind_on(&t1, "xen:self:5000")?;
//! let server = tokio::spawn(async move {
//!     let (mut s, _peer) = listener.accept().await?;
//!     let mut buf = [0u8; 5];
//!     s.read_exact(&mut buf).await?;
//!     s.write_all(&buf).await?;
//!     Ok::<_, std::io::Error>(())
//! });
//! let mut s = XenStream::connect_on(&t2, (u32::from(one.domid), 5000)).await?;
//! s.write_all(b"hello").await?;
//! let mut back = [0u8; 5];
//! s.read_exact(&mut back).await?;
//! assert_eq!(&back, b"hello");
//! server.await.unwrap()?;
//! # Ok(()) }
//! ```
//!
//! Over the kernel family (`af_xen.ko` loaded) each socket is an AF_XEN
//! socket descriptor with ordinary socket readiness. Over the user-space
//! transport, each socket's readiness is libxensock's eventfd, registered with
//! tokio's reactor through [`AsyncFd::register_with_interest`]. The
//! descriptor gets an edge whenever either direction may make progress;
//! every write to an eventfd reports both `EPOLLIN` and `EPOLLOUT`, so
//! readers wait on tokio's read readiness and writers on its write
//! readiness, each with its own waker (one reader task and one writer task
//! per stream, as with tokio's `TcpStream`). Operations are always tried
//! first; a `WouldBlock` re-arms the descriptor (and re-signals it if the
//! other direction is ready, so neither loses its wakeup).
//!
//! Each read or write takes one unit of the task's cooperative budget, as
//! tokio's own sockets do. A task whose every write is ready at once (a
//! peer that keeps up, a ring with room) gives its worker back only when
//! that budget (128 operations) runs out: if each round also does heavy
//! work, yield between rounds (`tokio::task::yield_now`), or the other
//! tasks on that worker, and the I/O driver and timers it would turn, wait
//! that long (in the lab under software emulation, 4-9 s; docs/lab.md,
//! "100 moves under one stream").
#![deny(unsafe_code)]

use std::io;
use std::net::Shutdown;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
pub use libxensock::{SockAddrXen, SocketOptions, ToXenAddr, Transport};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

pub use libxensock;

#[allow(unsafe_code)] // the unsafe floor: every unsafe block, each with its SAFETY comment
mod sys;
#[cfg(feature = "tonic")]
mod tonic;
#[cfg(feature = "tonic")]
pub use crate::tonic::XenConnectInfo;

use sys::register;

/// A xensock listener for tokio.
#[derive(Debug)]
pub struct XenListener {
    inner: AsyncFd<libxensock::XenListener>,
}

impl XenListener {
    /// Binds on the process-wide transport. Must be called inside a tokio
    /// runtime.
    pub fn bind(addr: impl ToXenAddr) -> io::Result<XenListener> {
        XenListener::from_std(libxensock::XenListener::bind(addr)?)
    }

    /// Binds on `transport` (e.g. one domain of a simulated host).
    pub fn bind_on(transport: &Transport, addr: impl ToXenAddr) -> io::Result<XenListener> {
        XenListener::from_std(transport.bind(addr)?)
    }

    /// Binds with socket options (backlog, receive-ring size).
    pub fn bind_with(
        transport: &Transport,
        addr: impl ToXenAddr,
        opts: SocketOptions,
    ) -> io::Result<XenListener> {
        XenListener::from_std(transport.bind_with(addr, opts)?)
    }

    /// Wraps a blocking listener (switching it to non-blocking mode).
    pub fn from_std(l: libxensock::XenListener) -> io::Result<XenListener> {
        l.set_nonblocking(true)?;
        Ok(XenListener {
            inner: register(l)?,
        })
    }

    /// Accepts a connection.
    pub async fn accept(&self) -> io::Result<(XenStream, SockAddrXen)> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for a connection.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(XenStream, SockAddrXen)>> {
        loop {
            match self.inner.get_ref().accept() {
                Ok((s, a)) => return Poll::Ready(XenStream::from_std(s).map(|s| (s, a))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(self.inner.poll_read_ready(cx))?.clear_ready();
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        self.inner.get_ref().local_addr()
    }

    /// A `Stream` of incoming connections.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }
}

impl Stream for XenListener {
    type Item = io::Result<XenStream>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
    }
}

/// The `Stream` returned by [`XenListener::incoming`].
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a XenListener,
}

impl Stream for Incoming<'_> {
    type Item = io::Result<XenStream>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.listener
            .poll_accept(cx)
            .map(|r| Some(r.map(|(s, _)| s)))
    }
}

/// A connected xensock stream for tokio.
#[derive(Debug)]
pub struct XenStream {
    inner: Arc<AsyncFd<libxensock::XenStream>>,
}

/// The socket's descriptor (the AF_XEN socket over the kernel family,
/// libxensock's readiness eventfd over the user-space transport), as
/// tokio's `TcpStream` lends its own: for `getsockopt`, `poll` or
/// diagnostics. Reading or writing through it bypasses tokio's readiness.
impl std::os::fd::AsFd for XenStream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.get_ref().as_fd()
    }
}

impl std::os::fd::AsRawFd for XenStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.as_raw_fd()
    }
}

impl XenStream {
    /// Connects with the backend [`libxensock::backend()`] picks: the
    /// kernel family where `af_xen.ko` is loaded, else the process-wide
    /// user-space transport (created on the blocking pool the first time:
    /// it talks to XenStore). Over the kernel family this is tokio's
    /// `TcpStream::connect` shape: a non-blocking `connect`
    /// (`EINPROGRESS`), then the socket's write readiness and `SO_ERROR`;
    /// no thread waits for the answer. Like `TcpStream::connect` it has no
    /// timeout of its own beyond the module's: wrap it in
    /// `tokio::time::timeout` (dropping it closes the socket, which
    /// abandons the attempt).
    pub async fn connect(addr: impl ToXenAddr) -> io::Result<XenStream> {
        let addr = addr.to_xen_addr()?;
        if libxensock::backend().kind == libxensock::BackendKind::Kernel {
            let s = XenStream::from_std(libxensock::XenStream::connect_nonblocking(
                addr,
                SocketOptions::default(),
            )?)?;
            std::future::poll_fn(|cx| s.poll_connected(cx)).await?;
            return Ok(s);
        }
        if libxensock::daemon::present().is_some() {
            // The guest's xensock daemon holds its transport: connect
            // through it on the blocking pool (it answers once the connect
            // ended; a daemon that is gone falls back to this process's
            // transport there).
            let s = tokio::task::spawn_blocking(move || libxensock::XenStream::connect(addr))
                .await
                .map_err(io::Error::other)??;
            return XenStream::from_std(s);
        }
        let t = tokio::task::spawn_blocking(Transport::global)
            .await
            .map_err(io::Error::other)??;
        XenStream::connect_on(&t, addr).await
    }

    /// Connects through `transport`.
    pub async fn connect_on(transport: &Transport, addr: impl ToXenAddr) -> io::Result<XenStream> {
        XenStream::connect_with(transport, addr, SocketOptions::default()).await
    }

    /// Connects through `transport` with socket options.
    ///
    /// The handshake never blocks a runtime thread: the request goes out
    /// with [`Transport::connect_nonblocking`] and the future waits for the
    /// stream's descriptor, like a non-blocking TCP connect. Only the first
    /// connect to a domain, which brings the link up through XenStore,
    /// runs that part on tokio's blocking pool. Like tokio's
    /// `TcpStream::connect` it has no timeout of its own: wrap it in
    /// `tokio::time::timeout` (dropping it abandons the attempt).
    pub async fn connect_with(
        transport: &Transport,
        addr: impl ToXenAddr,
        opts: SocketOptions,
    ) -> io::Result<XenStream> {
        let addr = addr.to_xen_addr()?;
        if !transport.link_ready(addr.domid) {
            let t = transport.clone();
            // Bounded by the transport's `Config::link_timeout`.
            let timeout = std::time::Duration::MAX;
            tokio::task::spawn_blocking(move || t.prepare_link(addr.domid, timeout))
                .await
                .map_err(io::Error::other)??;
        }
        let s = XenStream::from_std(transport.connect_nonblocking(addr, opts)?)?;
        std::future::poll_fn(|cx| s.poll_connected(cx)).await?;
        Ok(s)
    }

    /// Waits for the answer to a non-blocking connect.
    fn poll_connected(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            // Readiness first, so that clearing it below cannot lose an
            // edge that came after `finish_connect` looked.
            let mut guard = ready!(self.inner.poll_write_ready(cx))?;
            match self.inner.get_ref().finish_connect() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                r => return Poll::Ready(r),
            }
        }
    }

    /// Wraps a blocking stream (switching it to non-blocking mode).
    pub fn from_std(s: libxensock::XenStream) -> io::Result<XenStream> {
        s.set_nonblocking(true)?;
        Ok(XenStream {
            inner: Arc::new(register(s)?),
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SockAddrXen> {
        self.inner.get_ref().peer_addr()
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        self.inner.get_ref().local_addr()
    }

    /// Shuts down one or both directions (see
    /// [`libxensock::XenStream::shutdown`]).
    pub fn shutdown_std(&self, how: Shutdown) -> io::Result<()> {
        self.inner.get_ref().shutdown(how)
    }

    /// Waits until the stream may be read (bytes, its end or an error
    /// wait), as `TcpStream::readable`: a [`XenStream::try_read`] after it
    /// may still find nothing (`WouldBlock`), and the wait starts over.
    pub async fn readable(&self) -> io::Result<()> {
        self.inner.readable().await?.retain_ready();
        Ok(())
    }

    /// `SO_LINGER`, as `TcpStream::set_linger`: `Some(0)` makes the close
    /// reset the connection (see [`libxensock::XenStream::set_linger`]).
    pub fn set_linger(&self, linger: Option<std::time::Duration>) -> io::Result<()> {
        self.inner.get_ref().set_linger(linger)
    }

    /// The `SO_LINGER` value set.
    pub fn linger(&self) -> io::Result<Option<std::time::Duration>> {
        self.inner.get_ref().linger()
    }

    /// Receives into `buf` without consuming, as `TcpStream::peek`: waits
    /// until bytes (or the end, 0) are there; the next read returns them.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // tried first: the descriptor gets an edge only after a
            // WouldBlock
            match self.inner.get_ref().peek(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
            // readiness is cleared only by a WouldBlock: the bytes a peek
            // saw are still there, and still readable
            let mut ready = self.inner.readable().await?;
            if let Ok(r) = ready.try_io(|s| s.get_ref().peek(buf)) {
                return r;
            }
        }
    }

    /// Waits for any of `interest`, as `TcpStream::ready`, and says which
    /// came (a try call after it may still find `WouldBlock`).
    pub async fn ready(&self, interest: tokio::io::Interest) -> io::Result<tokio::io::Ready> {
        let mut guard = self.inner.ready(interest).await?;
        let ready = guard.ready();
        guard.retain_ready();
        Ok(ready)
    }

    /// Waits until a write may take bytes, as `TcpStream::writable`.
    pub async fn writable(&self) -> io::Result<()> {
        self.inner.writable().await?.retain_ready();
        Ok(())
    }

    /// One read without waiting, as `TcpStream::try_read`: `WouldBlock`
    /// when nothing is there (and [`XenStream::readable`] then waits for
    /// more); `Ok(0)` at the end of the stream.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner
            .try_io(Interest::READABLE, |s| io::Read::read(&mut &*s, buf))
    }

    /// One write without waiting, as `TcpStream::try_write`: `WouldBlock`
    /// when no byte fits now.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.inner
            .try_io(Interest::WRITABLE, |s| io::Write::write(&mut &*s, buf))
    }

    /// The stream's pending error, taken (`SO_ERROR` over the kernel
    /// family), as `TcpStream::take_error`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.inner.get_ref().take_error()
    }

    /// The blocking stream back, in non-blocking mode, as
    /// `TcpStream::into_std`. Fails (`Other`) while a split half still
    /// holds the stream.
    pub fn into_std(self) -> io::Result<libxensock::XenStream> {
        let fd = Arc::try_unwrap(self.inner)
            .map_err(|_| io::Error::other("a split half still holds this stream"))?;
        Ok(fd.into_inner())
    }

    /// Borrowed halves, usable concurrently.
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        (ReadHalf { s: &*self }, WriteHalf { s: &*self })
    }

    /// Owned halves, usable from different tasks. Dropping the write half
    /// shuts the write direction down, as tokio's `OwnedWriteHalf` does.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        (
            OwnedReadHalf {
                s: XenStream {
                    inner: self.inner.clone(),
                },
            },
            OwnedWriteHalf {
                s: self,
                shutdown_on_drop: true,
            },
        )
    }

    fn poll_read_priv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // one unit of the task's budget per operation, as tokio's own
        // sockets: see poll_op
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        loop {
            let unfilled = buf.initialize_unfilled();
            match io::Read::read(&mut self.inner.get_ref(), unfilled) {
                Ok(n) => {
                    coop.made_progress();
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(self.inner.poll_read_ready(cx))?.clear_ready();
        }
    }

    fn poll_write_priv(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_op(cx, |s| io::Write::write(&mut &*s, buf))
    }

    fn poll_write_vectored_priv(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_op(cx, |s| io::Write::write_vectored(&mut &*s, bufs))
    }

    /// Tries `op` first (the descriptor only gets an edge after a
    /// `WouldBlock`), then waits for readiness, clears it and retries.
    ///
    /// Each operation takes a unit of the task's cooperative budget (as
    /// tokio's TcpStream does): an operation that succeeds at once never
    /// returns `Pending` otherwise, and a task writing in a loop then held
    /// its worker forever, with the I/O driver and the timers of every
    /// other task on it (on the TCP carrier
    /// the lab's tokio stream writer was never ahead of its rate, never
    /// slept, and its reader and status task stood still until the
    /// connection reset).
    fn poll_op<T>(
        &self,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&libxensock::XenStream) -> io::Result<T>,
    ) -> Poll<io::Result<T>> {
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        loop {
            match op(self.inner.get_ref()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => {
                    coop.made_progress();
                    return Poll::Ready(r);
                }
            }
            ready!(self.inner.poll_write_ready(cx))?.clear_ready();
        }
    }

    fn shutdown_write(&self) -> io::Result<()> {
        match self.inner.get_ref().shutdown(Shutdown::Write) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(()),
            r => r,
        }
    }
}

impl AsyncRead for XenStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_read_priv(cx, buf)
    }
}

impl AsyncWrite for XenStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_priv(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored_priv(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.shutdown_write())
    }
}

/// The split halves hold the stream in `s` and forward to its readiness
/// helpers: one body for the borrowed and the owned halves.
macro_rules! forward_read_half {
    ($half:ty) => {
        impl AsyncRead for $half {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                self.s.poll_read_priv(cx, buf)
            }
        }
    };
}

macro_rules! forward_write_half {
    ($half:ty) => {
        impl AsyncWrite for $half {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                self.s.poll_write_priv(cx, buf)
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                self.s.poll_write_vectored_priv(cx, bufs)
            }
            fn is_write_vectored(&self) -> bool {
                true
            }
            fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(self.s.shutdown_write())
            }
        }
    };
}

forward_read_half!(ReadHalf<'_>);
forward_write_half!(WriteHalf<'_>);
forward_read_half!(OwnedReadHalf);
forward_write_half!(OwnedWriteHalf);

/// Borrowed read half from [`XenStream::split`].
#[derive(Debug)]
pub struct ReadHalf<'a> {
    s: &'a XenStream,
}

/// Borrowed write half from [`XenStream::split`].
#[derive(Debug)]
pub struct WriteHalf<'a> {
    s: &'a XenStream,
}

/// Owned read half from [`XenStream::into_split`].
#[derive(Debug)]
pub struct OwnedReadHalf {
    s: XenStream,
}

/// Owned write half from [`XenStream::into_split`].
#[derive(Debug)]
pub struct OwnedWriteHalf {
    s: XenStream,
    shutdown_on_drop: bool,
}

impl OwnedReadHalf {
    /// Puts the halves back together; `Err` gives them back if they are
    /// not from the same stream.
    pub fn reunite(self, w: OwnedWriteHalf) -> Result<XenStream, (OwnedReadHalf, OwnedWriteHalf)> {
        if Arc::ptr_eq(&self.s.inner, &w.s.inner) {
            let mut w = w;
            w.shutdown_on_drop = false;
            drop(self);
            Ok(XenStream {
                inner: w.s.inner.clone(),
            })
        } else {
            Err((self, w))
        }
    }
}

impl OwnedWriteHalf {
    /// Drops the half without shutting the write direction down.
    pub fn forget(mut self) {
        self.shutdown_on_drop = false;
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            let _ = self.s.shutdown_write();
        }
    }
}
