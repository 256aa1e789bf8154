// SPDX-License-Identifier: GPL-2.0
//! The carrier of a connection that only ever uses its two rings (`Rings`:
//! loopback, and SOCK_SEQPACKET), and what a ring step means for the socket,
//! which the switched carrier shares.

use super::ring::{Counted, NoCount, Pipe, Read, Wrote};
use super::{SocketCore, XenSock};
use crate::proto::ring::RingError;
use crate::sys::counters;
use crate::sys::poll::*;
use crate::sys::Msg;
use kernel::ffi::c_long;
use kernel::sync::Arc;

/// The carrier of a connection that only ever uses its two rings:
/// loopback, and SOCK_SEQPACKET (whose records the socket core frames).
pub(crate) struct Rings {
    /// the ring we write (the peer's receive ring)
    pub(super) tx: Option<Arc<Pipe>>,
    /// the ring we read
    pub(super) rx: Option<Arc<Pipe>>,
}

impl Rings {
    pub(crate) fn new(tx: Option<Arc<Pipe>>, rx: Option<Arc<Pipe>>) -> Rings {
        Rings { tx, rx }
    }

    /// SO_RCVLOWAT as a byte count the receive ring can reach: at most
    /// its capacity (a mark above it would never be met), at least 1.
    pub(crate) fn rx_lowat(&self, lowat: usize) -> u32 {
        let cap = self.rx.as_ref().map_or(u32::MAX, |rx| rx.capacity());
        (lowat.min(cap as usize) as u32).max(1)
    }

    /// poll's look at both rings, `rx_ready(pipe, readable bytes)` and
    /// `tx_ready(free bytes)` saying what counts as readable and writable
    /// (bytes for a stream, whole records for SOCK_SEQPACKET). Also the
    /// bytes readable on the ring.
    ///
    /// `rx_want`: how many readable bytes make the socket readable (its
    /// SO_RCVLOWAT; 1 for a record, whose readiness `rx_ready` decides).
    /// The peer is asked for a kick when that many are there, not on the
    /// next byte: with fewer bytes already in the ring, the next byte
    /// would not kick at all, and a poller below the mark would sleep
    /// through the byte that reaches it.
    pub(crate) fn readiness_with(
        &self,
        xs: &XenSock,
        rx_want: u32,
        rx_ready: impl FnOnce(&Pipe, u32) -> core::result::Result<bool, ()>,
        tx_ready: impl FnOnce(u32) -> bool,
    ) -> (super::Readiness, usize) {
        let mut r = super::Readiness::default();
        let mut ring_bytes = 0usize;
        if let Some(rx) = &self.rx {
            if rx.is_remote() {
                // the event-channel interrupt wakes this socket's pollers
                rx.set_owner(&xs.sk);
                // ask for a kick once `rx_want` bytes are there, before looking
                let _ = rx.rx.lock().prepare_wait_for(rx_want);
            }
            match rx.rx_state() {
                Ok((n, end)) => {
                    ring_bytes = n as usize;
                    match rx_ready(rx, n) {
                        Ok(ready) => r.readable = ready,
                        Err(()) => r.error = true,
                    }
                    r.read_hup = end.fin;
                    r.error |= end.reset;
                }
                Err(_) => r.error = true,
            }
        }
        if let Some(tx) = &self.tx {
            if tx.is_remote() {
                tx.set_owner(&xs.sk);
                let _ = tx.tx_prepare_wait(1);
            }
            match tx.tx_state() {
                Ok((free, end)) => {
                    if end.closed || end.reset {
                        r.write_hup = true;
                    } else {
                        r.writable = tx_ready(free);
                    }
                    r.error |= end.reset;
                }
                Err(_) => r.error = true,
            }
        }
        (r, ring_bytes)
    }
}

