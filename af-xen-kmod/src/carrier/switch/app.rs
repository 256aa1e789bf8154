// SPDX-License-Identifier: GPL-2.0
//! The application's reads and writes through the switch (`send`, `recv`,
//! readiness), on a ring or a leg.

use super::*;

pub(super) enum Write {
    /// the ring carries this direction: use it
    Ring,
    Sent(usize),
    /// no room (or frozen): wait for `tx_ready`
    Blocked,
    /// the peer closed (or the leg broke)
    Pipe,
    Fault,
}

/// One step of `sendmsg` on TCP: as much of the message as the outbound
/// leg takes now, straight from the user's iovecs, under one take of the
/// switch lock (before the leg is up, into the send queue). `waits`: the
/// caller, told Blocked, waits for room and calls again when woken (a
/// blocking writer; `writer_gone` if it leaves instead), so it flushes
/// what is queued and the leg's drains need not run the work item.
pub(super) fn send(xs: &XenSock, sw: &Switch, msg: &mut Msg, left: usize, waits: bool) -> Write {
    inc(&counters::SEND_STEPS, 1);
    let mut t = sw.tx.lock();
    t.writer_waits = false;
    let res = send_locked(&mut t, msg, left);
    // a blocking writer told Blocked waits for room and flushes when woken
    t.writer_waits = waits && matches!(res, Write::Blocked);
    own_outbound(xs, sw, &mut t);
    res
}

/// `send` under the switch's lock. On the raw leg a write is the user's
/// bytes and nothing else: one `sock_sendmsg` from its iovecs, as TCP's
/// own writer makes (with `Data` frames each write cost a second call for
/// the frame's prefix, ~47 us of the ~55 us the carrier's writer spent
/// over TCP's per 64 KiB). What the leg does
/// not take stays the writer's, as on a TCP socket.
pub(super) fn send_locked(t: &mut TxSide, msg: &mut Msg, left: usize) -> Write {
    match t.path.state() {
        TxState::Ring { .. } => return Write::Ring,
        TxState::Frozen { .. } => return Write::Blocked,
        TxState::Tcp => {}
    }
    // what is queued goes first, from here: a writer woken by the leg's
    // write_space (afx_leg_wake) makes its own room, no work item between
    flush_tx(t);
    if t.broken {
        return Write::Pipe;
    }
    if t.resend_pos < t.resend_end || t.offer.is_some() {
        return Write::Blocked;
    }
    let queued = t.q.as_ref().is_some_and(|q| !q.is_empty());
    if leg_ready(t) {
        if queued {
            return Write::Blocked;
        }
        let Some(leg) = t.leg.as_ref() else {
            return Write::Blocked;
        };
        return match leg.sock().send_from_user(msg, left, false) {
            Ok(n) if n > 0 => {
                let n = n.min(left);
                let _ = t.path.record_sent(n as u64);
                inc(&counters::TX_DIRECT_BYTES, n as i64);
                Write::Sent(n)
            }
            Ok(_) => Write::Blocked,
            Err(x) if x == e::EAGAIN => Write::Blocked,
            // TCP refuses a chunk that faults part way; the bytes before
            // the fault are the writer's to send, as with the ring (they
            // go through the queue, which is empty here)
            Err(x) if x == e::EFAULT => queue_from_user(t, msg, left),
            Err(_) => {
                t.broken = true;
                Write::Pipe
            }
        };
    }
    queue_from_user(t, msg, left)
}

/// Copies what the user's iovecs hold of the next `left` bytes (short on
/// a fault) into the send queue, behind what is queued: while the leg
/// connects, or for a write whose buffer faults part way.
pub(super) fn queue_from_user(t: &mut TxSide, msg: &mut Msg, left: usize) -> Write {
    let room = t.q.as_ref().map(|q| q.room()).unwrap_or(0);
    if room == 0 {
        return Write::Blocked;
    }
    let Some(q) = t.q.as_mut() else {
        return Write::Blocked;
    };
    let got = q.push_from(msg, left.min(room));
    if got == 0 {
        return Write::Fault;
    }
    let _ = t.path.record_sent(got as u64);
    inc(&counters::TX_QUEUED_BYTES, got as i64);
    Write::Sent(got)
}

/// SIOCOUTQ on TCP: stream bytes we hold that have not gone out on the
/// outbound leg yet (queued, or read back from a frozen ring to resend).
pub(super) fn tx_unsent(sw: &Switch) -> usize {
    if !sw.is_active() {
        return 0;
    }
    let t = sw.tx.lock();
    t.q.as_ref().map_or(0, |q| q.len()) + t.resend_end.saturating_sub(t.resend_pos)
}

/// Whether a writer waiting on TCP should look again.
pub(super) fn tx_ready(sw: &Switch) -> bool {
    let t = sw.tx.lock();
    match t.path.state() {
        TxState::Ring { .. } => true,
        TxState::Frozen { .. } => false,
        TxState::Tcp => t.broken || tcp_writable(&t),
    }
}

