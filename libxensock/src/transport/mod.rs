// SPDX-License-Identifier: MIT OR Apache-2.0
//! The user-space transport: one per process and domain. It owns the links
//! (one per peer domain, set up once through XenStore), dispatches control
//! frames in a manager thread, and creates connections with their own data
//! rings. See `docs/protocol.md` section 6.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xensock_discovery::xs::{CallbackWatch, XsClient, XsError};
use xensock_proto::ctrl::{
    self, Channel, Message, RejectReason, ResetReason, SockType, TcpEndpoint,
};
use xensock_proto::layout::{RingGeometry, RingIdentity, LINK_RING_ORDER};
use xensock_proto::link::{
    node, take_control_frame, ControlFrame, HalfPath, HalfValues, LinkState, PeerHalf,
};
use xensock_proto::link_half::{follow, FailedAttach, HalfId, HalfStep, Held, Ours, Theirs};
use xensock_proto::mem::RawRing;
use xensock_proto::ring::{Consumer, Field, Producer, RingMemory};
use xensock_proto::store;
use xensock_xenif::xs_wire::{Perm, PermAccess, XsErrno};
use xensock_xenif::{DomId, EventChannel, UnmapNotify, XenBackend};

use crate::addr::{SockAddrXen, DOMID_ANY, DOMID_FIRST_RESERVED, DOMID_SELF, PORT_ANY};
use crate::backend::{BackendKind, Dyn, DynXen};
use crate::carrier::{
    endpoint_of, socket_addr_of, LegListener, LegListenerConfig, LegStats, NewRing, RingAlloc,
    Seed, Switch, SwitchConfig, Trigger,
};
use crate::conn::{
    lock, Conn, ConnIo, ConnPhase, KickWait, LinkShared, RxSide, TxSide, NOT_WAITING,
};
use crate::error::{errno, Error};
use crate::options::SocketOptions;
use crate::rings::HeldRing;
use crate::rings::{
    data_identity, get_byte, grant_ring, link_identity, map_ring, reinit_ring, set_byte,
    verify_fresh, MappedRing, OwnedRing, LINK_MAPPER_ALIVE_OFFSET, LINK_OWNER_ALIVE_OFFSET,
};
use crate::sys;
use crate::sys::eventfd::EventFd;
use accept::ListenerShared;

pub(crate) mod accept;
mod config;
mod connections;
mod discovery;
mod exit;
#[cfg(test)]
mod kept_half_tests;
mod link;
mod manager;
mod migration;
mod pool;
mod start;
mod status;

use start::{random_u32, random_u64, GLOBAL};

use config::*;
pub use config::{Config, ENV_CONNECT_TIMEOUT_MS, ENV_LINK_TIMEOUT_MS, ENV_PEER_LOST_MS};
use manager::*;
pub use status::{decode_field, Carrier, ConnStatus, LegCounters, LinkStatus, Status};

/// XenStore directory, relative to a domain's home, under which a domain
/// publishes one node per peer it has a link with: `data/xensock/link/<peer>`.
pub(crate) const LINK_DIR: &str = store::LINK_DIR;

/// Idle receive rings kept per ring order on a link, at most.
const POOL_PER_ORDER: usize = 8;
/// Bytes of idle receive rings kept per ring order on a link, at most (one
/// ring is always kept).
const POOL_BYTES_PER_ORDER: usize = 4 << 20;
/// Peer rings kept mapped after their connection, per link, at most.
const MAPPED_KEPT_MAX: usize = 64;

/// A blocking connect spins for this many times `Config::busy_poll` for
/// the answer before sleeping: the peer's manager has to wake up first.
const CONNECT_SPIN_FACTOR: u32 = 4;

