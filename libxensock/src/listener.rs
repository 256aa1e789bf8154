// SPDX-License-Identifier: MIT OR Apache-2.0
//! `XenListener`: a bound port with a backlog of connections the link
//! manager has already completed (as the kernel completes TCP handshakes
//! before `accept`).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use xensock_xenif::DomId;

use crate::addr::{SockAddrXen, ToXenAddr};
use crate::backend::BackendKind;
use crate::conn::{lock, Conn};
use crate::daemon::RelayListener;
use crate::error::errno;
use crate::kernel::{loaded_family, KernelListener};
use crate::stream::XenStream;
use crate::sys::eventfd::EventFd;
use crate::transport::{SocketOptions, Transport};

pub(crate) struct ListenerShared {
    pub port: u32,
    pub recv_buffer: usize,
    backlog: usize,
    queue: Mutex<VecDeque<Arc<Conn>>>,
    cv: Condvar,
    evfd: EventFd,
}

impl ListenerShared {
    pub(crate) fn new(port: u32, backlog: usize, recv_buffer: usize) -> io::Result<Arc<Self>> {
        Ok(Arc::new(ListenerShared {
            port,
            recv_buffer,
            backlog,
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            evfd: EventFd::new()?,
        }))
    }

    /// The listener as a `ConnectRequest` sees it (user space listens on
    /// streams only).
    pub(crate) fn view(&self) -> xensock_proto::ctrl::ListenerView {
        xensock_proto::ctrl::ListenerView {
            sock_type: xensock_proto::ctrl::SockType::Stream,
            queued: lock(&self.queue).len(),
            backlog: self.backlog,
        }
    }

    pub(crate) fn push(&self, c: Arc<Conn>) {
        lock(&self.queue).push_back(c);
        self.cv.notify_all();
        self.evfd.signal();
    }

    /// The link to `peer` died: its connections waiting to be accepted go,
    /// except those on their carrier switch (they live on over TCP).
    pub(crate) fn drop_peer(&self, peer: DomId) {
        lock(&self.queue).retain(|c| c.peer() != peer || c.switch().is_some());
    }

    pub(crate) fn take_all(&self) -> Vec<Arc<Conn>> {
        lock(&self.queue).drain(..).collect()
    }

    fn pop(&self, deadline: Option<Instant>, block: bool) -> io::Result<Arc<Conn>> {
        let mut q = lock(&self.queue);
        loop {
            if let Some(c) = q.pop_front() {
                if q.is_empty() {
                    self.evfd.drain();
                }
                return Ok(c);
            }
            if !block {
                self.evfd.drain();
                return Err(io::ErrorKind::WouldBlock.into());
            }
            match deadline {
                None => q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(errno(libc::ETIMEDOUT));
                    }
                    q = self
                        .cv
                        .wait_timeout(q, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}

/// A listener of the user-space transport: a port in the transport's
/// table and an eventfd that is readable while a connection waits.
struct UserListener {
    transport: Transport,
    shared: Arc<ListenerShared>,
    nonblocking: AtomicBool,
}

impl UserListener {
    fn accept(&self) -> io::Result<(XenStream, SockAddrXen)> {
        let block = !self.nonblocking.load(Ordering::Acquire);
        let conn = self.shared.pop(None, block)?;
        let peer = SockAddrXen::new(u32::from(conn.peer()), conn.peer_port);
        Ok((XenStream::new(self.transport.clone(), conn), peer))
    }

    fn accept_timeout(&self, timeout: Duration) -> io::Result<(XenStream, SockAddrXen)> {
        let conn = self.shared.pop(Some(Instant::now() + timeout), true)?;
        let peer = SockAddrXen::new(u32::from(conn.peer()), conn.peer_port);
        Ok((XenStream::new(self.transport.clone(), conn), peer))
    }

    fn local_addr(&self) -> SockAddrXen {
        SockAddrXen::new(u32::from(self.transport.domid()), self.shared.port)
    }
}

impl Drop for UserListener {
    fn drop(&mut self) {
        self.transport.owner.inner.close_listener(&self.shared);
    }
}

enum ListenerImpl {
    /// Shared by [`XenListener::try_clone`]: the last handle closes it.
    User(Arc<UserListener>),
    Kernel(KernelListener),
    /// A listener of the guest's `xensock daemon` ([`crate::daemon`]).
    Relay(RelayListener),
}

/// A xensock listening socket, in the shape of `std::net::TcpListener`,
/// on the backend [`crate::backend()`] picks (the kernel family where
/// `af_xen.ko` is loaded, else the user-space transport).
///
/// Its descriptor ([`AsRawFd`]) is readable while a connection is waiting
/// to be accepted: poll it with `POLLIN` / `EPOLLIN`. (Kernel family: the
/// listening socket; user-space transport: an eventfd.)
pub struct XenListener {
    imp: ListenerImpl,
}

impl std::fmt::Debug for XenListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XenListener")
            .field("addr", &self.local_addr().ok())
            .finish()
    }
}

impl XenListener {
    pub(crate) fn new(transport: Transport, shared: Arc<ListenerShared>) -> XenListener {
        XenListener {
            imp: ListenerImpl::User(Arc::new(UserListener {
                transport,
                shared,
                nonblocking: AtomicBool::new(false),
            })),
        }
    }

