// SPDX-License-Identifier: GPL-2.0
//! Links to other domains (af-xen-kmod/README.md, "Link setup through
//! XenStore"): one per peer, a control ring each way plus an event channel
//! each way, set up through /local/domain/<me>/data/xensock/link/<peer>/.
//!
//! Everything asynchronous funnels into one work item (`work()`): the link
//! interrupts and the XenStore watches only schedule it. It discovers link
//! directories dom0 made for us, follows the peers' states, drains control
//! frames and wakes the sockets of every link.

pub(crate) mod wake;

use crate::proto::ctrl::{self, Channel, Message, RejectReason, ResetReason, SockType};
use crate::proto::layout::{RingGeometry, RingIdentity, LINK_RING_MAGIC, LINK_RING_ORDER};
use crate::proto::link::{node, HalfPath, HalfValues, LinkState, LINK_DIR};
use crate::proto::mem::RawRing;
use crate::proto::ring::{Consumer, Producer};
use crate::socket::{self, XenSock};
use crate::sys::{self, errno as e, xs, Evtchn, Grant, Mapping};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use kernel::fmt;
use kernel::new_mutex;
use kernel::prelude::*;
use kernel::rbtree::RBTree;
use kernel::str::CString;
use kernel::sync::{Arc, Mutex};
use wake::LinkWake;

/// Control frames handled per run of the work item before it requeues
/// itself (a busy link must not starve the other work of the system).
const DRAIN_BATCH: usize = 1024;

/// Our advertised half: the control ring the peer writes into, and the
/// port it kicks.
struct Half {
    rx: Consumer<RawRing>,
    _chan: Evtchn<LinkWake>,
    /// the interrupt reads `rx`'s ring too (wake.rs)
    wake: Arc<LinkWake>,
    /// last: the ring above points into it
    _grant: Grant,
}

impl Drop for Half {
    fn drop(&mut self) {
        // before the grant ends: the peer's channel may still interrupt
        self.wake.set_ctrl(None);
    }
}

/// The peer's half, once mapped and bound.
struct PeerHalf {
    tx: Producer<RawRing>,
    chan: Evtchn<LinkWake>,
    gref: u32,
    port: u32,
    /// last: the ring above points into it
    _map: Mapping,
}

/// An encoded control frame waiting for room in the peer's control ring.
struct Frame {
    len: usize,
    buf: [u8; ctrl::MAX_CONTROL_FRAME],
}

/// How long a closed connection's receive ring stays lent to the peer
/// without the peer's Close or Reset (see `Lent`). The peer only needs it
/// until it has mapped the ring (it answers our ConnectAccept by mapping
/// it, milliseconds under TCG); after that, ending the grant is deferred by
/// Xen until the peer unmaps. So the bound only matters for a peer that
/// never answers, and is far above any honest delay.
pub(crate) const LINGER_MAX_MS: u64 = 60_000;

/// A receive ring of a connection we accepted and have closed, kept
/// granted until the peer says it is done with it (its Close or Reset), the
/// link goes down, or `LINGER_MAX_MS` passes. Without it an acceptor that
/// closes at once ended the grant before the connector had mapped it, and
/// the connector's connect failed with ECONNREFUSED instead of reading the
/// data and EOF.
pub(crate) struct Lent {
    _pipe: Arc<crate::carrier::ring::Pipe>,
    deadline_ms: u64,
}

