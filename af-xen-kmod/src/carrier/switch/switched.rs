// SPDX-License-Identifier: GPL-2.0
//! `Switched`: the socket's carrier for an inter-domain stream, on its
//! rings or its legs.

use super::*;

/// Which carrier a step found full or empty: the waiter waits on that one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum On {
    Ring,
    Tcp,
}

/// The carrier of an inter-domain stream: each step goes to the ring or
/// to the TCP leg, whichever carries that direction now. A ring step holds
/// the direction on that very ring (`ring_writer`, `ring_reader`) for the
/// step, one take of the switch's lock: the bytes are counted before a
/// freeze can look, and the ring is named by its epoch.
pub(crate) struct Switched {
    pub(super) sw: Arc<Switch>,
    /// the rings this call writes and reads, as the socket held them (a
    /// step moves on to the ring the switch came back to)
    pub(super) rings: rings::Rings,
    /// where the last send step stopped for want of room
    pub(super) tx_wait: On,
    /// where the last receive step found nothing
    pub(super) rx_wait: On,
    /// the last send step was MSG_DONTWAIT (or on an O_NONBLOCK socket)
    pub(super) nonblock: bool,
}

impl Switched {
    pub(crate) fn new(sw: Arc<Switch>, tx: Option<Arc<Pipe>>, rx: Option<Arc<Pipe>>) -> Switched {
        Switched {
            sw,
            rings: rings::Rings::new(tx, rx),
            tx_wait: On::Ring,
            rx_wait: On::Ring,
            nonblock: false,
        }
    }

    /// One send step on TCP (the direction is off its ring).
    pub(super) fn send_on_tcp(
        &mut self,
        xs: &XenSock,
        msg: &mut Msg,
        left: usize,
        nonblock: bool,
    ) -> Option<Sent> {
        if xs.inner.lock().reset {
            return Some(Sent::Reset);
        }
        match send(xs, &self.sw, msg, left, !nonblock) {
            // back on a ring meanwhile: take the guard again
            Write::Ring => None,
            Write::Sent(n) => Some(Sent::Bytes(n)),
            Write::Blocked => {
                self.tx_wait = On::Tcp;
                Some(Sent::Full)
            }
            Write::Pipe => Some(Sent::Closed),
            Write::Fault => Some(Sent::Fault),
        }
    }
}

impl Carrier for Switched {
    fn send(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, nonblock: bool) -> Sent {
        self.nonblock = nonblock;
        loop {
            let Some(mut on_ring) = ring_writer(&self.sw) else {
                match self.send_on_tcp(xs, msg, left, nonblock) {
                    Some(s) => return s,
                    None => continue,
                }
            };
            // one look at the socket: reset, and, when the guard names
            // another ring than ours (the switch came back to a new one),
            // that ring (the switch replaces it under the lock the guard
            // holds)
            let (reset, newer) = {
                let i = xs.inner.lock();
                let stale = self
                    .rings
                    .tx
                    .as_ref()
                    .map_or(true, |t| on_ring.epoch() != t.epoch);
                (i.reset, stale.then(|| i.tx.clone()))
            };
            if reset {
                return Sent::Reset;
            }
            if let Some(now) = newer {
                self.rings.tx = now;
            }
            let Some(tx) = self.rings.tx.clone() else {
                return Sent::Failed(e::ENOTCONN);
            };
            // the event-channel interrupt wakes us when the peer frees space
            tx.set_owner(&xs.sk);
            if on_ring.epoch() != tx.epoch {
                // the switch replaces the ring and its epoch under one lock
                drop(on_ring);
                return Sent::Failed(SocketCore::conn_reset(
                    xs,
                    "the switch's ring is not the socket's",
                ));
            }
            let step = tx.write_msg(msg, left);
            if let Ok(Wrote::Bytes(n)) = &step {
                on_ring.sent(*n);
            }
            drop(on_ring);
            self.tx_wait = On::Ring;
            return rings::sent(xs, step);
        }
    }

    fn wait_writable(&mut self, xs: &XenSock, timeo: &mut c_long) -> core::result::Result<(), i32> {
        let sw = &self.sw;
        if self.tx_wait == On::Tcp {
            // the legs' callbacks wake the socket when the outbound leg
            // takes bytes again: nothing to ask for first
            if self.nonblock {
                return Err(e::EAGAIN);
            }
            inc(&counters::TCP_WRITE_WAITS, 1);
            let r = xs.sk.wait(timeo, || {
                let i = xs.inner.lock();
                let stop = i.reset || i.shut_wr;
                drop(i);
                stop || tx_ready(sw)
            });
            if r.is_err() {
                writer_gone(xs, sw);
            }
            return r;
        }
        match &self.rings.tx {
            // the switch leaving the ring ends the wait as well
            Some(tx) => rings::wait_for_space(xs, tx, timeo, || !sw.tx_on_ring()),
            None => Ok(()),
        }
    }

