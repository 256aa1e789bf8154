// SPDX-License-Identifier: MIT OR Apache-2.0
//! The receiving direction: the application's reads from the ring or
//! the inbound leg, control frames in order, our ring offers.

use super::*;

impl Shared {
    pub(super) fn read(&self, buf: &mut [u8], take: Take, nonblocking: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let peek = take == Take::Peek;
        let _one_reader = lock(&self.read_lock);
        let mut rx = lock(&self.rx);
        let mut got = 0;
        loop {
            if let Err(e) = self.check_failed() {
                if got > 0 {
                    break;
                }
                return Err(e);
            }
            if got == buf.len() {
                break;
            }
            if !rx.salvaged.is_empty() {
                let n = rx.salvaged.len().min(buf.len() - got);
                for (dst, src) in buf[got..got + n].iter_mut().zip(rx.salvaged.iter()) {
                    *dst = *src;
                }
                got += n;
                if peek {
                    break;
                }
                rx.salvaged.drain(..n);
                continue;
            }
            // What the driver queued for us may switch carriers or end the
            // stream here.
            if let Err(e) = self.pump_rx(&mut rx) {
                if got > 0 {
                    break;
                }
                return Err(self.breach(e));
            }
            if rx.path.eof_at() == Some(rx.path.taken()) {
                break;
            }
            let mut leg_events = NO_LEG;
            if rx.path.reads_ring() {
                let r = &mut *rx;
                let Some(c) = r.consumer.as_mut() else {
                    return Err(self.breach(protocol_error("ring state without a ring")));
                };
                let limit = buf.len() - got;
                let step = if peek {
                    c.receive_peek(&mut buf[got..got + limit])
                } else {
                    c.receive(&mut buf[got..got + limit])
                };
                let step = step.map_err(|e| self.breach(ring_error(e)))?;
                let end = match step {
                    Received::Bytes { n, .. } if peek => {
                        got += n;
                        break;
                    }
                    Received::Bytes { n, kick } => {
                        got += n;
                        if kick {
                            self.kick();
                        }
                        r.path
                            .record_ring_taken(n as u64)
                            .map_err(|e| self.breach(switch_error(e)))?;
                        continue;
                    }
                    Received::Reset if got > 0 => break,
                    Received::Reset => {
                        return Err(self.breach(io::ErrorKind::ConnectionReset.into()))
                    }
                    Received::Empty(end) => end,
                };
                if got > 0 {
                    break;
                }
                if let RxState::Ring { .. } = r.path.state() {
                    if end.fin {
                        // FIN, then empty: the end of the stream
                        let taken = r.path.taken();
                        r.path
                            .on_fin(taken)
                            .map_err(|e| self.breach(switch_error(e)))?;
                        continue;
                    }
                    // A frozen ring: its TxFreeze is on the way over TCP.
                    if !end.frozen && !c.prepare_wait().map_err(|e| self.breach(ring_error(e)))? {
                        continue;
                    }
                }
            } else if got > 0 {
                // One read of the leg per call, as on a plain TCP socket.
                break;
            } else if rx.leg_drained && !nonblocking && rx.order.run_open() && !rx.leg_closed {
                // The last read emptied the leg: wait for it first rather
                // than read only to be told so (a system call costs tens
                // of microseconds in a PV guest under emulation).
                rx.leg_drained = false;
                leg_events = libc::POLLIN;
            } else {
                match self.read_run(&mut rx, &mut buf[got..], take) {
                    Ok(RunStep::Read(n)) if peek => {
                        got += n;
                        break;
                    }
                    Ok(RunStep::Read(n)) => {
                        got += n;
                        continue;
                    }
                    Ok(RunStep::Again) => continue,
                    Ok(RunStep::WaitLeg) => leg_events = libc::POLLIN,
                    Ok(RunStep::WaitControl) => {}
                    Err(e) => return Err(self.breach(e)),
                }
            }
            if nonblocking {
                rx.nb_waiting.store(true, Ordering::Release);
                // The driver polls the leg for us.
                self.ctl.signal();
                return Err(io::ErrorKind::WouldBlock.into());
            }
            rx = self.wait_rx(rx, leg_events);
        }
        if !peek {
            rx.delivered += got as u64;
        }
        Ok(got)
    }

