// SPDX-License-Identifier: MIT OR Apache-2.0
//! The grant-table and event-channel interface the user-space transport is
//! written against. Two backends implement it: [`crate::dev::DevXen`] over
//! the real `/dev/xen/{gntalloc,gntdev,evtchn}` devices, and the simulated
//! host in `xensock-sim`.
//!
//! Shared memory is handed out as a raw pointer and a length, never as a
//! `&[u8]`: the peer domain writes it concurrently, so every access must go
//! through volatile or atomic operations chosen by the caller (the ring code
//! in `xensock-proto`).
//!
//! Everything is released on drop: dropping a [`GrantedRegion`] ends foreign
//! access (deferred by the backend while the peer still has the pages
//! mapped, as Xen does), dropping a [`MappedRegion`] unmaps, dropping an
//! [`EventChannel`] closes the port. Unmap notifications configured with
//! `set_unmap_notify` fire on drop and when the owning process dies.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

/// A Xen domain id (`domid_t`).
pub type DomId = u16;
/// A grant reference, an index into the granting domain's grant table.
pub type GrantRef = u32;
/// An event-channel port number (`evtchn_port_t`), local to one domain.
pub type Port = u32;

/// Size of one grant (a Xen page).
pub const PAGE_SIZE: usize = 4096;

/// Whether shared pages may be written by the side that maps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The mapper may only read.
    ReadOnly,
    /// The mapper may read and write.
    ReadWrite,
}

/// What to do when a shared region goes away (process exit, unmap, ungrant),
/// mirroring `IOCTL_GNTALLOC_SET_UNMAP_NOTIFY` / `IOCTL_GNTDEV_SET_UNMAP_NOTIFY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnmapNotify {
    /// Byte offset inside the region to set to zero (`UNMAP_NOTIFY_CLEAR_BYTE`).
    pub clear_byte: Option<usize>,
    /// Local event-channel port to signal (`UNMAP_NOTIFY_SEND_EVENT`); the
    /// port must be bound by this process.
    pub send_event: Option<Port>,
}

/// What is known about the other end of an event channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Allocated with `alloc_unbound`, the remote domain has not bound yet.
    Unbound,
    /// Both ends are bound.
    Connected,
    /// The remote end was closed, or the remote domain died or moved.
    Closed,
    /// The backend cannot tell (the Linux evtchn device has no status call;
    /// use unmap notifications and XenStore to detect a dead peer).
    Unknown,
}

/// Errors of the grant and event-channel operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XenError {
    /// A system call on a backend device or socket failed.
    #[error("{op}: {source}")]
    Os {
        /// The operation that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The hypervisor (or sim host) refused: not the grantee, read-only grant
    /// mapped writable, port not offered to this domain.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A bad argument: zero pages, offset outside the region, unknown ref.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The referenced grant, port or domain does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A resource limit was reached (grant table or port space full).
    #[error("resource limit reached: {0}")]
    Exhausted(String),
    /// The backend is not available here (no `/dev/xen`, no sim host).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// This domain's identity is gone: it was destroyed or migrated, and its
    /// grants, mappings and channels were torn down.
    #[error("domain was destroyed or migrated; its grants and channels are gone")]
    Revoked,
}

impl XenError {
    /// The errno a socket-style API should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            XenError::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            XenError::PermissionDenied(_) => libc::EPERM,
            XenError::Invalid(_) => libc::EINVAL,
            XenError::NotFound(_) => libc::ENOENT,
            XenError::Exhausted(_) => libc::ENOSPC,
            XenError::Unavailable(_) => libc::ENODEV,
            XenError::Revoked => libc::ECONNRESET,
        }
    }

    /// Wraps the current `errno` of a failed call.
    pub fn last_os(op: &'static str) -> XenError {
        XenError::Os {
            op,
            source: io::Error::last_os_error(),
        }
    }
}

/// A region of shared memory visible to two domains.
///
/// The pointer stays valid until the owner is dropped. The peer may write
/// the memory at any time (unless the region is read-only for the peer), so
/// never form a `&[u8]` or `&mut [u8]` over it.
pub trait SharedRegion {
    /// Start of the region (page aligned).
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes (a multiple of [`PAGE_SIZE`]).
    fn len(&self) -> usize;
    /// Whether the region is empty (never, for regions from a backend).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether *this side* may write the region.
    fn writable(&self) -> bool;
    /// The other domain.
    fn peer(&self) -> DomId;
}

