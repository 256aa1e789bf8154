// SPDX-License-Identifier: MIT OR Apache-2.0
//! The sending direction: the application's writes on the ring or the
//! outbound leg, freezing, resends, the peer's ring offers, dialling the leg.

use super::*;

impl Shared {
    pub(super) fn write(&self, buf: &[u8], nonblocking: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let _one_writer = lock(&self.write_lock);
        let mut tx = lock(&self.tx);
        loop {
            self.check_failed()?;
            if tx.path.is_finished() {
                return Err(io::Error::from_raw_os_error(libc::EPIPE));
            }
            let mut leg_events = NO_LEG;
            match tx.path.state() {
                TxState::Frozen { .. } => {}
                TxState::Ring { .. } => {
                    let Some(p) = tx.producer.as_mut() else {
                        return Err(self.breach(protocol_error("ring state without a ring")));
                    };
                    match p.send(buf).map_err(|e| self.breach(ring_error(e)))? {
                        Sent::ReaderReset => {
                            return Err(self.breach(io::ErrorKind::ConnectionReset.into()));
                        }
                        Sent::ReaderClosed => {
                            return Err(io::Error::from_raw_os_error(libc::EPIPE))
                        }
                        Sent::Bytes { n, kick } => {
                            tx.path
                                .record_sent(n as u64)
                                .map_err(|e| self.breach(switch_error(e)))?;
                            if kick {
                                self.kick();
                            }
                            return Ok(n);
                        }
                        Sent::Full => {}
                    }
                    let want = buf.len().min(p.capacity() as usize / 2).max(1) as u32;
                    if !p
                        .prepare_wait(want)
                        .map_err(|e| self.breach(ring_error(e)))?
                    {
                        continue;
                    }
                }
                TxState::Tcp => {
                    let t = &mut *tx;
                    if let Some(leg) = t.leg.as_ref() {
                        t.out.flush(leg).map_err(|e| self.breach(e))?;
                        if t.out.is_empty() {
                            // The run's bytes go as they are: one send, as
                            // on a plain TCP socket.
                            let n = send_raw(leg, buf).map_err(|e| self.breach(e))?;
                            if n > 0 {
                                t.path
                                    .record_sent(n as u64)
                                    .map_err(|e| self.breach(switch_error(e)))?;
                                return Ok(n);
                            }
                        }
                        leg_events = libc::POLLOUT;
                    }
                }
            }
            if nonblocking {
                // Under the lock: a notify after this sees the flag.
                tx.nb_waiting.store(true, Ordering::Release);
                if leg_events != NO_LEG {
                    // The driver polls the leg for us.
                    self.ctl.signal();
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            tx = self.wait_tx(tx, leg_events);
        }
    }

    pub(super) fn wait_tx<'a>(
        &'a self,
        mut tx: MutexGuard<'a, Tx>,
        leg_events: i16,
    ) -> MutexGuard<'a, Tx> {
        let fd = match (&tx.leg, leg_events) {
            (Some(l), ev) if ev != NO_LEG => Some(l.as_raw_fd()),
            _ => None,
        };
        tx.waiting = true;
        tx.writer_polls = fd.is_some();
        drop(tx);
        // The leg is never closed while the switch lives, so `fd` stays ours.
        sleep_on(&self.tx_wake, fd, leg_events);
        let mut tx = lock(&self.tx);
        tx.waiting = false;
        tx.writer_polls = false;
        tx
    }

    pub(super) fn shutdown_write(&self) -> io::Result<()> {
        self.check_failed()?;
        let mut tx = lock(&self.tx);
        if tx.path.is_finished() {
            return Ok(());
        }
        tx.path.finish();
        match tx.path.state() {
            TxState::Ring { .. } => {
                if let Some(p) = tx.producer.as_mut() {
                    p.finish();
                }
                self.kick();
            }
            TxState::Tcp => {
                self.send_ctl(&Message::Fin {
                    conn_id: self.cfg.peer_id,
                    offset: tx.path.sent(),
                });
            }
            // Sent after the resend.
            TxState::Frozen { .. } => {}
        }
        Ok(())
    }

