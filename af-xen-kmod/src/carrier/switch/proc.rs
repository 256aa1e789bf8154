// SPDX-License-Identifier: GPL-2.0
//! What `/proc/net/af_xen_stats` and `/proc/net/af_xen` show of the
//! switches.

use super::*;

/// /proc/net/af_xen_stats lines of the switch: its moves, the offers from
/// a moved peer's new domain, the work items and the waits on TCP, and
/// the application's calls on TCP and theirs into the legs.
pub(crate) fn stats(seq: &mut crate::sys::Seq) {
    use counters::*;
    use net::leg_calls;
    let g = |c: &AtomicI64| c.load(Ordering::Relaxed);
    seq.counters(&[
        ("switch_triggers", g(&TRIGGERS)),
        ("switch_to_tcp", g(&TO_TCP)),
        ("switch_to_ring", g(&TO_RING)),
        ("switch_offers_sent", g(&OFFERS_SENT)),
        ("switch_offers_taken", g(&OFFERS_TAKEN)),
        ("switch_peer_lost", g(&PEER_LOST)),
        ("switch_resent_bytes", g(&RESENT_BYTES)),
        ("switch_leg_connects", g(&LEG_CONNECTS)),
        ("switch_leg_retries", g(&LEG_RETRIES)),
        ("switch_peer_candidates", g(&CANDIDATES)),
        ("switch_peers_proved", g(&PEERS_PROVED)),
        ("switch_peers_followed", g(&PEERS_FOLLOWED)),
        ("switch_leg_kicks", g(&LEG_KICKS)),
        ("tcp_work_max_ms", g(&crate::sys::counters::TCP_WORK_MAX_MS)),
        (
            "link_work_max_ms",
            g(&crate::sys::counters::LINK_WORK_MAX_MS),
        ),
        ("tcp_work_passes", g(&TCP_WORK_PASSES)),
        ("tcp_read_waits", g(&TCP_READ_WAITS)),
        ("tcp_write_waits", g(&TCP_WRITE_WAITS)),
        ("tcp_tx_direct_bytes", g(&TX_DIRECT_BYTES)),
        ("tcp_tx_queued_bytes", g(&TX_QUEUED_BYTES)),
        ("tcp_send_steps", g(&SEND_STEPS)),
        ("tcp_recv_steps", g(&RECV_STEPS)),
        ("tcp_leg_sends", leg_calls::get(&leg_calls::SENDS)),
        ("tcp_leg_recvs", leg_calls::get(&leg_calls::RECVS)),
        ("tcp_nospace_armed", leg_calls::nospace_armed()),
    ]);
}

/// /proc/net/af_xen_tcp's lines of one connection on a switch: what each
/// direction's carrier holds and what its leg's socket says (a stream
/// that stands still shows who waits for what; bench's stall_watch).
pub(crate) fn tcp_show(conn: u32, sw: &Switch, seq: &mut crate::sys::Seq) {
    use core::fmt::Write;
    let leg = |l: Option<&leg::HeldLeg>| l.map(|l| l.sock().info());
    let mut l = crate::sys::Line::new();
    {
        let t = sw.tx.lock();
        let state = match t.path.state() {
            TxState::Ring { .. } => "ring",
            TxState::Frozen { .. } => "frozen",
            TxState::Tcp => "tcp",
        };
        let _ = write!(
            l,
            "{conn} tx {state} sent {} queued {} up {} hello {} broken {} resend {} offer {} waits {} owner_writes {}",
            t.path.sent(),
            t.q.as_ref().map(|q| q.len()).unwrap_or(0),
            t.leg_up as u8,
            t.hello_left,
            t.broken as u8,
            t.resend_end - t.resend_pos.min(t.resend_end),
            t.offer.is_some() as u8,
            t.writer_waits as u8,
            t.owner_writes as u8
        );
        let _ = match leg(t.leg.as_ref()) {
            Some(i) => writeln!(
                l,
                " leg unacked {} wmem {} sndbuf {} nospace {} writeable {} unread {} owner {}",
                i[0], i[1], i[2], i[3], i[4], i[5], i[6]
            ),
            None => writeln!(l, " leg -"),
        };
    }
    seq.write(l.bytes());
    let mut l = crate::sys::Line::new();
    {
        let r = sw.rx.lock();
        let state = match r.path.state() {
            RxState::Ring { .. } => "ring",
            RxState::Tcp => "tcp",
            RxState::Offered { .. } => "offered",
        };
        let _ = write!(
            l,
            "{conn} rx {state} taken {} buffered {} run {} join {} eof_leg {} control_queued {} control_out {} owner_pulls {}",
            r.path.taken(),
            r.buf.as_ref().map(|b| b.len()).unwrap_or(0),
            r.order.run_open() as u8,
            r.order.join_at().map(|j| j as i64).unwrap_or(-1),
            r.data_eof as u8,
            sw.rx_ctl.lock().len(),
            sw.ctl.lock().as_ref().map(|q| q.len()).unwrap_or(0),
            r.owner_pulls.map(|p| p as i8).unwrap_or(-1)
        );
        let _ = match leg(r.leg.as_ref()) {
            Some(i) => writeln!(l, " leg unacked {} unread {} owner {}", i[0], i[5], i[6]),
            None => writeln!(l, " leg -"),
        };
    }
    seq.write(l.bytes());
}
