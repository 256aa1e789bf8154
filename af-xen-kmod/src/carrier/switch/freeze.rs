// SPDX-License-Identifier: GPL-2.0
//! Triggers and freezes: a connection leaves its rings (`peer_gone`), each
//! direction stops where proto says.

use super::*;

/// The link to the peer went away while the connection is up (the peer
/// left this host's co-residency, moved, or its link was retracted):
/// freeze both directions and continue on TCP. False when the connection
/// cannot switch (no switch, no TCP endpoint, not connected): the caller
/// resets it as before.
pub(crate) fn peer_gone(xs: &Arc<XenSock>) -> bool {
    let (sw, ok) = {
        let i = xs.inner.lock();
        (
            i.sw.clone(),
            i.state == SockState::Connected && !i.reset && !i.released && i.tcp.peer.port != 0,
        )
    };
    let Some(sw) = sw else { return false };
    if !ok || leg::legs_disabled() {
        return false;
    }
    inc(&counters::TRIGGERS, 1);
    pr_info!(
        "connection {}: peer's link gone, switching to TCP\n",
        xs.inner.lock().conn_id
    );
    leg::hold_hellos_for_peer_lost();
    activate(xs, &sw);
    start_bound(&sw);
    {
        let mut t = sw.tx.lock();
        if let Err(why) = freeze_tx_locked(xs, &sw, &mut t) {
            drop(t);
            fail(xs, why);
            return true;
        }
        t.want_leg = true;
    }
    if let Err(why) = freeze_rx(xs, &sw) {
        fail(xs, why);
        return true;
    }
    net::schedule();
    wake(xs, POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM);
    true
}

/// Stops writing the ring (if it is in use), keeps a copy of what the
/// receiver has not consumed, queues `TxFreeze`. Caller holds `sw.tx`.
pub(super) fn freeze_tx_locked(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
) -> core::result::Result<(), &'static str> {
    tx_activate(t).map_err(|_| "no memory for the send queue")?;
    let ids = ids(xs);
    let mut copy = KVVec::new();
    let mut unconsumed = 0u64;
    let pipe = if let TxState::Ring { .. } = t.path.state() {
        // after close the socket no longer holds the ring: closing() kept it
        let pipe = xs.inner.lock().tx.take().or_else(|| t.closed_ring.take());
        if let Some(p) = &pipe {
            let mut prod = p.tx.lock();
            let n = prod.unconsumed().map_err(|_| "ring index out of range")? as usize;
            copy = KVVec::from_elem(0u8, n, GFP_KERNEL)
                .map_err(|_| "no memory for the resend copy")?;
            // the receiver may still be reading (a move it has not noticed
            // yet): what it consumed since the look above is its, and the
            // copy is the rest, the last `got` bytes written. Requiring
            // got == n reset such connections ("ring read back short",
            // once in 100 moves)
            let got = prod
                .read_back(&mut copy)
                .map_err(|_| "ring index out of range")?;
            if got < n {
                // (the kernel's Vec has no truncate in 6.12)
                let mut rest = KVVec::from_elem(0u8, got, GFP_KERNEL)
                    .map_err(|_| "no memory for the resend copy")?;
                rest.copy_from_slice(&copy[..got]);
                copy = rest;
            }
            unconsumed = got as u64;
        }
        pipe
    } else {
        None
    };
    let notice = t.path.freeze(unconsumed).map_err(|_| "freeze")?;
    if matches!(t.path.state(), TxState::Frozen { .. }) && pipe.is_some() {
        t.resend = copy;
        t.resend_pos = 0;
        t.resend_end = 0;
    }
    t.fin_sent = false;
    if !push_ctl(
        sw,
        &Message::TxFreeze {
            conn_id: ids.peer_conn,
            epoch: notice.epoch,
            offset: notice.offset,
        },
    ) {
        return Err("control queue full");
    }
    pr_info!(
        "connection {}: tx froze ring {} at {} ({} bytes to resend)\n",
        ids.conn_id,
        notice.epoch,
        notice.offset,
        unconsumed
    );
    // the mapping goes outside the switch lock's critical work
    drop(pipe);
    Ok(())
}

/// The receiving direction leaves its ring on its own: what was taken is
/// kept, the rest comes again from the sender (`Consumed{taken}`).
pub(super) fn freeze_rx(xs: &XenSock, sw: &Switch) -> core::result::Result<(), &'static str> {
    loop {
        let pipe = xs.inner.lock().rx.clone();
        let c = pipe.as_ref().map(|p| p.rx.lock());
        let r = sw.rx.lock();
        // a RingFrom may have put a new ring in between: lock that one
        if !same_pipe(&xs.inner.lock().rx, &pipe) {
            continue;
        }
        return freeze_rx_locked(xs, sw, pipe.clone(), c, r);
    }
}

pub(super) fn same_pipe(a: &Option<Arc<Pipe>>, b: &Option<Arc<Pipe>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

pub(super) type ConsumerGuard<'a> = kernel::sync::lock::Guard<
    'a,
    crate::proto::ring::Consumer<crate::proto::mem::RawRing>,
    kernel::sync::lock::mutex::MutexBackend,
>;

pub(super) type RxGuard<'a> =
    kernel::sync::lock::Guard<'a, RxSide, kernel::sync::lock::mutex::MutexBackend>;

pub(super) fn freeze_rx_locked(
    xs: &XenSock,
    sw: &Switch,
    pipe: Option<Arc<Pipe>>,
    c: Option<ConsumerGuard<'_>>,
    mut r: RxGuard<'_>,
) -> core::result::Result<(), &'static str> {
    rx_activate(&mut r).map_err(|_| "no memory for the receive buffer")?;
    if let (RxState::Ring { .. }, Some(c)) = (r.path.state(), c.as_ref()) {
        // a FIN the ring showed with every byte taken: end of stream known
        if let (Ok(0), Ok(end)) = (c.readable(), c.peer_end()) {
            if end.fin {
                let taken = r.path.taken();
                let _ = r.path.on_fin(taken);
            }
        }
    }
    let was_ring = matches!(r.path.state(), RxState::Ring { .. });
    if let Some(n) = r.path.freeze_local() {
        let peer_conn = xs.inner.lock().peer_conn;
        if !push_ctl(
            sw,
            &Message::Consumed {
                conn_id: peer_conn,
                epoch: n.epoch,
                offset: n.offset,
            },
        ) {
            return Err("control queue full");
        }
        if was_ring {
            r.clock.left_ring(n.epoch, net::now_ms());
            sw.to_tcp.fetch_add(1, Ordering::Relaxed);
            inc(&counters::TO_TCP, 1);
        }
        pr_info!(
            "connection {}: rx left ring {} at {}\n",
            xs.inner.lock().conn_id,
            n.epoch,
            n.offset
        );
    }
    let dead_offer = if matches!(r.path.state(), RxState::Offered { .. }) {
        None
    } else {
        r.offered.take()
    };
    drop(r);
    drop(c);
    let old = xs.inner.lock().rx.take();
    drop((old, dead_offer, pipe));
    Ok(())
}