    fn recv(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, peek: bool) -> Received {
        let mut disagreed_ms = 0u32;
        loop {
            // the ring first: the read holds the switch on this very ring
            // for the step, copied straight from the ring to the user's
            // iovecs
            let step = match &self.rings.rx {
                Some(rx) => {
                    rx.set_owner(&xs.sk);
                    let sw = &self.sw;
                    rx.read_msg(msg, left, peek, |epoch| match ring_reader(sw, epoch) {
                        Some(g) => ring::Counted::By(g),
                        None => ring::Counted::Elsewhere,
                    })
                }
                None => Ok(ring::Read::OffRing),
            };
            if !matches!(step, Ok(ring::Read::OffRing)) {
                self.rx_wait = On::Ring;
                return rings::received(xs, step);
            }
            // not this ring: TCP bytes come first, or the switch reads TCP
            // or a newer ring
            match recv(xs, &self.sw, msg, left, peek) {
                Read::Ring => {
                    let Some(now) = xs.inner.lock().rx.clone() else {
                        return Received::Failed(e::ENOTCONN);
                    };
                    // The switch reads a ring and the socket holds no other
                    // than the one just refused as not the switch's: the
                    // two disagree. For a moment while a ring is being
                    // adopted; should it last, this loop would hold the CPU
                    // for good (a soft lockup after moves was read so once;
                    // docs/lab.md, Known limits). Wait a little for the
                    // adoption, then end the connection: an error on both
                    // ends, no byte lost.
                    if self.rings.rx.as_ref().is_some_and(|r| Arc::ptr_eq(r, &now)) {
                        if disagreed_ms >= RING_DISAGREEMENT_MS {
                            // what disagrees, for the log: no case of it
                            // is known
                            let (state, epoch, buffered, offered) = {
                                let r = self.sw.rx.lock();
                                let (state, epoch) = match r.path.state() {
                                    RxState::Ring { epoch, .. } => ("ring", epoch as i64),
                                    RxState::Tcp => ("tcp", -1),
                                    RxState::Offered { .. } => ("offered", -1),
                                };
                                let buffered = r.buf.as_ref().map(|b| b.len()).unwrap_or(0);
                                let offered =
                                    r.offered.as_ref().map(|p| p.epoch as i64).unwrap_or(-1);
                                (state, epoch, buffered, offered)
                            };
                            let _ = xs.conn_reset(format_args!(
                                "the switch reads a ring the socket does not hold (switch rx {} epoch {}, {} bytes buffered, offered epoch {}; socket's ring epoch {})",
                                state, epoch, buffered, offered, now.epoch
                            ));
                            return Received::Reset;
                        }
                        crate::sys::sleep_ms(1);
                        disagreed_ms += 1;
                    }
                    // a ring the switch came back to: its interrupts wake
                    // us too (`set_owner` above)
                    self.rings.rx = Some(now);
                }
                Read::Got(n) => return Received::Bytes { n, short: false },
                Read::Empty { eof } => {
                    self.rx_wait = On::Tcp;
                    return Received::Empty { eof };
                }
                Read::Fault => return Received::Fault,
                Read::Reset => return Received::Reset,
            }
        }
    }

    fn wait_readable(&mut self, xs: &XenSock, timeo: &mut c_long) -> core::result::Result<(), i32> {
        let sw = &self.sw;
        if self.rx_wait == On::Tcp {
            inc(&counters::TCP_READ_WAITS, 1);
            return xs.sk.wait(timeo, || {
                let i = xs.inner.lock();
                let stop = i.shut_rd || i.reset;
                drop(i);
                stop || rx_ready(xs, sw)
            });
        }
        match &self.rings.rx {
            // the switch leaving the ring ends the wait as well
            Some(rx) => rings::wait_for_data(xs, rx, timeo, || !ring_read_ok(sw)),
            None => Ok(()),
        }
    }

    fn readiness(&mut self, xs: &XenSock, lowat: usize) -> Readiness {
        let want = self.rings.rx_lowat(lowat);
        let (mut r, ring_bytes) =
            self.rings
                .readiness_with(xs, want, |_, n| Ok(n >= want), |free| free > 0);
        // a direction on TCP
        if self.sw.is_active() {
            let (readable, read_hup, writable, write_hup) = poll_bits(xs, &self.sw);
            if readable && (lowat <= 1 || ring_bytes + tcp_readable(xs, &self.sw) >= lowat) {
                r.readable = true;
            }
            r.read_hup |= read_hup;
            r.writable |= writable;
            r.write_hup |= write_hup;
        }
        r
    }

    fn readable_bytes(&self, xs: &XenSock) -> usize {
        // bytes taken off TCP come first
        let on_tcp = tcp_readable(xs, &self.sw);
        let on_ring = self.rings.readable_bytes(xs);
        on_tcp + on_ring
    }

    fn unsent_bytes(&self) -> usize {
        tx_unsent(&self.sw)
    }

    fn shutdown(&mut self, xs: &XenSock, read: bool, write: bool) {
        if write {
            self.sw.tx.lock().path.finish();
            if self.sw.is_active() {
                net::schedule();
            }
        }
        self.rings.shutdown(xs, read, write);
    }

    fn reset(&mut self, xs: &XenSock) {
        self.rings.reset(xs);
    }

    fn release(&mut self, xs: &XenSock, abort: bool) -> Option<Arc<Pipe>> {
        // before the struct sock can go: its TCP legs' callbacks stop
        // waking it
        disown(&self.sw);
        // its TCP legs go once what it sent is out
        closing(&self.sw, self.rings.tx.as_ref());
        leg::connection_ended();
        self.rings.release(xs, abort)
    }
}
