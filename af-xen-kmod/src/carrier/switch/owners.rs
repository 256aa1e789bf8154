// SPDX-License-Identifier: GPL-2.0
//! Who moves a leg's bytes: the application's own calls or the work item
//! (`own`, `disown`), and legs put in (`attach_inbound`).

use super::*;

/// The socket was closed: finish sending what is queued, then let go.
/// `tx` is the ring it wrote (the socket lets go of it now), kept while the
/// switch is active until the receiver has taken it all (see
/// `ring_all_taken`).
pub(super) fn closing(sw: &Switch, tx: Option<&Arc<Pipe>>) {
    {
        let mut t = sw.tx.lock();
        t.path.finish();
        if sw.is_active() && matches!(t.path.state(), TxState::Ring { .. }) {
            t.closed_ring = tx.cloned();
        }
    }
    sw.closed.store(true, Ordering::Release);
    if sw.is_active() {
        let _ = sw.deadline.compare_exchange(
            0,
            net::now_ms() + net::peer_lost_ms(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        net::schedule();
    }
}

/// A leg of `xs`'s connection wakes its socket's waiters straight from its
/// callbacks (af_xen_net.c, afx_leg_wake) while the application holds the
/// socket. Caller holds the switch lock of the leg's direction, which
/// `disown` takes after `closed`: either this sees `closed` or `disown`
/// clears what this set.
pub(super) fn own(xs: &XenSock, sw: &Switch, leg: &leg::HeldLeg) {
    if !sw.closed.load(Ordering::Acquire) {
        leg.sock().set_owner(Some(&xs.sk), false, false);
    }
}

/// Whether the application's writer, when it writes or is woken, sends
/// everything this direction has for its leg: the hello is out and no
/// resend, ring offer or failure waits for the work item (it sends the
/// queue's frames itself, `flush_tx` in `send`).
pub(super) fn writer_flushes(t: &TxSide) -> bool {
    t.leg_up
        && !t.broken
        && t.hello_left == 0
        && t.resend_pos >= t.resend_end
        && t.offer.is_none()
        && matches!(t.path.state(), TxState::Tcp)
}

/// Tells the outbound leg whether a drain (`write_space`) must run the
/// work item: not while the writer covers the leg, i.e. it waits for room
/// (and flushes when woken) or nothing is queued behind it. A drain that
/// ran the work item every time competed with the writer it woke, on the
/// same vCPU. Caller holds
/// `sw.tx`; called wherever the answer may have changed.
pub(super) fn own_outbound(xs: &XenSock, sw: &Switch, t: &mut TxSide) {
    let queued = t.q.as_ref().is_some_and(|q| !q.is_empty());
    let writes = writer_flushes(t) && (t.writer_waits || !queued);
    if writes == t.owner_writes || sw.closed.load(Ordering::Acquire) {
        return;
    }
    let Some(leg) = t.leg.as_ref() else { return };
    leg.sock().set_owner(Some(&xs.sk), false, writes);
    t.owner_writes = writes;
    // a drain that ran while the flag was still set left the queue to the
    // writer: the work item takes it
    if !writes && leg.sock().writable() {
        net::schedule();
    }
}

/// A writer that waited for room leaves `sendmsg` without writing again
/// (a signal, its timeout): what it left queued is the work item's again.
pub(super) fn writer_gone(xs: &XenSock, sw: &Switch) {
    let mut t = sw.tx.lock();
    t.writer_waits = false;
    own_outbound(xs, sw, &mut t);
}

/// The inbound leg's owner, and who reads it: the application's recvmsg
/// while this direction is on TCP (the leg's data then wakes only it), the
/// work item while it is on a ring (a TxFreeze comes there). Called with
/// `sw.rx` held wherever the direction may have changed; a flag that lags
/// behind a move off the ring only schedules the work item once more.
pub(super) fn own_inbound(xs: &XenSock, sw: &Switch, r: &mut RxSide) {
    let Some(leg) = r.leg.as_ref() else { return };
    if sw.closed.load(Ordering::Acquire) {
        return;
    }
    let pulls = !r.path.reads_ring();
    if r.owner_pulls != Some(pulls) {
        leg.sock().set_owner(Some(&xs.sk), pulls, false);
        r.owner_pulls = Some(pulls);
    }
}

/// The application releases the socket: its legs (which may outlive it
/// until what it sent is out) wake nobody from now on.
pub(super) fn disown(sw: &Switch) {
    sw.closed.store(true, Ordering::Release);
    {
        let t = sw.tx.lock();
        if let Some(l) = t.leg.as_ref() {
            l.sock().set_owner(None, false, false);
        }
    }
    let r = sw.rx.lock();
    if let Some(l) = r.leg.as_ref() {
        l.sock().set_owner(None, false, false);
    }
}

/// An authenticated inbound leg for `xs` (`work`). Err: refused (a second
/// leg, or no switch).
pub(crate) fn attach_inbound(
    xs: &Arc<XenSock>,
    leg: leg::HeldLeg,
) -> core::result::Result<(), leg::HeldLeg> {
    let Some(sw) = sw_of(xs) else { return Err(leg) };
    {
        let mut r = sw.rx.lock();
        if r.leg.is_some() || rx_activate(&mut r).is_err() {
            return Err(leg);
        }
        r.leg = Some(leg);
        r.owner_pulls = None;
        own_inbound(xs, &sw, &mut r);
    }
    {
        // the peer uses TCP now: so do we, for what we send
        let mut t = sw.tx.lock();
        if tx_activate(&mut t).is_err() {
            return Ok(());
        }
        // (the pass that follows hears the peer on this leg: an attempt
        // of ours waiting for a backed-off SYN starts over, `leg_tx`)
        t.want_leg = true;
    }
    activate(xs, &sw);
    net::schedule();
    Ok(())
}
