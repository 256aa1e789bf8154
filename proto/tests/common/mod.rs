// SPDX-License-Identifier: MIT OR Apache-2.0
//! Test memory standing in for granted pages.
#![allow(dead_code)]

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use xensock_proto::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
use xensock_proto::mem::RawRing;

/// Page-aligned zeroed memory for one ring, freed on drop.
pub struct Region {
    ptr: NonNull<u8>,
    layout: Layout,
    pub ring: RawRing,
}

impl Region {
    /// A fresh ring of `order`, header initialised, both counters at `start`.
    pub fn new(order: u32, start: u32) -> Region {
        let geometry = RingGeometry::new(order).unwrap();
        let layout = Layout::from_size_align(geometry.region_size(), 4096).unwrap();
        // SAFETY: layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        // SAFETY: ptr is a fresh allocation of region_size bytes, page
        // aligned, freed only when Region drops (after every RawRing copy a
        // test holds is gone: tests keep Region alive for their duration).
        let ring = unsafe { RawRing::from_region(ptr, layout.size(), geometry) }.unwrap();
        ring.header().init(&RingIdentity {
            magic: DATA_RING_MAGIC,
            order,
            owner_domid: 1,
            peer_domid: 2,
            conn_id: 1,
            epoch: 0,
        });
        let h = ring.header();
        use std::sync::atomic::Ordering::Relaxed;
        h.producer.prod.store(start, Relaxed);
        h.consumer.cons.store(start, Relaxed);
        h.consumer.data_event.store(start, Relaxed);
        h.producer.space_event.store(start, Relaxed);
        Region { ptr, layout, ring }
    }

    /// What a guest restored from a live migration may see of this ring:
    /// the header as it was, the data the peer wrote through its mapping
    /// lost (here: zeros), since writes through a foreign mapping are not
    /// logged as dirty.
    pub fn torn_copy(&self) -> Region {
        let geometry = self.ring.geometry();
        // SAFETY: layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(self.layout) }).unwrap();
        // SAFETY: both regions are layout.size() bytes and do not overlap;
        // the data area (data_offset, data_size) lies inside the region.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), ptr.as_ptr(), self.layout.size());
            std::ptr::write_bytes(
                ptr.as_ptr().add(geometry.data_offset()),
                0,
                geometry.data_size(),
            );
        }
        // SAFETY: as in new(): a fresh allocation freed when the Region drops.
        let ring = unsafe { RawRing::from_region(ptr, self.layout.size(), geometry) }.unwrap();
        Region {
            ptr,
            layout: self.layout,
            ring,
        }
    }

    /// The data area as raw bytes, for a test playing a hostile peer.
    pub fn data_ptr(&self) -> *mut u8 {
        // SAFETY: data_offset is inside the region.
        unsafe { self.ptr.as_ptr().add(self.ring.geometry().data_offset()) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The byte at stream offset `i` of every test stream: position-dependent,
/// so a lost, duplicated or reordered byte shows.
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (i as u8)
}

/// `len` pattern bytes starting at stream offset `from`.
pub fn pattern_bytes(from: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|k| pattern(from + k)).collect()
}
