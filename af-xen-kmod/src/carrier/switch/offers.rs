// SPDX-License-Identifier: GPL-2.0
//! Ring offers: taking the peer's (`take_offer`), making and giving up ours
//! (`maybe_offer`, proto's offer clock), and the candidate domain that must
//! prove to be the peer.

use super::*;

/// A `RingOffer` from the link (under the link's lock: only recorded; the
/// work item maps and applies it).
pub(crate) fn on_ring_offer(xs: &Arc<XenSock>, grant: RingGrant) {
    let Some(sw) = sw_of(xs) else { return };
    if !sw.is_active() {
        return;
    }
    sw.tx.lock().offer = Some(grant);
    net::schedule();
}

/// A `RingOffer` naming this connection over `link`, from a domain that
/// is not its peer's, while the link to the peer is gone (under `link`'s
/// lock). The peer may have moved and come back under a new domid; but a
/// `RingOffer` carries no secret, and connection ids are small numbers, so
/// any guest on this host could send one: taken at its word, our sending
/// direction would move onto that guest's ring, and it would read the
/// stream. So the offer is only kept, and the work item offers our own
/// receive ring over `link` (granted to that domain alone). Only the peer
/// can answer that with `RingFrom` on its inbound leg, which its cookie
/// authenticated; then the link is adopted and the kept offer taken
/// (`adopt_proven`). A later candidate replaces an earlier one.
pub(crate) fn on_candidate_offer(xs: &Arc<XenSock>, link: Arc<Link>, grant: RingGrant) {
    let Some(sw) = sw_of(xs) else { return };
    if !sw.is_active() {
        return;
    }
    pr_info!("connection {}: ring offer from dom{}, not the peer's domain: kept until it proves to be the peer\n", xs.inner.lock().conn_id, link.peer);
    inc(&counters::CANDIDATES, 1);
    let earlier = sw.tx.lock().candidate.replace((link, grant));
    drop(earlier);
    net::schedule();
}

/// The work item's half of `on_candidate_offer`: a candidate that proved
/// to be the peer becomes the connection's link, and its kept offer is
/// taken as the peer's own would be.
pub(super) fn adopt_proven(xs: &Arc<XenSock>, sw: &Switch) {
    let Some(link) = sw.rx.lock().adopt.take() else {
        return;
    };
    if !adopt(&link, xs) {
        return;
    }
    inc(&counters::PEERS_PROVED, 1);
    take_kept_offer(xs, sw, &link);
}

/// Makes `link` the connection's, its peer proved to be the link's
/// domain (`adopt_proven`). Returns whether it did: not if
/// the link went down since, or the connection ended or has a live
/// link again.
pub(super) fn adopt(link: &Arc<Link>, xs: &Arc<XenSock>) -> bool {
    let mut i = link.inner.lock();
    if !link.is_up() {
        return false;
    }
    let (conn_id, old) = {
        let mut inner = xs.inner.lock();
        let stale = inner
            .link
            .as_ref()
            .map(|l| !Arc::ptr_eq(l, link) && !l.is_up())
            .unwrap_or(false);
        if inner.state != SockState::Connected || inner.released || !stale {
            return false;
        }
        let was = inner.peer.domid;
        inner.peer.domid = link.peer;
        pr_info!(
            "connection {}: peer dom{} is now dom{}\n",
            inner.conn_id,
            was,
            link.peer
        );
        (inner.conn_id, inner.link.replace(link.clone()))
    };
    drop(old);
    let _ = i
        .conns
        .try_create_and_insert(conn_id, xs.clone(), GFP_KERNEL);
    true
}

/// `link` became the connection's (its domain proved to be the peer, or
/// the agent lists the peer there): an offer it made while it was only a
/// candidate is taken now as the peer's own. An offer kept from another
/// domain is dropped; the peer offers again over its link, now ours (its
/// offer times out).
pub(super) fn take_kept_offer(xs: &Arc<XenSock>, sw: &Switch, link: &Arc<Link>) {
    let kept = {
        let mut t = sw.tx.lock();
        match t.candidate.take() {
            Some((l, grant)) if Arc::ptr_eq(&l, link) => Some(grant),
            other => {
                drop(other);
                None
            }
        }
    };
    if let Some(grant) = kept {
        on_ring_offer(xs, grant);
    }
}

/// The connection followed its peer to `link` by the agent's table
/// (`Link::adopt_moved`): the offer that link's domain made before, kept
/// as a candidate's, is the peer's.
pub(crate) fn followed_peer(xs: &Arc<XenSock>, link: &Arc<Link>) {
    inc(&counters::PEERS_FOLLOWED, 1);
    if let Some(sw) = sw_of(xs) {
        take_kept_offer(xs, &sw, link);
    }
}

/// This guest is back from a save (or the save was cancelled): the clock
/// may have jumped by the time it was away, so the peer-lost bounds
/// running start again from now.
pub(crate) fn resumed() {
    leg::resumed();
    let now = net::now_ms();
    for xs in leg::active_snapshot().iter() {
        if let Some(sw) = sw_of(xs) {
            if sw.deadline.load(Ordering::Acquire) != 0 {
                sw.deadline
                    .store(now + net::peer_lost_ms(), Ordering::Release);
            }
        }
    }
    net::schedule();
}

/// The link to the peer is up again: let the work item offer rings.
pub(crate) fn link_up() {
    net::schedule();
}

