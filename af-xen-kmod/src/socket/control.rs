// SPDX-License-Identifier: GPL-2.0
//! What a link's control frames and events mean for the sockets: the
//! socket core's side of [`LinkConn`]. The link (`link/`) moves frames
//! and keeps the table of the connections it carries; here a
//! ConnectRequest becomes a child of a listener, a ConnectAccept completes
//! a connect, a Close or Reset ends a connection, a ring offer goes to the
//! connection's switch, and a link going down moves streams to TCP or
//! resets them.

use super::connect::{
    accept_remote, accepted_remote, answer_lost, connect_accepted, connect_failed, is_seqpacket,
    link_lost, peer_ended, pending_request, request_sent,
};
use super::table::globals;
use crate::carrier::{self, setup, Link, XenSock};
use crate::link::{self, LinkConn, LinkTable};
use crate::proto::ctrl::{Message, RejectReason, ResetReason, SockType};
use crate::sock::State;
use crate::sys::{self, errno as e, poll::*};
use kernel::prelude::*;
use kernel::sync::{Arc, Mutex};

type LinkInner = link::LinkInner<XenSock>;

impl LinkConn for XenSock {
    type Ring = carrier::Ring;

    fn links() -> &'static Mutex<LinkTable<Self>> {
        &globals().links
    }

    fn link_up() {
        carrier::link_up();
    }

    fn resumed() {
        carrier::resumed();
    }

    fn wake(&self) {
        // Every readiness bit: we do not know what moved (data, space, a
        // FIN, a reset), and poll's wait entries filter wakeups by the
        // events they asked for (a POLLRDHUP-only poller missed FIN when
        // this woke with POLLIN|POLLOUT only).
        self.wake_live(POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM | POLLRDHUP | POLLHUP | POLLERR);
    }

    fn carried_elsewhere(&self, link: &Link) -> bool {
        self.inner
            .lock()
            .link
            .as_ref()
            .is_some_and(|l| !core::ptr::eq(&**l, link))
    }

    fn link_down(this: &Arc<Self>) -> bool {
        carrier::peer_gone(this)
    }

    fn link_lost(this: &Arc<Self>) {
        link_lost(this);
    }

    fn connect_deadline(&self) -> Option<u64> {
        let i = self.inner.lock();
        (i.state == State::Connecting).then_some(i.connect_deadline_ms)
    }

    fn conn_id(&self) -> u32 {
        self.inner.lock().conn_id
    }

    fn connect_failed(this: &Arc<Self>, errno: i32) {
        connect_failed(this, errno);
    }

    fn on_frame(link: &Arc<Link>, i: &mut LinkInner, m: &Message<'_>) {
        on_frame(link, i, m);
    }

    fn send_requests(i: &mut LinkInner) {
        send_requests(i);
    }

    fn adopt_moved(link: &Arc<Link>, i: &mut LinkInner) {
        adopt_moved(link, i);
    }
}

