// SPDX-License-Identifier: GPL-2.0
//! A link's two halves: following the peer's half in XenStore (proto's
//! link-half step), attaching to it, and taking the link down when the
//! peer goes.

use super::*;

impl<C: LinkConn> Link<C> {
    /// The peer's half changed: proto's link-half step ([`follow`]),
    /// done here. The module always holds its own half while the link
    /// exists, and writes no generation.
    pub(super) fn follow_peer(self: &Arc<Self>, i: &mut LinkInner<C>) {
        let values = HalfValues {
            ring_ref: xs::read_u32(&self.peer_dir, node::RING_REF),
            event_channel: xs::read_u32(&self.peer_dir, node::EVENT_CHANNEL),
            state: xs::read_u32(&self.peer_dir, node::STATE),
            generation: xs::read_u32(&self.peer_dir, node::GENERATION),
            peer_generation: xs::read_u32(&self.peer_dir, node::PEER_GENERATION),
            ring_reuse: None,
        };
        let theirs = match (values.state, values.offered()) {
            (None, _) => Theirs::Removed,
            (Some(_), Some(h)) => Theirs::Offered(h),
            (Some(_), None) => Theirs::Withdrawn,
        };
        let ours = i
            .peer
            .as_ref()
            .map_or(Ours::Offered { generation: None }, |a| {
                Ours::Attached(a.half)
            });
        let now = sys::net::now_ms();
        let held = Held {
            dead: None,
            failed: i.failed,
        };
        match follow(ours, theirs, held, now) {
            HalfStep::Ignore => return,
            HalfStep::Detach { removed: true } => {
                // vanished, not withdrawn: a destroyed domain, or a pair
                // dom0 ended; the first unless dom0 says it is gone
                self.vanished.store(true, Ordering::Release);
                self.detach(i, "peer state removed");
                if dead_marked(self.me, self.peer) {
                    self.end_dead_peer(i);
                }
                return;
            }
            HalfStep::Detach { removed: false } => {
                self.detach(i, "peer withdrew its half");
                return;
            }
            HalfStep::Restart => self.detach(i, "peer re-advertised (restarted)"),
            HalfStep::Attach | HalfStep::Answer { .. } => {}
        }
        let Theirs::Offered(h) = theirs else { return };
        let half = HalfId::from(&h);
        if let Err(x) = self.attach(i, half) {
            i.failed = Some(FailedAttach { half, at_ms: now });
            pr_warn!(
                "link to dom{}: cannot attach to ring-ref {} port {}: {:?}\n",
                self.peer,
                half.ring_ref,
                half.event_channel,
                x
            );
        } else {
            i.failed = None;
            C::adopt_moved(self, i);
        }
    }

    /// Maps the peer's control ring and binds its port.
    fn attach(&self, i: &mut LinkInner<C>, half: HalfId) -> Result {
        let (gref, port) = (half.ring_ref, half.event_channel);
        self.vanished.store(false, Ordering::Release);
        let g = link_geometry()?;
        let map = Mapping::map(self.peer, gref)?;
        let ring = map.ring(g).ok_or(EINVAL)?;
        ring.header()
            .verify(&RingIdentity {
                magic: LINK_RING_MAGIC,
                order: g.order(),
                owner_domid: self.peer,
                peer_domid: self.me,
                conn_id: 0,
                epoch: 0,
            })
            .map_err(|_| EINVAL)?;
        let tx = crate::proto::link::control_producer(ring);
        let chan = Evtchn::bind_interdomain(self.peer, port, &self.wake)?;
        self.kick_port.store(chan.port, Ordering::Release);
        chan.notify();
        i.peer = Some(Attached {
            tx,
            chan,
            half,
            _map: map,
        });
        self.up.store(true, Ordering::Release);
        self.wake.set_up(true);
        // Only into our own advertisement: when the pair's directories are
        // made again, the peer's half can be back before dom0 made ours, and
        // a write would create our directory's `state` with the link root's
        // owner-only permissions, which the peer then cannot read (and
        // never attached again).
        // `readvertise` writes the state with the rest.
        let ours = i
            .mine
            .as_ref()
            .map(|m| xs::read_u32(&self.my_dir, node::RING_REF) == Some(m._grant.gref))
            .unwrap_or(false);
        if ours {
            let _ = xs::write_state(&self.my_dir, LinkState::Connected.value() as i32);
        }
        pr_info!(
            "link to dom{} up (peer ring-ref {} event-channel {})\n",
            self.peer,
            gref,
            port
        );
        // connections that moved to TCP offer rings again
        C::link_up();
        Ok(())
    }