/// How long a `Close` may wait in the control ring for a kick: it only
/// does bookkeeping at the peer (the rings' FIN and CLOSED flags carry the
/// end of stream, and are kicked at once when the peer waits on them), and
/// the next frame on the link usually carries the kick, so closing a
/// connection does not wake the peer's manager thread.
const CLOSE_KICK_DELAY: Duration = Duration::from_millis(2);
/// epoll token of the transport's kick timer.
const KICK_TIMER_TOKEN: u64 = u64::MAX;

/// First port handed out for `PORT_ANY`.
pub const EPHEMERAL_PORT_FIRST: u32 = 49152;

struct LinkTx {
    ring: MappedRing,
    p: Producer<RawRing>,
    chan: Arc<dyn EventChannel>,
}

struct Link {
    peer: DomId,
    gen: u32,
    peer_half: Option<HalfId>,
    rx: OwnedRing,
    c: Consumer<RawRing>,
    rx_chan: Box<dyn EventChannel>,
    tx: Option<LinkTx>,
    pending: VecDeque<([u8; ctrl::MAX_CONTROL_FRAME], usize)>,
    shared: Arc<LinkShared>,
    conns: HashSet<u32>,
    peer_seen_alive: bool,
    owner_seen_alive: bool,
    created_dir: bool,
    /// Both sides advertise `feature-ring-reuse`.
    reuse: bool,
    /// Frames were written without deciding on a kick.
    kick_owed: bool,
    rings: RingCache,
}

/// Rings kept across connections on one link (docs/protocol.md 6.6).
#[derive(Default)]
struct RingCache {
    /// Our receive rings that no connection uses and that the peer no
    /// longer writes, by ring order: re-offered at the next connect/accept.
    pool: HashMap<u8, Vec<OwnedRing>>,
    /// Our receive rings whose connection closed here before the peer's
    /// `Close` came (until then it may still write), by our connection id.
    lent: HashMap<u32, OwnedRing>,
    /// Peer rings we stopped writing and keep mapped, oldest first.
    mapped: VecDeque<(ctrl::RingGrant, MappedRing)>,
}

/// Where the XenStore client's reader thread puts the paths that fired
/// (a callback per watch); the manager thread takes them. Not tied to the
/// transport's lifetime, so a callback never keeps it alive.
struct WatchSink {
    events: Mutex<Vec<String>>,
    wake: EventFd,
}

impl WatchSink {
    fn push(&self, path: String) {
        lock(&self.events).push(path);
        self.wake.signal();
    }
}

/// What the transport knows about which domains it may link with, and the
/// XenStore watches that follow them (`docs/protocol.md` 6.2).
#[derive(Default)]
struct Watches {
    /// Registered watches by path.
    by_path: HashMap<String, CallbackWatch>,
    /// The agent's table for us (`xensock/peers`), if it publishes one.
    table: Option<HashSet<DomId>>,
    /// Link directories dom0 made for us (`data/xensock/link/<P>`).
    dom0_dirs: HashSet<DomId>,
    /// UUIDs of the peers the table listed (kept after they leave it, to
    /// read the agent's `moved` note about them).
    uuids: HashMap<DomId, String>,
}

pub(crate) struct State {
    links: HashMap<DomId, Link>,
    pub(crate) listeners: HashMap<u32, Arc<ListenerShared>>,
    conns: HashMap<u32, Arc<Conn>>,
    used_ports: HashSet<u32>,
    dead_gens: HashMap<DomId, u32>,
    /// The last half of each peer we could not attach to (left alone for
    /// a while: `link_half::ATTACH_RETRY_MS`).
    failed_attach: HashMap<DomId, FailedAttach>,
    /// Peers whose link was lost without their half being retracted first
    /// (state Closed, as a guest being saved or migrated does): dead if
    /// dom0 notes them gone (`xensock/gone/<domid>`), else moving.
    vanished: HashSet<DomId>,
    next_port: u32,
}

/// Counters for `status`.
#[derive(Debug, Default)]
struct Counters {
    resets_sent: AtomicU64,
    resets_received: AtomicU64,
    ring_errors: AtomicU64,
    links_lost: AtomicU64,
    rejected: AtomicU64,
}

