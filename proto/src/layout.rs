// SPDX-License-Identifier: MIT OR Apache-2.0
//! Shared-page layouts.
//!
//! Every structure here lives in memory that a peer domain can write at any
//! moment. The types are `#[repr(C)]` with their sizes and offsets fixed by
//! compile-time assertions, so the kernel module, the user-space transport and
//! any other implementation agree byte for byte. Fields that change during
//! the life of a ring are atomics; nothing here is ever read through a plain
//! reference to a non-atomic field.
//!
//! A ring region (see [`RingGeometry`]) is one *header page* followed by the
//! data pages, except for compact rings (data of at most 2 KiB), where the
//! data shares the header page from [`COMPACT_DATA_OFFSET`] on. The header
//! page starts with a [`RingHeader`]:
//!
//! ```text
//! offset  0  identity line   written by the ring owner (the receiver) before
//!                            granting; read once by the peer when it attaches
//! offset 128 producer line   written only by the producer (the sender)
//! offset 256 consumer line   written only by the consumer (the receiver)
//! ```
//!
//! Lines are 128 bytes apart so that adjacent-line hardware prefetch does not
//! put the producer's and the consumer's fields in one contended pair.

use core::sync::atomic::{AtomicU32, Ordering};

/// Size of a Xen page; every grant covers exactly one.
pub const PAGE_SIZE: usize = 4096;

/// Spacing of the independently written lines of a [`RingHeader`].
pub const LINE_SIZE: usize = 128;

/// `magic` of a per-connection data ring ("XSDR").
pub const DATA_RING_MAGIC: u32 = 0x5853_4452;
/// `magic` of a link control ring ("XSLK").
pub const LINK_RING_MAGIC: u32 = 0x5853_4c4b;
/// Layout version written in every header. Bumped on incompatible change.
pub const LAYOUT_VERSION: u32 = 1;

/// Smallest ring: 2 KiB of data in the header page itself.
pub const MIN_RING_ORDER: u32 = 11;
/// Largest ring: 4 MiB of data (1024 data pages, one directory page).
pub const MAX_RING_ORDER: u32 = 22;
/// Rings of this order and below are compact: data shares the header page.
pub const COMPACT_MAX_ORDER: u32 = 11;
/// Offset of the data area in a compact ring's single page.
pub const COMPACT_DATA_OFFSET: usize = 2048;
/// Order of a link's control ring (compact, one page).
pub const LINK_RING_ORDER: u32 = 11;

/// Producer flag: the producer will write nothing after the current `prod`
/// (`shutdown(SHUT_WR)` / close). The consumer reports end-of-file once it
/// has consumed up to `prod`.
pub const PROD_FLAG_FIN: u32 = 1 << 0;
/// Producer flag: the producer aborted the connection (reset).
pub const PROD_FLAG_RESET: u32 = 1 << 1;
/// Producer flag: the producer has frozen this ring for a carrier switch and
/// will not advance `prod` again.
pub const PROD_FLAG_FROZEN: u32 = 1 << 2;
/// Every producer flag this version understands.
pub const PROD_FLAGS_KNOWN: u32 = PROD_FLAG_FIN | PROD_FLAG_RESET | PROD_FLAG_FROZEN;

/// Consumer flag: the consumer will read no more (`shutdown(SHUT_RD)` or
/// close); further writes fail with `EPIPE`.
pub const CONS_FLAG_CLOSED: u32 = 1 << 0;
/// Consumer flag: the consumer aborted the connection (reset).
pub const CONS_FLAG_RESET: u32 = 1 << 1;
/// Every consumer flag this version understands.
pub const CONS_FLAGS_KNOWN: u32 = CONS_FLAG_CLOSED | CONS_FLAG_RESET;

/// Identity of a ring, written by its owner before the grant is handed out.
#[repr(C)]
pub struct IdentityLine {
    /// [`DATA_RING_MAGIC`] or [`LINK_RING_MAGIC`].
    pub magic: AtomicU32,
    /// [`LAYOUT_VERSION`].
    pub version: AtomicU32,
    /// log2 of the data area size.
    pub order: AtomicU32,
    /// Domain id of the owner (the receiver).
    pub owner_domid: AtomicU32,
    /// Domain id allowed to map the ring (the sender).
    pub peer_domid: AtomicU32,
    /// Owner's connection id (0 for a link ring).
    pub conn_id: AtomicU32,
    /// Ring epoch: 0 for the ring set up at connect, +1 for every later ring
    /// of the same direction (resize, return from TCP).
    pub epoch: AtomicU32,
    _reserved: [u32; 25],
}