impl Lent {
    pub(crate) fn new(pipe: Arc<crate::carrier::ring::Pipe>) -> Self {
        sys::counters::add(&sys::counters::LINGERING, 1);
        Lent {
            _pipe: pipe,
            deadline_ms: crate::sys::net::now_ms() + LINGER_MAX_MS,
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // the pipe (and with it the grant) goes after this: Xen defers
        // freeing the pages while the peer still maps them
        sys::counters::add(&sys::counters::LINGERING, -1);
    }
}

/// Frames queued while the peer's control ring is full, at most. The ring
/// holds ~30 frames; a burst of connects, accepts or closes (1000
/// non-blocking connects at once) must not lose any.
const BACKLOG_MAX: usize = 8192;

pub(crate) struct LinkInner {
    mine: Option<Half>,
    peer: Option<PeerHalf>,
    /// frames for the peer, in order, that did not fit its ring yet
    backlog: KVec<Frame>,
    watch: Option<xs::Watch>,
    /// our connection id -> socket (connecting or connected over this link)
    pub(crate) conns: RBTree<u32, Arc<XenSock>>,
    /// the link's wake table (also `Link::wake`), for the backlog flag
    wake: Arc<LinkWake>,
    /// our connection id -> receive ring lent to the peer after close
    pub(crate) lent: RBTree<u32, Lent>,
}

#[pin_data]
pub(crate) struct Link {
    pub(crate) peer: u32,
    /// the peer's UUID in the agent's table when the link was made (none
    /// without an agent): the same guest under a new domid has it too
    peer_uuid: Option<xs::Uuid>,
    me: u32,
    my_dir: CString,
    peer_dir: CString,
    up: AtomicBool,
    /// The peer's half vanished while the link was up (not retracted by
    /// the peer as a departing guest does): if dom0 then says the domain
    /// is gone for good, its connections end at once (`end_dead_peer`).
    vanished: AtomicBool,
    /// our local port bound to the peer's advertised port (0: none)
    kick_port: AtomicU32,
    /// what the event-channel interrupt wakes (wake.rs)
    pub(crate) wake: Arc<LinkWake>,
    #[pin]
    pub(crate) inner: Mutex<LinkInner>,
}

/// Module-wide link table (in socket::Globals).
pub(crate) struct LinkTable {
    pub(crate) links: KVec<Arc<Link>>,
    pub(crate) watches: KVec<xs::Watch>,
    pub(crate) stopping: bool,
    /// this guest is being saved: no link until it is back
    pub(crate) suspended: bool,
}

impl LinkTable {
    pub(crate) fn new() -> Self {
        LinkTable {
            links: KVec::new(),
            watches: KVec::new(),
            stopping: false,
            suspended: false,
        }
    }
}

static NEXT_CONN: AtomicU32 = AtomicU32::new(1);

/// A fresh connection id (never 0: 0 names the link itself).
pub(crate) fn next_conn_id() -> u32 {
    loop {
        let v = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        if v != 0 {
            return v;
        }
    }
}

fn root(me: u32) -> Result<CString> {
    CString::try_from_fmt(fmt!("/local/domain/{}/{}", me, LINK_DIR))
}

/// `/local/domain/<me>/xensock/gone`: dom0's word that a domain is gone
/// for good, one node per domid (the agent writes it when a domain is
/// released without a move marker, and removes it when the domid is used
/// again).
fn gone_dir(me: u32) -> Result<CString> {
    CString::try_from_fmt(fmt!("/local/domain/{}/xensock/gone", me))
}

/// Whether dom0 says `peer` is gone for good.
fn dead_marked(me: u32, peer: u32) -> bool {
    let Ok(dir) = gone_dir(me) else {
        return false;
    };
    let mut ids = [0u32; 64];
    let n = xs::dir_ids(&dir, &mut ids);
    ids[..n].contains(&peer)
}

fn link_geometry() -> Result<RingGeometry> {
    RingGeometry::new(LINK_RING_ORDER).map_err(|_| EINVAL)
}

impl Link {
    /// Advertises our half for `peer` (dom0 made the directory).
    fn create(me: u32, peer: u32) -> Result<Arc<Link>> {
        let my_dir = CString::try_from_fmt(fmt!("{}", HalfPath { owner: me, peer }))?;
        let their_half = HalfPath {
            owner: peer,
            peer: me,
        };
        let peer_dir = CString::try_from_fmt(fmt!("{}", their_half))?;
        let state_path = CString::try_from_fmt(fmt!("{}/{}", their_half, node::STATE))?;
        // dom0 writes a peer's table entry with (or before) the pair's link
        // directories, so it is there whenever a link is made
        let table_entry =
            CString::try_from_fmt(fmt!("/local/domain/{}/xensock/peers/{}", me, peer))?;
        let peer_uuid = xs::read_uuid(&table_entry, c"uuid");
        let g = link_geometry()?;
        let grant = Grant::new(peer)?;
        let ring = grant.ring(g).ok_or(EINVAL)?;
        ring.header().init(&RingIdentity {
            magic: LINK_RING_MAGIC,
            order: g.order(),
            owner_domid: me,
            peer_domid: peer,
            conn_id: 0,
            epoch: 0,
        });
        let lw = LinkWake::new()?;
        lw.set_ctrl(Some(ring));
        let chan = Evtchn::alloc_unbound(peer, &lw)?;
        xs::advertise(
            &my_dir,
            grant.gref,
            chan.port,
            LinkState::Initialised.value() as i32,
        )?;
        let watch = xs::Watch::add(&state_path).ok();
        pr_info!(
            "link to dom{}: advertised ring-ref {} event-channel {}\n",
            peer,
            grant.gref,
            chan.port
        );
        Arc::pin_init(
            pin_init!(Link {
                peer,
                peer_uuid,
                me,
                my_dir,
                peer_dir,
                up: AtomicBool::new(false),
                vanished: AtomicBool::new(false),
                kick_port: AtomicU32::new(0),
                wake: lw.clone(),
                inner <- new_mutex!(LinkInner {
                    mine: Some(Half { rx: Consumer::new(ring), _chan: chan, wake: lw.clone(), _grant: grant }),
                    peer: None,
                    backlog: KVec::new(),
                    watch,
                    conns: RBTree::new(),
                    wake: lw,
                    lent: RBTree::new(),
                }, "af_xen_link"),
            }),
            GFP_KERNEL,
        )
    }

    /// Whether the peer's half is attached (frames can be sent).
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Kicks the peer (its rings moved or their flags changed).
    pub(crate) fn kick(&self) {
        let p = self.kick_port.load(Ordering::Acquire);
        if p != 0 {
            sys::notify_port(p);
        }
    }

    /// Sends one control frame (process context).
    pub(crate) fn send(&self, m: &Message<'_>) -> core::result::Result<(), i32> {
        let mut i = self.inner.lock();
        Self::send_locked(&mut i, m)
    }

    /// Sends one frame now, or queues it behind earlier ones when the
    /// peer's ring is full (sent by the work item once the peer made room).
    /// ENOBUFS only when the queue is full too.
    fn send_locked(i: &mut LinkInner, m: &Message<'_>) -> core::result::Result<(), i32> {
        let mut f = Frame {
            len: 0,
            buf: [0u8; ctrl::MAX_CONTROL_FRAME],
        };
        f.len = m.encode(&mut f.buf).map_err(|_| e::EINVAL)?;
        if i.peer.is_none() {
            return Err(e::ENOTCONN);
        }
        Self::flush_backlog(i);
        if i.backlog.is_empty() && Self::write_frame(i, &f.buf[..f.len])? {
            return Ok(());
        }
        if i.backlog.len() >= BACKLOG_MAX {
            return Err(e::ENOBUFS);
        }
        i.backlog.push(f, GFP_KERNEL).map_err(|_| e::ENOBUFS)?;
        Self::want_room(i);
        Ok(())
    }

    /// Writes one frame if it fits: Ok(false) when the ring is full.
    fn write_frame(i: &mut LinkInner, frame: &[u8]) -> core::result::Result<bool, i32> {
        let ph = i.peer.as_mut().ok_or(e::ENOTCONN)?;
        let free = ph.tx.free_space().map_err(|_| e::ECONNRESET)?;
        if (free as usize) < frame.len() {
            return Ok(false);
        }
        match ph.tx.write(frame) {
            Ok(w) if w == frame.len() => {}
            _ => return Err(e::ECONNRESET),
        }
        ph.chan.notify();
        Ok(true)
    }