    /// Queues a control frame for the peer (on our inbound leg) and writes
    /// what that leg takes now; the driver writes the rest, and all of it
    /// once the leg is up.
    pub(super) fn send_ctl(&self, msg: &Message<'_>) {
        let mut c = lock(&self.ctl_out);
        c.out.push(msg);
        let c = &mut *c;
        if let Some(leg) = c.leg.as_deref() {
            if let Err(e) = c.out.flush(leg) {
                self.breach(e);
            }
        }
        if !c.out.is_empty() {
            self.ctl.signal();
        }
    }

    /// Our sending direction starts on TCP: tells the peer where our raw
    /// bytes start (a resend says the same for its own).
    pub(super) fn open_run(&self, tx: &Tx) {
        self.send_ctl(&Message::RawFrom {
            conn_id: self.cfg.peer_id,
            offset: tx.path.sent(),
        });
    }

    /// Writes queued bytes if the leg is up; the driver finishes the rest.
    pub(super) fn flush_tx(&self, tx: &mut Tx) {
        if let Some(leg) = tx.leg.as_ref() {
            if let Err(e) = tx.out.flush(leg) {
                self.breach(e);
            }
        }
        if !tx.out.is_empty() {
            self.ctl.signal();
        }
    }

    /// Stops producing into the ring in use, copies back what the receiver
    /// has not consumed and queues the `TxFreeze`. Without `ring_mapped`
    /// ([`Trigger::Restored`]: the pages our mapping of the peer's ring
    /// showed are gone) nothing is read back, and a `Consumed` short of
    /// what we wrote fails the connection (proto's `BadOffset`).
    pub(super) fn freeze_tx(&self, tx: &mut Tx, ring_mapped: bool) -> io::Result<()> {
        // However this side learns of its own move (the domid watch, or a
        // `Consumed` from the peer that got here first), a mapping made
        // before it is not read.
        let stale = tx.ring.as_ref().is_some_and(|r| r.stale());
        if stale {
            tracing::warn!(
                conn = self.cfg.local_id,
                "the ring we wrote was mapped before this guest was suspended: nothing is read back from it"
            );
        }
        let ring_mapped = ring_mapped && !stale;
        let mut unconsumed = 0;
        if let (TxState::Ring { .. }, Some(p), true) =
            (tx.path.state(), tx.producer.as_mut(), ring_mapped)
        {
            p.freeze();
            let mut copy = vec![0u8; p.capacity() as usize];
            let n = p.read_back(&mut copy).map_err(ring_error)?;
            copy.truncate(n);
            tx.resend = copy;
            unconsumed = n as u64;
            self.kick();
        }
        let notice = tx.path.freeze(unconsumed).map_err(switch_error)?;
        tx.producer = None;
        tx.ring = None;
        self.send_ctl(&Message::TxFreeze {
            conn_id: self.cfg.peer_id,
            epoch: notice.epoch,
            offset: notice.offset,
        });
        Ok(())
    }

    pub(super) fn handle_consumed(&self, tx: &mut Tx, epoch: u32, offset: u64) -> io::Result<()> {
        let mut outcome = tx.path.on_consumed(epoch, offset).map_err(switch_error)?;
        if outcome == ConsumedOutcome::FreezeFirst {
            self.freeze_tx(tx, true)?;
            self.start_stall_clock();
            outcome = tx.path.on_consumed(epoch, offset).map_err(switch_error)?;
        }
        if let ConsumedOutcome::Resend(r) = outcome {
            let copy = std::mem::take(&mut tx.resend);
            let bytes = usize::try_from(r.skip)
                .ok()
                .zip(usize::try_from(r.skip + r.len).ok())
                .and_then(|(a, b)| copy.get(a..b))
                .ok_or_else(|| protocol_error("resend outside the copy"))?;
            self.send_ctl(&Message::RawFrom {
                conn_id: self.cfg.peer_id,
                offset: r.from,
            });
            tx.out.push_raw(bytes);
            if tx.path.is_finished() {
                self.send_ctl(&Message::Fin {
                    conn_id: self.cfg.peer_id,
                    offset: tx.path.sent(),
                });
            }
            self.counters.tx_to_tcp.fetch_add(1, Ordering::Relaxed);
            // An offer that overtook this Consumed can be taken now.
            if let Some((e, ring)) = tx.pending_offer.take() {
                self.apply_offer(tx, e, ring)?;
            }
            self.notify_tx(tx);
        }
        Ok(())
    }