pub(crate) struct Inner {
    xen: Box<dyn DynXen>,
    xs: XsClient,
    /// This domain's id; changes when the domain migrates on this host.
    domid: AtomicU16,
    kind: BackendKind,
    /// Ourselves, for callbacks that must not keep the transport alive.
    weak: std::sync::Weak<Inner>,
    /// The TCP listener for connections' legs (`None`: no TCP fallback).
    legs: Option<Arc<LegListener>>,
    /// Where peers reach `legs`, as it travels in the handshake.
    leg_endpoint: TcpEndpoint,
    pub(crate) cfg: Config,
    state: Mutex<State>,
    link_cv: Condvar,
    epoll: OwnedFd,
    sink: Arc<WatchSink>,
    watches: Mutex<Watches>,
    /// [`Config::static_peers`], resolved.
    static_peers: Option<HashSet<DomId>>,
    stop: AtomicBool,
    next_conn: AtomicU32,
    counters: Counters,
    /// Fires `CLOSE_KICK_DELAY` after a `Close` went out without a kick,
    /// so that the peer processes it even if nothing else follows.
    kick_timer: OwnedFd,
    kick_timer_armed: AtomicBool,
    /// Connections ever handed to a carrier switch (0: the link manager
    /// skips looking for them).
    carriers: std::sync::atomic::AtomicUsize,
    /// Between the suspend hook and the resume (or the new domid): no
    /// connection goes back onto a ring, whose pages the move would take.
    suspended: AtomicBool,
}

/// Keeps the transport running; dropped when the last handle goes.
pub(crate) struct Owner {
    pub(crate) inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The process-wide transport's control socket (`None` for others).
    control: Mutex<Option<crate::control::ControlServer>>,
    /// The domain's claim on its transport; released after the teardown
    /// in `drop`, so that a successor never meets our links.
    claim: crate::claim::Claim,
}

impl Drop for Owner {
    /// Orderly shutdown: every link is torn down (connections reset, our
    /// XenStore nodes withdrawn) and every watch removed, so that nothing
    /// of this transport stays in XenStore.
    fn drop(&mut self) {
        lock(&self.control).take();
        self.inner.stop.store(true, Ordering::Release);
        self.inner.sink.wake.signal();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        let mut st = self.inner.state();
        let peers: Vec<DomId> = st.links.keys().copied().collect();
        for p in peers {
            self.inner.link_down(&mut st, p, false);
        }
        st.listeners.clear();
        drop(st);
        lock(&self.inner.watches).by_path.clear();
    }
}

/// A domain's xensock endpoint in this process: the links to peer domains
/// and the connections over them. Cheap to clone.
///
/// Most programs use the process-wide transport implicitly
/// ([`XenListener::bind`](crate::XenListener::bind), [`XenStream::connect`](crate::XenStream::connect), chosen by
/// [`crate::backend()`]). Tests and the demo run several simulated
/// domains in one process, one `Transport` each ([`Transport::sim`]).
///
/// One `Transport` per domain at a time: the XenStore link nodes are per
/// domain, so a transport takes the domain's claim (a lock file, [`crate::hooks::ENV_CLAIM_PATH`]) and
/// a second one, in this process or another, is refused naming the first.
#[derive(Clone)]
pub struct Transport {
    pub(crate) owner: Arc<Owner>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("domid", &self.domid())
            .field("backend", &self.owner.inner.kind)
            .finish()
    }
}

/// The longest a process's exit waits for its TCP-carried connections'
/// bytes to be acknowledged ([`Inner::end_at_exit`]).
const EXIT_LINGER: Duration = Duration::from_secs(2);

impl Transport {
    /// This domain's id.
    pub fn domid(&self) -> DomId {
        self.owner.inner.domid()
    }