    /// Sends queued frames, in order, as far as they fit.
    fn flush_backlog(i: &mut LinkInner) {
        i.wake.set_backlog(!i.backlog.is_empty());
        while !i.backlog.is_empty() {
            let (len, buf) = (i.backlog[0].len, i.backlog[0].buf);
            match Self::write_frame(i, &buf[..len]) {
                Ok(true) => {
                    drop(sys::vec_remove(&mut i.backlog, 0));
                    if i.backlog.is_empty() {
                        i.wake.set_backlog(false);
                    }
                }
                Ok(false) => {
                    Self::want_room(i);
                    return;
                }
                Err(_) => return,
            }
        }
    }

    /// Asks the peer to kick us once it consumed from its control ring (its
    /// work item then flushes the backlog); if there is room already, run
    /// the work item again now.
    fn want_room(i: &mut LinkInner) {
        // the peer's kick (it consumed) must reach the work item
        i.wake.set_backlog(true);
        if let Some(ph) = i.peer.as_mut() {
            if let Ok(false) = ph.tx.prepare_wait(ctrl::MAX_CONTROL_FRAME as u32) {
                sys::schedule_work();
            }
        }
    }

    /// Maps the peer's control ring and binds its port.
    fn attach(&self, i: &mut LinkInner, gref: u32, port: u32) -> Result {
        self.vanished.store(false, Ordering::Release);
        let g = link_geometry()?;
        let map = Mapping::map(self.peer, gref)?;
        let ring = map.ring(g).ok_or(EINVAL)?;
        ring.header()
            .verify(&RingIdentity {
                magic: LINK_RING_MAGIC,
                order: g.order(),
                owner_domid: self.peer,
                peer_domid: self.me,
                conn_id: 0,
                epoch: 0,
            })
            .map_err(|_| EINVAL)?;
        // Continue where the peer's consumer stands (a previous incarnation
        // of ours may have written into this ring before).
        let tx = Producer::resume_at_consumer(ring);
        let chan = Evtchn::bind_interdomain(self.peer, port, &self.wake)?;
        self.kick_port.store(chan.port, Ordering::Release);
        chan.notify();
        i.peer = Some(PeerHalf {
            tx,
            chan,
            gref,
            port,
            _map: map,
        });
        self.up.store(true, Ordering::Release);
        self.wake.set_up(true);
        // Only into our own advertisement: when the pair's directories are
        // made again, the peer's half can be back before dom0 made ours, and
        // a write would create our directory's `state` with the link root's
        // owner-only permissions, which the peer then cannot read (and
        // never attached again).
        // `readvertise` writes the state with the rest.
        let ours = i
            .mine
            .as_ref()
            .map(|m| xs::read_u32(&self.my_dir, node::RING_REF) == Some(m._grant.gref))
            .unwrap_or(false);
        if ours {
            let _ = xs::write_state(&self.my_dir, LinkState::Connected.value() as i32);
        }
        pr_info!(
            "link to dom{} up (peer ring-ref {} event-channel {})\n",
            self.peer,
            gref,
            port
        );
        // connections that moved to TCP offer rings again (carrier.rs)
        crate::carrier::switch::link_up();
        Ok(())
    }

    /// The peer's half vanished while the link was up and dom0 says its
    /// domain is gone for good (`xensock/gone/<domid>` in our table, as
    /// the agent writes it when a domain is released without a move): the
    /// connections the link still lists (streams wait there on TCP for the
    /// peer to come back) end now with ECONNRESET, not after the lost-peer
    /// bound. A guest that leaves and comes back (save, migration) retracts
    /// its half first (state Closed, from its freeze hook), so its
    /// connections are never ended this way; the agent cannot tell a save
    /// from a destruction, the departing guest can. Link locked.
    fn end_dead_peer(&self, i: &mut LinkInner) {
        if !self.vanished.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut ended: KVec<u32> = KVec::new();
        for (id, _) in i.conns.iter() {
            if ended.push(*id, GFP_KERNEL).is_err() {
                break;
            }
        }
        for id in ended.iter() {
            if let Some(s) = i.conns.remove(id) {
                socket::link_lost(&s);
            }
        }
        sys::counters::add(&sys::counters::PEERS_DEAD, 1);
        pr_info!(
            "link to dom{}: dom0 says the domain is gone: {} connection(s) reset\n",
            self.peer,
            ended.len()
        );
    }

    /// The peer went away: stream connections switch to their TCP legs
    /// and stay listed (a ring offer finds them when the link is back);
    /// every other connection over the link is reset.
    fn detach(&self, i: &mut LinkInner, why: &str) {
        sys::counters::add(&sys::counters::LINKS_DOWN, 1);
        self.up.store(false, Ordering::Release);
        self.wake.set_up(false);
        self.kick_port.store(0, Ordering::Release);
        // frames for the peer that went away
        i.backlog = KVec::new();
        // nobody can map them any more (the rings go as the peer unmaps)
        let lent = core::mem::replace(&mut i.lent, RBTree::new());
        drop(lent);
        pr_info!("link to dom{} down: {}\n", self.peer, why);
        self.prune(i);
        // the peer's rings stay mapped until the switches copied them back
        let mut lost: KVec<u32> = KVec::new();
        for (id, s) in i.conns.iter() {
            if !crate::carrier::switch::peer_gone(s) && lost.push(*id, GFP_KERNEL).is_err() {
                socket::link_lost(s);
            }
        }
        for id in lost.iter() {
            if let Some(s) = i.conns.remove(id) {
                socket::link_lost(&s);
            }
        }
        let ph = i.peer.take();
        drop(ph);
        // a dead peer's mappings are gone: its pending grants can end
        sys::pending_grants_kick();
    }

