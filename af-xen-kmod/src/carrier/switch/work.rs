// SPDX-License-Identifier: GPL-2.0
//! The TCP work item: one pass over every active switch (`service`), the
//! legs' liveness and the peer heard from.

use super::*;

/// The work item's pass over one active connection. Returns false once
/// it is done with it (closed and flushed, or reset).
pub(crate) fn service(xs: &Arc<XenSock>, heard: &[[u8; 4]]) -> bool {
    let Some(sw) = sw_of(xs) else { return false };
    let ids = ids(xs);
    // the peer's address answered on some leg since the last pass
    let peer_heard = !heard.is_empty() && peer_ip(xs).is_some_and(|ip| heard.contains(&ip));
    let (reset, state) = {
        let i = xs.inner.lock();
        (i.reset, i.state)
    };
    let now = net::now_ms();
    if reset {
        release_legs(&sw);
        return false;
    }
    let closed = sw.closed.load(Ordering::Acquire) || state != SockState::Connected;
    adopt_proven(xs, &sw);
    // sending direction
    let tx_err = {
        let mut t = sw.tx.lock();
        leg_tx(xs, &mut t, &ids, peer_heard);
        let r = read_tx_leg(xs, &sw, &mut t, &ids).and_then(|_| loop {
            let before = t.resend_pos;
            pump_tx(xs, &sw, &mut t, &ids)?;
            flush_tx(&mut t);
            // a resend bigger than the queue goes on while the leg takes
            // it: a leg that drains the queue without filling up raises no
            // write_space, and the rest waited for the next tick (256 KiB
            // per 100 ms while the link was down, forever without ticks)
            if t.resend_pos == before || t.resend_pos >= t.resend_end || t.broken {
                break Ok(());
            }
        });
        flush_tx(&mut t);
        own_outbound(xs, &sw, &mut t);
        r
    };
    if let Err(why) = tx_err {
        fail(xs, why);
        release_legs(&sw);
        return false;
    }
    // receiving direction (the ring's consumer first, see the lock order)
    {
        let pipe = xs.inner.lock().rx.clone();
        let c = pipe.as_ref().map(|p| p.rx.lock());
        let mut r = sw.rx.lock();
        // a ring put in by a reader's own pull in between: next pass. On
        // TCP the application's recvmsg pulls for itself, one copy straight
        // into its buffers (the leg's callbacks wake it, poll says readable
        // when the leg is); the work item pulled into the buffer and the
        // reader copied it out again, preempted by it 5-6 times per MiB.
        // Bytes the application does not read wait in the leg, as in a
        // TCP socket; the control frames
        // (which come on the other leg) are taken here.
        let res = if closed || !same_pipe(&xs.inner.lock().rx, &pipe) {
            Ok(())
        } else {
            pull(xs, &sw, &mut r, &ids, &mut Sink::Control)
        };
        own_inbound(xs, &sw, &mut r);
        flush_ctl(&sw, &mut r);
        drop(r);
        drop(c);
        if let Err(why) = res {
            fail(xs, why);
        }
    }
    if xs.inner.lock().reset {
        release_legs(&sw);
        wake(
            xs,
            POLLIN | POLLOUT | POLLERR | POLLHUP | POLLRDNORM | POLLWRNORM,
        );
        return false;
    }
    kick_if_heard(&sw, peer_heard);
    // a leg unanswered at every look for the bound: the peer died (or is
    // away for longer than peer_lost_ms) with the legs up
    let (holds, unanswered) = leg_unanswered(&sw, now);
    let bound = net::peer_lost_ms();
    if liveness::peer_lost(unanswered, bound) {
        inc(&counters::PEER_LOST, 1);
        if !closed {
            fail(xs, "peer lost: a leg unanswered for peer_lost_ms");
        }
        release_legs(&sw);
        return false;
    }
    if holds {
        net::live_after_ms(liveness::look_every_ms(bound) as u32);
    }
    // both legs up: the bound stops (leg_unanswered covers the rest)
    let (out_up, tx_done, connecting) = {
        let t = sw.tx.lock();
        let on_ring = matches!(t.path.state(), TxState::Ring { .. });
        // off the ring, a broken outbound leg (never made again, leg_tx)
        // leaves a closed connection nothing to send: it held the socket
        // until peer_lost_ms when the peer closed first and let go of the
        // leg before our Fin (three in four rounds)
        // (our control frames too: the Fin or RingFrom that ends the stream
        // on TCP goes on the inbound leg, which release_legs closes)
        let done = (t.broken && !on_ring)
            || (t.q.as_ref().map(|q| q.is_empty()).unwrap_or(true)
                && t.hello_left == 0
                && t.resend_pos >= t.resend_end
                && (t.fin_sent || (on_ring && ring_all_taken(xs, &t)))
                && ctl_flushed(&sw));
        let connecting = !t.leg_up && t.want_leg && !t.broken;
        (t.leg_up, done, connecting)
    };
    let in_up = sw.rx.lock().leg.is_some();
    if !closed && out_up && in_up {
        sw.deadline.store(0, Ordering::Release);
    }
    if closed && tx_done {
        release_legs(&sw);
        return false;
    }
    let d = sw.deadline.load(Ordering::Acquire);
    if d != 0 && now > d {
        if closed {
            release_legs(&sw);
            return false;
        }
        inc(&counters::PEER_LOST, 1);
        fail(xs, "peer lost: legs not up within peer_lost_ms");
        release_legs(&sw);
        return false;
    }
    let waits = !closed && maybe_offer(xs, &sw, &ids, now);
    if d != 0 || connecting || waits {
        net::tick_after_ms(TICK_MS);
    }
    wake(xs, POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM | POLLRDHUP);
    true
}