/// Stream connections that went to TCP under an earlier link (gone
/// with our own save/restore, or with the pair's link directories)
/// continue under this one, so ring offers go here: those to this
/// peer's domid, and those to a domid the agent's table now lists
/// under this one's UUID, the same guest moved (after a save and
/// restore or a migration on this host). The second is what brings a
/// connection back to rings when both ends moved: each knows only the
/// other's old domid, and neither would take a ring offer from a
/// domain that has not proved to be the peer (`carrier::on_candidate_offer`)
/// while the other waits for the same; dom0's table is trusted as it
/// is for resolving addresses.
fn adopt_moved(link: &Arc<Link>, i: &mut LinkInner) {
    let mut followed: KVec<Arc<XenSock>> = KVec::new();
    let p = globals().ports.lock();
    for (_, xs) in p.all.iter() {
        let (id, old, was) = {
            let mut inner = xs.inner.lock();
            let Some(earlier) = inner.link.as_ref() else {
                continue;
            };
            let stale = !Arc::ptr_eq(earlier, link) && !earlier.is_up();
            let renamed = link.peer_uuid().is_some()
                && earlier.peer_uuid() == link.peer_uuid()
                && earlier.peer == inner.peer.domid;
            if inner.state != State::Connected || inner.released || inner.sw.is_none() || !stale {
                continue;
            }
            if inner.peer.domid != link.peer && !renamed {
                continue;
            }
            let was = core::mem::replace(&mut inner.peer.domid, link.peer);
            (inner.conn_id, inner.link.replace(link.clone()), was)
        };
        drop(old);
        if i.conns.get(&id).is_none() {
            let _ = i.conns.try_create_and_insert(id, xs.clone(), GFP_KERNEL);
        }
        if was == link.peer {
            pr_info!(
                "connection {}: continues under the new link to dom{}\n",
                id,
                link.peer
            );
        } else {
            pr_info!(
                "connection {}: peer dom{} is now dom{} (the agent lists its UUID {} there)\n",
                id,
                was,
                link.peer,
                link.peer_uuid().map_or("?", |u| u.as_str())
            );
            let _ = followed.push(xs.clone(), GFP_KERNEL);
        }
    }
    // sw.tx after the ports lock (link.inner -> sw.tx is the order)
    drop(p);
    for xs in followed.iter() {
        carrier::followed_peer(xs, link);
    }
}

/// A `RingOffer` for a connection this link does not know: the peer
/// may have moved (its domid changed with a save/restore or a
/// migration) and offer a ring for a connection of ours that went to
/// TCP when its old link died. Returns that connection, if `conn_id`
/// names one; nothing is changed (`carrier::on_candidate_offer` says
/// why).
fn moved_peer_candidate(link: &Link, conn_id: u32) -> Option<Arc<XenSock>> {
    let p = globals().ports.lock();
    for (_, xs) in p.all.iter() {
        let inner = xs.inner.lock();
        let stale = inner
            .link
            .as_ref()
            .map(|l| l.peer != link.peer && !l.is_up())
            .unwrap_or(false);
        if inner.conn_id == conn_id
            && inner.state == State::Connected
            && !inner.released
            && inner.sw.is_some()
            && stale
        {
            return Some(xs.clone());
        }
    }
    None
}

fn send_requests(i: &mut LinkInner) {
    let mut todo: KVec<Arc<XenSock>> = KVec::new();
    for (_, s) in i.conns.iter() {
        if pending_request(s).is_some() && todo.push(s.clone(), GFP_KERNEL).is_err() {
            break;
        }
    }
    for s in todo.iter() {
        let Some((conn_id, src_port, dst_port, rx)) = pending_request(s) else {
            continue;
        };
        let cookie = s.inner.lock().tcp.cookie;
        let req = Message::ConnectRequest {
            conn_id,
            src_port,
            dst_port,
            sock_type: if is_seqpacket(s) {
                SockType::SeqPacket
            } else {
                SockType::Stream
            },
            cookie,
            rx,
            tcp: setup::leg_endpoint(),
        };
        match Link::send_locked(i, &req) {
            Ok(()) => request_sent(s),
            // the frame queue is full: retry when the work item runs next
            Err(x) if x == e::ENOBUFS => return,
            Err(_) => {
                i.conns.remove(&conn_id);
                connect_failed(s, e::ECONNRESET);
            }
        }
    }
}