    /// Our directory for this link came back empty (dom0/the agent made
    /// the pair co-resident again): advertise our half again; the peer
    /// attaches to it as at first.
    fn readvertise(&self) {
        let i = self.inner.lock();
        let Some(mine) = i.mine.as_ref() else { return };
        // ring-ref, not state: attaching to the peer's half writes our
        // state into the new, empty directory before we advertised again
        // (state 4 without a ring-ref, and the peer never attached)
        if xs::read_u32(&self.my_dir, node::RING_REF) == Some(mine._grant.gref) {
            return;
        }
        let state = if i.peer.is_some() {
            LinkState::Connected.value() as i32
        } else {
            LinkState::Initialised.value() as i32
        };
        if xs::advertise(&self.my_dir, mine._grant.gref, mine._chan.port, state).is_ok() {
            pr_info!(
                "link to dom{}: directory back, advertised again\n",
                self.peer
            );
        }
    }

    /// Follows the peer's state, drains control frames, wakes sockets.
    fn service(self: &Arc<Self>, xs_changed: bool) {
        let mut i = self.inner.lock();
        if i.mine.is_none() {
            return;
        }
        if xs_changed {
            self.follow_peer(&mut i);
        }
        self.drain(&mut i);
        Self::flush_backlog(&mut i);
        self.send_requests_locked(&mut i);
        // Every readiness bit: we do not know what moved (data, space, a
        // FIN, a reset), and poll's wait entries filter wakeups by the
        // events they asked for (a POLLRDHUP-only poller missed FIN when
        // this woke with POLLIN|POLLOUT only).
        let all = sys::poll::POLLIN
            | sys::poll::POLLOUT
            | sys::poll::POLLRDNORM
            | sys::poll::POLLWRNORM
            | sys::poll::POLLRDHUP
            | sys::poll::POLLHUP
            | sys::poll::POLLERR;
        self.prune(&mut i);
        for (_, s) in i.conns.iter() {
            s.wake_live(all);
        }
    }

    /// Drops the entries of connections this link no longer carries: a
    /// connection that went on under a newer link to its peer
    /// (`adopt_moved`, `adopt`) stayed listed here too, and its
    /// close only takes it off the newer one; this link must neither wake
    /// it nor switch it again when it goes down. A socket with no link at
    /// all is one that `destroy` or a failed connect is taking off itself:
    /// it stays until then, so that the peer's `Close` still finds it
    /// (pruned, the Close went unnoticed and the closing acceptor lent its
    /// ring for the whole bound).
    fn prune(&self, i: &mut LinkInner) {
        let mut stale: KVec<u32> = KVec::new();
        for (id, s) in i.conns.iter() {
            let elsewhere = s
                .inner
                .lock()
                .link
                .as_ref()
                .is_some_and(|l| !core::ptr::eq(&**l, self));
            if elsewhere && stale.push(*id, GFP_KERNEL).is_err() {
                break;
            }
        }
        for id in stale.iter() {
            let gone = i.conns.remove(id);
            drop(gone);
        }
    }