/// Fields written only by the producer.
#[repr(C)]
pub struct ProducerLine {
    /// Bytes produced so far (free-running, wraps at 2^32).
    pub prod: AtomicU32,
    /// The producer asks for a kick once `cons` moves past this value
    /// (event index: it is waiting for space).
    pub space_event: AtomicU32,
    /// `PROD_FLAG_*`.
    pub flags: AtomicU32,
    /// Incremented by the producer's host periodically (link liveness).
    pub heartbeat: AtomicU32,
    _reserved: [u32; 28],
}

/// Fields written only by the consumer.
#[repr(C)]
pub struct ConsumerLine {
    /// Bytes consumed so far (free-running, wraps at 2^32).
    pub cons: AtomicU32,
    /// The consumer asks for a kick once `prod` moves past this value
    /// (event index: it is waiting for data).
    pub data_event: AtomicU32,
    /// `CONS_FLAG_*`.
    pub flags: AtomicU32,
    /// Incremented by the consumer's host periodically (link liveness).
    pub heartbeat: AtomicU32,
    _reserved: [u32; 28],
}

/// The header at the start of every ring's first page.
#[repr(C, align(128))]
pub struct RingHeader {
    /// Written by the owner before granting.
    pub identity: IdentityLine,
    /// Written by the producer only.
    pub producer: ProducerLine,
    /// Written by the consumer only.
    pub consumer: ConsumerLine,
}

/// Size of [`RingHeader`] in bytes.
pub const RING_HEADER_SIZE: usize = 3 * LINE_SIZE;

const _: () = {
    assert!(core::mem::size_of::<IdentityLine>() == LINE_SIZE);
    assert!(core::mem::size_of::<ProducerLine>() == LINE_SIZE);
    assert!(core::mem::size_of::<ConsumerLine>() == LINE_SIZE);
    assert!(core::mem::size_of::<RingHeader>() == RING_HEADER_SIZE);
    assert!(core::mem::align_of::<RingHeader>() == LINE_SIZE);
    assert!(core::mem::offset_of!(RingHeader, identity) == 0);
    assert!(core::mem::offset_of!(RingHeader, producer) == LINE_SIZE);
    assert!(core::mem::offset_of!(RingHeader, consumer) == 2 * LINE_SIZE);
    assert!(core::mem::offset_of!(ProducerLine, prod) == 0);
    assert!(core::mem::offset_of!(ProducerLine, space_event) == 4);
    assert!(core::mem::offset_of!(ProducerLine, flags) == 8);
    assert!(core::mem::offset_of!(ConsumerLine, cons) == 0);
    assert!(core::mem::offset_of!(ConsumerLine, data_event) == 4);
    assert!(core::mem::offset_of!(ConsumerLine, flags) == 8);
    assert!(core::mem::offset_of!(IdentityLine, epoch) == 24);
    assert!(RING_HEADER_SIZE <= COMPACT_DATA_OFFSET);
    assert!(COMPACT_DATA_OFFSET + (1 << COMPACT_MAX_ORDER) <= PAGE_SIZE);
};

/// Identity values a ring owner writes into [`IdentityLine`], and that the
/// mapping side compares against what the control message announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RingIdentity {
    /// [`DATA_RING_MAGIC`] or [`LINK_RING_MAGIC`].
    pub magic: u32,
    /// log2 of the data size.
    pub order: u32,
    /// Owner (receiver) domain.
    pub owner_domid: u32,
    /// Peer (sender) domain.
    pub peer_domid: u32,
    /// Owner's connection id, 0 for a link.
    pub conn_id: u32,
    /// Ring epoch.
    pub epoch: u32,
}

/// Why a ring header or grant directory read from a peer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// The identity line does not match what the control message announced.
    IdentityMismatch,
    /// The layout version is not one this implementation speaks.
    UnsupportedVersion(u32),
    /// A ring order outside [`MIN_RING_ORDER`]..=[`MAX_RING_ORDER`].
    BadOrder(u32),
    /// A region too small for the ring it should hold.
    RegionTooSmall,
    /// Producer or consumer indices are not in their initial state.
    NotFresh,
}

impl core::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LayoutError::IdentityMismatch => f.write_str("ring identity does not match the offer"),
            LayoutError::UnsupportedVersion(v) => write!(f, "unsupported ring layout version {v}"),
            LayoutError::BadOrder(o) => write!(f, "ring order {o} out of range"),
            LayoutError::RegionTooSmall => f.write_str("shared region too small for the ring"),
            LayoutError::NotFresh => f.write_str("ring indices are not in their initial state"),
        }
    }
}

