// SPDX-License-Identifier: GPL-2.0
//! Links to other domains (af-xen-kmod/README.md, "Link setup through
//! XenStore"): one per peer, a control ring each way plus an event channel
//! each way, set up through /local/domain/<me>/data/xensock/link/<peer>/.
//!
//! Everything asynchronous funnels into one work item (`work()`): the link
//! interrupts and the XenStore watches only schedule it. It discovers link
//! directories dom0 made for us, follows the peers' states, drains control
//! frames and wakes the sockets of every link.
//!
//! The link is a channel: what its frames and its going down mean for a
//! connection is decided above it, by the connections' owner through
//! [`LinkConn`] (the socket core, `socket/control.rs`). So nothing here
//! names a socket or a carrier.

mod half;
mod lent;
mod table;

pub(crate) mod wake;

pub(crate) use lent::*;
pub(crate) use table::*;

use crate::proto::ctrl::{self, Channel, Message};
use crate::proto::layout::{RingGeometry, RingIdentity, LINK_RING_MAGIC, LINK_RING_ORDER};
use crate::proto::link::{node, ControlFrame, HalfPath, HalfValues, LinkState};
use crate::proto::link_half::{follow, FailedAttach, HalfId, HalfStep, Held, Ours, Theirs};
use crate::proto::mem::RawRing;
use crate::proto::ring::{Consumer, Producer};
use crate::proto::store::{peer_node, InHome, DOMID, GONE_DIR, LINK_DIR, PEERS_DIR};
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
struct Attached {
    tx: Producer<RawRing>,
    chan: Evtchn<LinkWake>,
    /// The instance of the peer's half this is.
    half: HalfId,
    /// last: the ring above points into it
    _map: Mapping,
}

/// An encoded control frame waiting for room in the peer's control ring.
struct Frame {
    len: usize,
    buf: [u8; ctrl::MAX_CONTROL_FRAME],
}

/// Frames queued while the peer's control ring is full, at most. The ring
/// holds ~30 frames; a burst of connects, accepts or closes (1000
/// non-blocking connects at once) must not lose any.
const BACKLOG_MAX: usize = 8192;

/// What a link needs from the connections it carries and from the layer
/// that owns them. The link keeps the table of its connections and the
/// rings lent to its peer; the owner says what a control frame, the link
/// going down, a deadline or a restore mean for a connection.
pub(crate) trait LinkConn: Sized + Send + Sync + 'static {
    /// A closed connection's receive ring lent to the peer (`Lent`): the
    /// link only keeps it alive.
    type Ring: Send;

    /// The module's link table.
    fn links() -> &'static Mutex<LinkTable<Self>>;
    /// A link came up: connections waiting on TCP may offer rings again.
    fn link_up();
    /// This guest was restored or its suspend was cancelled.
    fn resumed();

    /// Wakes the connection's socket with every readiness bit.
    fn wake(&self);
    /// Whether the connection went on under another link (`prune`).
    fn carried_elsewhere(&self, link: &Link<Self>) -> bool;
    /// The connection's link went down: whether it stays listed, waiting
    /// for the link to come back (a stream gone to TCP).
    fn link_down(this: &Arc<Self>) -> bool;
    /// The connection's link is gone for it: it fails or is reset.
    fn link_lost(this: &Arc<Self>);
    /// When a pending connect fails with ETIMEDOUT, if it is one.
    fn connect_deadline(&self) -> Option<u64>;
    /// Our connection id.
    fn conn_id(&self) -> u32;
    /// A pending connect fails with `errno`.
    fn connect_failed(this: &Arc<Self>, errno: i32);

    /// One control frame from the peer (link locked).
    fn on_frame(link: &Arc<Link<Self>>, i: &mut LinkInner<Self>, m: &Message<'_>);
    /// Sends the ConnectRequests of pending connects (link locked, up).
    fn send_requests(i: &mut LinkInner<Self>);
    /// The link came up: connections that went to TCP under an earlier
    /// link to this peer (or to the same guest under an older domid)
    /// continue under it (link locked).
    fn adopt_moved(link: &Arc<Link<Self>>, i: &mut LinkInner<Self>);
}

