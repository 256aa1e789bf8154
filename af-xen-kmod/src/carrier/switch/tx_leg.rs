// SPDX-License-Identifier: GPL-2.0
//! The sending direction on TCP: dialling the outbound leg (proto's dial),
//! its queue and resends, the control stream back (`read_tx_leg`).

use super::*;

/// Sends what the outbound leg takes without blocking.
pub(super) fn flush_tx(t: &mut TxSide) {
    if !t.leg_up {
        return;
    }
    let Some(leg) = t.leg.as_ref() else { return };
    while t.hello_left > 0 {
        let start = leg::HELLO_LEN - t.hello_left;
        match leg.sock().send_nb(&t.hello[start..], false) {
            Ok(n) if n > 0 => t.hello_left -= n.min(t.hello_left),
            Ok(_) => return,
            Err(x) if x == e::EAGAIN => return,
            Err(_) => {
                t.broken = true;
                return;
            }
        }
    }
    let Some(q) = t.q.as_mut() else { return };
    while !q.is_empty() {
        match leg.sock().send_nb(q.front(), false) {
            Ok(n) if n > 0 => q.consume(n),
            Ok(_) => return,
            Err(x) if x == e::EAGAIN => return,
            Err(_) => {
                t.broken = true;
                return;
            }
        }
    }
}

/// Resend copy into the queue (raw: its run's `RawFrom` went with the
/// `Consumed` that started it), then `Fin`, then a pending ring offer.
pub(super) fn pump_tx(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    let Some(q) = t.q.as_mut() else { return Ok(()) };
    while t.resend_pos < t.resend_end && q.room() > 0 {
        let n = (t.resend_end - t.resend_pos).min(q.room());
        q.push(&t.resend[t.resend_pos..t.resend_pos + n]);
        t.resend_pos += n;
        t.resend_off += n as u64;
        inc(&counters::RESENT_BYTES, n as i64);
    }
    if t.resend_pos < t.resend_end {
        return Ok(());
    }
    if !t.resend.is_empty() && !matches!(t.path.state(), TxState::Frozen { .. }) {
        t.resend = KVVec::new();
        t.resend_pos = 0;
        t.resend_end = 0;
    }
    if t.path.state() != TxState::Tcp {
        return Ok(());
    }
    if t.path.is_finished() && !t.fin_sent {
        if !push_ctl(
            sw,
            &Message::Fin {
                conn_id: ids.peer_conn,
                offset: t.path.sent(),
            },
        ) {
            return Ok(());
        }
        t.fin_sent = true;
    }
    if let Some(grant) = t.offer {
        if t.path.offer_waits_for_consumed(grant.epoch) {
            return Ok(());
        }
        t.offer = None;
        take_offer(xs, sw, t, ids, &grant)?;
    }
    Ok(())
}

/// Connects the outbound leg when it is wanted, and follows its connect,
/// as proto's dial says.
pub(super) fn leg_tx(xs: &XenSock, t: &mut TxSide, ids: &Ids, peer_heard: bool) {
    let now = net::now_ms();
    if let Some(leg) = t.leg.as_ref().filter(|_| !t.leg_up) {
        match leg.sock().state() {
            Ok(true) => {
                t.leg_up = true;
                t.dial.connected();
                // from here the carrier's own bound (leg_unanswered):
                // TCP_USER_TIMEOUT also ends a live peer's zero window
                leg.sock().set_user_timeout(0);
                leg::leg_out();
            }
            Ok(false) => {}
            Err(_) => {
                // refused or unreachable: try again until the bound
                t.leg = None;
                t.dial.failed(now);
            }
        }
    }
    match t.dial.step(t.want_leg && !t.broken, peer_heard, now) {
        DialStep::Idle | DialStep::WaitUntil(_) => return,
        DialStep::Connect => {}
        DialStep::ConnectAgain => {
            pr_info!(
                "connection {}: leg to the peer not up yet, connecting again\n",
                ids.conn_id
            );
            t.leg = None;
            inc(&counters::LEG_RETRIES, 1);
        }
    }
    let peer = xs.inner.lock().tcp;
    let a = &peer.peer.addr;
    if peer.peer.port == 0 || a[..10].iter().any(|b| *b != 0) || a[10] != 0xff || a[11] != 0xff {
        t.broken = true;
        return;
    }
    match TcpSock::connect_start(
        [a[12], a[13], a[14], a[15]],
        peer.peer.port,
        net::peer_lost_ms() as u32,
    ) {
        Ok(s) => {
            let n = Message::TcpHello {
                conn_id: ids.peer_conn,
                cookie: peer.cookie,
            }
            .encode(&mut t.hello)
            .unwrap_or(0);
            t.hello_left = n;
            let leg = leg::HeldLeg::new(s);
            if let Some(sw) = sw_of(xs) {
                own(xs, &sw, &leg);
            }
            t.owner_writes = false;
            t.leg = Some(leg);
            t.leg_up = false;
            t.dial.connecting(now);
            inc(&counters::LEG_CONNECTS, 1);
        }
        Err(x) => {
            pr_info!(
                "connection {}: leg to the peer: error {}, retrying\n",
                ids.conn_id,
                x
            );
            t.dial.failed(now);
        }
    }
}