/// The outbound leg is up and its hello out: frames go on it.
pub(super) fn leg_ready(t: &TxSide) -> bool {
    t.leg_up && t.hello_left == 0 && t.leg.is_some()
}

/// A write on TCP would take bytes now: nothing to resend or offer first,
/// and a leg that takes bytes (the writer flushes what is queued itself,
/// `send`), or, while the leg connects, room in the queue.
pub(super) fn tcp_writable(t: &TxSide) -> bool {
    if t.resend_pos < t.resend_end || t.offer.is_some() {
        return false;
    }
    if leg_ready(t) {
        return t.leg.as_ref().is_some_and(|l| l.sock().writable());
    }
    t.q.as_ref().is_some_and(|q| q.room() > 0)
}

pub(super) enum Read {
    /// the ring carries this direction and no TCP bytes are ahead of it
    Ring,
    Got(usize),
    /// nothing to read; `eof`: the stream ended here
    Empty {
        eof: bool,
    },
    Fault,
    /// the connection was reset
    Reset,
}

/// How long a reader waits for the switch and its socket to agree on the
/// ring to read before it ends the connection (`Switched::recv`).
pub(super) const RING_DISAGREEMENT_MS: u32 = 2000;

/// One step of `recvmsg` on TCP: bytes taken off TCP come before the ring.
pub(super) fn recv(xs: &XenSock, sw: &Switch, msg: &mut Msg, left: usize, peek: bool) -> Read {
    inc(&counters::RECV_STEPS, 1);
    let mut r = sw.rx.lock();
    let pending = r.buf.as_ref().map(|b| b.len()).unwrap_or(0);
    if pending == 0 {
        if r.path.reads_ring() {
            return Read::Ring;
        }
        // pull what the leg has now (process context; the work item takes
        // control frames only). No ring pipe is in use here, so no consumer
        // lock first. A read takes the bytes straight into the user's
        // buffers; a peek goes through the buffer (it must not consume).
        if xs.inner.lock().rx.is_none() {
            let ids = ids(xs);
            let mut sink = if peek {
                Sink::Buffer
            } else {
                Sink::User {
                    msg: &mut *msg,
                    left,
                    got: 0,
                    fault: false,
                }
            };
            let res = pull(xs, sw, &mut r, &ids, &mut sink);
            let (got, fault) = match sink {
                Sink::User { got, fault, .. } => (got, fault),
                Sink::Buffer | Sink::Control => (0, false),
            };
            if let Err(why) = res {
                drop(r);
                fail(xs, why);
                // what arrived before the failure was the stream's
                return if got > 0 { Read::Got(got) } else { Read::Reset };
            }
            if got > 0 {
                return Read::Got(got);
            }
            if fault {
                return Read::Fault;
            }
        }
        let pending = r.buf.as_ref().map(|b| b.len()).unwrap_or(0);
        if pending == 0 {
            if r.path.reads_ring() {
                return Read::Ring;
            }
            let eof = r.path.eof_at() == Some(r.path.taken());
            return Read::Empty { eof };
        }
    }
    let Some(buf) = r.buf.as_mut() else {
        return Read::Fault;
    };
    let front = buf.front();
    let n = front.len().min(left);
    let out = msg.copy_to(&front[..n]);
    if out == 0 && n > 0 {
        return Read::Fault;
    }
    if !peek {
        let was_full = buf.room() == 0;
        buf.consume(out);
        if was_full {
            // the work item stopped reading the leg for want of room
            net::schedule();
        }
    }
    Read::Got(out)
}

/// This direction reads its inbound leg now: off every ring and none in
/// use (caller holds `sw.rx`, which comes before the socket's lock).
pub(super) fn reads_leg(xs: &XenSock, r: &RxSide) -> bool {
    !r.path.reads_ring() && xs.inner.lock().rx.is_none()
}

/// Bytes on the TCP carrier that the application has not read (FIONREAD
/// adds the ring's): what the leg has is taken into the buffer first (the
/// work item leaves it to the reader), so it is what a read returns now.
pub(super) fn tcp_readable(xs: &XenSock, sw: &Switch) -> usize {
    let mut r = sw.rx.lock();
    if reads_leg(xs, &r) {
        let ids = ids(xs);
        if let Err(why) = pull_frames(xs, sw, &mut r, &ids) {
            drop(r);
            fail(xs, why);
            return 0;
        }
    }
    r.buf.as_ref().map_or(0, |b| b.len())
}

