// SPDX-License-Identifier: MIT OR Apache-2.0
//! Rings kept across connections (`docs/protocol.md` 6.6): pooled receive
//! rings, rings lent to a peer, mappings of the peer's rings kept for reuse.

use super::*;

impl Inner {
    /// A receive ring for our connection `conn_id`: an idle one of the
    /// link's pool, re-initialised, else a fresh grant.
    pub(super) fn take_rx_ring(
        &self,
        st: &mut State,
        peer: DomId,
        geometry: RingGeometry,
        conn_id: u32,
    ) -> Result<OwnedRing, Error> {
        let order = geometry.order() as u8;
        let pooled = st
            .links
            .get_mut(&peer)
            .filter(|l| l.reuse)
            .and_then(|l| l.rings.pool.get_mut(&order)?.pop());
        let ring = match pooled {
            Some(ring) => {
                reinit_ring(&ring, self.domid(), peer, conn_id);
                ring
            }
            None => grant_ring(
                self.xen.as_ref(),
                self.domid(),
                peer,
                geometry,
                conn_id,
                false,
            )?,
        };
        // Our reader has not waited yet: say so, rather than leave the
        // event index at 0, which reads as "waiting at 0" (see close_conn).
        ring.ring
            .store(Field::DataEvent, NOT_WAITING, Ordering::Release);
        Ok(ring)
    }

    /// Maps the ring `peer` offered in `grant`, reusing a mapping kept from
    /// an earlier connection if it names the same pages. A kept mapping is
    /// checked like a fresh one (identity) and must start from zero.
    pub(super) fn map_peer_ring(
        &self,
        st: &mut State,
        peer: DomId,
        grant: &ctrl::RingGrant,
        expected: &RingIdentity,
    ) -> Result<MappedRing, Error> {
        let kept = st.links.get_mut(&peer).and_then(|l| {
            let i = l
                .rings
                .mapped
                .iter()
                .position(|(g, _)| g.header_ref == grant.header_ref)?;
            l.rings.mapped.remove(i)
        });
        if let Some((g, m)) = kept {
            if g.order == grant.order && g.dir_ref == grant.dir_ref {
                m.ring.header().verify(expected).map_err(Error::Layout)?;
                verify_fresh(&m.ring)?;
                return Ok(m);
            }
            // Same header page, other geometry: the peer is confused; map
            // what it says now (and let the identity check decide).
        }
        map_ring(self.xen.as_ref(), peer, grant, expected)
    }

    /// Keeps our mapping of a peer ring we will not write any more, for
    /// the peer to re-offer. Dropped (unmapped) when reuse is off.
    pub(super) fn keep_mapping(&self, st: &mut State, peer: DomId, tx: TxSide) {
        let Some(link) = st.links.get_mut(&peer).filter(|l| l.reuse) else {
            return;
        };
        link.rings.mapped.push_back((tx.grant, tx.mapped));
        while link.rings.mapped.len() > MAPPED_KEPT_MAX {
            link.rings.mapped.pop_front();
        }
    }

    /// Our receive ring is idle and the peer no longer writes it: into the
    /// pool, or, past the pool's bound, retired (the peer is told to unmap
    /// it, and our grant ends; Xen defers that until the peer has unmapped).
    pub(super) fn pool_rx_ring(&self, st: &mut State, peer: DomId, ring: OwnedRing) {
        let Some(link) = st.links.get_mut(&peer).filter(|l| l.reuse) else {
            return;
        };
        let size = ring.ring.geometry().data_size();
        let cap = (POOL_BYTES_PER_ORDER / size.max(1)).clamp(1, POOL_PER_ORDER);
        let pool = link.rings.pool.entry(ring.grant.order).or_default();
        if pool.len() < cap {
            pool.push(ring);
            return;
        }
        let grant = ring.grant;
        drop(ring);
        self.send_frame(st, peer, &Message::RingRetire { ring: grant });
    }

    /// Where our receive ring goes when our side of a cleanly closed
    /// connection is done: the pool if the peer already said it stopped
    /// writing (its `Close`), else lent until it does.
    pub(super) fn release_rx_ring(
        &self,
        st: &mut State,
        conn: &Conn,
        ring: OwnedRing,
        peer_done: bool,
    ) {
        if peer_done {
            self.pool_rx_ring(st, conn.peer(), ring);
        } else if let Some(link) = st.links.get_mut(&conn.peer()).filter(|l| l.reuse) {
            link.rings.lent.insert(conn.id, ring);
        }
    }

    pub(super) fn link_reuses_rings(&self, st: &State, peer: DomId) -> bool {
        st.links.get(&peer).is_some_and(|l| l.reuse)
    }
}