impl RingHeader {
    /// Initialises a header the caller owns and has not yet granted.
    /// Indices start at zero, flags clear, every reserved word zero.
    pub fn init(&self, id: &RingIdentity) {
        let all = [
            &self.identity.magic,
            &self.identity.version,
            &self.identity.order,
            &self.identity.owner_domid,
            &self.identity.peer_domid,
            &self.identity.conn_id,
            &self.identity.epoch,
        ];
        let vals = [
            id.magic,
            LAYOUT_VERSION,
            id.order,
            id.owner_domid,
            id.peer_domid,
            id.conn_id,
            id.epoch,
        ];
        for (field, v) in all.iter().zip(vals) {
            field.store(v, Ordering::Relaxed);
        }
        for line in [
            &self.producer.prod,
            &self.producer.space_event,
            &self.producer.flags,
        ] {
            line.store(0, Ordering::Relaxed);
        }
        self.producer.heartbeat.store(0, Ordering::Relaxed);
        for line in [
            &self.consumer.cons,
            &self.consumer.data_event,
            &self.consumer.flags,
        ] {
            line.store(0, Ordering::Relaxed);
        }
        self.consumer.heartbeat.store(0, Ordering::Relaxed);
        // Publish the initialised header before the grant reference leaves
        // this domain.
        core::sync::atomic::fence(Ordering::Release);
    }

    /// Reads the identity line once and checks it against `expected` (what
    /// the control message announced) before the sender starts using it.
    pub fn verify(&self, expected: &RingIdentity) -> Result<(), LayoutError> {
        let version = self.identity.version.load(Ordering::Acquire);
        if version != LAYOUT_VERSION {
            return Err(LayoutError::UnsupportedVersion(version));
        }
        let seen = RingIdentity {
            magic: self.identity.magic.load(Ordering::Relaxed),
            order: self.identity.order.load(Ordering::Relaxed),
            owner_domid: self.identity.owner_domid.load(Ordering::Relaxed),
            peer_domid: self.identity.peer_domid.load(Ordering::Relaxed),
            conn_id: self.identity.conn_id.load(Ordering::Relaxed),
            epoch: self.identity.epoch.load(Ordering::Relaxed),
        };
        if seen != *expected {
            return Err(LayoutError::IdentityMismatch);
        }
        Ok(())
    }
}

/// Where the pieces of a ring of a given order live.
///
/// The order is always the *local, validated* copy (from our own choice or a
/// decoded control message), never re-read from shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    order: u32,
}

impl RingGeometry {
    /// Validates `order`.
    pub const fn new(order: u32) -> Result<Self, LayoutError> {
        if order < MIN_RING_ORDER || order > MAX_RING_ORDER {
            return Err(LayoutError::BadOrder(order));
        }
        Ok(RingGeometry { order })
    }

    /// The smallest valid geometry whose data area holds at least `bytes`
    /// (clamped to the supported range), e.g. for `SO_RCVBUF`.
    pub const fn for_capacity(bytes: usize) -> Self {
        let mut order = MIN_RING_ORDER;
        while order < MAX_RING_ORDER && (1usize << order) < bytes {
            order += 1;
        }
        RingGeometry { order }
    }

    /// log2 of the data size.
    pub const fn order(&self) -> u32 {
        self.order
    }

    /// Bytes in the data area (a power of two).
    pub const fn data_size(&self) -> usize {
        1 << self.order
    }

    /// Whether the data shares the header page.
    pub const fn is_compact(&self) -> bool {
        self.order <= COMPACT_MAX_ORDER
    }

    /// Offset of the data area from the start of the region.
    pub const fn data_offset(&self) -> usize {
        if self.is_compact() {
            COMPACT_DATA_OFFSET
        } else {
            PAGE_SIZE
        }
    }

    /// Pages holding data only (0 for a compact ring).
    pub const fn data_pages(&self) -> usize {
        if self.is_compact() {
            0
        } else {
            self.data_size() / PAGE_SIZE
        }
    }

    /// Pages of grant directory needed to list the data pages.
    pub const fn directory_pages(&self) -> usize {
        self.data_pages().div_ceil(GRANT_DIRECTORY_ENTRIES)
    }

    /// Bytes of the whole region as mapped contiguously: header page plus
    /// data pages.
    pub const fn region_size(&self) -> usize {
        PAGE_SIZE + self.data_pages() * PAGE_SIZE
    }

    /// Grants the owner hands out for this ring: header page, data pages and
    /// directory pages.
    pub const fn total_grants(&self) -> usize {
        1 + self.data_pages() + self.directory_pages()
    }
}

/// Grant references per directory page.
pub const GRANT_DIRECTORY_ENTRIES: usize = PAGE_SIZE / 4;

/// A page listing the grant references of a ring's data pages, in order.
///
/// The owner fills it before granting; the mapping side copies the refs out
/// once with [`GrantDirectory::read_refs`] and never looks at the page again.
/// The count is not stored in the page: it follows from the ring order in
/// the control message.
#[repr(C, align(4096))]
pub struct GrantDirectory {
    /// Grant references of the data pages.
    pub refs: [AtomicU32; GRANT_DIRECTORY_ENTRIES],
}