pub(crate) struct LinkInner<C: LinkConn> {
    mine: Option<Half>,
    peer: Option<Attached>,
    /// frames for the peer, in order, that did not fit its ring yet
    backlog: KVec<Frame>,
    watch: Option<xs::Watch>,
    /// our connection id -> socket (connecting or connected over this link)
    pub(crate) conns: RBTree<u32, Arc<C>>,
    /// the link's wake table (also `Link::wake`), for the backlog flag
    wake: Arc<LinkWake>,
    /// our connection id -> receive ring lent to the peer after close
    pub(crate) lent: RBTree<u32, Lent<C::Ring>>,
    /// the last half of the peer we could not attach to, left alone for a
    /// while (proto's `ATTACH_RETRY_MS`)
    failed: Option<FailedAttach>,
}

#[pin_data]
pub(crate) struct Link<C: LinkConn> {
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
    pub(crate) inner: Mutex<LinkInner<C>>,
}

/// Module-wide link table (`LinkConn::links`).
pub(crate) struct LinkTable<C: LinkConn> {
    pub(crate) links: KVec<Arc<Link<C>>>,
    pub(crate) watches: KVec<xs::Watch>,
    pub(crate) stopping: bool,
    /// this guest is being saved: no link until it is back
    pub(crate) suspended: bool,
}

impl<C: LinkConn> LinkTable<C> {
    pub(crate) fn new() -> Self {
        LinkTable {
            links: KVec::new(),
            watches: KVec::new(),
            stopping: false,
            suspended: false,
        }
    }
}

/// Our domid as we last read it from XenStore (module init, and again
/// after a restore, which may give us a new one).
static OWN_DOMID: AtomicU32 = AtomicU32::new(0);

pub(crate) fn own_domid() -> u32 {
    OWN_DOMID.load(Ordering::Acquire)
}

pub(crate) fn set_own_domid(domid: u32) {
    OWN_DOMID.store(domid, Ordering::Release);
}

/// Our domid as XenStore says now (`domid` relative to our home: the
/// path is the node, read with an empty node name).
pub(crate) fn read_own_domid() -> Option<u32> {
    let path = CString::try_from_fmt(fmt!("{}", DOMID)).ok()?;
    let path = core::ffi::CStr::from_bytes_with_nul(path.as_bytes_with_nul()).ok()?;
    sys::xenstore_read_u32(path, c"")
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
    CString::try_from_fmt(fmt!(
        "{}",
        InHome {
            domid: me,
            rel: LINK_DIR
        }
    ))
}

