// SPDX-License-Identifier: GPL-2.0
//! The receiving direction on TCP: control frames in order, the peer's raw
//! runs off the inbound leg (`pull`), our control frames back.

use super::*;

/// Where the stream's bytes go as they come off the inbound leg.
pub(super) enum Sink<'m> {
    /// the receive buffer (a peeking reader, FIONREAD)
    Buffer,
    /// none: control frames only (the work item, poll), which leave the
    /// bytes to the application's recvmsg
    Control,
    /// straight into the user buffers of the recvmsg being served, at
    /// most `left` bytes in all: one copy and one `tcp_recvmsg`, as TCP's
    /// own recvmsg
    User {
        msg: &'m mut Msg,
        left: usize,
        got: usize,
        fault: bool,
    },
}

/// Takes the queued control frames, then reads the inbound leg into
/// `sink`. Caller holds the rx pipe's consumer (if a ring is in use) and
/// `sw.rx`; on Err it resets the connection after releasing them (the
/// reset takes the rings' locks).
pub(super) fn pull_frames(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    pull(xs, sw, r, ids, &mut Sink::Buffer)
}

pub(super) fn pull(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
    sink: &mut Sink<'_>,
) -> core::result::Result<(), &'static str> {
    let res = pull_inner(xs, sw, r, ids, sink);
    if res.is_err() {
        r.leg = None;
    }
    res
}

/// How many bytes of the run the inbound leg carries may be read now:
/// up to the end of stream, and up to a `RingFrom` already here (the bytes
/// after it are not on this leg); 0 when no run is open.
pub(super) fn run_room(sw: &Switch, r: &RxSide) -> u64 {
    if !r.order.run_open() || r.path.reads_ring() {
        return 0;
    }
    let taken = r.path.taken();
    let mut room = u64::MAX;
    if let Some(eof) = r.path.eof_at() {
        room = room.min(eof.saturating_sub(taken));
    }
    if let Some(end) = sw.rx_ctl.lock().run_end() {
        room = room.min(end.saturating_sub(taken));
    }
    room
}

/// The inbound leg ended (EOF, `failed`: an error) with the stream not
/// done: an error once no control frame can say otherwise (the peer's
/// `Fin` and `RingFrom` come on the other leg, and may come after).
pub(super) fn leg_ended(
    sw: &Switch,
    r: &RxSide,
    failed: bool,
) -> core::result::Result<(), &'static str> {
    let done = r.path.eof_at() == Some(r.path.taken());
    if done || r.path.reads_ring() {
        return Ok(());
    }
    if failed {
        return Err("inbound leg failed");
    }
    if sw.ctl_in_closed.load(Ordering::Acquire) && sw.rx_ctl.lock().front().is_none() {
        return Err("inbound leg closed mid-stream");
    }
    Ok(())
}

pub(super) fn pull_inner(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
    sink: &mut Sink<'_>,
) -> core::result::Result<(), &'static str> {
    loop {
        take_rx_ctl(xs, sw, r, ids)?;
        own_inbound(xs, sw, r);
        if r.data_eof {
            return leg_ended(sw, r, false);
        }
        let room = usize::try_from(run_room(sw, r)).unwrap_or(usize::MAX);
        if room == 0 {
            return Ok(());
        }
        let Some(leg) = r.leg.as_ref() else {
            return Ok(());
        };
        // an empty leg is seen without a call: a reader that caught up
        // with the stream made one more that said EAGAIN per recvmsg
        if !leg.sock().readable() {
            return Ok(());
        }
        let res = match sink {
            Sink::User { msg, left, got, .. } => {
                let want = room.min(*left - *got);
                if want == 0 {
                    return Ok(());
                }
                leg.sock().recv_to_user(msg, want).inspect(|n| *got += n)
            }
            Sink::Buffer => {
                let Some(b) = r.buf.as_mut() else {
                    return Ok(());
                };
                let tail = b.tail_room();
                let want = room.min(tail.len());
                if want == 0 {
                    // full: the leg waits (TCP's window closes) until the reader takes some
                    return Ok(());
                }
                leg.sock().recv(&mut tail[..want]).inspect(|n| b.commit(*n))
            }
            Sink::Control => return Ok(()),
        };
        match res {
            Ok(0) => r.data_eof = true,
            Ok(n) => {
                let taken = r.path.taken();
                r.path
                    .on_data(taken, n as u64)
                    .map_err(|_| "stream bytes past their end")?;
            }
            Err(x) if x == e::EAGAIN => return Ok(()),
            Err(x) if x == e::EFAULT => {
                // the user's buffer, not the leg: the bytes stay queued
                if let Sink::User { fault, .. } = sink {
                    *fault = true;
                }
                return Ok(());
            }
            Err(_) => {
                r.data_eof = true;
                return leg_ended(sw, r, true);
            }
        }
    }
}

