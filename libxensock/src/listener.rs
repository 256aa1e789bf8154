// SPDX-License-Identifier: MIT OR Apache-2.0
//! `XenListener`: a bound port with a backlog of connections the link
//! manager has already completed (as the kernel completes TCP handshakes
//! before `accept`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::addr::{SockAddrXen, ToXenAddr};
use crate::backend::BackendKind;
use crate::kernel::{loaded_family, KernelListener};
use crate::options::SocketOptions;
use crate::relay::RelayListener;
use crate::stream::XenStream;
use crate::transport::accept::ListenerShared;
use crate::transport::Transport;

/// The user-space transport's listeners: on a given [`Transport`] (one per
/// domain of a simulated host, or the process-wide one).
impl Transport {
    /// Listens on `addr` (its domid must be this domain, `self` or `any`).
    pub fn bind(&self, addr: impl ToXenAddr) -> io::Result<XenListener> {
        self.bind_with(addr, SocketOptions::default())
    }

    /// [`Transport::bind`] with a backlog and receive-ring size for accepted
    /// connections.
    pub fn bind_with(&self, addr: impl ToXenAddr, opts: SocketOptions) -> io::Result<XenListener> {
        let shared = self.listen(addr, opts)?;
        Ok(XenListener::new(self.clone(), shared))
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
                if let Some(path) = crate::relay::present() {
                    if let Some(r) = crate::relay::listen_via(&path, addr, opts)? {
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

/// A listening AF_XEN socket of the kernel family made elsewhere:
/// `InvalidInput` for a descriptor that is not one, saying what it is.
impl TryFrom<std::os::fd::OwnedFd> for XenListener {
    type Error = io::Error;

    fn try_from(fd: std::os::fd::OwnedFd) -> io::Result<XenListener> {
        Ok(XenListener {
            imp: ListenerImpl::Kernel(KernelListener::from_fd(fd)?),
        })
    }
}

impl XenListener {
    /// The socket descriptor, for the kernel family; a listener of the
    /// user-space transport or the daemon has none that accepts, and comes
    /// back as the error.
    pub fn into_fd(self) -> Result<std::os::fd::OwnedFd, XenListener> {
        match self.imp {
            ListenerImpl::Kernel(k) => Ok(k.into_fd()),
            imp => Err(XenListener { imp }),
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
