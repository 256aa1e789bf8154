// SPDX-License-Identifier: MIT OR Apache-2.0
//! Connections over a link: the control frames (connect, accept, close,
//! reset, ring offers), connect and accept, close and process exit.

use super::*;

impl Inner {
    pub(super) fn on_frame(&self, st: &mut State, peer: DomId, msg: Message<'_>) {
        match msg {
            Message::ConnectRequest {
                conn_id,
                src_port,
                dst_port,
                sock_type,
                cookie,
                rx,
                tcp,
            } => {
                let reject = |s: &Self, st: &mut State, reason| {
                    s.counters.rejected.fetch_add(1, Ordering::Relaxed);
                    s.send_frame(st, peer, &Message::ConnectReject { conn_id, reason });
                };
                let l = st.listeners.get(&dst_port).cloned();
                let view = l.as_ref().map(|l| l.view());
                if let Err(reason) = ctrl::admit(view, sock_type) {
                    return reject(self, st, reason);
                }
                let Some(l) = l else {
                    return reject(self, st, RejectReason::NoListener);
                };
                let req = Request {
                    their_id: conn_id,
                    src_port,
                    dst_port,
                    cookie,
                    tcp,
                };
                match self.accept_request(st, peer, &req, &rx, &l) {
                    Ok(conn) => {
                        self.freeze_if_suspended(&conn);
                        l.push(conn)
                    }
                    Err(e) => {
                        let reason = match e {
                            Error::Xen(_) => RejectReason::NoResources,
                            _ => RejectReason::BadRequest,
                        };
                        reject(self, st, reason)
                    }
                }
            }
            Message::ConnectAccept {
                conn_id,
                acceptor_id,
                cookie,
                rx,
                tcp,
            } => {
                let conn = st
                    .conns
                    .get(&conn_id)
                    .filter(|c| c.peer() == peer)
                    .filter(|c| c.cookie.load(Ordering::Relaxed) == cookie)
                    .cloned();
                if let Some(c) = &conn {
                    *lock(&c.peer_tcp) = socket_addr_of(&tcp);
                }
                let kicker = st
                    .links
                    .get(&peer)
                    .and_then(|l| l.tx.as_ref().map(|t| t.chan.clone()));
                let ok = match &conn {
                    Some(c) => {
                        let mut io = c.io();
                        if io.phase != ConnPhase::Connecting {
                            false
                        } else {
                            let expected = data_identity(peer, self.domid(), acceptor_id, rx.order);
                            match self.map_peer_ring(st, peer, &rx, &expected) {
                                Ok(mapped) => {
                                    let p = Producer::new(mapped.ring);
                                    p.memory().store(
                                        Field::SpaceEvent,
                                        NOT_WAITING,
                                        Ordering::Release,
                                    );
                                    io.tx = Some(TxSide {
                                        p,
                                        mapped,
                                        grant: rx,
                                    });
                                    io.peer_id = acceptor_id;
                                    io.kicker = kicker;
                                    io.phase = ConnPhase::Open;
                                    true
                                }
                                Err(_) => {
                                    io.release();
                                    io.phase = ConnPhase::Failed(libc::EPROTO);
                                    false
                                }
                            }
                        }
                    }
                    None => false,
                };
                if let Some(c) = &conn {
                    c.signal();
                    if ok {
                        self.freeze_if_suspended(c);
                    }
                }
                if !ok {
                    self.counters.resets_sent.fetch_add(1, Ordering::Relaxed);
                    self.send_frame(
                        st,
                        peer,
                        &Message::Reset {
                            conn_id: acceptor_id,
                            reason: ResetReason::ProtocolError,
                        },
                    );
                }
            }
            Message::ConnectReject { conn_id, reason } => {
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer() == peer).cloned() {
                    let e = match reason {
                        RejectReason::NoListener | RejectReason::BacklogFull => libc::ECONNREFUSED,
                        RejectReason::NoResources => libc::ENOBUFS,
                        RejectReason::Forbidden => libc::EACCES,
                        RejectReason::WrongType => libc::EPROTOTYPE,
                        RejectReason::BadRequest => libc::EPROTO,
                    };
                    {
                        let mut io = c.io();
                        if io.phase == ConnPhase::Connecting {
                            io.release();
                            io.phase = ConnPhase::Failed(e);
                        }
                    }
                    c.signal();
                }
            }
            Message::Close { conn_id } => {
                let reuse = self.link_reuses_rings(st, peer);
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer() == peer).cloned() {
                    let (tx, answer) = {
                        let mut io = c.io();
                        io.peer_closed = true;
                        io.close_received = true;
                        // The peer no longer reads: stop writing its ring
                        // (kept mapped for reuse, else unmapped). Our own
                        // ring stays until the data is read.
                        let tx = io.tx.take();
                        // On a reuse link our Close tells the peer that we
                        // no longer write its ring, so it may pool it.
                        let answer = reuse && !io.close_sent && io.phase == ConnPhase::Open;
                        if answer {
                            io.close_sent = true;
                        }
                        (tx, answer.then_some(io.peer_id))
                    };
                    if let Some(tx) = tx {
                        self.keep_mapping(st, peer, tx);
                    }
                    if let Some(peer_id) = answer {
                        self.send_frame_lazy(st, peer, &Message::Close { conn_id: peer_id });
                    }
                    c.signal();
                } else if let Some(ring) = st
                    .links
                    .get_mut(&peer)
                    .and_then(|l| l.rings.lent.remove(&conn_id))
                {
                    // Closed here first; now the peer stopped writing too.
                    self.pool_rx_ring(st, peer, ring);
                }
            }
            Message::Reset { conn_id, .. } => {
                self.counters
                    .resets_received
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer() == peer).cloned() {
                    {
                        let mut io = c.io();
                        io.close_received = true;
                        io.reset_local();
                    }
                    c.signal();
                    self.unregister(st, &c);
                } else if let Some(link) = st.links.get_mut(&peer) {
                    // A ring lent after a clean close: the peer's state is
                    // unknown, so it is not reused.
                    link.rings.lent.remove(&conn_id);
                }
            }
            Message::RingRetire { ring } => {
                if let Some(link) = st.links.get_mut(&peer) {
                    link.rings
                        .mapped
                        .retain(|(g, _)| g.header_ref != ring.header_ref);
                }
            }
            Message::RingOffer { conn_id, rx } => self.on_ring_offer(st, peer, conn_id, &rx),
            // Suspend and Resume are not used: each side's triggers come
            // from its own hooks and discovery (docs/migration.md).
            _ => {}
        }
    }

    pub(super) fn accept_request(
        &self,
        st: &mut State,
        peer: DomId,
        req: &Request,
        rx: &ctrl::RingGrant,
        l: &Arc<ListenerShared>,
    ) -> Result<Arc<Conn>, Error> {
        let Request {
            their_id,
            src_port,
            dst_port,
            cookie,
            tcp,
        } = *req;
        let link = st.links.get(&peer).ok_or(Error::Protocol("no link"))?;
        let kicker = link.tx.as_ref().map(|t| t.chan.clone());
        let shared = link.shared.clone();
        let id = self.next_conn_id();
        let expected = data_identity(peer, self.domid(), their_id, rx.order);
        let mapped = self.map_peer_ring(st, peer, rx, &expected)?;
        let owned = self.take_rx_ring(st, peer, RingGeometry::for_capacity(l.recv_buffer), id)?;
        let grant = owned.grant;
        let c = Consumer::new(owned.ring);
        let mut io = ConnIo::new(Some(RxSide { c, owned }));
        let p = Producer::new(mapped.ring);
        p.memory()
            .store(Field::SpaceEvent, NOT_WAITING, Ordering::Release);
        io.tx = Some(TxSide {
            p,
            mapped,
            grant: *rx,
        });
        io.peer_id = their_id;
        io.kicker = kicker;
        io.phase = ConnPhase::Open;
        let conn = Conn::new(id, peer, dst_port, src_port, io, shared).map_err(Error::Io)?;
        conn.cookie.store(cookie, Ordering::Relaxed);
        *lock(&conn.peer_tcp) = socket_addr_of(&tcp);
        st.conns.insert(id, conn.clone());
        if let Some(link) = st.links.get_mut(&peer) {
            link.conns.insert(id);
        }
        // Before our answer leaves (it lets the peer open legs to us).
        self.register_legs(&conn);
        self.send_frame(
            st,
            peer,
            &Message::ConnectAccept {
                conn_id: their_id,
                acceptor_id: id,
                cookie,
                rx: grant,
                tcp: self.leg_endpoint,
            },
        );
        Ok(conn)
    }

    /// Ensures a link to `peer` exists and waits until it is up.
    pub(super) fn ensure_link<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        peer: DomId,
        deadline: Instant,
    ) -> io::Result<MutexGuard<'a, State>> {
        // Suspended: no new link (it would go into the save); wait for the
        // resume.
        while self.suspended.load(Ordering::Acquire) && !st.links.contains_key(&peer) {
            let now = Instant::now();
            if now >= deadline {
                return Err(errno(libc::EHOSTUNREACH));
            }
            st = self
                .link_cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if !st.links.contains_key(&peer) {
            // A domain discovery does not know is unreachable now, not
            // after the link timeout.
            if !self.may_link(&st, peer) {
                return Err(errno(libc::EHOSTUNREACH));
            }
            self.create_link(&mut st, peer, None)?;
            // The peer may have offered first; pick its node up if so.
            self.on_peer_node(&mut st, peer);
        }
        loop {
            match st.links.get(&peer) {
                Some(l) if l.tx.is_some() => return Ok(st),
                Some(_) => {}
                None => return Err(errno(libc::EHOSTUNREACH)),
            }
            let now = Instant::now();
            if now >= deadline {
                // Nobody answered: withdraw the offer.
                if st
                    .links
                    .get(&peer)
                    .is_some_and(|l| l.tx.is_none() && l.conns.is_empty())
                {
                    self.link_down(&mut st, peer, false);
                }
                return Err(errno(libc::EHOSTUNREACH));
            }
            st = self
                .link_cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub(super) fn start_connect(
        &self,
        peer: DomId,
        dst_port: u32,
        opts: SocketOptions,
        link_deadline: Instant,
    ) -> io::Result<Arc<Conn>> {
        let st = self.state();
        let mut st = self.ensure_link(st, peer, link_deadline)?;
        let id = self.next_conn_id();
        let geometry = RingGeometry::for_capacity(opts.recv_buffer.unwrap_or(self.cfg.recv_buffer));
        let owned = self.take_rx_ring(&mut st, peer, geometry, id)?;
        let grant = owned.grant;
        let src_port = self.ephemeral_port(&mut st)?;
        let link = st
            .links
            .get_mut(&peer)
            .ok_or_else(|| errno(libc::EHOSTUNREACH))?;
        let c = Consumer::new(owned.ring);
        let io = ConnIo::new(Some(RxSide { c, owned }));
        let conn = Conn::new(id, peer, src_port, dst_port, io, link.shared.clone())?;
        link.conns.insert(id);
        st.used_ports.insert(src_port);
        st.conns.insert(id, conn.clone());
        let cookie = random_u64();
        conn.cookie.store(cookie, Ordering::Relaxed);
        // Before the cookie leaves: the peer may open a leg at once.
        self.register_legs(&conn);
        self.send_frame(
            &mut st,
            peer,
            &Message::ConnectRequest {
                conn_id: id,
                src_port,
                dst_port,
                sock_type: SockType::Stream,
                cookie,
                rx: grant,
                tcp: self.leg_endpoint,
            },
        );
        Ok(conn)
    }

    pub(super) fn unregister(&self, st: &mut State, conn: &Arc<Conn>) {
        if st.conns.remove(&conn.id).is_some() {
            if let Some(l) = st.links.get_mut(&conn.peer()) {
                l.conns.remove(&conn.id);
            }
            if !st.listeners.contains_key(&conn.local_port) {
                st.used_ports.remove(&conn.local_port);
            }
        }
    }

    /// Removes a connection that never opened (or was reset) from the tables.
    pub(crate) fn forget_conn(&self, conn: &Arc<Conn>) {
        let mut st = self.state();
        self.unregister(&mut st, conn);
    }

    /// The last handle of a connection went away: FIN, CLOSED, Close frame,
    /// release.
    pub(crate) fn close_conn(&self, conn: &Arc<Conn>) {
        // (The switch's lock must not be held while the state's is taken.)
        let switch = lock(&conn.switch).take();
        if let Some(switch) = switch {
            {
                let mut st = self.state();
                if let Some(l) = st.links.get_mut(&conn.peer()) {
                    l.conns.remove(&conn.id);
                }
                self.unregister(&mut st, conn);
                conn.io().phase = ConnPhase::Closed;
            }
            if conn.io().abort_on_close {
                switch.abort();
                return;
            }
            // End of stream after what was written, delivered on whichever
            // carrier is current before the legs close (a lingering close,
            // off the caller's thread).
            let _ = switch.shutdown_write();
            let linger = self.cfg.peer_lost_after;
            let spawned = std::thread::Builder::new()
                .name("xensock-linger".into())
                .spawn(move || switch.linger(linger));
            if let Err(e) = spawned {
                tracing::warn!("closing a carrier connection at once: {e}");
            }
            return;
        }
        let mut st = self.state();
        self.close_ring_conn(&mut st, conn);
    }

    /// [`Inner::close_conn`] for a connection on rings (no switch).
    pub(super) fn close_ring_conn(&self, st: &mut State, conn: &Arc<Conn>) {
        let reuse = self.link_reuses_rings(st, conn.peer());
        let mut lazy = false;
        let (send_close, reset, peer_id, kept) = {
            let mut io = conn.io();
            let open = io.phase == ConnPhase::Open;
            let violation = io.violation.take().is_some();
            // SO_LINGER 0: RESET on both rings before the frame, so the
            // peer's next read or write fails and what it has not read is
            // dropped
            let abort = open && io.abort_on_close;
            if abort {
                io.reset_local();
                io.close_sent = true;
            } else if open {
                // The Close frame that follows kicks the peer's link when
                // it is asleep: no separate kick for the flags then.
                let quiet = !violation && !io.close_sent && (reuse || !io.close_received);
                io.shutdown_write_kick(!quiet);
                io.shutdown_read_kick(!quiet);
                // On a reuse link the Close itself need not kick unless the
                // peer sleeps on one of the rings.
                lazy = quiet && reuse && !io.peer_waiting();
            }
            // A clean close on a reuse link keeps both rings (docs/protocol.md
            // 6.6); anything else releases them.
            let kept = (open && reuse && !violation && !abort).then(|| {
                let peer_done = io.close_received;
                (io.tx.take(), io.rx.take().map(|r| (r.owned, peer_done)))
            });
            io.release();
            if open {
                io.phase = ConnPhase::Closed;
            }
            let send_close = open && !io.close_sent && (reuse || !io.close_received);
            if send_close {
                io.close_sent = true;
            }
            let reset = if violation {
                Some(ResetReason::ProtocolError)
            } else if abort {
                Some(ResetReason::Abort)
            } else {
                None
            };
            (send_close, reset, io.peer_id, kept)
        };
        if let Some((tx, rx)) = kept {
            if let Some(tx) = tx {
                self.keep_mapping(st, conn.peer(), tx);
            }
            if let Some((ring, peer_done)) = rx {
                self.release_rx_ring(st, conn, ring, peer_done);
            }
        }
        if let Some(reason) = reset {
            self.counters.resets_sent.fetch_add(1, Ordering::Relaxed);
            self.send_frame(
                st,
                conn.peer(),
                &Message::Reset {
                    conn_id: peer_id,
                    reason,
                },
            );
        } else if send_close && lazy {
            self.send_frame_lazy(st, conn.peer(), &Message::Close { conn_id: peer_id });
        } else if send_close {
            self.send_frame(st, conn.peer(), &Message::Close { conn_id: peer_id });
        }
        self.unregister(st, conn);
    }

    /// The process exits with its transport. Its open connections end as
    /// a TCP socket's do when its process exits: what was written is
    /// delivered, then end of stream (a reset would lose what the peer has
    /// not read yet). On rings that costs nothing, the peer reads from its
    /// own ring after we are gone; a connection on TCP lingers until the
    /// peer has acknowledged its bytes, for at most [`EXIT_LINGER`] in all.
    /// Then the links go. Best effort: it gives up on a lock another thread
    /// holds.
    pub(super) fn end_at_exit(&self) {
        self.stop.store(true, Ordering::Release);
        self.sink.wake.signal();
        let deadline = Instant::now() + EXIT_LINGER.min(self.cfg.peer_lost_after);
        // The manager thread (or a reader, writer, the leg listener) may
        // hold the state at this moment: it is let go within a step, and
        // giving up at once left every connection to be reset (the link
        // withdrawn with no FIN written). Only a lock this thread holds
        // itself (exit called under it) is waited for in vain, and then
        // only until the deadline.
        let Some(st) = lock_by(&self.state, deadline) else {
            return;
        };
        let switches: Vec<Arc<Switch>> = st
            .conns
            .values()
            .filter_map(|c| lock_by(&c.switch, deadline).and_then(|e| e.clone()))
            .collect();
        drop(st);
        for e in &switches {
            if e.shutdown_write().is_ok() {
                e.linger(deadline.saturating_duration_since(Instant::now()));
            }
        }
        let Some(mut st) = lock_by(&self.state, deadline) else {
            return;
        };
        let on_rings: Vec<Arc<Conn>> = st
            .conns
            .values()
            .filter(|c| lock_by(&c.switch, deadline).is_some_and(|e| e.is_none()))
            .cloned()
            .collect();
        for c in &on_rings {
            self.close_ring_conn(&mut st, c);
        }
        let peers: Vec<DomId> = st.links.keys().copied().collect();
        for p in peers {
            self.link_down(&mut st, p, false);
        }
    }

    /// A ring violation was found by a reader or writer: tell the peer.
    pub(crate) fn report_violation(&self, conn: &Arc<Conn>) {
        let peer_id = {
            let mut io = conn.io();
            if io.violation.take().is_none() {
                return;
            }
            io.peer_id
        };
        self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
        self.counters.resets_sent.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state();
        self.send_frame(
            &mut st,
            conn.peer(),
            &Message::Reset {
                conn_id: peer_id,
                reason: ResetReason::ProtocolError,
            },
        );
        self.unregister(&mut st, conn);
    }

    pub(crate) fn close_listener(&self, l: &Arc<ListenerShared>) {
        let pending = {
            let mut st = self.state();
            st.listeners.remove(&l.port);
            st.used_ports.remove(&l.port);
            l.take_all()
        };
        for c in pending {
            self.close_conn(&c);
        }
    }
}

/// `m`'s lock, waiting for it until `deadline` at most (the exit hook:
/// another thread lets it go within a step; this thread never does).
pub(super) fn lock_by<T>(m: &Mutex<T>, deadline: Instant) -> Option<MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}
