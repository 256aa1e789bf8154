// SPDX-License-Identifier: MIT OR Apache-2.0
//! Links: our half in XenStore, attaching the peer's half, tearing a link
//! down, and the control ring (frames queued, flushed and serviced).

use super::*;

impl Inner {
    /// Creates our half of a link to `peer` (grant, port, XenStore node).
    pub(super) fn create_link(
        &self,
        st: &mut State,
        peer: DomId,
        peer_gen: Option<u32>,
    ) -> Result<(), Error> {
        if self.suspended.load(Ordering::Acquire) {
            // Its grants and mappings would go into the save.
            return Err(Error::Io(errno(libc::EAGAIN)));
        }
        // a peer we link with again is alive
        st.vanished.remove(&peer);
        let rx = grant_ring(
            self.xen.as_ref(),
            self.domid(),
            peer,
            RingGeometry::new(LINK_RING_ORDER).map_err(Error::Layout)?,
            0,
            true,
        )?;
        let mut rx = rx;
        set_byte(rx.region.as_ref(), LINK_OWNER_ALIVE_OFFSET, 1);
        rx.region.set_unmap_notify(UnmapNotify {
            clear_byte: Some(LINK_OWNER_ALIVE_OFFSET),
            send_event: None,
        })?;
        let rx_chan = self.xen.alloc_unbound(peer)?;
        let gen = random_u32();
        let node = self.my_node(peer);
        let me = self.domid();
        let (ring_ref, port) = (rx.grant.header_ref, rx_chan.local_port());
        let created_dir = self.xs.transaction(|tx| {
            // A directory made by dom0 (the agent's policy, as the kernel
            // module needs) is kept with its permissions; otherwise we make
            // it readable by the peer only.
            let exists = match tx.directory(&node) {
                Ok(_) => true,
                Err(e) if e.is(XsErrno::NoEnt) => false,
                Err(e) => return Err(e),
            };
            if !exists {
                tx.mkdir(&node)?;
                tx.set_perms(
                    &node,
                    &[
                        Perm::new(PermAccess::None, u32::from(me)),
                        Perm::new(PermAccess::Read, u32::from(peer)),
                    ],
                )?;
            }
            let at = |name: &str| format!("{node}/{name}");
            tx.write(&at(node::VERSION), xensock_proto::link::LINK_VERSION)?;
            tx.write(&at(node::RING_REF), ring_ref.to_string())?;
            tx.write(&at(node::EVENT_CHANNEL), port.to_string())?;
            tx.write(&at(node::GENERATION), gen.to_string())?;
            tx.write(
                &at(node::PEER_GENERATION),
                peer_gen.unwrap_or(0).to_string(),
            )?;
            if self.cfg.ring_reuse {
                tx.write(&at(node::FEATURE_RING_REUSE), "1")?;
            }
            tx.write(&at(node::STATE), LinkState::Initialised.as_str())?;
            Ok(!exists)
        })?;
        epoll_add(&self.epoll, rx_chan.as_raw_fd(), u64::from(peer) + 1)?;
        tracing::info!(peer, gen, answering = peer_gen, "link offered");
        // When the peer's domain is destroyed, xenstored reports the removal
        // of its node only to watchers of that path (it may already be
        // watched: a candidate peer).
        let _ = self.add_watch(&self.peer_node(peer));
        let c = Consumer::new(rx.ring);
        let shared = Arc::new(LinkShared::new(rx_chan.as_fd().try_clone_to_owned().ok()));
        st.links.insert(
            peer,
            Link {
                peer,
                gen,
                peer_half: None,
                rx,
                c,
                rx_chan,
                tx: None,
                pending: VecDeque::new(),
                shared,
                conns: HashSet::new(),
                peer_seen_alive: false,
                owner_seen_alive: false,
                created_dir,
                reuse: false,
                kick_owed: false,
                rings: RingCache::default(),
            },
        );
        Ok(())
    }