/// Whether the receiver took every byte written into the ring this
/// direction is on (caller holds `Switch::tx`, which comes before the
/// pipe's producer). A closed connection keeps its legs until then: the
/// receiver may still abandon the ring it offered (an offer it thought
/// unanswered, behind a TCP retransmission), and its `Consumed` then makes
/// us resend the ring's bytes on TCP (seen: the sender
/// closed on a ring the receiver had abandoned, its legs went with the
/// close, and the receiver reset without the stream's last 131072 bytes).
pub(super) fn ring_all_taken(xs: &XenSock, t: &TxSide) -> bool {
    let pipe = xs.inner.lock().tx.clone().or_else(|| t.closed_ring.clone());
    let Some(p) = pipe else { return true };
    let mut prod = p.tx.lock();
    // a reader that closed or reset takes nothing more: nothing to wait for
    let gone = prod
        .reader_end()
        .map(|r| r.closed || r.reset)
        .unwrap_or(true);
    gone || matches!(prod.unconsumed(), Ok(0))
}

/// The IPv4 address of the peer's end of the legs, if it has one.
pub(super) fn peer_ip(xs: &XenSock) -> Option<[u8; 4]> {
    let a = xs.inner.lock().tcp.peer.addr;
    let v4 = a[..10].iter().all(|b| *b == 0) && a[10] == 0xff && a[11] == 0xff;
    v4.then(|| [a[12], a[13], a[14], a[15]])
}

/// Whether a segment arrived on either leg of `xs`'s connection since the
/// TCP work item last looked (a leg put in since counts too): its peer's
/// address, which is reachable then. The work item asks every active
/// connection before its pass and hands the addresses to `service`.
pub(crate) fn heard_from(xs: &XenSock) -> Option<[u8; 4]> {
    let sw = sw_of(xs)?;
    let inbound = sw
        .rx
        .lock()
        .leg
        .as_ref()
        .map(|l| l.sock().segs_in())
        .unwrap_or(0);
    let mut t = sw.tx.lock();
    let heard = inbound.wrapping_add(t.leg.as_ref().map(|l| l.sock().segs_in()).unwrap_or(0));
    if heard == t.heard {
        return None;
    }
    t.heard = heard;
    drop(t);
    peer_ip(xs)
}