    /// The peer's half vanished while the link was up and dom0 says its
    /// domain is gone for good (`xensock/gone/<domid>` in our table, as
    /// the agent writes it when a domain is released without a move): the
    /// connections the link still lists (streams wait there on TCP for the
    /// peer to come back) end now with ECONNRESET, not after the lost-peer
    /// bound. A guest that leaves and comes back (save, migration) retracts
    /// its half first (state Closed, from its freeze hook), so its
    /// connections are never ended this way; the agent cannot tell a save
    /// from a destruction, the departing guest can. Link locked.
    pub(super) fn end_dead_peer(&self, i: &mut LinkInner<C>) {
        if !self.vanished.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut ended: KVec<u32> = KVec::new();
        for (id, _) in i.conns.iter() {
            if ended.push(*id, GFP_KERNEL).is_err() {
                break;
            }
        }
        for id in ended.iter() {
            if let Some(s) = i.conns.remove(id) {
                C::link_lost(&s);
            }
        }
        sys::counters::add(&sys::counters::PEERS_DEAD, 1);
        pr_info!(
            "link to dom{}: dom0 says the domain is gone: {} connection(s) reset\n",
            self.peer,
            ended.len()
        );
    }

    /// The peer went away: stream connections switch to their TCP legs
    /// and stay listed (a ring offer finds them when the link is back);
    /// every other connection over the link is reset.
    pub(super) fn detach(&self, i: &mut LinkInner<C>, why: &str) {
        sys::counters::add(&sys::counters::LINKS_DOWN, 1);
        self.up.store(false, Ordering::Release);
        self.wake.set_up(false);
        self.kick_port.store(0, Ordering::Release);
        // frames for the peer that went away
        i.backlog = KVec::new();
        // nobody can map them any more (the rings go as the peer unmaps)
        let lent = core::mem::replace(&mut i.lent, RBTree::new());
        drop(lent);
        pr_info!("link to dom{} down: {}\n", self.peer, why);
        self.prune(i);
        // the peer's rings stay mapped until the switches copied them back
        let mut lost: KVec<u32> = KVec::new();
        for (id, s) in i.conns.iter() {
            if !C::link_down(s) && lost.push(*id, GFP_KERNEL).is_err() {
                C::link_lost(s);
            }
        }
        for id in lost.iter() {
            if let Some(s) = i.conns.remove(id) {
                C::link_lost(&s);
            }
        }
        let ph = i.peer.take();
        drop(ph);
        // a dead peer's mappings are gone: its pending grants can end
        sys::pending_grants_kick();
    }

    /// Our directory for this link came back empty (dom0/the agent made
    /// the pair co-resident again): advertise our half again; the peer
    /// attaches to it as at first.
    pub(super) fn readvertise(&self) {
        let i = self.inner.lock();
        let Some(mine) = i.mine.as_ref() else { return };
        // ring-ref, not state: attaching to the peer's half writes our
        // state into the new, empty directory before we advertised again
        // (state 4 without a ring-ref, and the peer never attached)
        if xs::read_u32(&self.my_dir, node::RING_REF) == Some(mine._grant.gref) {
            return;
        }
        let state = if i.peer.is_some() {
            LinkState::Connected.value() as i32
        } else {
            LinkState::Initialised.value() as i32
        };
        if xs::advertise(&self.my_dir, mine._grant.gref, mine._chan.port, state).is_ok() {
            pr_info!(
                "link to dom{}: directory back, advertised again\n",
                self.peer
            );
        }
    }
}