    /// Maps the peer's control page and binds its port.
    pub(super) fn attach_link(
        &self,
        st: &mut State,
        peer: DomId,
        info: &PeerHalf,
    ) -> Result<(), Error> {
        let Some(link) = st.links.get_mut(&peer) else {
            return Ok(());
        };
        let grant = ctrl::RingGrant {
            order: LINK_RING_ORDER as u8,
            epoch: 0,
            header_ref: info.ring_ref,
            dir_ref: 0,
        };
        let mut ring = map_ring(
            self.xen.as_ref(),
            peer,
            &grant,
            &link_identity(peer, self.domid()),
        )?;
        let chan: Arc<dyn EventChannel> =
            Arc::from(self.xen.bind_interdomain(peer, info.event_channel)?);
        set_byte(ring.region.as_ref(), LINK_MAPPER_ALIVE_OFFSET, 1);
        ring.region.set_unmap_notify(UnmapNotify {
            clear_byte: Some(LINK_MAPPER_ALIVE_OFFSET),
            send_event: Some(chan.local_port()),
        })?;
        let p = xensock_proto::link::control_producer(ring.ring);
        link.tx = Some(LinkTx { ring, p, chan });
        link.peer_half = Some(HalfId::from(info));
        link.reuse = self.cfg.ring_reuse && info.ring_reuse;
        tracing::info!(peer, gen = link.gen, peer_gen = info.generation, "link up");
        let _ = self.xs.write(
            &format!("{}/{}", self.my_node(peer), node::STATE),
            LinkState::Connected.as_str(),
        );
        let _ = self.flush_link(link);
        if let Some(tx) = &link.tx {
            let _ = tx.chan.notify();
        }
        self.link_cv.notify_all();
        Ok(())
    }

