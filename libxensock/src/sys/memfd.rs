// SPDX-License-Identifier: MIT OR Apache-2.0
//! Rings in memfd memory, mapped twice (once for the owner, once for the
//! sender) as two domains would map them: the carrier tests' and
//! benchmark's stand-in for granted pages.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use xensock_proto::layout::RingGeometry;
use xensock_proto::mem::RawRing;

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
    /// A fresh zeroed ring region of `geometry`, mapped twice: `(owner's
    /// view, sender's view)`.
    pub(crate) fn pair(geometry: RingGeometry) -> io::Result<(MemfdRing, MemfdRing)> {
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
        Ok((
            Self::map(&fd, len, geometry)?,
            Self::map(&fd, len, geometry)?,
        ))
    }

    /// The ring over this mapping.
    pub(crate) fn ring(&self) -> RawRing {
        self.ring
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

impl Drop for MemfdRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