/// `/local/domain/<me>/xensock/gone`: dom0's word that a domain is gone
/// for good, one node per domid (the agent writes it when a domain is
/// released without a move marker, and removes it when the domid is used
/// again).
fn gone_dir(me: u32) -> Result<CString> {
    CString::try_from_fmt(fmt!(
        "{}",
        InHome {
            domid: me,
            rel: GONE_DIR
        }
    ))
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

impl<C: LinkConn> Link<C> {
    /// Advertises our half for `peer` (dom0 made the directory).
    fn create(me: u32, peer: u32) -> Result<Arc<Self>> {
        let my_dir = CString::try_from_fmt(fmt!("{}", HalfPath { owner: me, peer }))?;
        let their_half = HalfPath {
            owner: peer,
            peer: me,
        };
        let peer_dir = CString::try_from_fmt(fmt!("{}", their_half))?;
        let state_path = CString::try_from_fmt(fmt!("{}/{}", their_half, node::STATE))?;
        // dom0 writes a peer's table entry with (or before) the pair's link
        // directories, so it is there whenever a link is made
        let peer_uuid_path = CString::try_from_fmt(fmt!(
            "{}/{}/{}",
            InHome {
                domid: me,
                rel: PEERS_DIR
            },
            peer,
            peer_node::UUID
        ))?;
        // the whole path, read as a node's own value (empty node name)
        let peer_uuid = xs::read_uuid(&peer_uuid_path, c"");
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
                    failed: None,
                }, "af_xen_link"),
            }),
            GFP_KERNEL,
        )
    }

    /// The peer's UUID in the agent's table when the link was made.
    pub(crate) fn peer_uuid(&self) -> Option<&xs::Uuid> {
        self.peer_uuid.as_ref()
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
    pub(crate) fn send_locked(
        i: &mut LinkInner<C>,
        m: &Message<'_>,
    ) -> core::result::Result<(), i32> {
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
    fn write_frame(i: &mut LinkInner<C>, frame: &[u8]) -> core::result::Result<bool, i32> {
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
    fn flush_backlog(i: &mut LinkInner<C>) {
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
    fn want_room(i: &mut LinkInner<C>) {
        // the peer's kick (it consumed) must reach the work item
        i.wake.set_backlog(true);
        if let Some(ph) = i.peer.as_mut() {
            if let Ok(false) = ph.tx.prepare_wait(ctrl::MAX_CONTROL_FRAME as u32) {
                sys::schedule_work();
            }
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
        self.prune(&mut i);
        for (_, s) in i.conns.iter() {
            s.wake();
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
    fn prune(&self, i: &mut LinkInner<C>) {
        let mut stale: KVec<u32> = KVec::new();
        for (id, s) in i.conns.iter() {
            if s.carried_elsewhere(self) && stale.push(*id, GFP_KERNEL).is_err() {
                break;
            }
        }
        for id in stale.iter() {
            let gone = i.conns.remove(id);
            drop(gone);
        }
    }

    /// Test hook (`inject_ring_offers`): ring offers for the peer's
    /// connection ids 1..=n whose grant refs name nothing.
    #[cfg(afx_test_hooks)]
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

    fn send_requests_locked(&self, i: &mut LinkInner<C>) {
        if i.peer.is_some() {
            C::send_requests(i);
        }
    }

    fn drain(self: &Arc<Self>, i: &mut LinkInner<C>) {
        let mut buf = [0u8; ctrl::MAX_CONTROL_FRAME];
        for _ in 0..DRAIN_BATCH {
            let Some(len) = self.next_frame(i, &mut buf) else {
                if Self::frames_after_arming(i) {
                    continue;
                }
                self.after_drain(i);
                return;
            };
            let frame = buf;
            match ctrl::decode(&frame[..len], Channel::Link) {
                Ok((m, _)) => C::on_frame(self, i, &m),
                Err(_) => {
                    sys::counters::add(&sys::counters::LINK_FRAMES_BAD, 1);
                    pr_warn!(
                        "link to dom{}: undecodable control frame dropped\n",
                        self.peer
                    )
                }
            }
        }
        // more frames than one batch: let other work run, then continue
        self.after_drain(i);
        sys::schedule_work();
    }

    /// Publishes our event index before the link sleeps: the peer's
    /// producer kicks only when it writes past it (the ring's rule, which
    /// the user-space transport follows). Left at 0, only a link's first
    /// frame from position 0 would kick, and a later process of the peer,
    /// going on at our consumer's position, would never wake us.
    /// Returns whether whole frames came in meanwhile.
    fn frames_after_arming(i: &mut LinkInner<C>) -> bool {
        i.mine.as_mut().is_some_and(|m| {
            matches!(m.rx.prepare_wait(), Ok(false))
                && m.rx
                    .readable()
                    .is_ok_and(|n| n as usize >= ctrl::HEADER_LEN)
        })
    }

    /// The peer may wait for room in our control ring (its event index).
    fn after_drain(&self, i: &mut LinkInner<C>) {
        if let Some(mine) = i.mine.as_mut() {
            if mine.rx.flush() {
                self.kick();
            }
        }
    }

    /// Takes the next whole control frame out of our receive ring into
    /// `buf` (proto's framing rule): its length, or None when there is
    /// none. Garbage costs what was readable; a corrupt ring takes the
    /// link down.
    fn next_frame(
        &self,
        i: &mut LinkInner<C>,
        buf: &mut [u8; ctrl::MAX_CONTROL_FRAME],
    ) -> Option<usize> {
        let mine = i.mine.as_mut()?;
        match crate::proto::link::take_control_frame(&mut mine.rx, buf) {
            Ok(ControlFrame::Whole(len)) => Some(len),
            Ok(ControlFrame::Incomplete) => None,
            Ok(ControlFrame::Garbage(n)) => {
                sys::counters::add(&sys::counters::LINK_FRAMES_BAD, 1);
                pr_warn!(
                    "link to dom{}: bad control frame, dropping {} bytes\n",
                    self.peer,
                    n
                );
                None
            }
            Err(_) => {
                sys::counters::add(&sys::counters::LINK_FRAMES_BAD, 1);
                if i.peer.is_some() {
                    self.detach(i, "corrupt control ring");
                }
                None
            }
        }
    }
}