/// Reads the peer's control frames off our outbound leg: `Consumed` (and
/// `Reset`) are handled here, the receiving direction's are queued for it
/// (`Switch::rx_ctl`, taken under `Switch::rx` by `take_rx_ctl`).
pub(super) fn read_tx_leg(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
) -> core::result::Result<(), &'static str> {
    if !t.leg_up {
        return Ok(());
    }
    loop {
        let Some(leg) = t.leg.as_ref() else {
            return Ok(());
        };
        let need = if t.ib_got < ctrl::HEADER_LEN {
            ctrl::HEADER_LEN
        } else {
            control_stream::frame_len(&t.ib[..ctrl::HEADER_LEN], ids.conn_id)
                .map_err(|_| "breach of the control stream")?
        };
        if t.ib_got < need {
            let got = t.ib_got;
            match leg.sock().recv(&mut t.ib[got..need]) {
                Ok(0) => {
                    // the peer closed its end: fine once we are done (its
                    // control frames end too: a reader still waiting for
                    // one learns none comes)
                    t.broken = true;
                    t.leg = None;
                    sw.ctl_in_closed.store(true, Ordering::Release);
                    if matches!(t.path.state(), TxState::Frozen { .. }) {
                        return Err("outbound leg closed while frozen");
                    }
                    return Ok(());
                }
                Ok(n) => t.ib_got += n,
                Err(x) if x == e::EAGAIN => return Ok(()),
                Err(_) => {
                    t.broken = true;
                    t.leg = None;
                    sw.ctl_in_closed.store(true, Ordering::Release);
                    if matches!(t.path.state(), TxState::Frozen { .. }) {
                        return Err("outbound leg failed while frozen");
                    }
                    return Ok(());
                }
            }
            continue;
        }
        let frame = t.ib;
        t.ib_got = 0;
        let for_rx = match control_stream::decode_frame(&frame[..need], ids.conn_id)
            .map_err(|_| "breach of the control stream")?
        {
            LegControl::Consumed { epoch, offset } => {
                on_consumed(xs, sw, t, ids, epoch, offset)?;
                None
            }
            LegControl::Reset => return Err("peer reset"),
            LegControl::Receiving(f) => Some(f),
        };
        if let Some(f) = for_rx {
            if sw.rx_ctl.lock().push(f).is_err() {
                return Err("control frames pile up unanswered");
            }
        }
    }
}

pub(super) fn on_consumed(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
    epoch: u32,
    offset: u64,
) -> core::result::Result<(), &'static str> {
    let mut out = t
        .path
        .on_consumed(epoch, offset)
        .map_err(|_| "bad Consumed")?;
    if out == ConsumedOutcome::FreezeFirst {
        freeze_tx_locked(xs, sw, t)?;
        out = t
            .path
            .on_consumed(epoch, offset)
            .map_err(|_| "bad Consumed")?;
    }
    if let ConsumedOutcome::Resend(r) = out {
        let skip = r.skip as usize;
        let len = r.len as usize;
        if skip + len > t.resend.len() {
            return Err("resend beyond the copy");
        }
        // a run from r.from on the leg: its bytes (the resend, then the
        // application's) follow whatever of the last run is still queued
        // for the leg, in order
        if !push_ctl(
            sw,
            &Message::RawFrom {
                conn_id: ids.peer_conn,
                offset: r.from,
            },
        ) {
            return Err("control queue full");
        }
        t.resend_pos = skip;
        t.resend_end = skip + len;
        t.resend_off = r.from;
        t.fin_sent = false;
        sw.to_tcp.fetch_add(1, Ordering::Relaxed);
        inc(&counters::TO_TCP, 1);
        pr_info!(
            "connection {}: tx on TCP, resending {} bytes from {}\n",
            ids.conn_id,
            len,
            r.from
        );
    }
    Ok(())
}