    fn follow_peer(self: &Arc<Self>, i: &mut LinkInner) {
        let st = xs::read_u32(&self.peer_dir, node::STATE);
        let gref = xs::read_u32(&self.peer_dir, node::RING_REF);
        let port = xs::read_u32(&self.peer_dir, node::EVENT_CHANNEL);
        let advertised = st
            .and_then(LinkState::from_value)
            .is_some_and(LinkState::is_offered);
        if let Some(ph) = &i.peer {
            if !advertised && st.is_none() {
                // vanished, not retracted: a destroyed domain, or a pair
                // dom0 ended; the first unless dom0 says it is gone
                self.vanished.store(true, Ordering::Release);
                self.detach(i, "peer state removed");
                if dead_marked(self.me, self.peer) {
                    self.end_dead_peer(i);
                }
            } else if !advertised {
                self.detach(i, "peer state changed or removed");
            } else if gref != Some(ph.gref) || port != Some(ph.port) {
                self.detach(i, "peer re-advertised (restarted)");
            }
        }
        if i.peer.is_none() && advertised {
            if let (Some(r), Some(p)) = (gref, port) {
                if let Err(x) = self.attach(i, r, p) {
                    pr_warn!(
                        "link to dom{}: cannot attach to ring-ref {} port {}: {:?}\n",
                        self.peer,
                        r,
                        p,
                        x
                    );
                } else {
                    self.adopt_moved(i);
                }
            }
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
    fn adopt_moved(self: &Arc<Self>, i: &mut LinkInner) {
        let mut followed: KVec<Arc<XenSock>> = KVec::new();
        let p = socket::globals().ports.lock();
        for (_, xs) in p.all.iter() {
            let (id, old, was) = {
                let mut inner = xs.inner.lock();
                let Some(earlier) = inner.link.as_ref() else {
                    continue;
                };
                let stale = !Arc::ptr_eq(earlier, self) && !earlier.is_up();
                let renamed = self.peer_uuid.is_some()
                    && earlier.peer_uuid == self.peer_uuid
                    && earlier.peer == inner.peer.domid;
                if inner.state != socket::State::Connected
                    || inner.released
                    || inner.sw.is_none()
                    || !stale
                {
                    continue;
                }
                if inner.peer.domid != self.peer && !renamed {
                    continue;
                }
                let was = core::mem::replace(&mut inner.peer.domid, self.peer);
                (inner.conn_id, inner.link.replace(self.clone()), was)
            };
            drop(old);
            if i.conns.get(&id).is_none() {
                let _ = i.conns.try_create_and_insert(id, xs.clone(), GFP_KERNEL);
            }
            if was == self.peer {
                pr_info!(
                    "connection {}: continues under the new link to dom{}\n",
                    id,
                    self.peer
                );
            } else {
                pr_info!(
                    "connection {}: peer dom{} is now dom{} (the agent lists its UUID {} there)\n",
                    id,
                    was,
                    self.peer,
                    self.peer_uuid.as_ref().map_or("?", |u| u.as_str())
                );
                let _ = followed.push(xs.clone(), GFP_KERNEL);
            }
        }
        // sw.tx after the ports lock (link.inner -> sw.tx is the order)
        drop(p);
        for xs in followed.iter() {
            crate::carrier::switch::followed_peer(xs, self);
        }
    }

    /// A `RingOffer` for a connection this link does not know: the peer
    /// may have moved (its domid changed with a save/restore or a
    /// migration) and offer a ring for a connection of ours that went to
    /// TCP when its old link died. Returns that connection, if `conn_id`
    /// names one; nothing is changed (`carrier::on_candidate_offer` says
    /// why).
    fn moved_peer_candidate(&self, conn_id: u32) -> Option<Arc<XenSock>> {
        let p = socket::globals().ports.lock();
        for (_, xs) in p.all.iter() {
            let inner = xs.inner.lock();
            let stale = inner
                .link
                .as_ref()
                .map(|l| l.peer != self.peer && !l.is_up())
                .unwrap_or(false);
            if inner.conn_id == conn_id
                && inner.state == socket::State::Connected
                && !inner.released
                && inner.sw.is_some()
                && stale
            {
                return Some(xs.clone());
            }
        }
        None
    }

    /// Makes this link the connection's, its peer proved to be this link's
    /// domain (`carrier::adopt_proven`). Returns whether it did: not if
    /// the link went down since, or the connection ended or has a live
    /// link again.
    pub(crate) fn adopt(self: &Arc<Self>, xs: &Arc<XenSock>) -> bool {
        let mut i = self.inner.lock();
        if !self.is_up() {
            return false;
        }
        let (conn_id, old) = {
            let mut inner = xs.inner.lock();
            let stale = inner
                .link
                .as_ref()
                .map(|l| !Arc::ptr_eq(l, self) && !l.is_up())
                .unwrap_or(false);
            if inner.state != socket::State::Connected || inner.released || !stale {
                return false;
            }
            let was = inner.peer.domid;
            inner.peer.domid = self.peer;
            pr_info!(
                "connection {}: peer dom{} is now dom{}\n",
                inner.conn_id,
                was,
                self.peer
            );
            (inner.conn_id, inner.link.replace(self.clone()))
        };
        drop(old);
        let _ = i
            .conns
            .try_create_and_insert(conn_id, xs.clone(), GFP_KERNEL);
        true
    }

    /// Test hook (`inject_ring_offers`): ring offers for the peer's
    /// connection ids 1..=n whose grant refs name nothing.
    fn send_forged_offers(&self, n: u32) {
        pr_warn!(
            "inject_ring_offers: forged ring offers for connections 1..{} to dom{}\n",
            n,
            self.peer
        );
        for conn_id in 1..=n {
            let rx = crate::proto::ctrl::RingGrant {
                order: 12,
                epoch: 1,
                header_ref: 0,
                dir_ref: 0,
            };
            if self.send(&Message::RingOffer { conn_id, rx }).is_err() {
                break;
            }
        }
    }

    /// Sends the ConnectRequests of pending connects over this link, if it
    /// is up (process context).
    pub(crate) fn send_requests(&self) {
        let mut i = self.inner.lock();
        self.send_requests_locked(&mut i);
    }

    fn send_requests_locked(&self, i: &mut LinkInner) {
        if i.peer.is_none() {
            return;
        }
        let mut todo: KVec<Arc<XenSock>> = KVec::new();
        for (_, s) in i.conns.iter() {
            if socket::pending_request(s).is_some() && todo.push(s.clone(), GFP_KERNEL).is_err() {
                break;
            }
        }
        for s in todo.iter() {
            let Some((conn_id, src_port, dst_port, rx)) = socket::pending_request(s) else {
                continue;
            };
            let cookie = s.inner.lock().tcp.cookie;
            let req = Message::ConnectRequest {
                conn_id,
                src_port,
                dst_port,
                sock_type: if socket::is_seqpacket(s) {
                    SockType::SeqPacket
                } else {
                    SockType::Stream
                },
                cookie,
                rx,
                tcp: crate::carrier::leg::local_endpoint(),
            };
            match Self::send_locked(i, &req) {
                Ok(()) => socket::request_sent(s),
                // the frame queue is full: retry when the work item runs next
                Err(x) if x == e::ENOBUFS => return,
                Err(_) => {
                    i.conns.remove(&conn_id);
                    socket::connect_failed(s, e::ECONNRESET);
                }
            }
        }
    }

    fn drain(self: &Arc<Self>, i: &mut LinkInner) {
        let mut buf = [0u8; ctrl::MAX_CONTROL_FRAME];
        for _ in 0..DRAIN_BATCH {
            let Some(len) = self.next_frame(i, &mut buf) else {
                self.after_drain(i);
                return;
            };
            let frame = buf;
            match ctrl::decode(&frame[..len], Channel::Link) {
                Ok((m, _)) => self.handle(i, &m),
                Err(_) => pr_warn!(
                    "link to dom{}: undecodable control frame dropped\n",
                    self.peer
                ),
            }
        }
        // more frames than one batch: let other work run, then continue
        self.after_drain(i);
        sys::schedule_work();
    }

    /// The peer may wait for room in our control ring (its event index).
    fn after_drain(&self, i: &mut LinkInner) {
        if let Some(mine) = i.mine.as_mut() {
            if mine.rx.flush() {
                self.kick();
            }
        }
    }

    /// Takes the next whole control frame out of our receive ring into
    /// `buf`; its length, or None when there is none (or garbage, dropped).
    fn next_frame(
        &self,
        i: &mut LinkInner,
        buf: &mut [u8; ctrl::MAX_CONTROL_FRAME],
    ) -> Option<usize> {
        let mine = i.mine.as_mut()?;
        let n = match mine.rx.readable() {
            Ok(n) => n as usize,
            Err(_) => {
                pr_warn!("link to dom{}: corrupt control ring\n", self.peer);
                return None;
            }
        };
        if n < ctrl::HEADER_LEN {
            return None;
        }
        let _ = mine.rx.peek(&mut buf[..ctrl::HEADER_LEN]);
        let len = match ctrl::decode_header(&buf[..ctrl::HEADER_LEN], Channel::Link) {
            Ok(h) => h.frame_len(),
            Err(_) => usize::MAX,
        };
        if len > buf.len() {
            pr_warn!(
                "link to dom{}: bad control frame, dropping {} bytes\n",
                self.peer,
                n
            );
            let _ = mine.rx.skip(n as u32);
            return None;
        }
        if n < len {
            return None;
        }
        let _ = mine.rx.peek(&mut buf[..len]);
        let _ = mine.rx.skip(len as u32);
        Some(len)
    }

    fn handle(self: &Arc<Self>, i: &mut LinkInner, m: &Message<'_>) {
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
                let r = socket::accept_remote(
                    self,
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
                            socket::link_lost(child);
                            Message::ConnectReject {
                                conn_id,
                                reason: RejectReason::NoResources,
                            }
                        } else {
                            child.inner.lock().tcp =
                                crate::carrier::leg::ConnTcp { cookie, peer: tcp };
                            Message::ConnectAccept {
                                conn_id,
                                acceptor_id: *my_id,
                                cookie,
                                rx: *rx_grant,
                                tcp: crate::carrier::leg::local_endpoint(),
                            }
                        }
                    }
                    Err(reason) => Message::ConnectReject {
                        conn_id,
                        reason: *reason,
                    },
                };
                let sent = Self::send_locked(i, &reply);
                if let Err(x) = sent {
                    pr_warn!("link to dom{}: cannot answer connect: {}\n", self.peer, x);
                }
                if let Ok((child, my_id, _)) = r {
                    if sent.is_err() {
                        // the requester never hears of it: nothing to lend
                        i.conns.remove(&my_id);
                        socket::answer_lost(&child);
                    }
                    socket::accepted_remote(&child);
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
                        let _ = Self::send_locked(
                            i,
                            &Message::Reset {
                                conn_id: acceptor_id,
                                reason: ResetReason::ProtocolError,
                            },
                        );
                        i.conns.remove(&conn_id);
                        socket::connect_failed(&s, e::ECONNREFUSED);
                    }
                    Some(s) => {
                        s.inner.lock().tcp.peer = tcp;
                        if socket::connect_accepted(&s, self, acceptor_id, &rx).is_err() {
                            let _ = Self::send_locked(
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
                        let _ = Self::send_locked(
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
                    socket::connect_failed(&s, e::ECONNREFUSED);
                }
            }
            // The peer is done with the connection (socket::destroy): a ring
            // we lent it after our close can go now; a socket still open
            // learns that it need not lend its ring when it closes.
            Message::Reset { conn_id, .. } => {
                let lent = i.lent.remove(&conn_id);
                drop(lent);
                // the peer unmapped our rings of this connection before
                // it sent this: ring grants ended while it mapped them go now
                sys::pending_grants_kick();
                if let Some(s) = i.conns.remove(&conn_id) {
                    socket::peer_ended(&s);
                    socket::link_lost(&s);
                }
            }
            Message::RingOffer { conn_id, rx } => {
                if let Some(s) = i.conns.get(&conn_id).cloned() {
                    crate::carrier::switch::on_ring_offer(&s, rx);
                } else if let Some(s) = self.moved_peer_candidate(conn_id) {
                    crate::carrier::switch::on_candidate_offer(&s, self.clone(), rx);
                }
            }
            // Both directions' flags are already in the rings; the wake
            // after the drain lets the socket see them.
            Message::Close { conn_id } => {
                let lent = i.lent.remove(&conn_id);
                drop(lent);
                sys::pending_grants_kick();
                if let Some(s) = i.conns.get(&conn_id) {
                    socket::peer_ended(s);
                }
            }
            _ => {}
        }
    }
}

fn globals_table() -> &'static Mutex<LinkTable> {
    &socket::globals().links
}

/// The link to `peer`, advertised now if dom0 made its directory for us.
pub(crate) fn get_or_create(peer: u32) -> core::result::Result<Arc<Link>, i32> {
    let me = socket::globals().own_domid();
    let mut t = globals_table().lock();
    if t.stopping || t.suspended {
        return Err(e::ENETUNREACH);
    }
    if let Some(l) = t.links.iter().find(|l| l.peer == peer) {
        return Ok(l.clone());
    }
    let dir = root(me).map_err(|_| e::ENOMEM)?;
    let mut ids = [0u32; 64];
    let n = xs::dir_ids(&dir, &mut ids);
    if !ids[..n].contains(&peer) {
        return Err(e::EHOSTUNREACH);
    }
    let l = Link::create(me, peer).map_err(|x| {
        pr_warn!("link to dom{}: cannot advertise: {:?}\n", peer, x);
        e::EHOSTUNREACH
    })?;
    t.links.push(l.clone(), GFP_KERNEL).map_err(|_| e::ENOMEM)?;
    Ok(l)
}

/// A link half in our link directory that the user-space transport
/// (libxensock) advertises: the peer's domid. It writes `generation`,
/// which the module never does. Module init refuses to start beside it:
/// both would own these nodes and withdraw each other's links.
pub(crate) fn user_space_link(me: u32) -> Option<u32> {
    let dir = root(me).ok()?;
    let mut ids = [0u32; 64];
    let n = xs::dir_ids(&dir, &mut ids);
    ids[..n].iter().copied().find(|peer| {
        let Ok(half) = CString::try_from_fmt(fmt!(
            "{}",
            HalfPath {
                owner: me,
                peer: *peer
            }
        )) else {
            return false;
        };
        HalfValues {
            generation: xs::read_u32(&half, node::GENERATION),
            state: xs::read_u32(&half, node::STATE),
            ..HalfValues::default()
        }
        .held_by_user_space()
    })
}

/// Module init: watch our link directory (dom0 creating a link) and domain
/// deaths, then look once.
pub(crate) fn start() {
    let me = socket::globals().own_domid();
    if me == 0 {
        return;
    }
    let mut t = globals_table().lock();
    add_watches(&mut t, me);
    drop(t);
    sys::schedule_work();
}

/// Our link directory (dom0 creating a link) and domain deaths.
fn add_watches(t: &mut LinkTable, me: u32) {
    if let Ok(p) = root(me) {
        if let Ok(w) = xs::Watch::add(&p) {
            let _ = t.watches.push(w, GFP_KERNEL);
        }
    }
    // dom0 saying a peer is gone for good (`end_dead_peer`)
    if let Ok(p) = gone_dir(me) {
        if let Ok(w) = xs::Watch::add(&p) {
            let _ = t.watches.push(w, GFP_KERNEL);
        }
    }
    if let Ok(p) = CString::try_from_fmt(fmt!("@releaseDomain")) {
        if let Ok(w) = xs::Watch::add(&p) {
            let _ = t.watches.push(w, GFP_KERNEL);
        }
    }
}

/// Set by the restore hook: the work item starts over under our new domid.
static RESUMED: AtomicBool = AtomicBool::new(false);

/// This guest is about to be saved (`xl save`/`migrate`; the freeze hook,
/// with grants, mappings and event channels still valid): every link goes
/// down properly, its stream connections move to TCP (carrier.rs, the
/// read-back copy is taken from the peer's pages while they are mapped),
/// and our advertisements are retracted. Nothing of it is left to touch
/// after the restore, when all of it would be stale.
pub(crate) fn suspend_all() {
    let (links, watches) = {
        let mut t = globals_table().lock();
        if t.stopping {
            return;
        }
        t.suspended = true;
        (
            core::mem::replace(&mut t.links, KVec::new()),
            core::mem::replace(&mut t.watches, KVec::new()),
        )
    };
    drop(watches);
    for l in links.iter() {
        let (w, mine) = {
            let mut i = l.inner.lock();
            l.detach(&mut i, "this domain is being saved");
            (i.watch.take(), i.mine.take())
        };
        drop(w);
        xs::retract(&l.my_dir);
        drop(mine);
    }
    pr_info!(
        "suspend: {} links down, stream connections on TCP\n",
        links.len()
    );
}

/// The freeze is over: restored (a new domain, maybe a new domid) or the
/// suspend was cancelled. The work item starts the links over.
pub(crate) fn resumed(restored: bool) {
    pr_info!(
        "{}: links start over\n",
        if restored {
            "restored"
        } else {
            "suspend cancelled"
        }
    );
    RESUMED.store(true, Ordering::Release);
    crate::carrier::switch::resumed();
    sys::schedule_work();
}

/// Work item, after a restore: our domid as XenStore says now, watches on
/// our (new) link directory.
fn start_over() {
    let old = socket::globals().own_domid();
    let me = sys::xenstore_read_u32(c"domid", c"").unwrap_or(old);
    socket::globals().set_own_domid(me);
    let mut t = globals_table().lock();
    t.suspended = false;
    let w = core::mem::replace(&mut t.watches, KVec::new());
    add_watches(&mut t, me);
    drop(t);
    drop(w);
    pr_info!("back as dom{} (was dom{})\n", me, old);
}

/// The work item.
pub(crate) fn work() {
    let t0 = crate::sys::net::now_ms();
    work_pass();
    crate::carrier::switch::note_work_ms(
        &crate::carrier::switch::counters::LINK_WORK_MAX_MS,
        crate::sys::net::now_ms() - t0,
    );
}

fn work_pass() {
    let resumed = RESUMED.swap(false, Ordering::AcqRel);
    if resumed {
        start_over();
    }
    let me = socket::globals().own_domid();
    if me == 0 {
        return;
    }
    let xs_changed = sys::take_xs_dirty() || resumed;
    let mut ids = [0u32; 64];
    let mut n = 0;
    if let Ok(dir) = root(me).and_then(|d| if xs_changed { Ok(d) } else { Err(EAGAIN) }) {
        n = xs::dir_ids(&dir, &mut ids);
        for &peer in &ids[..n] {
            if peer != me {
                let _ = get_or_create(peer);
            }
        }
    }
    let Some(links) = links_snapshot(|_| true) else {
        return;
    };
    let forge = sys::take_inject_ring_offers();
    for l in links.iter() {
        if xs_changed && ids[..n].contains(&l.peer) {
            l.readvertise();
        }
        if forge > 0 && l.is_up() {
            l.send_forged_offers(forge);
        }
        l.service(xs_changed);
        // dom0's word may come after the peer's half vanished
        if xs_changed && l.vanished.load(Ordering::Acquire) && dead_marked(me, l.peer) {
            let mut i = l.inner.lock();
            l.end_dead_peer(&mut i);
        }
    }
}

/// The links `keep` selects, taken out of the table so they can be
/// serviced without its lock; None while the module stops or the guest
/// is suspended.
fn links_snapshot(keep: impl Fn(&Link) -> bool) -> Option<KVec<Arc<Link>>> {
    let t = globals_table().lock();
    if t.stopping || t.suspended {
        return None;
    }
    let mut v = KVec::new();
    for l in t.links.iter() {
        if keep(l) && v.push(l.clone(), GFP_KERNEL).is_err() {
            break;
        }
    }
    Some(v)
}

/// While stream connections wait on TCP for their link to come back:
/// look at the links that are down as if a watch had fired (the TCP work
/// item calls this at most every 500 ms). A watch event can be missed
/// while a link directory is being made again (one side re-advertised,
/// the other never attached to it), and a connection must not stay on TCP because of it.
pub(crate) fn poll_down_links() {
    static LAST_MS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
    let now = crate::sys::net::now_ms();
    let last = LAST_MS.load(Ordering::Relaxed);
    if now < last + 500
        || LAST_MS
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let me = socket::globals().own_domid();
    let Some(links) = links_snapshot(|l| !l.is_up()) else {
        return;
    };
    if links.is_empty() {
        return;
    }
    let mut ids = [0u32; 64];
    let n = root(me).map(|d| xs::dir_ids(&d, &mut ids)).unwrap_or(0);
    for l in links.iter() {
        if !ids[..n].contains(&l.peer) {
            continue;
        }
        l.readvertise();
        let mut i = l.inner.lock();
        if i.mine.is_some() && i.peer.is_none() {
            l.follow_peer(&mut i);
        }
    }
}

/// Module exit (no sockets left): stop the work, retract every link.
pub(crate) fn shutdown_all() {
    let (watches, links) = {
        let mut t = globals_table().lock();
        t.stopping = true;
        (
            core::mem::replace(&mut t.watches, KVec::new()),
            core::mem::replace(&mut t.links, KVec::new()),
        )
    };
    drop(watches);
    for l in links.iter() {
        let (w, ph, mine) = {
            let mut i = l.inner.lock();
            l.up.store(false, Ordering::Release);
            l.wake.set_up(false);
            l.kick_port.store(0, Ordering::Release);
            (i.watch.take(), i.peer.take(), i.mine.take())
        };
        drop(w);
        drop(ph);
        xs::retract(&l.my_dir);
        drop(mine);
        // lent rings hold the link (the pipes' `link`): break the cycle
        let lent = core::mem::replace(&mut l.inner.lock().lent, RBTree::new());
        drop(lent);
    }
    sys::cancel_work();
    sys::cancel_reap();
    drop(links);
}

/// Lends `rx`, the receive ring of our closed connection `conn_id`, to the
/// link's peer until its Close or Reset (see `Lent`). Called with the link
/// locked, in the same critical section that took the connection off
/// `conns`, so a Close handled by the work item either found the socket
/// (and it does not lend) or finds the ring here.
pub(crate) fn lend(i: &mut LinkInner, conn_id: u32, rx: Arc<crate::carrier::ring::Pipe>) {
    // no memory for the entry: the grant ends now, as it did before lending
    if i.lent
        .try_create_and_insert(conn_id, Lent::new(rx), GFP_KERNEL)
        .is_ok()
    {
        sys::schedule_reap(LINGER_MAX_MS as u32 + 100);
    }
}

/// The delayed work for the links' deadlines: ends lent rings whose peer
/// never answered within `LINGER_MAX_MS` (counted in `linger_expired`;
/// ending is kept pending while the peer maps the ring), fails connects
/// whose answer did not come within `socket::CONNECT_TIMEOUT_MS`
/// (ETIMEDOUT), and runs again for the rest.
pub(crate) fn reap() {
    let links: KVec<Arc<Link>> = {
        let t = globals_table().lock();
        if t.stopping {
            return;
        }
        let mut v = KVec::new();
        for l in t.links.iter() {
            if v.push(l.clone(), GFP_KERNEL).is_err() {
                break;
            }
        }
        v
    };
    let now = crate::sys::net::now_ms();
    let mut next: Option<u64> = None;
    for l in links.iter() {
        let mut expired: KVec<Lent> = KVec::new();
        let mut n_expired = 0i64;
        {
            let mut i = l.inner.lock();
            let mut due: KVec<u32> = KVec::new();
            for (id, lent) in i.lent.iter() {
                if lent.deadline_ms <= now {
                    if due.push(*id, GFP_KERNEL).is_err() {
                        break;
                    }
                } else {
                    next = Some(next.map_or(lent.deadline_ms, |n| n.min(lent.deadline_ms)));
                }
            }
            let mut late: KVec<Arc<XenSock>> = KVec::new();
            for (_, s) in i.conns.iter() {
                match socket::connect_deadline(s) {
                    Some(d) if d <= now => {
                        let _ = late.push(s.clone(), GFP_KERNEL);
                    }
                    Some(d) => next = Some(next.map_or(d, |n| n.min(d))),
                    None => {}
                }
            }
            for s in late.iter() {
                let id = s.inner.lock().conn_id;
                i.conns.remove(&id);
                socket::connect_failed(s, e::ETIMEDOUT);
            }
            for id in due.iter() {
                if let Some(lent) = i.lent.remove(id) {
                    n_expired += 1;
                    // no room to carry it out: it ends here, under the
                    // link's mutex (may sleep: fine in a work item)
                    let _ = expired.push(lent, GFP_KERNEL);
                }
            }
        }
        if n_expired > 0 {
            sys::counters::add(&sys::counters::LINGER_EXPIRED, n_expired);
            pr_info!(
                "link to dom{}: {} closed connection(s) got no Close or Reset within {} s; their rings' grants end now\n",
                l.peer,
                n_expired,
                LINGER_MAX_MS / 1000
            );
        }
        // ending grants (and vfree) outside the link's lock
        drop(expired);
    }
    if let Some(n) = next {
        sys::schedule_reap((n.saturating_sub(now) + 100).min(u32::MAX as u64) as u32);
    }
}
