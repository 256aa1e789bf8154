// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the driver does for a switch: what it waits on, the legs put in,
//! the control stream read, the bounds for a peer that went away.

use super::*;

impl Shared {
    /// What the driver waits on now (see [`Driven::interest`]): the wake
    /// eventfd and the doorbell always, the legs while they are needed
    /// (first failure: tell the peer, then only those two).
    pub(super) fn wait_set(&self, fds: &mut Vec<libc::pollfd>) -> Option<Instant> {
        let failed = self.failed.load(Ordering::SeqCst) != 0;
        if failed {
            self.propagate_failure_once();
        }
        fds.push(libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.push(libc::pollfd {
            fd: self.doorbell.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        if failed || self.stop.load(Ordering::SeqCst) {
            return None;
        }
        let mut wake_at: Option<Instant> = None;
        let mut has_leg;
        {
            let tx = lock(&self.tx);
            has_leg = tx.leg.is_some();
            if let Some(leg) = &tx.leg {
                // The peer's control frames come back on it (always
                // watched). A leg the peer closed has nothing more to read
                // (and would be readable for ever), but a non-blocking
                // writer still waits for it: its next send is what reports
                // the close.
                let mut events = if tx.leg_closed { 0 } else { libc::POLLIN };
                if (!tx.out.is_empty() || tx.nb_waiting.load(Ordering::Acquire)) && !tx.writer_polls
                {
                    events |= libc::POLLOUT;
                }
                if events != 0 {
                    fds.push(libc::pollfd {
                        fd: leg.as_raw_fd(),
                        events,
                        revents: 0,
                    });
                }
            }
            if let Some(sock) = &tx.dialing {
                // writable once the connect completed or failed
                fds.push(libc::pollfd {
                    fd: sock.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                });
            }
            let now = now_ms();
            if let DialStep::WaitUntil(t) =
                tx.dial.step(tx.leg_wanted && tx.leg.is_none(), false, now)
            {
                wake_at = earliest(
                    wake_at,
                    Some(Instant::now() + Duration::from_millis(t.saturating_sub(now))),
                );
            }
        }
        let ctl_pending = !lock(&self.ctl_out).out.is_empty();
        {
            let rx = lock(&self.rx);
            has_leg |= rx.leg.is_some();
            if let Some(leg) = &rx.leg {
                let mut events = 0;
                // Only a non-blocking reader needs the driver to watch the
                // peer's stream; control for it comes on the other leg.
                if rx.nb_waiting.load(Ordering::Acquire) && !rx.reader_polls && !rx.leg_closed {
                    events |= libc::POLLIN;
                }
                if ctl_pending {
                    events |= libc::POLLOUT;
                }
                if events != 0 {
                    let fd = leg.as_raw_fd();
                    fds.push(libc::pollfd {
                        fd,
                        events,
                        revents: 0,
                    });
                }
            }
        }
        let stall = *lock(&self.stall_since);
        let wake_at = earliest(wake_at, stall.map(|t| t + self.cfg.peer_lost_after));
        // the legs are looked at again within the bound (check_stall)
        let live = has_leg.then(|| *lock(&self.legs_sampled) + self.legs_look_every());
        earliest(wake_at, live)
    }

    /// After the poll (see [`Driven::step`]): whoever waits on a ring or
    /// leg that moved looks again; new legs, frames to answer, deadlines.
    pub(super) fn on_ready(&self, fds: &[libc::pollfd]) {
        self.ctl.drain();
        let rang = fds.get(1).is_some_and(|f| f.revents != 0);
        let leg_moved = fds.iter().skip(2).any(|f| f.revents != 0);
        if rang || leg_moved {
            if rang {
                self.doorbell.0.drain();
            }
            // A ring or a leg moved: whoever waits on it looks again.
            self.notify_tx(&lock(&self.tx));
            self.notify_rx(&lock(&self.rx));
        }
        if self.stop.load(Ordering::SeqCst) || self.failed.load(Ordering::SeqCst) != 0 {
            return;
        }
        self.install_legs();
        let r = self.service_tx(&mut lock(&self.tx));
        let ended = match r {
            Ok(ended) => ended,
            Err(e) => {
                self.breach(e);
                return;
            }
        };
        let r = self.service_rx(&mut lock(&self.rx), ended);
        if let Err(e) = r {
            self.breach(e);
            return;
        }
        self.check_stall();
    }

    pub(super) fn install_legs(&self) {
        let legs = std::mem::take(&mut *lock(&self.inbound));
        for sock in legs {
            {
                let mut rx = lock(&self.rx);
                // One leg per direction; a second one is not ours to trust.
                if rx.leg.is_some() || set_leg_options(&sock).is_err() {
                    continue;
                }
                let sock = Arc::new(sock);
                rx.leg = Some(sock.clone());
                tracing::info!(conn = self.cfg.local_id, "inbound leg up");
                let mut c = lock(&self.ctl_out);
                let c = &mut *c;
                if let Err(e) = c.out.flush(&sock) {
                    self.breach(e);
                }
                c.leg = Some(sock);
                self.notify_rx(&rx);
            }
            // The peer is on TCP: bring our leg up too, so its control
            // frames have a way to us.
            self.ensure_tx_leg(&mut lock(&self.tx));
        }
        let heard = self.peer_heard();
        let mut tx = lock(&self.tx);
        if tx.leg.is_none() && tx.leg_wanted {
            self.dial_tx_leg(&mut tx, heard);
        }
    }

    /// Takes the control frames the peer sent back on our outbound leg:
    /// answers for our sending direction are handled at once, frames for
    /// our receiving direction are queued (`rx_ctl`) for it, in order (the
    /// caller then takes them, `pump_rx`). Returns whether the control
    /// stream ended in this call.
    pub(super) fn read_control(&self, tx: &mut Tx) -> io::Result<bool> {
        let mut ended = false;
        while !tx.leg_closed {
            let t = &mut *tx;
            let Some(leg) = t.leg.as_ref() else { break };
            match t.inbox.next(leg, self.cfg.local_id)? {
                Incoming::Frame(LegControl::Consumed { epoch, offset }) => {
                    self.handle_consumed(tx, epoch, offset)?;
                }
                Incoming::Frame(LegControl::Reset) => {
                    return Err(io::ErrorKind::ConnectionReset.into())
                }
                Incoming::Frame(LegControl::Receiving(frame)) => {
                    // Each frame waits for the receiving direction only
                    // while a RingFrom before it waits for the bytes ahead
                    // of it, and a sender sends few before it needs an
                    // answer; a peer that floods is in breach.
                    if lock(&self.rx_ctl).push(frame).is_err() {
                        return Err(protocol_error("control frames pile up unanswered"));
                    }
                }
                Incoming::WouldBlock => break,
                Incoming::Closed => {
                    // The peer closed our outbound leg: it reads nothing
                    // more from us (its side was closed, or it died), and
                    // sends no more control frames. What it sent us stays
                    // readable on the other leg, so this is not yet the
                    // connection's end: a write after it fails on the
                    // socket, and a peer that died mid-stream shows on the
                    // receiving side (no `Fin` will come). Only a frozen
                    // direction, which waits for the peer's `Consumed` on
                    // this leg, cannot go on without it.
                    tx.leg_closed = true;
                    self.ctl_in_closed.store(true, Ordering::Release);
                    ended = true;
                    if matches!(tx.path.state(), TxState::Frozen { .. }) {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
            }
        }
        Ok(ended)
    }

    /// Reads the control stream and writes our queued bytes; whether the
    /// control stream ended in this call.
    pub(super) fn service_tx(&self, tx: &mut Tx) -> io::Result<bool> {
        if tx.leg.is_none() {
            if tx.leg_wanted {
                let heard = self.peer_heard();
                self.dial_tx_leg(tx, heard);
            }
            return Ok(false);
        }
        let ended = self.read_control(tx)?;
        if !tx.writer_polls && !tx.out.is_empty() {
            if let Some(leg) = tx.leg.as_ref() {
                tx.out.flush(leg)?;
            }
        }
        Ok(ended)
    }

    /// Takes what can be taken of the receiving direction's control
    /// frames and writes ours; `wake`: the control stream just ended, and
    /// a reader waiting for a frame must learn none will come.
    pub(super) fn service_rx(&self, rx: &mut Rx, wake: bool) -> io::Result<()> {
        self.pump_rx(rx)?;
        if wake {
            self.notify_rx(rx);
        }
        let mut c = lock(&self.ctl_out);
        let c = &mut *c;
        if let (false, Some(leg)) = (c.out.is_empty(), c.leg.as_deref()) {
            c.out.flush(leg)?;
        }
        Ok(())
    }

    /// Fails the connection if the legs it needs did not come up in time,
    /// or if a leg waited longer than the bound for its peer to
    /// acknowledge what it holds (the peer died or stayed away with the
    /// legs up).
    pub(super) fn check_stall(&self) {
        let up = lock(&self.tx).leg.is_some() && lock(&self.rx).leg.is_some();
        let mut since = lock(&self.stall_since);
        match *since {
            Some(_) if up => *since = None,
            Some(t) if t.elapsed() >= self.cfg.peer_lost_after => {
                drop(since);
                lock(&self.failure).get_or_insert_with(|| "peer not reachable on TCP".into());
                self.fail(libc::ECONNRESET, ResetReason::PeerLost);
                return;
            }
            _ => {}
        }
        drop(since);
        {
            let mut at = lock(&self.legs_sampled);
            if at.elapsed() < self.legs_look_every() {
                return;
            }
            *at = Instant::now();
        }
        let unanswered = self.sample_legs();
        if liveness::peer_lost(unanswered, self.bound_ms()) {
            tracing::warn!(
                conn = self.cfg.local_id,
                "peer stopped answering on TCP for {} ms: connection fails",
                unanswered.unwrap_or_default()
            );
            lock(&self.failure).get_or_insert_with(|| "peer stopped answering on TCP".into());
            self.fail(libc::ECONNRESET, ResetReason::PeerLost);
        }
    }

    /// Whether the peer's end answered since the last look: a segment came
    /// on the inbound leg (a leg just put in counts), as the module tells
    /// by its legs' segment counts. Then our outbound connect that waits
    /// for a backed-off SYN is made again (proto's dial); a peer that is
    /// paused sends nothing, and the connect keeps its own pace.
    fn peer_heard(&self) -> bool {
        let mut rx = lock(&self.rx);
        let Some(segs) = rx
            .leg
            .as_deref()
            .and_then(|l| crate::sys::tcp_info(l.as_fd()).ok())
            .map(|i| i.tcpi_segs_in)
        else {
            return false;
        };
        let heard = segs != rx.segs_seen;
        rx.segs_seen = segs;
        heard
    }

    /// The peer-lost bound in ms.
    fn bound_ms(&self) -> u64 {
        u64::try_from(self.cfg.peer_lost_after.as_millis()).unwrap_or(u64::MAX)
    }

    /// How often the legs are looked at for an unanswered peer (proto's
    /// liveness).
    pub(super) fn legs_look_every(&self) -> Duration {
        Duration::from_millis(liveness::look_every_ms(self.bound_ms()))
    }

    /// Samples both legs ([`sample_leg`]): the longer time (ms) either has
    /// been unanswered.
    pub(super) fn sample_legs(&self) -> Option<u64> {
        let tu = {
            let mut tx = lock(&self.tx);
            let t = &mut *tx;
            sample_leg(t.leg.as_ref(), &mut t.leg_unanswered)
        };
        let ru = {
            let mut rx = lock(&self.rx);
            let r = &mut *rx;
            sample_leg(r.leg.as_deref(), &mut r.leg_unanswered)
        };
        tu.max(ru)
    }

    /// [`Shared::propagate_failure`], the first time only.
    pub(super) fn propagate_failure_once(&self) {
        if !self.propagated.swap(true, Ordering::SeqCst) {
            self.propagate_failure();
        }
    }

    /// Tells the peer, on every carrier we still have, that we are gone:
    /// RESET on the rings, `Reset` on the control stream, and the end of
    /// our raw stream (without its `Fin`).
    pub(super) fn propagate_failure(&self) {
        let reason = *lock(&self.failure_reason);
        {
            let mut tx = lock(&self.tx);
            if let Some(p) = tx.producer.as_mut() {
                p.reset();
            }
            if let Some(leg) = tx.leg.as_ref() {
                let _ = leg.shutdown(std::net::Shutdown::Write);
            }
        }
        {
            let mut rx = lock(&self.rx);
            if let Some(c) = rx.consumer.as_mut() {
                c.reset();
            }
        }
        {
            let mut c = lock(&self.ctl_out);
            c.out.push(&Message::Reset {
                conn_id: self.cfg.peer_id,
                reason,
            });
            let c = &mut *c;
            if let Some(leg) = c.leg.as_deref() {
                let _ = c.out.flush(leg);
            }
        }
        self.kick();
        self.tx_wake.signal();
        self.rx_wake.signal();
    }
}

impl Driven for Shared {
    fn interest(&self, fds: &mut Vec<libc::pollfd>) -> Option<Instant> {
        self.wait_set(fds)
    }

    fn step(&self, fds: &[libc::pollfd]) {
        self.on_ready(fds)
    }
}

pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
