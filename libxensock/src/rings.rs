// SPDX-License-Identifier: MIT OR Apache-2.0
//! Granting and mapping rings: the only place that turns backend regions
//! into proto [`RawRing`]s.

use std::sync::atomic::{AtomicU8, Ordering};

use xensock_proto::ctrl::RingGrant;
use xensock_proto::layout::{
    LayoutError, RingGeometry, RingIdentity, DATA_RING_MAGIC, LINK_RING_MAGIC, LINK_RING_ORDER,
};
use xensock_proto::mem::RawRing;
use xensock_xenif::{Access, DomId, GrantedRegion, MappedRegion, SharedRegion};

use crate::backend::DynXen;
use crate::error::Error;
use crate::sys::shared;

/// Offset, in a link's control page, of the byte the *mapping* side sets to
/// 1 once it has mapped the page and that its unmap notification clears
/// (process death or unmap). In the page's unused area (zero otherwise).
pub(crate) const LINK_MAPPER_ALIVE_OFFSET: usize = 1024;
/// Offset of the byte the *owner* sets to 1 before publishing the page and
/// that the owner's grant unmap notification clears.
pub(crate) const LINK_OWNER_ALIVE_OFFSET: usize = 1025;

/// A ring this domain granted (it is the receiver).
pub(crate) struct OwnedRing {
    pub ring: RawRing,
    pub grant: RingGrant,
    pub region: Box<dyn GrantedRegion>,
}

/// A peer's ring mapped here (this domain is the sender).
pub(crate) struct MappedRing {
    pub ring: RawRing,
    pub region: Box<dyn MappedRegion>,
    /// [`crate::clock::slept`] when it was mapped.
    pub mapped_at: std::time::Duration,
}

fn ring_over(ptr: *mut u8, len: usize, geometry: RingGeometry) -> Result<RawRing, Error> {
    shared::ring_over(ptr, len, geometry)
        .map_err(Error::Layout)?
        .ok_or(Error::Protocol("null shared region"))
}

/// Grants a fresh ring of `geometry` to `peer` and initialises its header.
pub(crate) fn grant_ring(
    xen: &dyn DynXen,
    me: DomId,
    peer: DomId,
    geometry: RingGeometry,
    conn_id: u32,
    link: bool,
) -> Result<OwnedRing, Error> {
    let pages = geometry.total_grants();
    let region = xen.grant(peer, pages, Access::ReadWrite)?;
    let ring = ring_over(region.as_ptr(), region.len(), geometry)?;
    ring.header().init(&RingIdentity {
        magic: if link {
            LINK_RING_MAGIC
        } else {
            DATA_RING_MAGIC
        },
        order: geometry.order(),
        owner_domid: u32::from(me),
        peer_domid: u32::from(peer),
        conn_id,
        epoch: 0,
    });
    let refs = region.refs();
    let mut dir_ref = 0;
    if !geometry.is_compact() {
        let data = geometry.data_pages();
        let dir_off = geometry.region_size();
        let dir = match shared::directory_at(&*region, dir_off) {
            Some(d) if refs.len() > 1 + data => d,
            _ => return Err(Error::Protocol("backend returned too few grant refs")),
        };
        dir.write_refs(&refs[1..1 + data]).map_err(Error::Layout)?;
        dir_ref = refs[1 + data];
    }
    let grant = RingGrant {
        order: geometry.order() as u8,
        epoch: 0,
        header_ref: refs
            .first()
            .copied()
            .ok_or(Error::Protocol("no grant ref"))?,
        dir_ref,
    };
    Ok(OwnedRing {
        ring,
        grant,
        region,
    })
}

/// Maps the ring `peer` announced in `grant` and checks its identity line.
pub(crate) fn map_ring(
    xen: &dyn DynXen,
    peer: DomId,
    grant: &RingGrant,
    expected: &RingIdentity,
) -> Result<MappedRing, Error> {
    let geometry = RingGeometry::new(u32::from(grant.order)).map_err(Error::Layout)?;
    let mut refs = vec![grant.header_ref];
    if !geometry.is_compact() {
        let dir = xen.map(peer, &[grant.dir_ref], Access::ReadOnly)?;
        let mut data = vec![0u32; geometry.data_pages()];
        let d =
            shared::directory_at(&*dir, 0).ok_or(Error::Protocol("directory mapping too small"))?;
        d.read_refs(&mut data).map_err(Error::Layout)?;
        drop(dir);
        refs.extend_from_slice(&data);
    }
    let region = xen.map(peer, &refs, Access::ReadWrite)?;
    let ring = ring_over(region.as_ptr(), region.len(), geometry)?;
    ring.header().verify(expected).map_err(Error::Layout)?;
    Ok(MappedRing {
        ring,
        region,
        mapped_at: crate::clock::slept(),
    })
}

/// Checks, once, that a ring re-offered for a new connection starts from
/// scratch: both counters at zero and no flags. A mapping kept from an
/// earlier connection must never carry its indices into the next one.
pub(crate) fn verify_fresh(ring: &RawRing) -> Result<(), Error> {
    let h = ring.header();
    let words = [
        h.producer.prod.load(Ordering::Acquire),
        h.producer.flags.load(Ordering::Acquire),
        h.consumer.cons.load(Ordering::Acquire),
        h.consumer.flags.load(Ordering::Acquire),
    ];
    if words.iter().any(|&w| w != 0) {
        return Err(Error::Layout(LayoutError::NotFresh));
    }
    Ok(())
}