/// After a save, the peer's bytes sent to us while we were away, and ours
/// to a peer that was away, come with the sender's next TCP retransmission,
/// backed off by then (1, 3, 7, 15, 31 s ...): the pause after a restore
/// could last about as long again as the suspension (docs/migration.md,
/// "Around a save"). Once the peer's address is heard from again, on a leg
/// of this connection or of any other (`heard_from`), a backed-off
/// retransmission on either leg fires now (sys_net kick_retransmit): the
/// outbound one carries our data and `TxFreeze`, the inbound one our
/// `Consumed`. A connection whose frames all went out before the save
/// hears nothing on its own legs, and its `TxFreeze` (or the peer's
/// `Consumed`) waited out the back-off while its sibling streamed
/// (7 s after the restore). Evidence of
/// reception only: a kick into a path still down would double the back-off
/// again.
pub(super) fn kick_if_heard(sw: &Switch, peer_heard: bool) {
    if !peer_heard {
        return;
    }
    let mut kicked = 0;
    {
        let t = sw.tx.lock();
        if let (true, Some(leg)) = (t.leg_up, t.leg.as_ref()) {
            kicked += i64::from(leg.sock().kick_retransmit());
        }
    }
    if let Some(leg) = sw.rx.lock().leg.as_ref() {
        kicked += i64::from(leg.sock().kick_retransmit());
    }
    if kicked > 0 {
        inc(&counters::LEG_KICKS, kicked);
    }
}

/// Looks at both legs (`TcpSock::waits`) at `now`: whether either holds
/// bytes its peer has not acknowledged, and for how long (ms) either has
/// been unanswered at every look without a break. A live peer answers a
/// retransmission or probe within a round trip, so one look that finds it
/// answered starts the count over.
pub(super) fn leg_unanswered(sw: &Switch, now: u64) -> (bool, Option<u64>) {
    fn look(leg: Option<&leg::HeldLeg>, clock: &mut Unanswered, now: u64) -> (bool, Option<u64>) {
        let waits = leg.and_then(|l| l.sock().waits());
        (waits.is_some(), clock.look(waits, now))
    }
    let (th, tu) = {
        let mut t = sw.tx.lock();
        let t = &mut *t;
        let leg = if t.leg_up { t.leg.as_ref() } else { None };
        look(leg, &mut t.unanswered, now)
    };
    let (rh, ru) = {
        let mut r = sw.rx.lock();
        let r = &mut *r;
        look(r.leg.as_ref(), &mut r.unanswered, now)
    };
    (th || rh, tu.max(ru))
}

pub(super) fn release_legs(sw: &Switch) {
    let (a, b, ring) = {
        let mut t = sw.tx.lock();
        t.leg_up = false;
        let a = t.leg.take();
        let ring = t.closed_ring.take();
        let mut r = sw.rx.lock();
        (a, r.leg.take(), ring)
    };
    drop((a, b, ring));
}

/// The TCP work item (the legs' socket callbacks, deadlines): legs that
/// authenticated go to their connections' switches, then every active
/// switch is serviced.
pub(crate) fn work() {
    let t0 = net::now_ms();
    counters::TCP_WORK_PASSES.fetch_add(1, Ordering::Relaxed);
    work_pass();
    // a pass that blocks holds up every leg's frames and every wake of a
    // socket on TCP (an epoll reader waits for those): shown in the stats
    crate::sys::counters::note_work_ms(&crate::sys::counters::TCP_WORK_MAX_MS, net::now_ms() - t0);
}

pub(super) fn work_pass() {
    // outside the legs' lock: the switch takes its own locks
    for (xs, sock) in leg::take_authenticated().into_iter() {
        // no TCP_USER_TIMEOUT on an established leg: leg_unanswered
        if attach_inbound(&xs, leg::HeldLeg::new(sock)).is_err() {
            // a second leg for one connection, or no switch: closed
            leg::refused();
        }
    }
    let active = leg::active_snapshot();
    // peers' addresses that answered on some leg since the last pass: every
    // connection to them kicks its backed-off legs (kick_if_heard)
    let mut heard: KVec<[u8; 4]> = KVec::new();
    for xs in active.iter() {
        if let Some(ip) = heard_from(xs) {
            if !heard.contains(&ip) {
                let _ = heard.push(ip, GFP_KERNEL);
            }
        }
    }
    let mut done: KVec<Arc<XenSock>> = KVec::new();
    for xs in active.iter() {
        if !service(xs, &heard) {
            let _ = done.push(xs.clone(), GFP_KERNEL);
        }
    }
    if !active.is_empty() {
        // connections on TCP wait for their link: do not rely on watches alone
        crate::link::poll_down_links::<XenSock>();
    }
    leg::retire(&done);
}