    /// The peer's half for us, as [`follow`] takes it.
    pub(super) fn read_peer_node(&self, peer: DomId) -> Result<Theirs, XsError> {
        let half = self.peer_node(peer);
        let num = |name: &str| -> Result<Option<u32>, XsError> {
            Ok(self
                .xs
                .try_read(&format!("{half}/{name}"))?
                .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok()))
        };
        let read = || -> Result<Theirs, XsError> {
            let Some(state) = num(node::STATE)? else {
                return Ok(Theirs::Removed);
            };
            // Withdrawn or incomplete (the usual case when it is going):
            // the rest need not be read.
            let (Some(ring_ref), Some(event_channel)) =
                (num(node::RING_REF)?, num(node::EVENT_CHANNEL)?)
            else {
                return Ok(Theirs::Withdrawn);
            };
            let values = HalfValues {
                ring_ref: Some(ring_ref),
                event_channel: Some(event_channel),
                state: Some(state),
                generation: num(node::GENERATION)?,
                peer_generation: num(node::PEER_GENERATION)?,
                ring_reuse: num(node::FEATURE_RING_REUSE)?,
            };
            Ok(values.offered().map_or(Theirs::Withdrawn, Theirs::Offered))
        };
        match read() {
            Ok(v) => Ok(v),
            Err(e) if e.is(XsErrno::Acces) || e.is(XsErrno::NoEnt) => Ok(Theirs::Removed),
            Err(e) => Err(e),
        }
    }

    /// A peer's link node for us changed (or appeared, or went away): the
    /// step is proto's ([`follow`]); this does it.
    pub(super) fn on_peer_node(&self, st: &mut State, peer: DomId) {
        if self.suspended.load(Ordering::Acquire) && !st.links.contains_key(&peer) {
            // Answered after the resume (which offers a link itself).
            return;
        }
        let Ok(theirs) = self.read_peer_node(peer) else {
            return;
        };
        let ours = match st.links.get(&peer) {
            None => Ours::Nothing,
            Some(l) => l.peer_half.map_or(
                Ours::Offered {
                    generation: Some(l.gen),
                },
                Ours::Attached,
            ),
        };
        let now = crate::clock::now_ms();
        let held = Held {
            dead: st.dead_gens.get(&peer).copied(),
            failed: st.failed_attach.get(&peer).copied(),
        };
        let Theirs::Offered(info) = theirs else {
            match follow(ours, theirs, held, now) {
                // the peer tore its half down or its domain died
                HalfStep::Detach { .. } => self.link_down(st, peer, true),
                // retracted after we saw the link die: saved or migrating
                _ if self.peer_retracted(peer) => {
                    st.vanished.remove(&peer);
                }
                _ => {}
            }
            return;
        };
        match follow(ours, theirs, held, now) {
            HalfStep::Ignore | HalfStep::Detach { .. } => return,
            HalfStep::Restart => {
                // Everything on the old link is dead; the new half is an
                // offer to answer.
                self.link_down(st, peer, true);
                if self.create_link(st, peer, Some(info.generation)).is_err() {
                    return;
                }
            }
            HalfStep::Answer { answering } => {
                if self.create_link(st, peer, Some(answering)).is_err() {
                    return;
                }
            }
            HalfStep::Attach => {}
        }
        match self.attach_link(st, peer, &info) {
            Ok(()) => {
                st.failed_attach.remove(&peer);
                self.offer_carriers(st, peer);
            }
            Err(e) => {
                tracing::warn!(
                    peer,
                    ring_ref = info.ring_ref,
                    event_channel = info.event_channel,
                    "cannot attach to the peer's half of the link: {e}"
                );
                st.failed_attach.insert(
                    peer,
                    FailedAttach {
                        half: HalfId::from(&info),
                        at_ms: now,
                    },
                );
                self.link_down(st, peer, false);
            }
        }
    }

    /// Tears a link down: rings and channels released, our XenStore node
    /// removed. Connections on their carrier switch leave their rings for
    /// TCP ([`Trigger::PeerGone`] when the link was `lost`, else as after a
    /// move). Of those still on the fast path, one whose peer ended its
    /// half stays readable; when the link was lost because the agent says
    /// the peer moved or this side was restored, the others go to their
    /// switch too; the rest are reset.
    pub(super) fn link_down(&self, st: &mut State, peer: DomId, lost: bool) {
        // Lost because this side was saved and restored, seen before the
        // domid watch (`check_domid`) was: as `check_domid` does.
        let trigger = if lost && self.domid_changed() {
            Trigger::Restored
        } else {
            Trigger::PeerGone
        };
        self.link_down_as(st, peer, lost, trigger)
    }

    /// [`Inner::link_down`], with what of the rings is trusted when the
    /// link was lost: [`Trigger::Restored`] when this side ran on after a
    /// save with the peer's rings mapped.
    pub(super) fn link_down_as(&self, st: &mut State, peer: DomId, lost: bool, trigger: Trigger) {
        let Some(link) = st.links.remove(&peer) else {
            return;
        };
        if lost {
            self.counters.links_lost.fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(peer, lost, gen = link.gen, "link down");
        if let Some(h) = link.peer_half {
            st.dead_gens.insert(peer, h.generation);
        }
        epoll_del(&self.epoll, link.rx_chan.as_raw_fd());
        // Ring offers that went over this link cannot be taken now:
        // abandoned, as the module does (proto's one rule).
        for c in st.conns.values() {
            let mut offered = lock(&c.offered_to);
            if let (Some((to, epoch)), Some(e)) = (*offered, c.switch()) {
                if to == peer && e.abandon_offer(epoch) {
                    *offered = None;
                    tracing::info!(
                        conn = c.id,
                        peer,
                        epoch,
                        "ring offer abandoned with its link"
                    );
                }
            }
        }
        let moved = lost && self.peer_moved(peer);
        if lost && !moved && !self.peer_retracted(peer) {
            st.vanished.insert(peer);
        } else {
            st.vanished.remove(&peer);
        }
        let trigger = if lost { trigger } else { Trigger::LocalMove };
        for id in &link.conns {
            let Some(c) = st.conns.get(id).cloned() else {
                continue;
            };
            // A connection on its carrier switch goes on over TCP (its legs
            // are its own); it comes back to a ring on a new link. The
            // link's event channel goes with the link.
            if let Some(e) = c.switch() {
                if e.on_ring() {
                    match e.freeze(trigger) {
                        Ok(()) => tracing::info!(
                            conn = c.id,
                            ?trigger,
                            "connection leaves its ring with its link"
                        ),
                        Err(err) => tracing::warn!(conn = c.id, "freeze: {err}"),
                    }
                }
                lock(&c.carrier_kick).take();
                c.io().kicker = None;
                continue;
            }
            // One whose peer ended its half stays readable until closed.
            if c.io().end_with_link() {
                c.signal();
                continue;
            }
            // The agent says the peer moved, or this side was restored
            // with the link's rings mapped: the peer is alive elsewhere,
            // and the connection goes on over TCP if it can, leaving its
            // rings as `trigger` says (a peer that never answers there
            // ends it after the lost-peer bound). A peer that merely
            // vanished is a process or domain that died as often as one
            // that was saved, and dom0 notes a saved one gone anyway: its
            // connections are reset now.
            let follows = moved || (lost && trigger == Trigger::Restored);
            if follows && self.escalate_leaving(&c, Some(trigger)).is_some() {
                lock(&c.carrier_kick).take();
                c.io().kicker = None;
                continue;
            }
            if let Some(conn) = st.conns.remove(id) {
                st.used_ports.remove(&conn.local_port);
                conn.io().reset_local();
                conn.signal();
            }
        }
        for l in st.listeners.values() {
            l.drop_peer(peer);
        }
        // dom0 may have noted the peer gone before its link was seen to go
        self.end_dead_peer(st, peer);
        let created = link.created_dir;
        drop(link);
        self.withdraw_node(peer, created);
        // Stop watching a peer that is no candidate any more (a link it
        // offered while only the broad watch knew it).
        let keep = {
            let w = lock(&self.watches);
            w.table.as_ref().is_some_and(|t| t.contains(&peer))
                || w.dom0_dirs.contains(&peer)
                || self
                    .static_peers
                    .as_ref()
                    .is_some_and(|s| s.contains(&peer))
        };
        if !keep {
            lock(&self.watches).by_path.remove(&self.peer_node(peer));
        }
        self.link_cv.notify_all();
    }

    /// Removes our half of the link from XenStore: the whole node if we
    /// made it, else (dom0 made it) our values, leaving `state` Closed.
    pub(super) fn withdraw_node(&self, peer: DomId, created_dir: bool) {
        let node = self.my_node(peer);
        if created_dir {
            let _ = self.xs.rm(&node);
            return;
        }
        let _ = self.xs.transaction(|tx| {
            // Gone already (dom0 removed it: the pair ended): writing
            // `state` would recreate it.
            if tx.try_read(&node)?.is_none() {
                return Ok(());
            }
            for name in [
                node::RING_REF,
                node::EVENT_CHANNEL,
                node::GENERATION,
                node::PEER_GENERATION,
                node::FEATURE_RING_REUSE,
            ] {
                match tx.rm(&format!("{node}/{name}")) {
                    Ok(()) => {}
                    Err(e) if e.is(XsErrno::NoEnt) => {}
                    Err(e) => return Err(e),
                }
            }
            tx.write(
                &format!("{node}/{}", node::STATE),
                LinkState::Closed.as_str(),
            )
        });
    }

    pub(super) fn link_alive(&self, link: &mut Link) -> bool {
        if link.tx.is_none() {
            return true;
        }
        let mapper = get_byte(link.rx.region.as_ref(), LINK_MAPPER_ALIVE_OFFSET);
        let owner = link.tx.as_ref().map_or(1, |t| {
            get_byte(t.ring.region.as_ref(), LINK_OWNER_ALIVE_OFFSET)
        });
        // A byte counts only once it has been seen set: a peer that does
        // not use it (the kernel module today) is never declared dead by it.
        if mapper == 1 {
            link.peer_seen_alive = true;
        }
        if owner == 1 {
            link.owner_seen_alive = true;
        }
        !((link.owner_seen_alive && owner == 0) || (link.peer_seen_alive && mapper == 0))
    }

    /// Writes queued frames while they fit; kicks once.
    pub(super) fn flush_link(&self, link: &mut Link) -> Result<(), Error> {
        self.flush_link_with(link, true)
    }

    /// [`Inner::flush_link`]; with `kick` false the kick decision is left
    /// to the next flush (which covers these frames too) or the kick timer.
    pub(super) fn flush_link_with(&self, link: &mut Link, kick: bool) -> Result<(), Error> {
        let Some(tx) = link.tx.as_mut() else {
            return Ok(());
        };
        while let Some((buf, len)) = link.pending.front() {
            let free = tx.p.free_space().map_err(Error::Ring)?;
            if (free as usize) < *len {
                let _ = tx.p.prepare_wait(*len as u32).map_err(Error::Ring)?;
                // Space may have appeared between the two checks.
                if (tx.p.free_space().map_err(Error::Ring)? as usize) < *len {
                    break;
                }
                continue;
            }
            tx.p.write(&buf[..*len]).map_err(Error::Ring)?;
            link.pending.pop_front();
        }
        if !kick {
            link.kick_owed = true;
            return Ok(());
        }
        link.kick_owed = false;
        if tx.p.flush() {
            let _ = tx.chan.notify();
        }
        Ok(())
    }

    /// Sends `msg` without a kick of its own (see `CLOSE_KICK_DELAY`).
    pub(super) fn send_frame_lazy(&self, st: &mut State, peer: DomId, msg: &Message<'_>) {
        if !self.queue_frame(st, peer, msg, false) {
            return;
        }
        if !self.kick_timer_armed.swap(true, Ordering::AcqRel) {
            sys::timerfd_arm(self.kick_timer.as_fd(), CLOSE_KICK_DELAY);
        }
    }

    pub(super) fn send_frame(&self, st: &mut State, peer: DomId, msg: &Message<'_>) {
        self.queue_frame(st, peer, msg, true);
    }

    /// Queues `msg` on the link to `peer` and flushes what fits (kicking
    /// the peer only if `kick`); a broken ring takes the link down. False
    /// when nothing was queued or the link went down.
    pub(super) fn queue_frame(
        &self,
        st: &mut State,
        peer: DomId,
        msg: &Message<'_>,
        kick: bool,
    ) -> bool {
        let Some(link) = st.links.get_mut(&peer) else {
            return false;
        };
        let mut buf = [0u8; ctrl::MAX_CONTROL_FRAME];
        let Ok(len) = msg.encode(&mut buf) else {
            return false;
        };
        link.pending.push_back((buf, len));
        if self.flush_link_with(link, kick).is_err() {
            self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
            self.link_down(st, peer, true);
            return false;
        }
        true
    }

    /// The peer kicked the link: liveness, control frames, queued frames,
    /// waiting connections.
    pub(super) fn service_link(&self, st: &mut State, peer: DomId) {
        let mut frames: Vec<([u8; ctrl::MAX_CONTROL_FRAME], usize)> = Vec::new();
        let mut broken = false;
        {
            let Some(link) = st.links.get_mut(&peer) else {
                return;
            };
            let _ = link.rx_chan.ack();
            if !self.link_alive(link) {
                drop(frames);
                self.link_down(st, peer, true);
                return;
            }
            loop {
                // Drain whole frames (proto's framing rule: garbage costs
                // what was readable, a corrupt ring takes the link down).
                loop {
                    let mut buf = [0u8; ctrl::MAX_CONTROL_FRAME];
                    match take_control_frame(&mut link.c, &mut buf) {
                        Ok(ControlFrame::Whole(len)) => frames.push((buf, len)),
                        Ok(ControlFrame::Incomplete) => break,
                        Ok(ControlFrame::Garbage(n)) => {
                            self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(peer, n, "bad control frame: bytes dropped");
                        }
                        Err(_) => {
                            broken = true;
                            break;
                        }
                    }
                }
                if broken {
                    break;
                }
                if link.c.flush() {
                    if let Some(tx) = &link.tx {
                        let _ = tx.chan.notify();
                    }
                }
                match link.c.prepare_wait() {
                    Ok(true) => break,
                    Ok(false) => {
                        if link.c.readable().unwrap_or(0) < ctrl::HEADER_LEN as u32 {
                            break;
                        }
                    }
                    Err(_) => {
                        broken = true;
                        break;
                    }
                }
            }
            if !broken && self.flush_link(link).is_err() {
                broken = true;
            }
        }
        if broken {
            self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
            self.link_down(st, peer, true);
            return;
        }
        for (buf, len) in frames {
            match ctrl::decode(&buf[..len], Channel::Link) {
                Ok((msg, _)) => self.on_frame(st, peer, msg),
                Err(e) => {
                    // that frame alone: the framing is intact
                    self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer, "undecodable control frame dropped: {e}");
                }
            }
        }
        // First: a kick from a peer that moved here may be the first one
        // for a connection that follows it now.
        self.check_rehomes(st, peer);
        self.ring_carriers(st, peer);
        // Wake connections whose condition holds.
        if let Some(link) = st.links.get(&peer) {
            let shared = link.shared.clone();
            let mut list = lock(&shared.armed);
            list.retain(|w| match w.upgrade() {
                Some(c) => c.check_armed(),
                None => false,
            });
        }
    }
}