/// Whether a reader waiting on TCP should look again: bytes buffered, the
/// leg has bytes of an open run (the reader pulls them itself, see
/// `service`), the end, back on a ring, or a failure to report.
pub(super) fn rx_ready(xs: &XenSock, sw: &Switch) -> bool {
    let r = sw.rx.lock();
    r.path.reads_ring()
        || r.buf.as_ref().map(|b| !b.is_empty()).unwrap_or(false)
        || r.path.eof_at() == Some(r.path.taken())
        || (run_room(sw, &r) > 0
            && !r.data_eof
            && r.leg.as_ref().is_some_and(|l| l.sock().readable())
            && reads_leg(xs, &r))
        || (r.data_eof && leg_ended(sw, &r, false).is_err())
}

/// poll() bits of the directions on TCP: (readable, read hangup, writable, write hangup).
/// While the leg is this direction's carrier, poll takes the queued control
/// frames (never bytes, `Sink::Control`), so that readable means bytes of
/// an open run are there or the stream ended, as TCP's poll says. A
/// `RingFrom` taken here says readable once: the reader's next call moves
/// to the ring (and its interrupts wake it).
pub(super) fn poll_bits(xs: &XenSock, sw: &Switch) -> (bool, bool, bool, bool) {
    let (readable, rd_hup) = {
        let mut r = sw.rx.lock();
        let mut to_ring = false;
        if r.leg.is_some() && reads_leg(xs, &r) {
            let ids = ids(xs);
            if let Err(why) = pull(xs, sw, &mut r, &ids, &mut Sink::Control) {
                drop(r);
                fail(xs, why);
                return (true, true, false, true);
            }
            to_ring = r.path.reads_ring();
        }
        let pending = r.buf.as_ref().map(|b| !b.is_empty()).unwrap_or(false);
        let eof = !r.path.reads_ring() && r.path.eof_at() == Some(r.path.taken());
        let bytes = run_room(sw, &r) > 0
            && !r.data_eof
            && r.leg.as_ref().is_some_and(|l| l.sock().readable());
        let failed = r.data_eof && leg_ended(sw, &r, false).is_err();
        (pending || eof || bytes || to_ring || failed, eof || failed)
    };
    let (writable, wr_hup) = {
        let t = sw.tx.lock();
        match t.path.state() {
            TxState::Tcp => (!t.broken && tcp_writable(&t), t.broken),
            _ => (false, false),
        }
    };
    (readable, rd_hup, writable, wr_hup)
}

/// A ring read of `n` bytes (caller holds the rx pipe's consumer). False:
/// this direction has left the ring (or TCP bytes come first): the reader
/// must not consume from it.
pub(super) fn ring_read_ok(sw: &Switch) -> bool {
    let r = sw.rx.lock();
    r.path.reads_ring() && r.buf.as_ref().map(|b| b.is_empty()).unwrap_or(true)
}

/// Locks the receiving direction for one ring read (caller holds the
/// consumer of the ring of `epoch`): Some only if this direction reads that
/// very ring and no TCP bytes come first. One take of the lock for the
/// check and the count of what was taken (the ring data path's fast path:
/// ring_read_ok and a second take for the count cost a lock each per step).
pub(super) fn ring_reader(sw: &Switch, epoch: u32) -> Option<RingReader<'_>> {
    let g = sw.rx.lock();
    let this_ring = match g.path.state() {
        RxState::Ring { epoch: e, .. } => e == epoch,
        _ => false,
    };
    if this_ring && g.buf.as_ref().map(|b| b.is_empty()).unwrap_or(true) {
        Some(RingReader(g))
    } else {
        None
    }
}

/// The receiving direction, held on its ring for one read.
pub(super) struct RingReader<'a>(
    kernel::sync::lock::Guard<'a, RxSide, kernel::sync::lock::mutex::MutexBackend>,
);

impl ring::TakenCount for RingReader<'_> {
    /// Records `n` bytes taken off the ring; Err: the switch refuses the
    /// count (the direction has left the ring).
    fn taken(&mut self, n: usize) -> core::result::Result<(), ()> {
        self.0.path.record_ring_taken(n as u64).map_err(|_| ())
    }
}

/// Locks the sending direction for a ring write; None: it is not on the ring.
pub(super) fn ring_writer(sw: &Switch) -> Option<RingWriter<'_>> {
    let g = sw.tx.lock();
    if matches!(g.path.state(), TxState::Ring { .. }) {
        Some(RingWriter(g))
    } else {
        None
    }
}

/// The sending direction, held on the ring for one write.
pub(super) struct RingWriter<'a>(
    kernel::sync::lock::Guard<'a, TxSide, kernel::sync::lock::mutex::MutexBackend>,
);

impl RingWriter<'_> {
    /// The epoch of the ring it holds (Pipe::epoch names the same).
    pub(super) fn epoch(&self) -> u32 {
        match self.0.path.state() {
            TxState::Ring { epoch, .. } => epoch,
            // (ring_writer hands out a guard on a ring only)
            _ => u32::MAX,
        }
    }

    pub(super) fn sent(&mut self, n: usize) {
        let _ = self.0.path.record_sent(n as u64);
    }
}