    /// The backend in use.
    pub fn backend_kind(&self) -> BackendKind {
        self.owner.inner.kind
    }

    /// A listening port for `addr` (its domid must be this domain, `self`
    /// or `any`): [`Transport::bind_with`]'s table entry.
    pub(crate) fn listen(
        &self,
        addr: impl crate::addr::ToXenAddr,
        opts: SocketOptions,
    ) -> io::Result<Arc<ListenerShared>> {
        let addr = addr.to_xen_addr()?;
        let inner = &self.owner.inner;
        if addr.domid != DOMID_SELF
            && addr.domid != DOMID_ANY
            && addr.domid != u32::from(inner.domid())
        {
            return Err(errno(libc::EADDRNOTAVAIL));
        }
        let mut st = inner.state();
        let port = if addr.port == PORT_ANY {
            inner.ephemeral_port(&mut st)?
        } else {
            if st.used_ports.contains(&addr.port) {
                return Err(errno(libc::EADDRINUSE));
            }
            addr.port
        };
        st.used_ports.insert(port);
        let shared = ListenerShared::new(
            port,
            opts.backlog.unwrap_or(inner.cfg.backlog).max(1),
            opts.recv_buffer.unwrap_or(inner.cfg.recv_buffer),
        )?;
        st.listeners.insert(port, shared.clone());
        drop(st);
        Ok(shared)
    }

    /// Connects to `addr`: [`Transport::connect_with`]'s connection, open.
    pub(crate) fn open_stream(
        &self,
        addr: impl crate::addr::ToXenAddr,
        timeout: Option<Duration>,
        opts: SocketOptions,
    ) -> io::Result<Arc<Conn>> {
        let addr = addr.to_xen_addr()?;
        let inner = &self.owner.inner;
        let peer = self.check_connect_addr(&addr)?;
        let deadline = Instant::now() + timeout.unwrap_or(inner.cfg.connect_timeout);
        let link_deadline = deadline.min(Instant::now() + inner.cfg.link_timeout);
        let conn = inner.start_connect(peer, addr.port, opts, link_deadline)?;
        // The answer usually comes back within microseconds: spin a little,
        // taking it off the control ring ourselves, before sleeping until
        // the manager thread signals it.
        let spin_end = Instant::now() + inner.cfg.busy_poll * CONNECT_SPIN_FACTOR;
        // After the spin, sleep on the link's event channel and take the
        // answer ourselves when it kicks; after a kick that was not our
        // answer, wait for the manager's signal instead.
        let mut direct = true;
        // Wait for Accept / Reject.
        loop {
            if direct && Instant::now() >= spin_end {
                // Before reading the generation for the sleep below. Not
                // handed out yet: nobody else watches this eventfd.
                conn.evfd.drain();
            }
            let g0 = conn.generation();
            let phase = conn.io().phase;
            match phase {
                ConnPhase::Connecting => {}
                ConnPhase::Open => break,
                ConnPhase::Failed(e) => {
                    inner.forget_conn(&conn);
                    return Err(errno(e));
                }
                _ => {
                    inner.forget_conn(&conn);
                    return Err(errno(libc::ECONNREFUSED));
                }
            }
            if Instant::now() < spin_end {
                inner.poll_link(peer);
                std::thread::yield_now();
                continue;
            }
            let woke = match direct.then(|| conn.wait_kick(g0, deadline)).flatten() {
                Some(KickWait::Kicked) => {
                    inner.poll_link(peer);
                    direct = false;
                    true
                }
                Some(KickWait::Signalled) => true,
                Some(KickWait::TimedOut) => false,
                None => {
                    direct = false;
                    conn.wait_since(g0, Some(deadline))
                }
            };
            if !woke && conn.io().phase == ConnPhase::Connecting {
                {
                    let mut io = conn.io();
                    io.release();
                    io.phase = ConnPhase::Failed(libc::ETIMEDOUT);
                }
                inner.forget_conn(&conn);
                return Err(errno(libc::ETIMEDOUT));
            }
        }
        Ok(conn)
    }

