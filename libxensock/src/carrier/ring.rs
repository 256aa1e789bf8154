// SPDX-License-Identifier: MIT OR Apache-2.0
//! Rings as the engine sees them: a [`RawRing`] plus whatever keeps its
//! memory mapped. The transport will hand in grant mappings; tests and the
//! benchmark use [`MemfdRing`], the same memory mapped twice, once for the
//! owner (receiver) and once for the peer (sender), as two domains would.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use xensock_proto::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
use xensock_proto::mem::RawRing;

/// Memory holding one ring; the ring stays valid while the value lives.
pub(crate) trait RingRegion: Send + Sync {
    /// The ring over this memory.
    fn ring(&self) -> RawRing;
}

/// A ring shared between the engine and whoever supplied it.
pub(crate) type SharedRing = Arc<dyn RingRegion>;

/// A receive ring just made for an offer: the owner's view, and the view
/// to hand to the sender (on a real host: a grant it maps).
pub(crate) struct NewRing {
    /// The receiver's mapping.
    pub local: SharedRing,
    /// The sender's mapping.
    pub for_peer: SharedRing,
}

/// One mapping of a memfd-backed ring.
pub(crate) struct MemfdRing {
    base: NonNull<u8>,
    len: usize,
    ring: RawRing,
}

// SAFETY: the mapping is only accessed through RawRing (atomics and raw
// copies), which is Send + Sync; `base` is only used to unmap on drop.
unsafe impl Send for MemfdRing {}
// SAFETY: as above.
unsafe impl Sync for MemfdRing {}

impl MemfdRing {
    /// A fresh ring of `order` with `identity` written by the owner, mapped
    /// twice: `(owner's view, sender's view)`.
    pub(crate) fn pair(order: u32, identity: RingIdentity) -> io::Result<NewRing> {
        let geometry = RingGeometry::new(order)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let len = geometry.region_size();
        // SAFETY: the name is a NUL-terminated literal; no other pointers.
        let fd = unsafe { libc::memfd_create(c"xensock-carrier".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let local = Self::map(&fd, len, geometry)?;
        local.ring.header().init(&RingIdentity {
            magic: DATA_RING_MAGIC,
            order,
            ..identity
        });
        let peer = Self::map(&fd, len, geometry)?;
        Ok(NewRing {
            local: Arc::new(local),
            for_peer: Arc::new(peer),
        })
    }

    fn map(fd: &OwnedFd, len: usize, geometry: RingGeometry) -> io::Result<MemfdRing> {
        // SAFETY: a fresh shared mapping of a memfd of `len` bytes; no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: the mapping is page aligned, `len` bytes, and unmapped only
        // when this value drops, after every RawRing copy taken from it is
        // gone (holders keep the Arc next to the ring they use); it is only
        // accessed through RawRing.
        let ring = unsafe { RawRing::from_region(base, len, geometry) }
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(MemfdRing { base, len, ring })
    }
}

impl RingRegion for MemfdRing {
    fn ring(&self) -> RawRing {
        self.ring
    }
}

impl Drop for MemfdRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