    /// Binds with the backend [`crate::backend()`] picks: the kernel
    /// family if loaded, else the process-wide user-space transport
    /// ([`Transport::global`]). `EADDRINUSE` if the port is taken,
    /// `EADDRNOTAVAIL` for another domain's id; with no backend available,
    /// an [`io::ErrorKind::Unsupported`] error that says why.
    pub fn bind(addr: impl ToXenAddr) -> io::Result<XenListener> {
        XenListener::bind_with(addr, SocketOptions::default())
    }

    /// [`XenListener::bind`] with a backlog and receive-ring size
    /// (`listen(backlog)` and `SO_RCVBUF` for the kernel family).
    pub fn bind_with(addr: impl ToXenAddr, opts: SocketOptions) -> io::Result<XenListener> {
        let addr = addr.to_xen_addr()?;
        match loaded_family() {
            Some(f) => Ok(XenListener {
                imp: ListenerImpl::Kernel(KernelListener::bind(f, addr, opts)?),
            }),
            None => {
                if let Some(path) = crate::daemon::present() {
                    if let Some(r) = crate::daemon::listen_via(&path, addr, opts)? {
                        return Ok(XenListener {
                            imp: ListenerImpl::Relay(r),
                        });
                    }
                }
                Transport::global()?.bind_with(addr, opts)
            }
        }
    }

    /// Accepts a connection (blocking unless non-blocking mode is set, then
    /// `WouldBlock`).
    pub fn accept(&self) -> io::Result<(XenStream, SockAddrXen)> {
        match &self.imp {
            ListenerImpl::User(u) => u.accept(),
            ListenerImpl::Kernel(k) => k.accept().map(|(s, a)| (XenStream::from_kernel(s), a)),
            ListenerImpl::Relay(r) => r.accept().map(|(s, a)| (XenStream::from_relay(s), a)),
        }
    }

    /// Accepts with a timeout (`ETIMEDOUT`).
    pub fn accept_timeout(&self, timeout: Duration) -> io::Result<(XenStream, SockAddrXen)> {
        match &self.imp {
            ListenerImpl::User(u) => u.accept_timeout(timeout),
            ListenerImpl::Kernel(k) => k
                .accept_timeout(timeout)
                .map(|(s, a)| (XenStream::from_kernel(s), a)),
            ListenerImpl::Relay(r) => r
                .accept_timeout(timeout)
                .map(|(s, a)| (XenStream::from_relay(s), a)),
        }
    }

    /// An iterator over incoming connections, as `TcpListener::incoming`.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        match &self.imp {
            ListenerImpl::User(u) => Ok(u.local_addr()),
            ListenerImpl::Kernel(k) => k.local_addr(),
            ListenerImpl::Relay(r) => Ok(r.local_addr()),
        }
    }

    /// Non-blocking mode for `accept`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match &self.imp {
            ListenerImpl::User(u) => {
                u.nonblocking.store(nonblocking, Ordering::Release);
                Ok(())
            }
            ListenerImpl::Kernel(k) => k.set_nonblocking(nonblocking),
            ListenerImpl::Relay(r) => {
                r.set_nonblocking(nonblocking);
                Ok(())
            }
        }
    }

    /// Another handle to the same listener, as `TcpListener::try_clone`:
    /// either accepts the next connection, non-blocking mode is shared,
    /// and the listener closes with the last handle. A listener of the
    /// guest's `xensock daemon` cannot be cloned (`Unsupported`).
    pub fn try_clone(&self) -> io::Result<XenListener> {
        let imp = match &self.imp {
            ListenerImpl::User(u) => ListenerImpl::User(u.clone()),
            ListenerImpl::Kernel(k) => ListenerImpl::Kernel(k.try_clone()?),
            ListenerImpl::Relay(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a listener of the xensock daemon cannot be cloned",
                ))
            }
        };
        Ok(XenListener { imp })
    }

    /// The listener's pending error (`SO_ERROR`), taken, as
    /// `TcpListener::take_error`; the user-space transport's listeners
    /// have none.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        match &self.imp {
            ListenerImpl::Kernel(k) => k.take_error(),
            ListenerImpl::User(_) | ListenerImpl::Relay(_) => Ok(None),
        }
    }

    /// Which backend this listener runs on.
    pub fn backend_kind(&self) -> BackendKind {
        match &self.imp {
            ListenerImpl::User(u) => u.transport.backend_kind(),
            ListenerImpl::Kernel(_) => BackendKind::Kernel,
            ListenerImpl::Relay(_) => BackendKind::Daemon,
        }
    }

    /// The user-space transport this listener belongs to; `None` for a
    /// socket of the kernel family.
    pub fn transport(&self) -> Option<&Transport> {
        match &self.imp {
            ListenerImpl::User(u) => Some(&u.transport),
            ListenerImpl::Kernel(_) => None,
            ListenerImpl::Relay(_) => None,
        }
    }
}

impl AsRawFd for XenListener {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl AsFd for XenListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.imp {
            ListenerImpl::User(u) => u.shared.evfd.as_fd(),
            ListenerImpl::Kernel(k) => k.as_fd(),
            ListenerImpl::Relay(r) => r.as_fd(),
        }
    }
}

/// Iterator returned by [`XenListener::incoming`].
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a XenListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<XenStream>;
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}
