// SPDX-License-Identifier: MIT OR Apache-2.0
//! [`RingMemory`] over a region of raw shared memory: kernel pages, mmap'd
//! grant pages, memfd mappings or a test buffer.
//!
//! Header fields are accessed as atomics. Data bytes are copied with
//! `ptr::copy_nonoverlapping` through raw pointers, never through Rust
//! references to the shared bytes: the peer may be writing them at the same
//! moment, and the values are opaque payload whose only consumer is the
//! application (the same rule as Linux's `memcpy` on ring pages; every value
//! that drives control flow is an atomically loaded, validated index).

use core::ptr::NonNull;
use core::sync::atomic::{fence, AtomicU32, Ordering};

use super::layout::{LayoutError, RingGeometry, RingHeader};
use super::ring::{Field, RingMemory};

/// One ring in a shared region: a header and a data area.
///
/// Cheap to copy; the region must outlive every copy (see
/// [`RawRing::from_region`]).
#[derive(Clone, Copy, Debug)]
pub struct RawRing {
    header: NonNull<RingHeader>,
    data: NonNull<u8>,
    geometry: RingGeometry,
}

// SAFETY: a RawRing only performs atomic header accesses and raw copies of
// opaque bytes; it is designed for concurrent use by a producer and a
// consumer in different threads, processes or domains.
unsafe impl Send for RawRing {}
// SAFETY: as above: all shared accesses are atomic or raw byte copies.
unsafe impl Sync for RawRing {}

impl RawRing {
    /// Views `len` bytes at `base` as a ring of `geometry`.
    ///
    /// # Safety
    ///
    /// `base` must be aligned to 128 bytes, valid for reads and writes of
    /// `len` bytes for as long as the returned value or any copy of it is
    /// used, and not accessed through Rust references by anyone else while
    /// it is (other processes or domains may access it freely).
    pub unsafe fn from_region(
        base: NonNull<u8>,
        len: usize,
        geometry: RingGeometry,
    ) -> Result<Self, LayoutError> {
        if len < geometry.region_size() || !(base.as_ptr() as usize).is_multiple_of(128) {
            return Err(LayoutError::RegionTooSmall);
        }
        // SAFETY: data_offset() < region_size() <= len, so the pointer stays
        // inside the caller's region.
        let data = unsafe { NonNull::new_unchecked(base.as_ptr().add(geometry.data_offset())) };
        Ok(RawRing {
            header: base.cast(),
            data,
            geometry,
        })
    }

    /// Views a ring whose header page and data area are mapped separately
    /// (e.g. a header page plus a contiguous mapping of the data pages).
    ///
    /// # Safety
    ///
    /// `header` must be a 128-byte aligned mapping of at least
    /// [`crate::layout::RING_HEADER_SIZE`] bytes, and `data` of
    /// `geometry.data_size()` bytes; both valid as for
    /// [`RawRing::from_region`].
    pub unsafe fn from_parts(
        header: NonNull<u8>,
        data: NonNull<u8>,
        geometry: RingGeometry,
    ) -> Self {
        RawRing {
            header: header.cast(),
            data,
            geometry,
        }
    }

    /// The ring's header, for initialisation and identity checks.
    pub fn header(&self) -> &RingHeader {
        // SAFETY: from_region's contract keeps the header mapped and aligned
        // for our lifetime; RingHeader is only atomics, so shared mutation by
        // the peer is sound.
        unsafe { self.header.as_ref() }
    }

    /// The ring's geometry.
    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    /// Start of the data area (`geometry().data_size()` bytes), for hosts
    /// that copy payload straight between it and another address space
    /// (the kernel module's `copy_from_iter`/`copy_to_iter`) instead of
    /// through [`RingMemory::write_data`]'s slices. Offsets into it come
    /// from the producer's or consumer's validated counters.
    pub fn data_ptr(&self) -> NonNull<u8> {
        self.data
    }

    fn cell(&self, field: Field) -> &AtomicU32 {
        let h = self.header();
        match field {
            Field::Prod => &h.producer.prod,
            Field::SpaceEvent => &h.producer.space_event,
            Field::ProdFlags => &h.producer.flags,
            Field::Cons => &h.consumer.cons,
            Field::DataEvent => &h.consumer.data_event,
            Field::ConsFlags => &h.consumer.flags,
        }
    }
}

impl RingMemory for RawRing {
    #[inline]
    fn data_size(&self) -> u32 {
        self.geometry.data_size() as u32
    }

    #[inline]
    fn load(&self, field: Field, order: Ordering) -> u32 {
        self.cell(field).load(order)
    }

    #[inline]
    fn store(&self, field: Field, value: u32, order: Ordering) {
        self.cell(field).store(value, order)
    }

    #[inline]
    fn fence(&self) {
        fence(Ordering::SeqCst)
    }

    #[inline]
    fn write_data(&self, offset: u32, src: &[u8]) {
        let size = self.geometry.data_size();
        let offset = offset as usize;
        if offset > size || src.len() > size - offset {
            // Callers never ask for this; refusing keeps the contract local.
            return;
        }
        // SAFETY: offset + len <= data_size, inside the mapped data area;
        // src is private memory and cannot overlap the shared area.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.data.as_ptr().add(offset), src.len())
        }
    }

    #[inline]
    fn read_data(&self, offset: u32, dst: &mut [u8]) {
        let size = self.geometry.data_size();
        let offset = offset as usize;
        if offset > size || dst.len() > size - offset {
            return;
        }
        // SAFETY: as in write_data; dst is a private exclusive buffer.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.data.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }
}