    /// Starts a connect: [`Transport::connect_nonblocking`]'s connection,
    /// still connecting, non-blocking.
    pub(crate) fn open_stream_nonblocking(
        &self,
        addr: impl crate::addr::ToXenAddr,
        opts: SocketOptions,
    ) -> io::Result<Arc<Conn>> {
        let addr = addr.to_xen_addr()?;
        let peer = self.check_connect_addr(&addr)?;
        let inner = &self.owner.inner;
        let link_deadline = Instant::now() + inner.cfg.link_timeout;
        let conn = inner.start_connect(peer, addr.port, opts, link_deadline)?;
        conn.nonblocking.store(true, Ordering::Release);
        Ok(conn)
    }

    /// Whether the link to `domid` is up, so that
    /// [`Transport::connect_nonblocking`] will not block.
    pub fn link_ready(&self, domid: u32) -> bool {
        let Ok(peer) = DomId::try_from(domid) else {
            return false;
        };
        self.owner
            .inner
            .state()
            .links
            .get(&peer)
            .is_some_and(|l| l.tx.is_some())
    }

    /// Brings the link to `domid` up (through XenStore, the first time),
    /// waiting at most `timeout` and `Config::link_timeout`: `EHOSTUNREACH`
    /// if the domain does not answer. Blocks; see [`Transport::connect_nonblocking`].
    pub fn prepare_link(&self, domid: u32, timeout: Duration) -> io::Result<()> {
        let addr = SockAddrXen::new(domid, 1);
        let peer = self.check_connect_addr(&addr)?;
        let inner = &self.owner.inner;
        let st = inner.state();
        let deadline = Instant::now() + timeout.min(inner.cfg.link_timeout);
        inner.ensure_link(st, peer, deadline).map(drop)
    }

    fn check_connect_addr(&self, addr: &SockAddrXen) -> io::Result<DomId> {
        if addr.domid >= DOMID_FIRST_RESERVED
            || addr.port == PORT_ANY
            || addr.domid == u32::from(self.owner.inner.domid())
        {
            return Err(errno(libc::EINVAL));
        }
        DomId::try_from(addr.domid).map_err(|_| errno(libc::EINVAL))
    }

    /// A snapshot of links and connections, for `xensock status`.
    pub fn status(&self) -> Status {
        self.owner.inner.status()
    }

    /// Test hook: sends `RingOffer`s naming the peer's connection ids
    /// `ids` over our link to `peer` (if it is up), with grant refs that
    /// name nothing, as a guest posing as another guest's moved peer would.
    /// Returns how many were queued. Not for applications.
    #[doc(hidden)]
    pub fn send_forged_ring_offers(
        &self,
        peer: DomId,
        ids: std::ops::RangeInclusive<u32>,
    ) -> usize {
        let inner = &self.owner.inner;
        let mut st = inner.state();
        let mut sent = 0;
        for conn_id in ids {
            let rx = ctrl::RingGrant {
                order: 12,
                epoch: 1,
                header_ref: 0,
                dir_ref: 0,
            };
            if !inner.queue_frame(&mut st, peer, &Message::RingOffer { conn_id, rx }, true) {
                break;
            }
            sent += 1;
        }
        sent
    }

