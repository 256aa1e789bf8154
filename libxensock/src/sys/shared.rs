// SPDX-License-Identifier: MIT OR Apache-2.0
//! Memory shared with another domain (a granted or mapped region): rings,
//! a large ring's grant directory, single shared cells. The peer may write
//! any of it at any time, so it is only ever reached through atomics and
//! raw copies, never through plain references.

use std::ptr::NonNull;
#[cfg(test)]
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicU8;

use xensock_proto::layout::{GrantDirectory, LayoutError, RingGeometry, PAGE_SIZE};
use xensock_proto::mem::RawRing;
use xensock_xenif::SharedRegion;

/// The ring of `geometry` over `len` bytes at `ptr`, a whole shared region.
///
/// The caller keeps the region mapped for as long as the ring is used
/// (next to it, dropped together).
pub(crate) fn ring_over(
    ptr: *mut u8,
    len: usize,
    geometry: RingGeometry,
) -> Result<Option<RawRing>, LayoutError> {
    let Some(base) = NonNull::new(ptr) else {
        return Ok(None);
    };
    // SAFETY: `ptr` is the start of a page-aligned shared region of `len`
    // bytes that stays mapped while the ring is used (the caller keeps the
    // region next to the ring); it is only accessed through atomics and
    // raw copies (RawRing), never through references.
    unsafe { RawRing::from_region(base, len, geometry) }.map(Some)
}

/// The grant directory in the page at `offset` of `region`, if the page
/// lies inside it.
pub(crate) fn directory_at<R: SharedRegion + ?Sized>(
    region: &R,
    offset: usize,
) -> Option<&GrantDirectory> {
    if !offset.is_multiple_of(PAGE_SIZE) || offset.checked_add(PAGE_SIZE)? > region.len() {
        return None;
    }
    // SAFETY: the page is inside the region (checked) and page aligned
    // (regions are); GrantDirectory is an array of atomics, so a shared
    // reference to memory the peer may also write is sound; it borrows
    // `region`, which keeps the memory mapped.
    Some(unsafe { &*(region.as_ptr().add(offset) as *const GrantDirectory) })
}

/// The shared byte at `offset` of `region`.
pub(crate) fn byte_at<R: SharedRegion + ?Sized>(region: &R, offset: usize) -> Option<&AtomicU8> {
    if offset >= region.len() {
        return None;
    }
    // SAFETY: offset < len, inside the mapped region, which outlives the
    // returned reference (it borrows `region`); an AtomicU8 may alias
    // memory written concurrently by the peer.
    Some(unsafe { &*(region.as_ptr().add(offset) as *const AtomicU8) })
}

/// The shared 32-bit word at `offset` (4-aligned) of `region` (the
/// hostile-peer test scribbles through it).
#[cfg(test)]
pub(crate) fn word_at<R: SharedRegion + ?Sized>(region: &R, offset: usize) -> Option<&AtomicU32> {
    if !offset.is_multiple_of(4) || offset.checked_add(4)? > region.len() {
        return None;
    }
    // SAFETY: 4-aligned (regions are page aligned) and inside the region,
    // which outlives the reference; an AtomicU32 may alias memory the peer
    // writes concurrently.
    Some(unsafe { &*(region.as_ptr().add(offset) as *const AtomicU32) })
}