const _: () = {
    assert!(core::mem::size_of::<GrantDirectory>() == PAGE_SIZE);
    assert!(MAX_RING_ORDER >= 22, "rings of at least 4 MiB");
    // One directory page is enough for the largest ring.
    assert!((1usize << MAX_RING_ORDER) / PAGE_SIZE <= GRANT_DIRECTORY_ENTRIES);
};

impl GrantDirectory {
    /// Writes `refs` into the page (owner side, before granting).
    pub fn write_refs(&self, refs: &[u32]) -> Result<(), LayoutError> {
        if refs.len() > GRANT_DIRECTORY_ENTRIES {
            return Err(LayoutError::RegionTooSmall);
        }
        for (slot, r) in self.refs.iter().zip(refs) {
            slot.store(*r, Ordering::Relaxed);
        }
        for slot in &self.refs[refs.len()..] {
            slot.store(0, Ordering::Relaxed);
        }
        core::sync::atomic::fence(Ordering::Release);
        Ok(())
    }

    /// Copies the first `out.len()` refs out of the page, each read once.
    /// The values themselves are validated by the hypervisor when mapped.
    pub fn read_refs(&self, out: &mut [u32]) -> Result<(), LayoutError> {
        if out.len() > GRANT_DIRECTORY_ENTRIES {
            return Err(LayoutError::RegionTooSmall);
        }
        core::sync::atomic::fence(Ordering::Acquire);
        for (o, slot) in out.iter_mut().zip(self.refs.iter()) {
            *o = slot.load(Ordering::Relaxed);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(unsafe_code)] // tests build rings over their own buffers
mod tests {
    use super::*;

    #[test]
    fn geometry_of_small_and_large_rings() {
        let compact = RingGeometry::new(11).unwrap();
        assert!(compact.is_compact());
        assert_eq!(compact.data_offset(), 2048);
        assert_eq!(compact.region_size(), PAGE_SIZE);
        assert_eq!(compact.total_grants(), 1);

        let one_page = RingGeometry::new(12).unwrap();
        assert_eq!(one_page.data_pages(), 1);
        assert_eq!(one_page.directory_pages(), 1);
        assert_eq!(one_page.region_size(), 2 * PAGE_SIZE);
        assert_eq!(one_page.total_grants(), 3);

        let max = RingGeometry::new(MAX_RING_ORDER).unwrap();
        assert_eq!(max.data_size(), 4 << 20);
        assert_eq!(max.data_pages(), 1024);
        assert_eq!(max.directory_pages(), 1);

        assert_eq!(RingGeometry::new(10), Err(LayoutError::BadOrder(10)));
        assert_eq!(RingGeometry::new(23), Err(LayoutError::BadOrder(23)));
        assert_eq!(RingGeometry::for_capacity(0).order(), MIN_RING_ORDER);
        assert_eq!(RingGeometry::for_capacity(65536).order(), 16);
        assert_eq!(RingGeometry::for_capacity(65537).order(), 17);
        assert_eq!(
            RingGeometry::for_capacity(usize::MAX).order(),
            MAX_RING_ORDER
        );
    }

    fn id() -> RingIdentity {
        RingIdentity {
            magic: DATA_RING_MAGIC,
            order: 12,
            owner_domid: 1,
            peer_domid: 2,
            conn_id: 7,
            epoch: 0,
        }
    }

    #[test]
    fn header_verifies_what_it_was_initialised_with() {
        // SAFETY: RingHeader is made of atomics and padding; all-zero is valid.
        let hdr: RingHeader = unsafe { core::mem::zeroed() };
        hdr.init(&id());
        assert_eq!(hdr.verify(&id()), Ok(()));
        let other = RingIdentity { conn_id: 8, ..id() };
        assert_eq!(hdr.verify(&other), Err(LayoutError::IdentityMismatch));
        hdr.identity.version.store(9, Ordering::Relaxed);
        assert_eq!(hdr.verify(&id()), Err(LayoutError::UnsupportedVersion(9)));
    }

    #[test]
    fn directory_round_trip() {
        // SAFETY: GrantDirectory is an array of atomics; all-zero is valid.
        let dir: GrantDirectory = unsafe { core::mem::zeroed() };
        dir.write_refs(&[5, 6, 7]).unwrap();
        let mut out = [0u32; 4];
        dir.read_refs(&mut out).unwrap();
        assert_eq!(out, [5, 6, 7, 0]);
        let mut too_many = [0u32; GRANT_DIRECTORY_ENTRIES + 1];
        assert_eq!(
            dir.read_refs(&mut too_many),
            Err(LayoutError::RegionTooSmall)
        );
    }
}