    /// The suspend hook: this domain is about to be suspended, saved or
    /// migrated. Every open stream connection leaves its rings for its TCP
    /// carrier while the rings are still shared (the unconsumed bytes of
    /// what it sent are copied back out, nothing in what it receives is
    /// trusted past what it consumed). Returns once each such connection
    /// has both TCP legs up (or failed), at most
    /// [`Config::peer_lost_after`], with the number of connections moved.
    /// Readers and writers only pause. Connections whose peer offered no
    /// TCP endpoint cannot move and end when the link does.
    pub fn suspend(&self) -> usize {
        let inner = &self.owner.inner;
        inner.suspended.store(true, Ordering::Release);
        let switches = inner.freeze_conns(None, Trigger::LocalMove);
        let deadline = Instant::now() + inner.cfg.peer_lost_after;
        while Instant::now() < deadline
            && !switches.iter().all(|e| e.failed() || e.status().legs_up)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Nothing shared may stay through the save: a PV guest restored
        // with gntdev mappings of another domain's pages crashed in the
        // lab. The links go (control rings, event channels, kept and
        // pooled rings; the peers see them withdrawn), offers not taken
        // are dropped, and rings the connections still hold are waited
        // for. No link comes up again until `resume` or a new domid.
        for e in &switches {
            e.drop_pending_offer();
        }
        {
            let mut st = inner.state();
            let peers: Vec<DomId> = st.links.keys().copied().collect();
            for p in peers {
                inner.link_down(&mut st, p, false);
            }
        }
        while Instant::now() < deadline && inner.shared_pages_held() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let held = inner.shared_pages_held();
        if held > 0 {
            tracing::warn!(held, "suspend: shared pages still held at the bound");
        }
        tracing::info!(connections = switches.len(), "suspended");
        switches.len()
    }

    /// Links and connections that still hold a shared page (a grant of
    /// ours or a mapping of a peer's page): 0 after a complete
    /// [`Transport::suspend`].
    pub fn shared_pages_held(&self) -> usize {
        self.owner.inner.shared_pages_held()
    }

    /// The resume hook: looks whether this domain's id changed (a
    /// same-host migration) and, if so, follows it: links are set up anew
    /// and moved connections return to rings. The transport does this by
    /// itself when XenStore's `domid` watch fires; a suspend that ends on
    /// the same domid (cancelled, or saved and restored under the same id)
    /// needs this call to let connections back onto rings. Returns whether
    /// the domid changed.
    pub fn resume(&self) -> bool {
        let inner = &self.owner.inner;
        let moved = inner.check_domid();
        if !moved {
            inner.suspended.store(false, Ordering::Release);
            // The suspend took the links down: new ones bring the moved
            // connections back to rings.
            let mut st = inner.state();
            inner.relink_carriers(&mut st);
            // Offers that came while suspended were left alone: answer them.
            let offered: Vec<DomId> = lock(&inner.watches)
                .by_path
                .keys()
                .filter_map(|p| inner.is_link_event(p))
                .collect();
            for p in offered {
                if !st.links.contains_key(&p) {
                    inner.on_peer_node(&mut st, p);
                }
            }
        }
        inner.link_cv.notify_all();
        // The manager sweeps soon: offers kept while suspended are taken.
        inner.sink.wake.signal();
        tracing::info!(domid = inner.domid(), moved, "resumed");
        moved
    }

    /// The current domid of a co-resident peer named by IP address or
    /// UUID, from the dom0 agent's table for us, which follows migrations:
    /// connect to a domain that may have moved by what stays, not by a
    /// domid that may be stale. `EHOSTUNREACH` when the table does not list
    /// it (not co-resident, or no agent).
    pub fn resolve(&self, name: &str) -> io::Result<DomId> {
        let co = xensock_discovery::peers::CoResidency::new(self.owner.inner.xs.clone());
        let found = match name.parse::<IpAddr>() {
            Ok(ip) => co.lookup_ip(ip),
            Err(_) => co.lookup_uuid(name),
        }
        .map_err(Error::from)?;
        found
            .map(|p| p.domid)
            .ok_or_else(|| errno(libc::EHOSTUNREACH))
    }

