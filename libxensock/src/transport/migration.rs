// SPDX-License-Identifier: MIT OR Apache-2.0
//! Connections on their carrier switch (`docs/migration.md`): handing a
//! connection to its switch, ring offers when peers are co-resident again,
//! freezes, suspend and resume, a new domid.

use super::*;

impl Inner {
    /// Routes legs presenting this connection's id and cookie to it: the
    /// first one hands the connection to its carrier switch (the peer left
    /// the ring).
    pub(super) fn register_legs(&self, conn: &Arc<Conn>) {
        let Some(legs) = &self.legs else {
            return;
        };
        let (wi, wc) = (self.weak.clone(), Arc::downgrade(conn));
        legs.register(
            conn.id,
            conn.cookie.load(Ordering::Relaxed),
            Arc::new(move |sock| {
                let (Some(inner), Some(conn)) = (wi.upgrade(), wc.upgrade()) else {
                    return;
                };
                // A leg can overtake the `ConnectAccept` that opens us.
                let end = Instant::now() + inner.cfg.link_timeout;
                while conn.io().phase == ConnPhase::Connecting && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(1));
                }
                match inner.escalate(&conn) {
                    Some(e) => e.adopt_leg(sock),
                    None => drop(sock),
                }
            }),
        );
    }

    /// Hands an open connection from the ring fast path to its carrier
    /// switch, once: the switch takes the rings and the switch state as they
    /// stand. `None` when the connection has no TCP carrier (the peer sent
    /// no endpoint, or we have no leg listener) or is not open with both
    /// rings.
    pub(crate) fn escalate(&self, conn: &Arc<Conn>) -> Option<Arc<Switch>> {
        self.escalate_leaving(conn, None)
    }

    /// [`Inner::escalate`], and the connection leaves its rings for
    /// `trigger` (when given) before anyone can use them through the
    /// switch: with [`Trigger::Restored`] not even a look at the peer's
    /// ring, which is not there any more. `None` also when the freeze
    /// failed (the connection is reset).
    pub(crate) fn escalate_leaving(
        &self,
        conn: &Arc<Conn>,
        trigger: Option<Trigger>,
    ) -> Option<Arc<Switch>> {
        let legs = self.legs.clone()?;
        let mut slot = lock(&conn.switch);
        if let Some(e) = slot.as_ref() {
            let e = e.clone();
            drop(slot);
            if let Some(t) = trigger.filter(|_| e.on_ring()) {
                if let Err(err) = e.freeze(t) {
                    tracing::warn!(conn = conn.id, ?t, "freeze: {err}");
                    return None;
                }
                tracing::info!(conn = conn.id, trigger = ?t, "connection leaves its ring");
            }
            return Some(e);
        }
        let peer_tcp = (*lock(&conn.peer_tcp))?;
        let mut io = conn.io();
        if io.phase != ConnPhase::Open || io.tx.is_none() || io.rx.is_none() {
            return None;
        }
        let (tx, rx) = (io.tx.take()?, io.rx.take()?);
        let order = rx.owned.grant.order;
        let rx_ring = rx.owned.ring;
        let seed = Seed {
            tx_path: io.tx_path.clone(),
            producer: Some((tx.p, HeldRing::mapped(tx.mapped))),
            rx_path: io.rx_path.clone(),
            consumer: Some((rx.c, HeldRing::shared(rx_ring, rx.owned))),
            delivered: io.bytes_in,
            leave_ring: trigger,
        };
        *lock(&conn.carrier_kick) = io.kicker.clone();
        conn.offer_target.store(conn.peer(), Ordering::Release);
        let cfg = SwitchConfig {
            peer_lost_after: self.cfg.peer_lost_after,
            ..SwitchConfig::new(
                conn.id,
                io.peer_id,
                conn.cookie.load(Ordering::Relaxed),
                Some(peer_tcp),
            )
        };
        let wc = Arc::downgrade(conn);
        let kick: crate::carrier::Kick = Arc::new(move || {
            if let Some(c) = wc.upgrade() {
                if let Some(k) = lock(&c.carrier_kick).as_ref() {
                    let _ = k.notify();
                }
            }
        });
        let wc = Arc::downgrade(conn);
        let ready: crate::carrier::ReadyHook = Arc::new(move || {
            if let Some(c) = wc.upgrade() {
                c.signal();
            }
        });
        let alloc = self.ring_alloc(conn, order);
        match Switch::start_seeded(
            cfg,
            seed,
            legs,
            conn.doorbell.clone(),
            kick,
            alloc,
            Some(ready),
        ) {
            Ok(e) => {
                let e = Arc::new(e);
                io.carried = true;
                *slot = Some(e.clone());
                self.carriers.fetch_add(1, Ordering::Relaxed);
                drop(io);
                drop(slot);
                tracing::info!(
                    conn = conn.id,
                    peer = conn.peer(),
                    ?trigger,
                    "connection handed to its carrier switch"
                );
                // Waiters on the fast path retry on the switch.
                conn.signal();
                Some(e)
            }
            Err(err) => {
                tracing::warn!(conn = conn.id, "carrier switch: {err}");
                io.reset_local();
                drop(io);
                conn.signal();
                None
            }
        }
    }

    /// Makes receive rings for a connection's offers: granted to the
    /// domain the offer goes to, identity epoch as the switch says.
    pub(super) fn ring_alloc(&self, conn: &Arc<Conn>, order: u8) -> RingAlloc {
        let (wi, wc) = (self.weak.clone(), Arc::downgrade(conn));
        Box::new(move |epoch| {
            let (Some(inner), Some(c)) = (wi.upgrade(), wc.upgrade()) else {
                return Err(errno(libc::ECONNRESET));
            };
            let geometry = RingGeometry::new(u32::from(order))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            let (me, to) = (inner.domid(), c.offer_target.load(Ordering::Acquire));
            let mut owned = grant_ring(inner.xen.as_ref(), me, to, geometry, c.id, false)
                .map_err(io::Error::from)?;
            owned.ring.header().init(&RingIdentity {
                epoch,
                ..data_identity(me, to, c.id, order)
            });
            owned
                .ring
                .store(Field::DataEvent, NOT_WAITING, Ordering::Release);
            owned.grant.epoch = epoch;
            *lock(&c.offered_grant) = Some(owned.grant);
            let ring = owned.ring;
            let local = HeldRing::shared(ring, owned);
            Ok(NewRing {
                for_peer: local.clone(),
                local,
            })
        })
    }

    /// Carrier connections to `peer`, for triggers and offers.
    pub(super) fn carriers_to(&self, st: &State, peer: DomId) -> Vec<(Arc<Conn>, Arc<Switch>)> {
        if self.carriers.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        st.conns
            .values()
            .filter(|c| c.peer() == peer)
            .filter_map(|c| c.switch().map(|e| (c.clone(), e)))
            .collect()
    }

    /// The link to `peer` is up: every carrier connection to it offers a
    /// ring for its receiving direction (when that is on TCP), to return
    /// to the rings.
    pub(super) fn offer_carriers(&self, st: &mut State, peer: DomId) {
        for (conn, switch) in self.carriers_to(st, peer) {
            self.rehome(st, &conn, peer);
            self.offer_ring_to(st, &conn, &switch, peer);
        }
    }

    /// Puts a carrier connection on the link to `peer` (kicks, doorbell).
    pub(super) fn rehome(&self, st: &mut State, conn: &Arc<Conn>, peer: DomId) {
        let old = conn.peer();
        if old != peer {
            if let Some(l) = st.links.get_mut(&old) {
                l.conns.remove(&conn.id);
            }
            conn.set_peer(peer);
            tracing::info!(
                conn = conn.id,
                old,
                new = peer,
                "peer moved: connection follows"
            );
        }
        if let Some(l) = st.links.get_mut(&peer) {
            l.conns.insert(conn.id);
            let chan = l.tx.as_ref().map(|t| t.chan.clone());
            *lock(&conn.carrier_kick) = chan.clone();
            // Kicks we gave before, through the old link, were lost: one
            // now, so that a peer waiting on one of the rings looks again.
            if let Some(c) = &chan {
                let _ = c.notify();
            }
        }
        // Kicks for it may have come before it was on this link.
        conn.doorbell.ring();
    }

    pub(super) fn offer_ring_to(
        &self,
        st: &mut State,
        conn: &Arc<Conn>,
        switch: &Switch,
        to: DomId,
    ) {
        if self.suspended.load(Ordering::Acquire) {
            return;
        }
        // Not over a link whose peer is gone (a migration we have not
        // processed yet): the offer could never be taken.
        if !link_usable(st, to) {
            return;
        }
        conn.offer_target.store(to, Ordering::Release);
        match switch.offer_ring() {
            Ok(Some((epoch, _))) => {
                let Some(grant) = lock(&conn.offered_grant).take() else {
                    return;
                };
                *lock(&conn.offered_to) = Some((to, epoch));
                let peer_id = conn.io().peer_id;
                tracing::info!(conn = conn.id, to, epoch, "ring offered");
                self.send_frame(
                    st,
                    to,
                    &Message::RingOffer {
                        conn_id: peer_id,
                        rx: grant,
                    },
                );
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(conn = conn.id, "ring offer: {e}"),
        }
    }

    /// A peer's `RingOffer` for our sending direction. From the domain the
    /// connection is on: taken. From another domain (the peer may have
    /// moved there): nothing proves it is the peer, since a `RingOffer`
    /// carries no secret, so we offer our own ring to it first and take its
    /// offer only once the peer, over its cookie-authenticated leg, has
    /// switched onto that ring (`RingFrom`): only the domain we granted it
    /// to can have been offered it.
    pub(super) fn on_ring_offer(
        &self,
        st: &mut State,
        peer: DomId,
        conn_id: u32,
        rx: &ctrl::RingGrant,
    ) {
        let Some(conn) = st.conns.get(&conn_id).cloned() else {
            return;
        };
        let Some(switch) = conn.switch() else {
            return;
        };
        if self.suspended.load(Ordering::Acquire) {
            // The move would take the ring away again: kept for a resume
            // without a move (after a move the peer offers anew, and this
            // grant, made for our old domid, is of no use).
            *lock(&conn.pending_offer) = Some((peer, *rx));
            return;
        }
        if conn.peer() != peer {
            *lock(&conn.pending_offer) = Some((peer, *rx));
            let offered = *lock(&conn.offered_to);
            if offered.map(|(to, ..)| to) != Some(peer) {
                self.offer_ring_to(st, &conn, &switch, peer);
            }
            self.check_rehome(st, &conn, &switch);
            return;
        }
        self.take_offer(st, &conn, &switch, peer, rx);
        self.offer_ring_to(st, &conn, &switch, peer);
    }

    pub(super) fn take_offer(
        &self,
        st: &mut State,
        conn: &Arc<Conn>,
        switch: &Switch,
        peer: DomId,
        rx: &ctrl::RingGrant,
    ) {
        let peer_id = conn.io().peer_id;
        let expected = RingIdentity {
            epoch: rx.epoch,
            ..data_identity(peer, self.domid(), peer_id, rx.order)
        };
        let mapped = match map_ring(self.xen.as_ref(), peer, rx, &expected) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(conn = conn.id, peer, "ring offer not mapped: {e}");
                return;
            }
        };
        self.rehome(st, conn, peer);
        match switch.accept_ring_offer(rx.epoch, HeldRing::mapped(mapped)) {
            Ok(true) => tracing::info!(conn = conn.id, peer, epoch = rx.epoch, "back on a ring"),
            Ok(false) => tracing::debug!(conn = conn.id, epoch = rx.epoch, "stale ring offer"),
            Err(e) => tracing::warn!(conn = conn.id, "ring offer: {e}"),
        }
    }

    /// A connection holding an offer from another domain: once our
    /// receiving direction reads the ring we offered that domain, the peer
    /// is there; move the connection and take its offer.
    pub(super) fn check_rehome(&self, st: &mut State, conn: &Arc<Conn>, switch: &Switch) {
        let Some((from, grant)) = *lock(&conn.pending_offer) else {
            return;
        };
        let Some((to, epoch)) = *lock(&conn.offered_to) else {
            return;
        };
        if from != to {
            return;
        }
        let rx = switch.status().rx;
        let on_it =
            matches!(rx, xensock_proto::switch::RxState::Ring { epoch: e, .. } if e == epoch);
        if !on_it {
            tracing::trace!(
                conn = conn.id,
                from,
                epoch,
                ?rx,
                "waiting for the peer on our ring"
            );
            return;
        }
        *lock(&conn.pending_offer) = None;
        self.take_offer(st, conn, switch, from, &grant);
    }

    /// Retries what a carrier connection on TCP needs to return to a ring
    /// (an offer refused for now by the switch, e.g. before the sender's
    /// freeze notice arrived, or voided by a later freeze), and moves
    /// connections whose peer proved to be on another domain. Returns
    /// whether any of them could use a sweep: a usable link to its
    /// target, or an offer kept for later.
    pub(super) fn sweep_carriers(&self) -> bool {
        let mut st = self.state();
        let conns: Vec<(Arc<Conn>, Arc<Switch>)> = st
            .conns
            .values()
            .filter_map(|c| c.switch().map(|e| (c.clone(), e)))
            .collect();
        let mut busy = false;
        for (conn, switch) in conns {
            if switch.failed() {
                continue;
            }
            let target = match *lock(&conn.pending_offer) {
                Some((from, _)) if !link_usable(&st, conn.peer()) => from,
                _ => conn.peer(),
            };
            if link_usable(&st, target) {
                busy = true;
                self.offer_ring_to(&mut st, &conn, &switch, target);
            }
            // An offer from the peer's own domain kept while suspended:
            // nothing to do with it before `resume` (which wakes us), so it
            // does not keep the sweep at its fastest meanwhile (it cost the
            // suspended lab guest ~3% of its CPU).
            let kept = *lock(&conn.pending_offer);
            busy |= kept.is_some() && !self.suspended.load(Ordering::Acquire);
            if let Some((from, grant)) = kept {
                if from == conn.peer() && !self.suspended.load(Ordering::Acquire) {
                    *lock(&conn.pending_offer) = None;
                    self.take_offer(&mut st, &conn, &switch, from, &grant);
                }
            }
            self.check_rehome(&mut st, &conn, &switch);
            self.drop_unproven(&conn, &switch);
        }
        busy
    }

    /// Our ring offered to a domain that is not the connection's peer
    /// (whose own offer named the connection: the peer, moved, or a guest
    /// posing as it), and the switch gave the offer up (proto's offer
    /// clock: not taken within its timeout) without that domain reading
    /// it: that domain is not the peer. Its kept offer is dropped and the
    /// next candidate gets our ring; without this, one silent guest posing
    /// as the peer kept the connection on TCP for good. The module drops
    /// its candidate at the same step.
    pub(super) fn drop_unproven(&self, conn: &Arc<Conn>, switch: &Switch) {
        let mut offered = lock(&conn.offered_to);
        let Some((to, epoch)) = *offered else {
            return;
        };
        if to == conn.peer() {
            return;
        }
        match switch.status().rx {
            // still waiting, or proved (`check_rehome` moves the connection)
            xensock_proto::switch::RxState::Offered { epoch: e }
            | xensock_proto::switch::RxState::Ring { epoch: e, .. }
                if e == epoch =>
            {
                return
            }
            _ => {}
        }
        tracing::info!(
            conn = conn.id,
            to,
            epoch,
            "ring offer to a domain not the peer's was not taken: its offer is dropped"
        );
        *offered = None;
        drop(offered);
        let mut kept = lock(&conn.pending_offer);
        if kept.is_some_and(|(from, _)| from == to) {
            *kept = None;
        }
    }

    /// Connections waiting to follow a peer that may have moved to `peer`.
    pub(super) fn check_rehomes(&self, st: &mut State, peer: DomId) {
        if self.carriers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let waiting: Vec<(Arc<Conn>, Arc<Switch>)> = st
            .conns
            .values()
            .filter(|c| lock(&c.pending_offer).is_some_and(|(from, _)| from == peer))
            .filter_map(|c| c.switch().map(|e| (c.clone(), e)))
            .collect();
        for (conn, switch) in waiting {
            self.check_rehome(st, &conn, &switch);
        }
    }

    /// Rings the doorbells of carrier connections on `peer`'s link.
    pub(super) fn ring_carriers(&self, st: &State, peer: DomId) {
        for (conn, _) in self.carriers_to(st, peer) {
            conn.doorbell.ring();
        }
    }

    /// Freezes every open stream connection (to `peer` only, if given):
    /// each is handed to its carrier switch and leaves its rings. Returns
    /// the switches.
    pub(super) fn freeze_conns(&self, peer: Option<DomId>, trigger: Trigger) -> Vec<Arc<Switch>> {
        let conns: Vec<Arc<Conn>> = self
            .state()
            .conns
            .values()
            .filter(|c| peer.is_none_or(|p| c.peer() == p))
            .cloned()
            .collect();
        let mut switches = Vec::new();
        for c in conns {
            if let Some(e) = self.escalate(&c) {
                match e.freeze(trigger) {
                    Ok(()) => {
                        tracing::info!(conn = c.id, ?trigger, "connection leaves its ring");
                        switches.push(e);
                    }
                    Err(err) => tracing::warn!(conn = c.id, "freeze: {err}"),
                }
            }
        }
        switches
    }

    /// Connections to `peer` still on a ring (their first, or one their
    /// carrier switch came back to) leave it: the peer moved away.
    pub(super) fn freeze_ring_conns(&self, peer: DomId) {
        let conns: Vec<Arc<Conn>> = self
            .state()
            .conns
            .values()
            .filter(|c| c.peer() == peer && c.switch().is_none_or(|e| e.on_ring()))
            .cloned()
            .collect();
        for c in conns {
            if let Some(e) = self.escalate(&c) {
                match e.freeze(Trigger::LocalMove) {
                    Ok(()) => {
                        tracing::info!(conn = c.id, trigger = ?Trigger::LocalMove, "connection leaves its ring")
                    }
                    Err(err) => tracing::warn!(conn = c.id, "freeze: {err}"),
                }
            }
        }
    }

    /// A connection opened between the suspend hook and the move leaves
    /// its rings at once, as those opened before did.
    pub(super) fn freeze_if_suspended(&self, conn: &Arc<Conn>) {
        if !self.suspended.load(Ordering::Acquire) {
            return;
        }
        if let Some(e) = self.escalate(conn) {
            if let Err(err) = e.freeze(Trigger::LocalMove) {
                tracing::warn!(conn = conn.id, "freeze: {err}");
            }
        }
    }

    /// Whether XenStore gives this domain another domid than the one we
    /// run under: it was saved and restored, or migrated, and
    /// [`Inner::check_domid`] has not caught up yet.
    pub(super) fn domid_changed(&self) -> bool {
        self.xs
            .read_string(store::DOMID)
            .ok()
            .and_then(|v| v.trim().parse::<DomId>().ok())
            .is_some_and(|d| d != self.domid())
    }

    /// Our own domid changed (same-host migration): the old links are
    /// dead (connections on the ring fast path with them; carrier
    /// connections go on over TCP), XenStore paths follow the new domid,
    /// and new links to the carriers' peers bring them back to rings.
    /// Returns whether it changed.
    pub(crate) fn check_domid(&self) -> bool {
        let Ok(v) = self.xs.read_string(store::DOMID) else {
            return false;
        };
        let Ok(new) = v.trim().parse::<DomId>() else {
            return false;
        };
        // Under the state lock: the watch and the resume hook may both look.
        let mut st = self.state();
        let old = self.domid();
        if new == old {
            return false;
        }
        tracing::info!(old, new, "this domain migrated");
        self.suspended.store(false, Ordering::Release);
        // Whatever we mapped of a peer's before the save is not there any
        // more: nothing is read back from it (a suspend hook that ran left
        // no connection on a ring).
        let peers: Vec<DomId> = st.links.keys().copied().collect();
        for p in peers {
            self.link_down_as(&mut st, p, true, Trigger::Restored);
        }
        self.domid.store(new, Ordering::Release);
        st.dead_gens.clear();
        // Offers kept while suspended were granted to our old domid.
        for c in st.conns.values() {
            lock(&c.pending_offer).take();
        }
        // Watches of paths named after the old domid go; `domid` (relative)
        // and the broad `/local/domain` stay registered, so that an offer
        // made to the new domid while the others are re-registered is
        // not missed.
        lock(&self.watches)
            .by_path
            .retain(|path, _| path == store::DOMID || path == store::DOMAINS);
        let _ = self.add_watch(store::DOMID);
        let _ = self.add_watch(&self.table_dir());
        let _ = self.refresh_peers(&st);
        self.relink_carriers(&mut st);
        self.link_cv.notify_all();
        true
    }

    /// Offers a link to the peer of every carrier connection that has
    /// none (after a move or a suspend), whose coming up offers rings.
    pub(super) fn relink_carriers(&self, st: &mut State) {
        let mut peers: Vec<DomId> = st
            .conns
            .values()
            .filter(|c| c.switch().is_some())
            .map(|c| c.peer())
            .collect();
        peers.sort_unstable();
        peers.dedup();
        for p in peers {
            if !st.links.contains_key(&p) && self.create_link(st, p, None).is_ok() {
                self.on_peer_node(st, p);
            }
        }
    }

    /// Links, and connections whose switch holds a ring: what a save
    /// would carry in grant mappings.
    pub(super) fn shared_pages_held(&self) -> usize {
        let st = self.state();
        st.links.len()
            + st.conns
                .values()
                .filter(|c| c.switch().is_some_and(|e| e.holds_rings()))
                .count()
    }
}