/// Pages this domain allocated and granted to exactly one peer
/// (`/dev/xen/gntalloc`). Always writable by this side.
pub trait GrantedRegion: SharedRegion + Send {
    /// One grant reference per page, in page order; send them to the peer.
    fn refs(&self) -> &[GrantRef];
    /// Whether the peer may map the pages writable.
    fn peer_access(&self) -> Access;
    /// Configures what happens when this side releases the pages (drop or
    /// process death): clear a byte in the region and/or signal a port.
    fn set_unmap_notify(&mut self, notify: UnmapNotify) -> Result<(), XenError>;
}

/// A peer's granted pages mapped into this process (`/dev/xen/gntdev`).
pub trait MappedRegion: SharedRegion + Send {
    /// Configures what happens when this mapping goes away (drop or process
    /// death): clear a byte in the region (visible to the granter) and/or
    /// signal a port.
    fn set_unmap_notify(&mut self, notify: UnmapNotify) -> Result<(), XenError>;
}

/// One end of an interdomain event channel.
///
/// The file descriptor becomes readable when the peer notifies; call
/// [`EventChannel::ack`] to consume the kick and re-arm it. Works with
/// `poll`/`epoll` and with `tokio::io::unix::AsyncFd`.
pub trait EventChannel: AsFd + AsRawFd + Send + Sync {
    /// This end's port number.
    fn local_port(&self) -> Port;
    /// The domain at the other end.
    fn remote_domid(&self) -> DomId;
    /// Signals the peer.
    fn notify(&self) -> Result<(), XenError>;
    /// Consumes pending kicks and unmasks the port. Never blocks; returns
    /// whether a kick was pending.
    fn ack(&self) -> Result<bool, XenError>;
    /// Waits up to `timeout_ms` milliseconds (negative: without a bound)
    /// for the channel's descriptor to become readable (a kick pending),
    /// without acking: whether it did. Each backend polls through its own
    /// floor ([`crate::poll_readable`] for a real descriptor).
    fn wait_readable(&self, timeout_ms: i32) -> io::Result<bool>;
    /// Blocks until a kick arrives or the timeout passes, then acks it.
    /// Returns whether a kick arrived.
    fn wait(&self, timeout: Option<Duration>) -> Result<bool, XenError> {
        if self.ack()? {
            return Ok(true);
        }
        let ms = match timeout {
            None => -1,
            Some(t) => i32::try_from(t.as_millis()).unwrap_or(i32::MAX),
        };
        match self.wait_readable(ms) {
            Ok(false) => Ok(false),
            Ok(true) => self.ack(),
            Err(source) => Err(XenError::Os {
                op: "poll event channel",
                source,
            }),
        }
    }
    /// What is known about the other end.
    fn peer_state(&self) -> Result<PeerState, XenError>;
}

/// A provider of grants and event channels for the calling domain.
///
/// ```no_run
/// use xensock_xenif::{Access, EventChannel, GrantedRegion, SharedRegion, XenBackend};
/// fn offer<B: XenBackend>(xen: &B, peer: u16) -> Result<(), xensock_xenif::XenError> {
///     let ring = xen.grant(peer, 4, Access::ReadWrite)?;
///     let chan = xen.alloc_unbound(peer)?;
///     // publish ring.refs() and chan.local_port() to the peer (XenStore),
///     // then wait for it:
///     chan.wait(None)?;
///     // SAFETY of the access below is the ring protocol's business.
///     let _first = unsafe { std::ptr::read_volatile(ring.as_ptr()) };
///     Ok(())
/// }
/// ```
pub trait XenBackend: Send + Sync {
    /// Pages granted by this domain.
    type Grant: GrantedRegion;
    /// A peer's pages mapped here.
    type Mapping: MappedRegion;
    /// An event-channel end.
    type Channel: EventChannel;

    /// Allocates `pages` zeroed pages and grants them to `peer` only.
    fn grant(&self, peer: DomId, pages: usize, access: Access) -> Result<Self::Grant, XenError>;

    /// Maps pages that `peer` granted to this domain. `access` must not
    /// exceed what the grant allows. The refs need not be contiguous; the
    /// mapping is one contiguous region in their order.
    fn map(
        &self,
        peer: DomId,
        refs: &[GrantRef],
        access: Access,
    ) -> Result<Self::Mapping, XenError>;

    /// Allocates a port that `remote` may bind to.
    fn alloc_unbound(&self, remote: DomId) -> Result<Self::Channel, XenError>;

    /// Binds to `remote_port`, which `remote` allocated for this domain.
    fn bind_interdomain(&self, remote: DomId, remote_port: Port)
        -> Result<Self::Channel, XenError>;
}