/// What a ring write step means for the socket; a ring that breaks the
/// protocol resets the connection.
pub(crate) fn sent(xs: &XenSock, step: core::result::Result<Wrote, RingError>) -> super::Sent {
    use super::Sent;
    match step {
        Ok(Wrote::Bytes(n)) => Sent::Bytes(n),
        Ok(Wrote::Full) => Sent::Full,
        Ok(Wrote::Closed) => Sent::Closed,
        Ok(Wrote::Reset) => {
            xs.inner.lock().reset = true;
            Sent::Reset
        }
        Ok(Wrote::Fault) => Sent::Fault,
        Err(why) => Sent::Failed(xs.conn_reset(why)),
    }
}

/// What a ring read step means for the socket (`Read::OffRing` is the
/// caller's: only a switched carrier reads elsewhere).
pub(crate) fn received(
    xs: &XenSock,
    step: core::result::Result<Read, RingError>,
) -> super::Received {
    use super::Received;
    match step {
        Err(why) => Received::Failed(xs.conn_reset(why)),
        Ok(Read::Reset) => {
            xs.inner.lock().reset = true;
            Received::Reset
        }
        Ok(Read::OffRing) => Received::Failed(crate::sys::errno::ENOTCONN),
        Ok(Read::Untracked) => Received::Failed(xs.conn_reset("ring read after the switch")),
        // the user's buffer faulted before any byte moved
        Ok(Read::Bytes(0, _)) => Received::Fault,
        Ok(Read::Bytes(n, short)) => Received::Bytes { n, short },
        Ok(Read::Empty(end)) => Received::Empty { eof: end.fin },
    }
}

/// A writer waits for half of `tx` to be free (or the reader's end, a
/// reset, shutdown for writing, or `moved()`: the connection left this
/// ring). The peer kicks once half the ring is free, not on its first
/// byte read (as TCP wakes a writer once a third of its send buffer is
/// free), so a writer ahead of its reader sleeps once per half ring, not
/// once per write (~300 sleeps and kicks per 64 MiB with 64 KiB writes,
/// whatever the ring size).
pub(crate) fn wait_for_space(
    xs: &XenSock,
    tx: &Pipe,
    timeo: &mut c_long,
    moved: impl Fn() -> bool,
) -> core::result::Result<(), i32> {
    let want = tx.capacity() / 2;
    // SO_BUSY_POLL: room due within the budget costs no sleep
    if *timeo != 0 && xs.sk.busy_wait_timed(|| tx.tx_free_at_least(want)) {
        counters::add(&counters::SPIN_HITS, 1);
        return Ok(());
    }
    counters::add(&counters::SLEEPS, 1);
    // prepare_wait publishes our event index and re-checks
    xs.sk.wait_timed(timeo, || match tx.tx_prepare_wait(want) {
        Ok(sleep) => {
            let i = xs.inner.lock();
            let stop = !sleep || i.reset || i.shut_wr;
            drop(i);
            stop || moved()
        }
        Err(_) => true,
    })
}

/// A reader waits for a byte of `rx` (or its end, a reset, shutdown for
/// reading, or `moved()`: the connection left this ring).
pub(crate) fn wait_for_data(
    xs: &XenSock,
    rx: &Pipe,
    timeo: &mut c_long,
    moved: impl Fn() -> bool,
) -> core::result::Result<(), i32> {
    // SO_BUSY_POLL: a reply due within the budget costs no event index,
    // kick, interrupt or sleep
    if *timeo != 0 && xs.sk.busy_wait_timed(|| rx.rx_pending() || moved()) {
        counters::add(&counters::SPIN_HITS, 1);
        return Ok(());
    }
    counters::add(&counters::SLEEPS, 1);
    xs.sk.wait_timed(timeo, || match rx.rx_prepare_wait(1) {
        Ok(sleep) => {
            let i = xs.inner.lock();
            let stop = !sleep || i.shut_rd || i.reset;
            drop(i);
            stop || moved()
        }
        Err(_) => true,
    })
}