    /// The peer of every connection to `domid` left the ring (it moved
    /// away, or its link died while discovery says it is alive
    /// elsewhere): those connections drain what it wrote and go on over
    /// TCP. Returns how many connections moved. Only correct once the
    /// peer has stopped writing into the rings (it is suspended or gone).
    pub fn peer_gone(&self, domid: DomId) -> usize {
        self.owner
            .inner
            .freeze_conns(Some(domid), Trigger::PeerGone)
            .len()
    }
}

fn epoll_add(ep: &OwnedFd, fd: i32, token: u64) -> io::Result<()> {
    sys::epoll_add(ep.as_fd(), fd, token)
}

fn epoll_del(ep: &OwnedFd, fd: i32) {
    sys::epoll_del(ep.as_fd(), fd)
}

impl Inner {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn domid(&self) -> DomId {
        self.domid.load(Ordering::Acquire)
    }

    fn link_dir_abs(&self) -> String {
        home(self.domid(), LINK_DIR)
    }

    fn my_node(&self, peer: DomId) -> String {
        HalfPath {
            owner: u32::from(self.domid()),
            peer: u32::from(peer),
        }
        .to_string()
    }

    fn peer_node(&self, peer: DomId) -> String {
        HalfPath {
            owner: u32::from(peer),
            peer: u32::from(self.domid()),
        }
        .to_string()
    }

    /// The agent's co-residency table for us.
    fn table_dir(&self) -> String {
        home(self.domid(), store::PEERS_DIR)
    }

    /// Where dom0 notes peers destroyed for good: `xensock/gone/<domid>`.
    fn gone_dir(&self) -> String {
        home(self.domid(), store::GONE_DIR)
    }

    /// Whether `path` is the gone notes or one of them.
    fn is_gone_event(&self, path: &str) -> bool {
        path.strip_prefix(&self.gone_dir())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// Whether dom0 noted `peer` destroyed for good.
    fn peer_gone(&self, peer: DomId) -> bool {
        matches!(
            self.xs.try_read(&format!("{}/{peer}", self.gone_dir())),
            Ok(Some(_))
        )
    }

    /// Whether `peer` retracted its half of our link (state Closed), as a
    /// guest about to be saved or migrated does.
    fn peer_retracted(&self, peer: DomId) -> bool {
        matches!(
            self.xs.try_read(&format!("{}/{}", self.peer_node(peer), node::STATE)),
            Ok(Some(v)) if std::str::from_utf8(&v).ok().map(str::trim) == Some(LinkState::Closed.as_str())
        )
    }

    /// A vanished peer that dom0 notes gone: its connections, carried on
    /// since the link went, fail now.
    fn end_dead_peer(&self, st: &mut State, peer: DomId) {
        if !st.vanished.contains(&peer) || !self.peer_gone(peer) {
            return;
        }
        st.vanished.remove(&peer);
        for c in st.conns.values().filter(|c| c.peer() == peer) {
            if let Some(e) = c.switch() {
                tracing::info!(conn = c.id, peer, "peer domain destroyed: connection reset");
                e.peer_dead();
            }
        }
    }

    /// Whether `path` is our table or an entry of it.
    fn is_table_event(&self, path: &str) -> bool {
        path.strip_prefix(&self.table_dir())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }
}

/// Whether the link to `peer` is up and its peer not known to be gone
/// (a move or death the manager has not processed yet).
fn link_usable(st: &State, peer: DomId) -> bool {
    st.links.get(&peer).is_some_and(|l| {
        l.tx.as_ref().is_some_and(|t| {
            !matches!(
                t.chan.peer_state(),
                Ok(xensock_xenif::PeerState::Closed) | Err(_)
            )
        })
    })
}

/// A `ConnectRequest` as the acceptor needs it.
struct Request {
    their_id: u32,
    src_port: u32,
    dst_port: u32,
    cookie: u64,
    tcp: TcpEndpoint,
}

/// The absolute path of `rel` in `domid`'s home.
fn home(domid: DomId, rel: &str) -> String {
    store::InHome {
        domid: u32::from(domid),
        rel,
    }
    .to_string()
}