/// Takes the receiving direction's control frames (`Switch::rx_ctl`) in
/// order, as far as they can be taken now: as on one ordered stream, a
/// `RingFrom` waits until every byte before it was read off the leg, and
/// what follows it waits with it. Caller holds `sw.rx` (and the rx pipe's
/// consumer, if a ring is in use).
pub(super) fn take_rx_ctl(
    xs: &XenSock,
    sw: &Switch,
    r: &mut RxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    loop {
        let Some(f) = sw.rx_ctl.lock().front() else {
            return Ok(());
        };
        let was_ring = matches!(r.path.state(), RxState::Ring { .. });
        // a TxFreeze: we keep what we took, the sender resends the rest
        let Some(taken) = r.order.take(&mut r.path, f).map_err(|e| e.what())? else {
            return Ok(());
        };
        match taken {
            RxControlTaken::Run | RxControlTaken::Fin => {}
            RxControlTaken::RingFrom {
                epoch,
                offset,
                outcome,
            } => {
                if outcome == RingFromOutcome::Switch {
                    let Some(p) = r.offered.take() else {
                        return Err("RingFrom without a ring");
                    };
                    let old = xs.inner.lock().rx.replace(p);
                    drop(old);
                    if let Some(l) = r.offered_via.take() {
                        // only the domain the ring was granted to could
                        // have mapped it, and only the peer writes on our
                        // outbound leg's way back
                        pr_info!("connection {}: dom{} proved to be the peer (switched onto the ring granted to it)\n", ids.conn_id, l.peer);
                        r.adopt = Some(l);
                        net::schedule();
                    }
                    sw.to_ring.fetch_add(1, Ordering::Relaxed);
                    inc(&counters::TO_RING, 1);
                    pr_info!(
                        "connection {}: rx back on a ring (epoch {}) from {}\n",
                        ids.conn_id,
                        epoch,
                        offset
                    );
                }
            }
            RxControlTaken::TxFreeze {
                epoch,
                offset,
                consumed,
            } => {
                r.clock.saw_freeze(epoch);
                if let Some(n) = consumed {
                    if !push_ctl(
                        sw,
                        &Message::Consumed {
                            conn_id: ids.peer_conn,
                            epoch: n.epoch,
                            offset: n.offset,
                        },
                    ) {
                        return Err("control queue full");
                    }
                    if was_ring {
                        sw.to_tcp.fetch_add(1, Ordering::Relaxed);
                        inc(&counters::TO_TCP, 1);
                        // no one reads that ring again (the caller holds its consumer)
                        let old = xs.inner.lock().rx.take();
                        drop(old);
                    }
                    if !matches!(r.path.state(), RxState::Offered { .. }) {
                        let dead = r.offered.take();
                        drop(dead);
                    }
                    pr_info!(
                        "connection {}: rx: sender froze ring {} at {}; on TCP from {}\n",
                        ids.conn_id,
                        epoch,
                        offset,
                        n.offset
                    );
                }
            }
        }
        sw.rx_ctl.lock().pop();
    }
}

/// Sends our queued control frames on the inbound leg (caller holds
/// `sw.rx`, which holds the leg).
pub(super) fn flush_ctl(sw: &Switch, r: &mut RxSide) {
    let Some(leg) = r.leg.as_ref() else { return };
    let mut q = sw.ctl.lock();
    let Some(q) = q.as_mut() else { return };
    while !q.is_empty() {
        match leg.sock().send_nb(q.front(), false) {
            Ok(n) if n > 0 => q.consume(n),
            Ok(_) => return,
            Err(x) if x == e::EAGAIN => return,
            Err(_) => {
                // the leg is gone (the peer closed it): nothing queued
                // here can reach the peer any more, and a close must not
                // wait for it (`service`'s tx_done)
                let n = q.len();
                q.consume(n);
                return;
            }
        }
    }
}