/// Re-initialises the header of a ring we own for its next connection:
/// identity with the new connection id, every index, event index and flag
/// back to zero (the caller then marks its own event index "not waiting").
/// The data area keeps stale bytes, which no reader can see
/// (`prod == cons`), and which came from the same peer anyway.
pub(crate) fn reinit_ring(ring: &OwnedRing, me: DomId, peer: DomId, conn_id: u32) {
    ring.ring
        .header()
        .init(&data_identity(me, peer, conn_id, ring.grant.order));
}

/// Identity of a data ring owned by `owner` for `peer`.
pub(crate) fn data_identity(owner: DomId, peer: DomId, conn_id: u32, order: u8) -> RingIdentity {
    RingIdentity {
        magic: DATA_RING_MAGIC,
        order: u32::from(order),
        owner_domid: u32::from(owner),
        peer_domid: u32::from(peer),
        conn_id,
        epoch: 0,
    }
}

/// Identity of a link control ring owned by `owner` for `peer`.
pub(crate) fn link_identity(owner: DomId, peer: DomId) -> RingIdentity {
    RingIdentity {
        magic: LINK_RING_MAGIC,
        order: LINK_RING_ORDER,
        owner_domid: u32::from(owner),
        peer_domid: u32::from(peer),
        conn_id: 0,
        epoch: 0,
    }
}

/// One byte of a shared page, accessed atomically.
pub(crate) fn shared_byte<R: SharedRegion + ?Sized>(
    region: &R,
    offset: usize,
) -> Option<&AtomicU8> {
    shared::byte_at(region, offset)
}

/// Sets a liveness byte.
pub(crate) fn set_byte<R: SharedRegion + ?Sized>(region: &R, offset: usize, v: u8) {
    if let Some(b) = shared_byte(region, offset) {
        b.store(v, Ordering::Release);
    }
}

/// Reads a liveness byte once.
pub(crate) fn get_byte<R: SharedRegion + ?Sized>(region: &R, offset: usize) -> u8 {
    shared_byte(region, offset).map_or(0, |b| b.load(Ordering::Acquire))
}

/// A transport ring (granted or mapped) handed to the carrier switch: the
/// pages stay granted or mapped as long as the switch holds it.
pub(crate) struct HeldRing<T: Send> {
    ring: RawRing,
    /// For a peer's ring: [`crate::clock::slept`] when it was mapped.
    mapped_at: Option<std::time::Duration>,
    _keep: std::sync::Mutex<T>,
}

impl<T: Send + 'static> HeldRing<T> {
    pub(crate) fn shared(ring: RawRing, keep: T) -> crate::carrier::SharedRing {
        std::sync::Arc::new(HeldRing {
            ring,
            mapped_at: None,
            _keep: std::sync::Mutex::new(keep),
        })
    }
}

impl HeldRing<MappedRing> {
    /// A peer's ring we mapped, which goes stale when this guest is
    /// suspended with it ([`crate::carrier::RingRegion::stale`]).
    pub(crate) fn mapped(m: MappedRing) -> crate::carrier::SharedRing {
        std::sync::Arc::new(HeldRing {
            ring: m.ring,
            mapped_at: Some(m.mapped_at),
            _keep: std::sync::Mutex::new(m),
        })
    }
}

impl<T: Send> crate::carrier::RingRegion for HeldRing<T> {
    fn ring(&self) -> RawRing {
        self.ring
    }

    fn stale(&self) -> bool {
        // The two clocks are read a few nanoseconds apart: only a suspend
        // moves them a millisecond or more.
        self.mapped_at.is_some_and(|at| {
            crate::clock::slept().saturating_sub(at) >= std::time::Duration::from_millis(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xensock_proto::layout::PAGE_SIZE;

    #[repr(C, align(4096))]
    struct Page([u8; PAGE_SIZE]);

    #[test]
    fn a_reused_ring_must_start_from_zero() {
        let mut page = Box::new(Page([0; PAGE_SIZE]));
        let geometry = RingGeometry::new(11).unwrap();
        // (a private, page-aligned page that outlives `ring`)
        let ring = shared::ring_over(page.0.as_mut_ptr(), PAGE_SIZE, geometry)
            .unwrap()
            .unwrap();
        ring.header().init(&data_identity(1, 2, 7, 11));
        assert!(verify_fresh(&ring).is_ok());
        // What the last connection leaves behind: counters, FIN, CLOSED.
        let h = ring.header();
        for (cell, v) in [
            (&h.producer.prod, 300u32),
            (&h.producer.flags, 1),
            (&h.consumer.cons, 300),
            (&h.consumer.flags, 1),
        ] {
            cell.store(v, Ordering::Release);
            assert!(
                matches!(
                    verify_fresh(&ring),
                    Err(Error::Layout(LayoutError::NotFresh))
                ),
                "a stale value must be refused"
            );
            cell.store(0, Ordering::Release);
        }
        h.producer.prod.store(300, Ordering::Release);
        h.consumer.flags.store(1, Ordering::Release);
        // The owner's re-initialisation for the next connection clears them
        // and carries the new connection id.
        h.init(&data_identity(1, 2, 8, 11));
        assert!(verify_fresh(&ring).is_ok());
        assert!(h.verify(&data_identity(1, 2, 8, 11)).is_ok());
        assert!(h.verify(&data_identity(1, 2, 7, 11)).is_err());
    }
}