/// Moves the sending direction onto the ring the receiver offered.
pub(super) fn take_offer(
    xs: &XenSock,
    sw: &Switch,
    t: &mut TxSide,
    ids: &Ids,
    grant: &RingGrant,
) -> core::result::Result<(), &'static str> {
    if t.path.is_finished() {
        // after FIN a ring is pointless: decline (the receiver keeps reading TCP)
        return Ok(());
    }
    // the link need not be up from our side yet: the mapping names the
    // peer's domain, and the pipe kicks through the link once it is
    let link = xs.inner.lock().link.clone();
    let Some(link) = link else { return Ok(()) };
    let me = crate::link::own_domid();
    let pipe = match Pipe::new_mapped(&link, me, grant, ids.peer_conn, grant.epoch) {
        Ok(p) => p,
        Err(_) => {
            pr_warn!(
                "connection {}: offered ring {} cannot be mapped; staying on TCP\n",
                ids.conn_id,
                grant.epoch
            );
            return Ok(());
        }
    };
    match t
        .path
        .on_ring_offer(grant.epoch)
        .map_err(|_| "ring offer")?
    {
        Some(m) => {
            // ends the run at m: nothing after it goes on the leg
            if !push_ctl(
                sw,
                &Message::RingFrom {
                    conn_id: ids.peer_conn,
                    epoch: grant.epoch,
                    offset: m,
                },
            ) {
                return Err("control queue full");
            }
            let old = xs.inner.lock().tx.replace(pipe);
            drop(old);
            inc(&counters::OFFERS_TAKEN, 1);
            inc(&counters::TO_RING, 1);
            sw.to_ring.fetch_add(1, Ordering::Relaxed);
            pr_info!(
                "connection {}: tx back on a ring (epoch {}) from {}\n",
                ids.conn_id,
                grant.epoch,
                m
            );
            Ok(())
        }
        None => Ok(()),
    }
}

/// Offers a new receive ring when the link to the peer is up and this
/// direction is on TCP, and gives an unanswered offer up, as proto's offer
/// clock says (`proto::offer`). Returns whether it waits for time to pass
/// (the work item then ticks).
pub(super) fn maybe_offer(xs: &XenSock, sw: &Switch, ids: &Ids, now: u64) -> bool {
    let own = xs.inner.lock().link.clone().filter(|l| l.is_up());
    // without the peer's link: a domain that may be the peer, moved
    // (`on_candidate_offer`)
    let candidate = || {
        sw.tx
            .lock()
            .candidate
            .as_ref()
            .map(|(l, _)| l.clone())
            .filter(|l| l.is_up())
    };
    let (link, via) = match own {
        Some(l) => (l, None),
        None => match candidate() {
            Some(l) => (l.clone(), Some(l)),
            // nothing to offer on: the link's coming up schedules the work
            // item (link_up). Ticking every 100 ms here woke a connection
            // on TCP ten times a second for as long as its peer stayed away
            // (30-40 passes per bench round, each waking the socket's
            // waiters)
            None => return false,
        },
    };
    let mut r = sw.rx.lock();
    let leg_up = r.leg.is_some();
    match r.clock.step(&r.path, true, leg_up, now) {
        OfferStep::Idle => false,
        OfferStep::WaitUntil(_) => true,
        OfferStep::Abandon => {
            abandon_offer(sw, ids, r, "unanswered");
            true
        }
        OfferStep::Offer => {
            let mut probe = r.path.clone();
            let Ok(epoch) = probe.offer_ring() else {
                return false;
            };
            let me = crate::link::own_domid();
            let Ok((pipe, grant)) = Pipe::new_granted(&link, me, ids.conn_id, sw.rx_cap, epoch)
            else {
                return true;
            };
            r.path = probe;
            r.offered = Some(pipe);
            r.offered_via = via;
            r.clock.offered(now);
            drop(r);
            match link.send(&Message::RingOffer {
                conn_id: ids.peer_conn,
                rx: grant,
            }) {
                Ok(()) => {
                    inc(&counters::OFFERS_SENT, 1);
                    pr_info!(
                        "connection {}: offered ring {} to the peer\n",
                        ids.conn_id,
                        grant.epoch
                    );
                }
                // not sent: abandoned as a move would (Consumed says so);
                // a candidate stays one (the link failed, not the domain)
                Err(_) => {
                    let mut r = sw.rx.lock();
                    r.offered_via = None;
                    abandon_offer(sw, ids, r, "not sent");
                }
            }
            true
        }
    }
}

/// Gives the outstanding offer up: its `Consumed` declares the epoch dead,
/// the ring goes, and a candidate it went to that never answered is not
/// the peer (its offer, kept, would block the peer's).
pub(super) fn abandon_offer(sw: &Switch, ids: &Ids, mut r: RxGuard<'_>, why: &str) {
    if !matches!(r.path.state(), RxState::Offered { .. }) {
        return;
    }
    if let Some(n) = r.path.freeze_local() {
        let _ = push_ctl(
            sw,
            &Message::Consumed {
                conn_id: ids.peer_conn,
                epoch: n.epoch,
                offset: n.offset,
            },
        );
        pr_info!(
            "connection {}: offer of ring {} {}, abandoned\n",
            ids.conn_id,
            n.epoch,
            why
        );
    }
    r.clock.settled();
    let dead = r.offered.take();
    let via = r.offered_via.take();
    drop(r);
    drop(dead);
    let Some(l) = via else { return };
    let mut t = sw.tx.lock();
    if t.candidate
        .as_ref()
        .is_some_and(|(c, _)| Arc::ptr_eq(c, &l))
    {
        pr_info!(
            "connection {}: dom{} did not prove to be the peer; its offer is dropped\n",
            ids.conn_id,
            l.peer
        );
        let dead = t.candidate.take();
        drop(t);
        drop(dead);
    }
}