    /// One read of the run the inbound leg carries, into `dst`: bounded by
    /// the end of stream and by a `RingFrom` already here (the bytes after
    /// it are not on this leg). The sender puts no byte past a run's end
    /// into it and starts its next run only after we answered a later
    /// `TxFreeze` (which comes after the `RingFrom` on the same control
    /// stream), so a read before the end is known cannot go past it,
    /// except into a run that continues at that very end (see
    /// [`Shared::pump_rx`]).
    pub(super) fn read_run(&self, rx: &mut Rx, dst: &mut [u8], take: Take) -> io::Result<RunStep> {
        let Some(leg) = rx.leg.clone() else {
            return Ok(RunStep::WaitControl);
        };
        if rx.leg_closed || !rx.order.run_open() {
            // Nothing to read until a control frame says what comes next
            // (a run's `RawFrom`, its `RingFrom`, the `Fin`); without a
            // control stream, nothing will.
            if self.ctl_in_closed.load(Ordering::Acquire) && lock(&self.rx_ctl).is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            return Ok(RunStep::WaitControl);
        }
        let taken = rx.path.taken();
        let mut limit = dst.len() as u64;
        if let Some(eof) = rx.path.eof_at() {
            limit = limit.min(eof.saturating_sub(taken));
        }
        if let Some(end) = lock(&self.rx_ctl).run_end() {
            limit = limit.min(end.saturating_sub(taken));
        }
        if limit == 0 {
            return Ok(RunStep::WaitControl);
        }
        let want = limit as usize;
        let step = match take {
            Take::Consume => (&*leg).read(&mut dst[..want]),
            Take::Peek => leg.peek(&mut dst[..want]),
        };
        match step {
            Ok(0) => {
                rx.leg_closed = true;
                Ok(RunStep::Again)
            }
            Ok(n) if take == Take::Peek => Ok(RunStep::Read(n)),
            Ok(n) => {
                rx.path.on_data(taken, n as u64).map_err(switch_error)?;
                rx.leg_drained = n < want;
                Ok(RunStep::Read(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(RunStep::WaitLeg),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(RunStep::Again),
            Err(e) => Err(e),
        }
    }

    pub(super) fn wait_rx<'a>(
        &'a self,
        mut rx: MutexGuard<'a, Rx>,
        leg_events: i16,
    ) -> MutexGuard<'a, Rx> {
        let fd = match (&rx.leg, leg_events) {
            (Some(l), ev) if ev != NO_LEG => Some(l.as_raw_fd()),
            _ => None,
        };
        rx.waiting = true;
        rx.reader_polls = fd.is_some();
        drop(rx);
        sleep_on(&self.rx_wake, fd, leg_events);
        let mut rx = lock(&self.rx);
        rx.waiting = false;
        rx.reader_polls = false;
        rx
    }

    /// Copies every byte our receive ring holds past what was taken into
    /// `rx.salvaged` ([`Trigger::PeerGone`]) and returns how many. The ring
    /// is our own page; its indices are read once and validated as for
    /// any read. A FIN behind them ends the stream there; a RESET fails
    /// the connection as a read would.
    pub(super) fn salvage(&self, rx: &mut Rx) -> io::Result<u64> {
        let Some(c) = rx.consumer.as_mut() else {
            return Ok(0);
        };
        let mut chunk = vec![0u8; c.capacity() as usize];
        let mut n = 0u64;
        let fin = loop {
            match c.receive(&mut chunk).map_err(ring_error)? {
                Received::Bytes { n: k, .. } => {
                    rx.salvaged.extend(&chunk[..k]);
                    n += k as u64;
                }
                Received::Empty(end) => break end.fin,
                Received::Reset => return Err(io::ErrorKind::ConnectionReset.into()),
            }
        };
        if fin {
            let end = rx.path.taken() + n;
            rx.path.on_fin(end).map_err(switch_error)?;
        }
        Ok(n)
    }

    pub(super) fn queue_consumed(&self, epoch: u32, offset: u64) {
        self.send_ctl(&Message::Consumed {
            conn_id: self.cfg.peer_id,
            epoch,
            offset,
        });
    }

    /// Drops the ring(s) the receiving state no longer reads.
    pub(super) fn settle_rx_rings(rx: &mut Rx) {
        if !rx.path.reads_ring() {
            rx.consumer = None;
            rx.ring = None;
        }
        if rx.path.state() == RxState::Tcp {
            rx.offered = None;
        }
    }

    /// Takes this direction's control frames (`rx_ctl`) in order, as far
    /// as they can be taken now: as on one ordered stream, a `RingFrom`
    /// waits until every byte before it was read off the leg, a `RawFrom`
    /// or `Fin` until the ring in use gave way, and what follows
    /// waits with them.
    pub(super) fn pump_rx(&self, rx: &mut Rx) -> io::Result<()> {
        loop {
            let Some(frame) = lock(&self.rx_ctl).front() else {
                break;
            };
            let Some(taken) = rx.order.take(&mut rx.path, frame).map_err(|e| match e {
                RxControlError::Switch(e) => switch_error(e),
                e => protocol_error(e),
            })?
            else {
                return Ok(());
            };
            match taken {
                RxControlTaken::Run | RxControlTaken::Fin => {}
                RxControlTaken::RingFrom { outcome, .. } => {
                    if outcome == RingFromOutcome::Switch {
                        let ring = rx
                            .offered
                            .take()
                            .ok_or_else(|| protocol_error("RingFrom without an offered ring"))?;
                        rx.consumer = Some(Consumer::new(ring.ring()));
                        rx.ring = Some(ring);
                        self.counters.rx_to_ring.fetch_add(1, Ordering::Relaxed);
                    }
                }
                RxControlTaken::TxFreeze {
                    epoch, consumed, ..
                } => {
                    rx.clock.saw_freeze(epoch);
                    if let Some(c) = consumed {
                        self.queue_consumed(c.epoch, c.offset);
                    }
                    Self::settle_rx_rings(rx);
                }
            }
            lock(&self.rx_ctl).pop();
            self.notify_rx(rx);
        }
        Ok(())
    }

    pub(super) fn offer_ring(&self) -> io::Result<Option<(u32, SharedRing)>> {
        self.check_failed()?;
        // Take the control frames already here first: a TxFreeze sent
        // before this offer must not be read as voiding it.
        let r = self.read_control(&mut lock(&self.tx));
        let ended = r.map_err(|e| self.breach(e))?;
        let mut rx = lock(&self.rx);
        self.service_rx(&mut rx, ended)
            .map_err(|e| self.breach(e))?;
        let now = now_ms();
        match rx.clock.step(&rx.path, true, true, now) {
            OfferStep::Offer => {}
            OfferStep::Abandon => {
                // unanswered: its epoch is declared dead; the next sweep
                // offers anew
                if let Some(n) = rx.path.freeze_local() {
                    self.queue_consumed(n.epoch, n.offset);
                }
                rx.offered = None;
                rx.clock.settled();
                return Ok(None);
            }
            OfferStep::Idle | OfferStep::WaitUntil(_) => return Ok(None),
        }
        let mut next = rx.path.clone();
        let epoch = next.offer_ring().map_err(switch_error)?;
        let ring = (self.alloc)(epoch)?;
        rx.path = next;
        rx.offered = Some(ring.local);
        rx.clock.offered(now);
        Ok(Some((epoch, ring.for_peer)))
    }
}

/// Whether a read consumes what it copies or leaves it (`MSG_PEEK`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    Consume,
    Peek,
}

/// What one read of the inbound leg's run gave ([`Shared::read_run`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RunStep {
    /// Stream bytes, into the caller's buffer.
    Read(usize),
    /// Look again (a state changed).
    Again,
    /// Nothing on the leg now.
    WaitLeg,
    /// A control frame must come first.
    WaitControl,
}
