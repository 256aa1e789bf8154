// SPDX-License-Identifier: MIT OR Apache-2.0
//! Whom the transport may link with: the agent's table, link directories
//! dom0 made, the static peer list, and the watches that follow them.

use super::*;

impl Inner {
    /// Registers a watch on `path` whose events go to the manager thread.
    pub(super) fn add_watch(&self, path: &str) -> Result<(), XsError> {
        let mut w = lock(&self.watches);
        if w.by_path.contains_key(path) {
            return Ok(());
        }
        let sink = self.sink.clone();
        let watch = self.xs.watch_with(path, move |ev| sink.push(ev.path))?;
        tracing::debug!(path, "watching");
        w.by_path.insert(path.to_string(), watch);
        Ok(())
    }

    /// Re-reads whom we may link with (the agent's table, link directories
    /// dom0 made for us, the static list) and makes the watches follow:
    /// one on each candidate peer's `link/<me>` node (its offers, and its
    /// removal when the peer's domain dies), plus, only when neither a
    /// table nor a static list exists, `/local/domain`, the one way to hear
    /// an offer from a domain we know nothing about.
    pub(super) fn refresh_peers(&self, st: &State) -> Result<(), XsError> {
        let ids = |path: &str| -> Result<Option<HashSet<DomId>>, XsError> {
            match self.xs.directory(path) {
                Ok(v) => Ok(Some(v.iter().filter_map(|d| d.parse().ok()).collect())),
                Err(e) if e.is(XsErrno::NoEnt) || e.is(XsErrno::Acces) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let table = ids(&self.table_dir())?;
        let dom0_dirs = ids(&self.link_dir_abs())?.unwrap_or_default();
        let unknown: Vec<DomId> = {
            let w = lock(&self.watches);
            table
                .iter()
                .flatten()
                .filter(|d| !w.uuids.contains_key(d))
                .copied()
                .collect()
        };
        for d in unknown {
            if let Ok(Some(u)) = self.xs.try_read(&format!(
                "{}/{d}/{}",
                self.table_dir(),
                store::peer_node::UUID
            )) {
                let u = String::from_utf8_lossy(&u).trim().to_ascii_lowercase();
                lock(&self.watches).uuids.insert(d, u);
            }
        }
        let candidates: HashSet<DomId> = table
            .iter()
            .flatten()
            .chain(self.static_peers.iter().flatten())
            .chain(dom0_dirs.iter())
            .chain(st.links.keys())
            .copied()
            .filter(|&p| p != self.domid())
            .collect();
        let broad = table.is_none() && self.static_peers.is_none();
        let mut wanted: HashSet<String> = candidates.iter().map(|&p| self.peer_node(p)).collect();
        wanted.insert(self.table_dir());
        wanted.insert(self.gone_dir());
        wanted.insert(store::DOMID.to_string());
        if broad {
            wanted.insert(store::DOMAINS.to_string());
        }
        {
            let mut w = lock(&self.watches);
            w.table = table;
            w.dom0_dirs = dom0_dirs;
            // Dropping a watch unregisters it.
            w.by_path.retain(|path, _| wanted.contains(path));
        }
        let mut sorted: Vec<&String> = wanted.iter().collect();
        sorted.sort();
        for path in sorted {
            self.add_watch(path)?;
        }
        Ok(())
    }

    /// Whether the agent says `peer` left this host (or was marked away)
    /// rather than died: its `xensock/moved/<uuid>` note in our table.
    pub(super) fn peer_moved(&self, peer: DomId) -> bool {
        let Some(uuid) = lock(&self.watches).uuids.get(&peer).cloned() else {
            return false;
        };
        let moved = format!("{}/{}", store::XENSOCK, store::MOVED);
        let note = format!("{}/{uuid}", home(self.domid(), &moved));
        matches!(self.xs.try_read(&note), Ok(Some(_)))
    }

    /// After a table change: connections to peers that left the table
    /// with a `moved` note leave their rings (`LocalMove`, safe whatever
    /// the peer does: nothing past what we consumed is trusted), before
    /// the link is withdrawn under them.
    pub(super) fn follow_table(&self) {
        let gone: Vec<DomId> = {
            let st = self.state();
            let w = lock(&self.watches);
            let Some(table) = w.table.as_ref() else {
                return;
            };
            let mut v: Vec<DomId> = st
                .conns
                .values()
                .filter(|c| c.switch().is_none_or(|e| e.on_ring()) && !table.contains(&c.peer()))
                .map(|c| c.peer())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        for peer in gone {
            if self.peer_moved(peer) {
                tracing::info!(peer, "peer left the co-residency table for another host");
                self.freeze_ring_conns(peer);
            }
        }
        let mut st = self.state();
        // A carrier connection's peer listed under a new domid with the
        // same UUID (it moved on this host): dom0 says where it is, so the
        // connection follows at once (no proof needed from the peer; and
        // when both ends moved, nothing else could tell either of them).
        let renamed: Vec<(Arc<Conn>, DomId)> = {
            let w = lock(&self.watches);
            let Some(table) = w.table.as_ref() else {
                return;
            };
            st.conns
                .values()
                .filter(|c| c.switch().is_some() && !table.contains(&c.peer()))
                .filter_map(|c| {
                    let uuid = w.uuids.get(&c.peer())?;
                    let now = table
                        .iter()
                        .find(|d| w.uuids.get(d) == Some(uuid))
                        .copied()?;
                    Some((c.clone(), now))
                })
                .collect()
        };
        for (conn, now) in renamed {
            tracing::info!(
                conn = conn.id,
                old = conn.peer(),
                new = now,
                "the agent lists the peer under a new domid"
            );
            lock(&conn.pending_offer).take();
            self.rehome(&mut st, &conn, now);
        }
        // Peers of moved connections that are co-resident again: a link,
        // whose coming up offers rings.
        let back: Vec<DomId> = {
            let w = lock(&self.watches);
            let Some(table) = w.table.as_ref() else {
                return;
            };
            let mut v: Vec<DomId> = st
                .conns
                .values()
                .filter(|c| c.switch().is_some() && table.contains(&c.peer()))
                .map(|c| c.peer())
                .filter(|p| !st.links.contains_key(p))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        for peer in back {
            tracing::info!(peer, "peer co-resident again: new link");
            if self.create_link(&mut st, peer, None).is_ok() {
                self.on_peer_node(&mut st, peer);
            }
        }
    }

    /// Whether discovery allows a link to `peer`: false when the agent's
    /// table (or the static list) exists and names neither it nor a link
    /// directory dom0 made for it, or when dom0 learns from xenstored that
    /// no such domain exists. Reads XenStore afresh: a
    /// connect must not fail on a table event not yet processed.
    pub(super) fn may_link(&self, st: &State, peer: DomId) -> bool {
        if self.domid() == 0 {
            if let Ok(false) = self.xs.is_domain_introduced(u32::from(peer)) {
                return false;
            }
        }
        if self.refresh_peers(st).is_err() {
            // XenStore trouble is no evidence against the peer.
            return true;
        }
        let w = lock(&self.watches);
        if w.table.is_none() && self.static_peers.is_none() {
            return true;
        }
        w.table.as_ref().is_some_and(|t| t.contains(&peer))
            || self
                .static_peers
                .as_ref()
                .is_some_and(|s| s.contains(&peer))
            || w.dom0_dirs.contains(&peer)
    }

    /// `Some(peer)` if `path` is (inside) a peer's link node for us.
    pub(super) fn is_link_event(&self, path: &str) -> Option<DomId> {
        let rest = path.strip_prefix(store::DOMAINS)?.strip_prefix('/')?;
        let (peer, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix(LINK_DIR)?.strip_prefix('/')?;
        let me = self.domid().to_string();
        let tail = rest.strip_prefix(me.as_str())?;
        if !(tail.is_empty() || tail.starts_with('/')) {
            return None;
        }
        let peer: DomId = peer.parse().ok()?;
        (peer != self.domid()).then_some(peer)
    }

    pub(super) fn ephemeral_port(&self, st: &mut State) -> io::Result<u32> {
        for _ in 0..(u32::MAX - EPHEMERAL_PORT_FIRST) {
            let p = st.next_port;
            st.next_port = if p >= PORT_ANY - 1 {
                EPHEMERAL_PORT_FIRST
            } else {
                p + 1
            };
            if !st.used_ports.contains(&p) {
                return Ok(p);
            }
        }
        Err(errno(libc::EADDRINUSE))
    }

    pub(super) fn next_conn_id(&self) -> u32 {
        loop {
            let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    /// After a kick, keeps servicing links for `Config::busy_poll` (renewed
    /// by every frame) before the manager sleeps in epoll again: the next
    /// frame (an answer, a client's next connect) often follows within
    /// microseconds, and a sleeping manager costs a scheduler wake-up per
    /// frame. Yields between looks, as blocked readers do, and takes the
    /// state lock only when it is free. Kicks (for control or data rings)
    /// are taken from epoll without sleeping, so no link waits for another;
    /// a XenStore watch or the kick timer ends the spin (the main loop
    /// handles those).
    pub(super) fn spin_links(&self) {
        let mut end = Instant::now() + self.cfg.busy_poll;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        while Instant::now() < end && !self.stop.load(Ordering::Acquire) {
            std::thread::yield_now();
            let n = sys::epoll_wait(self.epoll.as_fd(), &mut evs, 0);
            let Ok(n) = usize::try_from(n) else {
                return;
            };
            let kicked = &evs[..n];
            if kicked
                .iter()
                .any(|e| e.u64 == 0 || e.u64 == KICK_TIMER_TOKEN)
            {
                // Level-triggered: the main loop's epoll_wait sees it again.
                return;
            }
            let mut st = match self.state.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            let mut peers: Vec<DomId> = kicked.iter().map(|e| (e.u64 - 1) as DomId).collect();
            peers.extend(
                st.links
                    .iter()
                    .filter(|(_, l)| l.c.readable().is_ok_and(|n| n as usize >= ctrl::HEADER_LEN))
                    .map(|(p, _)| *p),
            );
            peers.sort_unstable();
            peers.dedup();
            for p in &peers {
                self.service_link(&mut st, *p);
            }
            if !peers.is_empty() {
                end = Instant::now() + self.cfg.busy_poll;
            }
        }
    }

    /// Services `peer`'s link from the calling thread when a frame is
    /// waiting and the manager thread is not at it: a waiter that takes its
    /// own answer off the control ring saves two thread wake-ups.
    pub(crate) fn poll_link(&self, peer: DomId) {
        let mut st = match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let waiting = st
            .links
            .get(&peer)
            .is_some_and(|l| l.c.readable().is_ok_and(|n| n as usize >= ctrl::HEADER_LEN));
        if waiting {
            self.service_link(&mut st, peer);
        }
    }
}