impl Rings {
    /// RESET on both rings, their ends woken and the peer kicked.
    fn reset_rings(&self) {
        if let Some(tx) = &self.tx {
            tx.tx.lock().reset();
            tx.wake_reader(POLLERR | POLLIN);
            tx.kick();
        }
        if let Some(rx) = &self.rx {
            rx.rx.lock().reset();
            rx.wake_writer(POLLERR | POLLOUT);
            rx.kick();
        }
    }
}

impl super::Carrier for Rings {
    fn send(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, _nonblock: bool) -> super::Sent {
        let Some(tx) = &self.tx else {
            return super::Sent::Failed(crate::sys::errno::ENOTCONN);
        };
        // the event-channel interrupt wakes us when the peer frees space
        tx.set_owner(&xs.sk);
        if xs.inner.lock().reset {
            return super::Sent::Reset;
        }
        // copied straight from the user's iovecs into the ring
        sent(xs, tx.write_msg(msg, left))
    }

    fn wait_writable(&mut self, xs: &XenSock, timeo: &mut c_long) -> core::result::Result<(), i32> {
        match &self.tx {
            Some(tx) => wait_for_space(xs, tx, timeo, || false),
            None => Err(crate::sys::errno::ENOTCONN),
        }
    }

    fn recv(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, peek: bool) -> super::Received {
        let Some(rx) = &self.rx else {
            return super::Received::Failed(crate::sys::errno::ENOTCONN);
        };
        // the event-channel interrupt wakes us when data arrives
        rx.set_owner(&xs.sk);
        received(
            xs,
            rx.read_msg::<NoCount>(msg, left, peek, |_| Counted::Uncounted),
        )
    }

    fn wait_readable(&mut self, xs: &XenSock, timeo: &mut c_long) -> core::result::Result<(), i32> {
        match &self.rx {
            Some(rx) => wait_for_data(xs, rx, timeo, || false),
            None => Err(crate::sys::errno::ENOTCONN),
        }
    }

    fn readiness(&mut self, xs: &XenSock, lowat: usize) -> super::Readiness {
        let want = self.rx_lowat(lowat);
        self.readiness_with(xs, want, |_, n| Ok(n >= want), |free| free > 0)
            .0
    }

    fn readable_bytes(&self, _xs: &XenSock) -> usize {
        match self.rx.as_ref().map(|rx| rx.rx_state()) {
            Some(Ok((n, _))) => n as usize,
            Some(Err(_)) | None => 0,
        }
    }

    fn unsent_bytes(&self) -> usize {
        0
    }

    fn reset(&mut self, _xs: &XenSock) {
        self.reset_rings();
    }

    fn release(&mut self, xs: &XenSock, abort: bool) -> Option<Arc<Pipe>> {
        if abort {
            self.reset_rings();
        }
        // CLOSED goes out before FIN: a peer that has seen our EOF must
        // also see that we stopped reading (its next send: EPIPE, not a
        // byte written into the void).
        let rx = self.rx.take();
        if let Some(rx) = &rx {
            rx.rx.lock().close();
            rx.detach(xs);
            rx.wake_writer(POLLOUT | POLLERR);
            rx.kick();
        }
        if let Some(tx) = self.tx.take() {
            tx.tx.lock().finish();
            tx.detach(xs);
            tx.wake_reader(POLLIN | POLLRDNORM | POLLRDHUP);
            tx.kick();
        }
        rx
    }

    fn shutdown(&mut self, _xs: &XenSock, read: bool, write: bool) {
        if write {
            if let Some(tx) = &self.tx {
                tx.tx.lock().finish();
                tx.wake_reader(POLLIN | POLLRDNORM | POLLRDHUP);
                tx.kick();
            }
        }
        if read {
            if let Some(rx) = &self.rx {
                rx.rx.lock().close();
                rx.wake_writer(POLLOUT | POLLERR);
                rx.kick();
            }
        }
    }
}