fn on_frame(link: &Arc<Link>, i: &mut LinkInner, m: &Message<'_>) {
    match *m {
        Message::ConnectRequest {
            conn_id,
            src_port,
            dst_port,
            sock_type,
            cookie,
            rx,
            tcp,
        } => {
            let r = accept_remote(
                link,
                conn_id,
                src_port,
                dst_port,
                sock_type == SockType::SeqPacket,
                &rx,
            );
            let reply = match &r {
                Ok((child, my_id, rx_grant)) => {
                    // listed before the accept goes out: its first data may follow at once
                    if i.conns
                        .try_create_and_insert(*my_id, child.clone(), GFP_KERNEL)
                        .is_err()
                    {
                        link_lost(child);
                        Message::ConnectReject {
                            conn_id,
                            reason: RejectReason::NoResources,
                        }
                    } else {
                        child.inner.lock().tcp = setup::accepted_legs(cookie, tcp);
                        Message::ConnectAccept {
                            conn_id,
                            acceptor_id: *my_id,
                            cookie,
                            rx: *rx_grant,
                            tcp: setup::leg_endpoint(),
                        }
                    }
                }
                Err(reason) => Message::ConnectReject {
                    conn_id,
                    reason: *reason,
                },
            };
            let sent = Link::send_locked(i, &reply);
            if let Err(x) = sent {
                pr_warn!("link to dom{}: cannot answer connect: {}\n", link.peer, x);
            }
            if let Ok((child, my_id, _)) = r {
                if sent.is_err() {
                    // the requester never hears of it: nothing to lend
                    i.conns.remove(&my_id);
                    answer_lost(&child);
                }
                accepted_remote(&child);
            }
        }
        Message::ConnectAccept {
            conn_id,
            acceptor_id,
            rx,
            cookie,
            tcp,
        } => {
            let s = i.conns.get(&conn_id).cloned();
            match s {
                Some(s) if s.inner.lock().tcp.cookie != cookie => {
                    // not the cookie we made: the accept is not for us
                    let _ = Link::send_locked(
                        i,
                        &Message::Reset {
                            conn_id: acceptor_id,
                            reason: ResetReason::ProtocolError,
                        },
                    );
                    i.conns.remove(&conn_id);
                    connect_failed(&s, e::ECONNREFUSED);
                }
                Some(s) => {
                    s.inner.lock().tcp.peer = tcp;
                    if connect_accepted(&s, link, acceptor_id, &rx).is_err() {
                        let _ = Link::send_locked(
                            i,
                            &Message::Reset {
                                conn_id: acceptor_id,
                                reason: ResetReason::ProtocolError,
                            },
                        );
                        i.conns.remove(&conn_id);
                    }
                }
                None => {
                    let _ = Link::send_locked(
                        i,
                        &Message::Reset {
                            conn_id: acceptor_id,
                            reason: ResetReason::Abort,
                        },
                    );
                }
            }
        }
        Message::ConnectReject { conn_id, .. } => {
            if let Some(s) = i.conns.remove(&conn_id) {
                connect_failed(&s, e::ECONNREFUSED);
            }
        }
        // The peer is done with the connection (destroy): a ring
        // we lent it after our close can go now; a socket still open
        // learns that it need not lend its ring when it closes.
        Message::Reset { conn_id, .. } => {
            let lent = i.lent.remove(&conn_id);
            drop(lent);
            // the peer unmapped our rings of this connection before
            // it sent this: ring grants ended while it mapped them go now
            sys::pending_grants_kick();
            if let Some(s) = i.conns.remove(&conn_id) {
                peer_ended(&s);
                link_lost(&s);
            }
        }
        Message::RingOffer { conn_id, rx } => {
            if let Some(s) = i.conns.get(&conn_id).cloned() {
                carrier::on_ring_offer(&s, rx);
            } else if let Some(s) = moved_peer_candidate(link, conn_id) {
                carrier::on_candidate_offer(&s, link.clone(), rx);
            }
        }
        // Both directions' flags are already in the rings; the wake
        // after the drain lets the socket see them.
        Message::Close { conn_id } => {
            let lent = i.lent.remove(&conn_id);
            drop(lent);
            sys::pending_grants_kick();
            if let Some(s) = i.conns.get(&conn_id) {
                peer_ended(s);
            }
        }
        _ => {}
    }
}