    pub(super) fn apply_offer(
        &self,
        tx: &mut Tx,
        epoch: u32,
        ring: SharedRing,
    ) -> io::Result<bool> {
        if tx.path.offer_waits_for_consumed(epoch) {
            // The offer overtook the Consumed for the ring we use: keep the
            // newest one and hand it in after the resend.
            if tx.pending_offer.as_ref().is_none_or(|(e, _)| *e < epoch) {
                tx.pending_offer = Some((epoch, ring));
            }
            return Ok(false);
        }
        match tx.path.on_ring_offer(epoch).map_err(switch_error)? {
            Some(marker) => {
                self.send_ctl(&Message::RingFrom {
                    conn_id: self.cfg.peer_id,
                    epoch,
                    offset: marker,
                });
                tx.producer = Some(Producer::new(ring.ring()));
                tx.ring = Some(ring);
                self.flush_tx(tx);
                self.counters.tx_to_ring.fetch_add(1, Ordering::Relaxed);
                self.notify_tx(tx);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub(super) fn accept_ring_offer(&self, epoch: u32, ring: SharedRing) -> io::Result<bool> {
        self.check_failed()?;
        let mut tx = lock(&self.tx);
        self.apply_offer(&mut tx, epoch, ring)
            .map_err(|e| self.breach(e))
    }

    /// Wants our leg up: connects it when proto's dial says.
    pub(super) fn ensure_tx_leg(&self, tx: &mut Tx) {
        tx.leg_wanted = true;
        self.dial_tx_leg(tx, false);
    }

    /// Follows the outbound leg's pending connect, and connects it (again)
    /// as proto's dial says; `peer_heard`: the peer reaches us on the
    /// other leg, so a connect of ours waiting for a backed-off SYN is made
    /// again.
    pub(super) fn dial_tx_leg(&self, tx: &mut Tx, peer_heard: bool) {
        let now = now_ms();
        if let Some(sock) = tx.dialing.as_ref() {
            match connect_done(sock) {
                Ok(false) => {}
                Ok(true) => {
                    let sock = TcpStream::from(tx.dialing.take().expect("pending connect"));
                    if let Err(e) = set_leg_options(&sock) {
                        tracing::info!(conn = self.cfg.local_id, "outbound leg: {e}; retrying");
                        tx.dial.failed(now);
                        return;
                    }
                    tx.dial.connected();
                    tx.out.push_front(&Message::TcpHello {
                        conn_id: self.cfg.peer_id,
                        cookie: self.cfg.cookie,
                    });
                    tx.leg = Some(sock);
                    tracing::info!(conn = self.cfg.local_id, "outbound leg up");
                    self.flush_tx(tx);
                    self.notify_tx(tx);
                    return;
                }
                Err(e) => {
                    tracing::info!(conn = self.cfg.local_id, "outbound leg: {e}; retrying");
                    tx.dialing = None;
                    tx.dial.failed(now);
                }
            }
        }
        match tx
            .dial
            .step(tx.leg_wanted && tx.leg.is_none(), peer_heard, now)
        {
            DialStep::Idle | DialStep::WaitUntil(_) => return,
            DialStep::Connect => {}
            DialStep::ConnectAgain => {
                tracing::info!(
                    conn = self.cfg.local_id,
                    "outbound leg not up yet: connecting again"
                );
                tx.dialing = None;
            }
        }
        let Some(addr) = self.cfg.peer_tcp else {
            return;
        };
        match connect_start(addr) {
            Ok(sock) => {
                tx.dialing = Some(sock);
                tx.dial.connecting(now);
            }
            Err(e) => {
                tracing::info!(conn = self.cfg.local_id, "outbound leg: {e}; retrying");
                tx.dial.failed(now);
            }
        }
    }
}
