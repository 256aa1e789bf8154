//! The user-space transport: one per process and domain. It owns the links
//! (one per peer domain, set up once through XenStore), dispatches control
//! frames in a manager thread, and creates connections with their own data
//! rings. See `docs/protocol.md` section 6.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xensock_discovery::xs::{XsClient, XsError};
use xensock_proto::ctrl::{
    self, Channel, Message, RejectReason, ResetReason, SockType, TcpEndpoint,
};
use xensock_proto::layout::{RingGeometry, LINK_RING_ORDER};
use xensock_proto::mem::RawRing;
use xensock_proto::ring::{Consumer, Producer};
use xensock_xenif::xs_wire::{Perm, PermAccess, XsErrno};
use xensock_xenif::{DomId, EventChannel, UnmapNotify, XenBackend};

use crate::addr::{SockAddrXen, DOMID_ANY, DOMID_FIRST_RESERVED, DOMID_SELF, PORT_ANY};
use crate::backend::{BackendKind, Dyn, DynXen};
use crate::conn::{lock, Conn, ConnIo, ConnPhase, LinkShared, RxSide, TxSide};
use crate::error::{errno, Error};
use crate::evfd::EventFd;
use crate::listener::{ListenerShared, XenListener};
use crate::rings::{
    data_identity, get_byte, grant_ring, link_identity, map_ring, set_byte, MappedRing, OwnedRing,
    LINK_MAPPER_ALIVE_OFFSET, LINK_OWNER_ALIVE_OFFSET,
};
use crate::stream::XenStream;

/// XenStore directory, relative to a domain's home, under which a domain
/// publishes one node per peer it has a link with: `data/xensock/link/<peer>`.
pub const LINK_DIR: &str = "data/xensock/link";

/// `state` of a link node once our half is advertised (`XenbusStateInitialised`).
pub const STATE_INITIALISED: &str = "3";
/// `state` once we mapped the peer's page and bound its port (`XenbusStateConnected`).
pub const STATE_CONNECTED: &str = "4";
/// `state` of a withdrawn half-link in a directory dom0 made (`XenbusStateClosed`).
pub const STATE_CLOSED: &str = "6";

/// First port handed out for `PORT_ANY`.
pub const EPHEMERAL_PORT_FIRST: u32 = 49152;

/// Settings of a [`Transport`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Receive ring size (bytes, rounded up to a power of two between 2 KiB
    /// and 4 MiB) for new connections: the `SO_RCVBUF` default.
    pub recv_buffer: usize,
    /// Listener backlog default.
    pub backlog: usize,
    /// How long `connect` waits for a new link to come up before failing
    /// with `EHOSTUNREACH`.
    pub link_timeout: Duration,
    /// How long `connect` waits for the answer when no timeout is given.
    pub connect_timeout: Duration,
    /// How long a blocking read or write spins on the ring before sleeping.
    pub busy_poll: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            recv_buffer: 256 * 1024,
            backlog: 128,
            link_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            busy_poll: Duration::from_micros(50),
        }
    }
}

/// Per-socket options: the `SO_RCVBUF` and `listen(backlog)` equivalents.
#[derive(Debug, Clone, Copy, Default)]
pub struct SocketOptions {
    /// Receive ring size in bytes (power of two, 2 KiB..4 MiB); `None` for
    /// the transport's default. The peer's send ring is our receive ring,
    /// so this is also the peer's `SO_SNDBUF`.
    pub recv_buffer: Option<usize>,
    /// Listener backlog; `None` for the transport's default.
    pub backlog: Option<usize>,
}

struct LinkTx {
    ring: MappedRing,
    p: Producer<RawRing>,
    chan: Arc<dyn EventChannel>,
}

struct Link {
    peer: DomId,
    gen: u32,
    peer_gen: Option<u32>,
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
    /// Stops the watch on the peer's node (its removal when the peer's
    /// domain is destroyed is only reported to watchers of that path).
    watch_stop: Arc<AtomicBool>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.watch_stop.store(true, Ordering::Release);
    }
}

/// Where watch threads put the paths that fired; not tied to the
/// transport's lifetime, so a watch thread never keeps it alive.
struct WatchSink {
    events: Mutex<Vec<String>>,
    wake: EventFd,
    stop: AtomicBool,
}

impl WatchSink {
    fn run(self: Arc<Self>, mut watch: xensock_discovery::xs::Watch, stop: Arc<AtomicBool>) {
        while !self.stop.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
            match watch.recv_timeout(Duration::from_millis(100)) {
                Ok(Some(ev)) => {
                    lock(&self.events).push(ev.path);
                    self.wake.signal();
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
    }
}

pub(crate) struct State {
    links: HashMap<DomId, Link>,
    pub(crate) listeners: HashMap<u32, Arc<ListenerShared>>,
    conns: HashMap<u32, Arc<Conn>>,
    used_ports: HashSet<u32>,
    dead_gens: HashMap<DomId, u32>,
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
    domid: DomId,
    kind: BackendKind,
    pub(crate) cfg: Config,
    state: Mutex<State>,
    link_cv: Condvar,
    epoll: OwnedFd,
    sink: Arc<WatchSink>,
    stop: AtomicBool,
    next_conn: AtomicU32,
    counters: Counters,
}

/// Keeps the transport running; dropped when the last handle goes.
pub(crate) struct Owner {
    pub(crate) inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.sink.stop.store(true, Ordering::Release);
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
    }
}

/// A domain's xensock endpoint in this process: the links to peer domains
/// and the connections over them. Cheap to clone.
///
/// Most programs use the process-wide transport implicitly
/// ([`XenListener::bind`], [`XenStream::connect`], chosen by
/// [`crate::backend()`]). Tests and the demo run several simulated
/// domains in one process, one `Transport` each ([`Transport::sim`]).
///
/// The user-space transport supports one `Transport` per domain at a time
/// (the XenStore link nodes are per domain, as the kernel module's will be).
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

static GLOBAL: OnceLock<Transport> = OnceLock::new();

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = io::Read::read_exact(&mut f, &mut b);
    }
    let v = u32::from_ne_bytes(b);
    if v == 0 {
        (std::process::id() ^ Instant::now().elapsed().subsec_nanos()) | 1
    } else {
        v
    }
}

fn random_u64() -> u64 {
    u64::from(random_u32()) << 32 | u64::from(random_u32())
}

impl Transport {
    /// A transport for domain `domid` of the simulated host in `sim_dir`.
    pub fn sim(sim_dir: &Path, domid: DomId) -> io::Result<Transport> {
        Transport::sim_with(sim_dir, domid, Config::default())
    }

    /// [`Transport::sim`] with settings.
    pub fn sim_with(sim_dir: &Path, domid: DomId, cfg: Config) -> io::Result<Transport> {
        let xen = xensock_sim::SimXen::connect(sim_dir, domid).map_err(Error::from)?;
        let xs =
            XsClient::open_path(xensock_sim::domain_dir(sim_dir, domid).join("xenstored.sock"))
                .map_err(Error::from)?;
        Transport::with_backend(xen, xs, domid, BackendKind::Sim, cfg)
    }

    /// A transport over any backend, for domain `domid` whose XenStore is
    /// reached through `xs`.
    pub fn with_backend<B>(
        backend: B,
        xs: XsClient,
        domid: DomId,
        kind: BackendKind,
        cfg: Config,
    ) -> io::Result<Transport>
    where
        B: XenBackend + 'static,
        B::Grant: 'static,
        B::Mapping: 'static,
        B::Channel: 'static,
    {
        // SAFETY: epoll_create1 has no pointer arguments.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        let sink = Arc::new(WatchSink {
            events: Mutex::new(Vec::new()),
            wake: EventFd::new()?,
            stop: AtomicBool::new(false),
        });
        epoll_add(&epoll, sink.wake.as_raw_fd(), 0)?;
        let inner = Arc::new(Inner {
            xen: Box::new(Dyn(backend)),
            xs,
            domid,
            kind,
            cfg,
            state: Mutex::new(State {
                links: HashMap::new(),
                listeners: HashMap::new(),
                conns: HashMap::new(),
                used_ports: HashSet::new(),
                dead_gens: HashMap::new(),
                next_port: EPHEMERAL_PORT_FIRST,
            }),
            link_cv: Condvar::new(),
            epoll,
            sink,
            stop: AtomicBool::new(false),
            next_conn: AtomicU32::new(1),
            counters: Counters::default(),
        });
        // Links of an earlier process of this domain are dead.
        if let Ok(peers) = inner.xs.directory(&inner.link_dir_abs()) {
            for p in peers.iter().filter_map(|p| p.parse::<DomId>().ok()) {
                inner.withdraw_node(p, false);
            }
        }
        let watch = inner.xs.watch("/local/domain").map_err(Error::from)?;
        let mut threads = Vec::new();
        let sink = inner.sink.clone();
        let never = Arc::new(AtomicBool::new(false));
        threads.push(
            std::thread::Builder::new()
                .name(format!("xensock-watch-{domid}"))
                .spawn(move || sink.run(watch, never))?,
        );
        let i3 = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("xensock-link-{domid}"))
                .spawn(move || manager_thread(i3))?,
        );
        Ok(Transport {
            owner: Arc::new(Owner {
                inner,
                threads: Mutex::new(threads),
            }),
        })
    }

    /// The user-space backend [`crate::backend()`] reports
    /// (`user_space`), for this process's domain: real `/dev/xen` devices,
    /// else the simulated host named by `XENSOCK_SIM`/`XENSOCK_SIM_DOMID`.
    /// `ENODEV` when neither exists. (Where `af_xen.ko` is loaded,
    /// `XenStream::connect`/`XenListener::bind` use the kernel family
    /// instead; a `Transport` is always the user-space transport.)
    pub fn from_env() -> io::Result<Transport> {
        let report = crate::backend::backend();
        match report.user_space {
            BackendKind::DevXen => {
                let xen = xensock_xenif::dev::DevXen::open().map_err(Error::from)?;
                let xs = XsClient::open().map_err(Error::from)?;
                let domid: DomId = xs
                    .read_string("domid")
                    .map_err(Error::from)?
                    .trim()
                    .parse()
                    .map_err(|_| errno(libc::EIO))?;
                Transport::with_backend(xen, xs, domid, BackendKind::DevXen, Config::default())
            }
            BackendKind::Sim => {
                let xen = xensock_sim::SimXen::from_env().map_err(Error::from)?;
                let domid = xen.domid();
                let dir = std::env::var_os(xensock_sim::ENV_SIM_DIR).unwrap_or_default();
                let xs = XsClient::open_path(
                    xensock_sim::domain_dir(Path::new(&dir), domid).join("xenstored.sock"),
                )
                .map_err(Error::from)?;
                Transport::with_backend(xen, xs, domid, BackendKind::Sim, Config::default())
            }
            BackendKind::Kernel | BackendKind::None => Err(errno(libc::ENODEV)),
        }
    }

    /// The process-wide transport (created on first use with
    /// [`Transport::from_env`]).
    pub fn global() -> io::Result<Transport> {
        if let Some(t) = GLOBAL.get() {
            return Ok(t.clone());
        }
        let t = Transport::from_env()?;
        Ok(GLOBAL.get_or_init(|| t).clone())
    }

    /// This domain's id.
    pub fn domid(&self) -> DomId {
        self.owner.inner.domid
    }

    /// The backend in use.
    pub fn backend_kind(&self) -> BackendKind {
        self.owner.inner.kind
    }

    /// Listens on `addr` (its domid must be this domain, `self` or `any`).
    pub fn bind(&self, addr: impl crate::ToXenAddr) -> io::Result<XenListener> {
        self.bind_with(addr, SocketOptions::default())
    }

    /// [`Transport::bind`] with a backlog and receive-ring size for accepted
    /// connections.
    pub fn bind_with(
        &self,
        addr: impl crate::ToXenAddr,
        opts: SocketOptions,
    ) -> io::Result<XenListener> {
        let addr = addr.to_xen_addr()?;
        let inner = &self.owner.inner;
        if addr.domid != DOMID_SELF
            && addr.domid != DOMID_ANY
            && addr.domid != u32::from(inner.domid)
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
        Ok(XenListener::new(self.clone(), shared))
    }

    /// Connects to `addr` with the default timeout.
    pub fn connect(&self, addr: impl crate::ToXenAddr) -> io::Result<XenStream> {
        let t = self.owner.inner.cfg.connect_timeout;
        self.connect_with(addr, Some(t), SocketOptions::default())
    }

    /// Connects to `addr`, failing with `ETIMEDOUT` after `timeout`
    /// (`EHOSTUNREACH` if the link to the domain does not come up).
    pub fn connect_timeout(
        &self,
        addr: impl crate::ToXenAddr,
        timeout: Duration,
    ) -> io::Result<XenStream> {
        if timeout.is_zero() {
            return Err(errno(libc::EINVAL));
        }
        self.connect_with(addr, Some(timeout), SocketOptions::default())
    }

    /// Connects with a receive-ring size (`SO_RCVBUF` equivalent).
    pub fn connect_with(
        &self,
        addr: impl crate::ToXenAddr,
        timeout: Option<Duration>,
        opts: SocketOptions,
    ) -> io::Result<XenStream> {
        let addr = addr.to_xen_addr()?;
        let inner = &self.owner.inner;
        if addr.domid >= DOMID_FIRST_RESERVED
            || addr.port == PORT_ANY
            || addr.domid == u32::from(inner.domid)
        {
            return Err(errno(libc::EINVAL));
        }
        let peer = addr.domid as DomId;
        let deadline = Instant::now() + timeout.unwrap_or(inner.cfg.connect_timeout);
        let link_deadline = deadline.min(Instant::now() + inner.cfg.link_timeout);
        let conn = inner.start_connect(peer, addr.port, opts, link_deadline)?;
        // Wait for Accept / Reject.
        loop {
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
            if !conn.wait_since(g0, Some(deadline)) && conn.io().phase == ConnPhase::Connecting {
                {
                    let mut io = conn.io();
                    io.release();
                    io.phase = ConnPhase::Failed(libc::ETIMEDOUT);
                }
                inner.forget_conn(&conn);
                return Err(errno(libc::ETIMEDOUT));
            }
        }
        Ok(XenStream::new(self.clone(), conn))
    }

    /// A snapshot of links and connections, for `xensock status`.
    pub fn status(&self) -> Status {
        self.owner.inner.status()
    }
}

/// A link, as reported by [`Transport::status`].
#[derive(Debug, Clone)]
pub struct LinkStatus {
    /// The peer domain.
    pub peer: DomId,
    /// Our link generation (XenStore `generation`).
    pub generation: u32,
    /// The peer's generation, once attached.
    pub peer_generation: Option<u32>,
    /// Both control rings are mapped.
    pub up: bool,
    /// Connections on the link.
    pub connections: usize,
    /// Control frames waiting for ring space.
    pub pending_frames: usize,
}

/// A connection, as reported by [`Transport::status`].
#[derive(Debug, Clone)]
pub struct ConnStatus {
    /// Local connection id.
    pub id: u32,
    /// Local address.
    pub local: SockAddrXen,
    /// Peer address.
    pub peer: SockAddrXen,
    /// Phase.
    pub phase: ConnPhase,
    /// Bytes waiting in the receive ring / receive ring size.
    pub rx_fill: (u32, u32),
    /// Bytes unconsumed in the send ring / send ring size.
    pub tx_fill: (u32, u32),
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
}

/// What [`Transport::status`] returns.
#[derive(Debug, Clone)]
pub struct Status {
    /// This domain.
    pub domid: DomId,
    /// Backend in use.
    pub backend: BackendKind,
    /// Links.
    pub links: Vec<LinkStatus>,
    /// Connections.
    pub connections: Vec<ConnStatus>,
    /// Listening ports.
    pub listeners: Vec<u32>,
    /// Reset frames sent.
    pub resets_sent: u64,
    /// Reset frames received.
    pub resets_received: u64,
    /// Ring violations by peers.
    pub ring_errors: u64,
    /// Links lost (peer died or left).
    pub links_lost: u64,
    /// Connection requests refused.
    pub rejected: u64,
}

fn epoll_add(ep: &OwnedFd, fd: i32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: valid epoll and target descriptors; ev outlives the call.
    let rc = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn epoll_del(ep: &OwnedFd, fd: i32) {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: as in epoll_add; failure (already gone) is harmless.
    unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
}

fn manager_thread(inner: Arc<Inner>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    while !inner.stop.load(Ordering::Acquire) {
        // SAFETY: `events` has room for its length; the epoll fd is ours.
        let n = unsafe {
            libc::epoll_wait(
                inner.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                -1,
            )
        };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if inner.stop.load(Ordering::Acquire) {
            break;
        }
        let mut ready = Vec::new();
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token == 0 {
                inner.sink.wake.drain();
            } else {
                ready.push((token - 1) as DomId);
            }
        }
        let mut st = inner.state();
        let evs = std::mem::take(&mut *lock(&inner.sink.events));
        let mut peers: Vec<DomId> = evs.iter().filter_map(|p| inner.is_link_event(p)).collect();
        peers.sort_unstable();
        peers.dedup();
        for p in peers {
            inner.on_peer_node(&mut st, p);
        }
        for p in ready {
            inner.service_link(&mut st, p);
        }
    }
}

impl Inner {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn link_dir_abs(&self) -> String {
        format!("/local/domain/{}/{LINK_DIR}", self.domid)
    }

    fn my_node(&self, peer: DomId) -> String {
        format!("{}/{peer}", self.link_dir_abs())
    }

    fn peer_node(&self, peer: DomId) -> String {
        format!("/local/domain/{peer}/{LINK_DIR}/{}", self.domid)
    }

    /// `Some(peer)` if `path` is (inside) a peer's link node for us.
    fn is_link_event(&self, path: &str) -> Option<DomId> {
        let rest = path.strip_prefix("/local/domain/")?;
        let (peer, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix(LINK_DIR)?.strip_prefix('/')?;
        let me = self.domid.to_string();
        let tail = rest.strip_prefix(me.as_str())?;
        if !(tail.is_empty() || tail.starts_with('/')) {
            return None;
        }
        let peer: DomId = peer.parse().ok()?;
        (peer != self.domid).then_some(peer)
    }

    fn ephemeral_port(&self, st: &mut State) -> io::Result<u32> {
        for _ in 0..(u32::MAX - EPHEMERAL_PORT_FIRST) {
            let p = st.next_port;
            st.next_port = if p >= PORT_ANY - 1 {
                EPHEMERAL_PORT_FIRST
            } else {
                p + 1
            };
            if !st.used_ports.contains(&p) {
                return Ok(p);
            }
        }
        Err(errno(libc::EADDRINUSE))
    }

    fn next_conn_id(&self) -> u32 {
        loop {
            let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    // ---- links ----------------------------------------------------------

    /// Creates our half of a link to `peer` (grant, port, XenStore node).
    fn create_link(&self, st: &mut State, peer: DomId, peer_gen: Option<u32>) -> Result<(), Error> {
        let rx = grant_ring(
            self.xen.as_ref(),
            self.domid,
            peer,
            RingGeometry::new(LINK_RING_ORDER).map_err(Error::Layout)?,
            0,
            true,
        )?;
        let mut rx = rx;
        set_byte(rx.region.as_ref(), LINK_OWNER_ALIVE_OFFSET, 1);
        rx.region.set_unmap_notify(UnmapNotify {
            clear_byte: Some(LINK_OWNER_ALIVE_OFFSET),
            send_event: None,
        })?;
        let rx_chan = self.xen.alloc_unbound(peer)?;
        let gen = random_u32();
        let node = self.my_node(peer);
        let me = self.domid;
        let (ring_ref, port) = (rx.grant.header_ref, rx_chan.local_port());
        let created_dir = self.xs.transaction(|tx| {
            // A directory made by dom0 (the agent's policy, as the kernel
            // module needs) is kept with its permissions; otherwise we make
            // it readable by the peer only.
            let exists = match tx.directory(&node) {
                Ok(_) => true,
                Err(e) if e.is(XsErrno::NoEnt) => false,
                Err(e) => return Err(e),
            };
            if !exists {
                tx.mkdir(&node)?;
                tx.set_perms(
                    &node,
                    &[
                        Perm::new(PermAccess::None, u32::from(me)),
                        Perm::new(PermAccess::Read, u32::from(peer)),
                    ],
                )?;
            }
            tx.write(&format!("{node}/version"), "1")?;
            tx.write(&format!("{node}/ring-ref"), ring_ref.to_string())?;
            tx.write(&format!("{node}/event-channel"), port.to_string())?;
            tx.write(&format!("{node}/generation"), gen.to_string())?;
            tx.write(
                &format!("{node}/peer-generation"),
                peer_gen.unwrap_or(0).to_string(),
            )?;
            tx.write(&format!("{node}/state"), STATE_INITIALISED)?;
            Ok(!exists)
        })?;
        epoll_add(&self.epoll, rx_chan.as_raw_fd(), u64::from(peer) + 1)?;
        let watch_stop = Arc::new(AtomicBool::new(false));
        if let Ok(w) = self.xs.watch(&self.peer_node(peer)) {
            let (sink, stop) = (self.sink.clone(), watch_stop.clone());
            let _ = std::thread::Builder::new()
                .name(format!("xensock-watch-{}-{peer}", self.domid))
                .spawn(move || sink.run(w, stop));
        }
        let c = Consumer::new(rx.ring);
        st.links.insert(
            peer,
            Link {
                peer,
                gen,
                peer_gen: None,
                rx,
                c,
                rx_chan,
                tx: None,
                pending: VecDeque::new(),
                shared: Arc::new(LinkShared {
                    armed: Mutex::new(Vec::new()),
                }),
                conns: HashSet::new(),
                peer_seen_alive: false,
                owner_seen_alive: false,
                created_dir,
                watch_stop,
            },
        );
        Ok(())
    }

    /// Maps the peer's control page and binds its port.
    fn attach_link(&self, st: &mut State, peer: DomId, info: &PeerNode) -> Result<(), Error> {
        let Some(link) = st.links.get_mut(&peer) else {
            return Ok(());
        };
        let grant = ctrl::RingGrant {
            order: LINK_RING_ORDER as u8,
            epoch: 0,
            header_ref: info.ring_ref,
            dir_ref: 0,
        };
        let mut ring = map_ring(
            self.xen.as_ref(),
            peer,
            &grant,
            &link_identity(peer, self.domid),
        )?;
        let chan: Arc<dyn EventChannel> = Arc::from(self.xen.bind_interdomain(peer, info.port)?);
        set_byte(ring.region.as_ref(), LINK_MAPPER_ALIVE_OFFSET, 1);
        ring.region.set_unmap_notify(UnmapNotify {
            clear_byte: Some(LINK_MAPPER_ALIVE_OFFSET),
            send_event: Some(chan.local_port()),
        })?;
        let p = Producer::new(ring.ring);
        link.tx = Some(LinkTx { ring, p, chan });
        link.peer_gen = Some(info.gen);
        let _ = self
            .xs
            .write(&format!("{}/state", self.my_node(peer)), STATE_CONNECTED);
        let _ = self.flush_link(link);
        if let Some(tx) = &link.tx {
            let _ = tx.chan.notify();
        }
        self.link_cv.notify_all();
        Ok(())
    }

    fn read_peer_node(&self, peer: DomId) -> Result<Option<PeerNode>, XsError> {
        let node = self.peer_node(peer);
        let num = |name: &str| -> Result<Option<u32>, XsError> {
            Ok(self
                .xs
                .try_read(&format!("{node}/{name}"))?
                .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok()))
        };
        let read = || -> Result<Option<PeerNode>, XsError> {
            let (Some(ring_ref), Some(port), Some(state)) =
                (num("ring-ref")?, num("event-channel")?, num("state")?)
            else {
                return Ok(None);
            };
            // Hosts that write no `generation` (the kernel module) are
            // identified by their ring-ref and port: a restart changes them.
            let gen = num("generation")?
                .unwrap_or_else(|| (ring_ref.rotate_left(16) ^ port ^ 0x5853_0000) | 1);
            if !(3..=4).contains(&state) {
                return Ok(None);
            }
            Ok(Some(PeerNode {
                gen,
                ring_ref,
                port,
                peer_gen: num("peer-generation")?.unwrap_or(0),
            }))
        };
        match read() {
            Ok(v) => Ok(v),
            Err(e) if e.is(XsErrno::Acces) || e.is(XsErrno::NoEnt) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A peer's link node for us changed (or appeared, or went away).
    fn on_peer_node(&self, st: &mut State, peer: DomId) {
        let info = match self.read_peer_node(peer) {
            Ok(i) => i,
            Err(_) => return,
        };
        let Some(info) = info else {
            // Node gone: the peer tore its link down or its domain died.
            if st.links.get(&peer).is_some_and(|l| l.peer_gen.is_some()) {
                self.link_down(st, peer, true);
            }
            return;
        };
        if st.dead_gens.get(&peer) == Some(&info.gen) {
            return;
        }
        match st.links.get(&peer).map(|l| (l.gen, l.peer_gen)) {
            Some((_, Some(g))) if g == info.gen => return,
            Some((_, Some(_))) => {
                // The peer restarted: everything on the old link is dead.
                self.link_down(st, peer, true);
            }
            Some((mine, None)) => {
                if info.peer_gen != 0 && info.peer_gen != mine {
                    // An answer to an older offer of ours; it will see the
                    // current one and answer again.
                    return;
                }
                if self.attach_link(st, peer, &info).is_err() {
                    self.link_down(st, peer, false);
                }
                return;
            }
            None => {}
        }
        if st.links.contains_key(&peer) {
            return;
        }
        if self.create_link(st, peer, Some(info.gen)).is_err() {
            return;
        }
        if self.attach_link(st, peer, &info).is_err() {
            self.link_down(st, peer, false);
        }
    }

    /// Tears a link down: every connection on it is reset, rings and
    /// channels released, our XenStore node removed.
    fn link_down(&self, st: &mut State, peer: DomId, lost: bool) {
        let Some(link) = st.links.remove(&peer) else {
            return;
        };
        if lost {
            self.counters.links_lost.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(g) = link.peer_gen {
            st.dead_gens.insert(peer, g);
        }
        epoll_del(&self.epoll, link.rx_chan.as_raw_fd());
        for id in &link.conns {
            if let Some(conn) = st.conns.remove(id) {
                st.used_ports.remove(&conn.local_port);
                conn.io().reset_local();
                conn.signal();
            }
        }
        for l in st.listeners.values() {
            l.drop_peer(peer);
        }
        let created = link.created_dir;
        drop(link);
        self.withdraw_node(peer, created);
        self.link_cv.notify_all();
    }

    /// Removes our half of the link from XenStore: the whole node if we
    /// made it, else (dom0 made it) our values, leaving `state` Closed.
    fn withdraw_node(&self, peer: DomId, created_dir: bool) {
        let node = self.my_node(peer);
        if created_dir {
            let _ = self.xs.rm(&node);
            return;
        }
        let _ = self.xs.transaction(|tx| {
            for name in ["ring-ref", "event-channel", "generation", "peer-generation"] {
                match tx.rm(&format!("{node}/{name}")) {
                    Ok(()) => {}
                    Err(e) if e.is(XsErrno::NoEnt) => {}
                    Err(e) => return Err(e),
                }
            }
            tx.write(&format!("{node}/state"), STATE_CLOSED)
        });
    }

    fn link_alive(&self, link: &mut Link) -> bool {
        if link.tx.is_none() {
            return true;
        }
        let mapper = get_byte(link.rx.region.as_ref(), LINK_MAPPER_ALIVE_OFFSET);
        let owner = link.tx.as_ref().map_or(1, |t| {
            get_byte(t.ring.region.as_ref(), LINK_OWNER_ALIVE_OFFSET)
        });
        // A byte counts only once it has been seen set: a peer that does
        // not use it (the kernel module today) is never declared dead by it.
        if mapper == 1 {
            link.peer_seen_alive = true;
        }
        if owner == 1 {
            link.owner_seen_alive = true;
        }
        !((link.owner_seen_alive && owner == 0) || (link.peer_seen_alive && mapper == 0))
    }

    /// Writes queued frames while they fit; kicks once.
    fn flush_link(&self, link: &mut Link) -> Result<(), Error> {
        let Some(tx) = link.tx.as_mut() else {
            return Ok(());
        };
        while let Some((buf, len)) = link.pending.front() {
            let free = tx.p.free_space().map_err(Error::Ring)?;
            if (free as usize) < *len {
                let _ = tx.p.prepare_wait(*len as u32).map_err(Error::Ring)?;
                // Space may have appeared between the two checks.
                if (tx.p.free_space().map_err(Error::Ring)? as usize) < *len {
                    break;
                }
                continue;
            }
            tx.p.write(&buf[..*len]).map_err(Error::Ring)?;
            link.pending.pop_front();
        }
        if tx.p.flush() {
            let _ = tx.chan.notify();
        }
        Ok(())
    }

    fn send_frame(&self, st: &mut State, peer: DomId, msg: &Message<'_>) {
        let Some(link) = st.links.get_mut(&peer) else {
            return;
        };
        let mut buf = [0u8; ctrl::MAX_CONTROL_FRAME];
        let Ok(len) = msg.encode(&mut buf) else {
            return;
        };
        link.pending.push_back((buf, len));
        if self.flush_link(link).is_err() {
            self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
            self.link_down(st, peer, true);
        }
    }

    /// The peer kicked the link: liveness, control frames, queued frames,
    /// waiting connections.
    fn service_link(&self, st: &mut State, peer: DomId) {
        let mut frames: Vec<([u8; ctrl::MAX_CONTROL_FRAME], usize)> = Vec::new();
        let mut broken = false;
        {
            let Some(link) = st.links.get_mut(&peer) else {
                return;
            };
            let _ = link.rx_chan.ack();
            if !self.link_alive(link) {
                drop(frames);
                self.link_down(st, peer, true);
                return;
            }
            loop {
                // Drain whole frames.
                loop {
                    let mut hdr = [0u8; ctrl::MAX_CONTROL_FRAME];
                    let got = match link.c.peek(&mut hdr) {
                        Ok(n) => n,
                        Err(_) => {
                            broken = true;
                            break;
                        }
                    };
                    if got < ctrl::HEADER_LEN {
                        break;
                    }
                    let h = match ctrl::decode_header(&hdr[..got], Channel::Link) {
                        Ok(h) => h,
                        Err(_) => {
                            broken = true;
                            break;
                        }
                    };
                    let total = h.frame_len();
                    if total > ctrl::MAX_CONTROL_FRAME {
                        broken = true;
                        break;
                    }
                    if got < total {
                        break;
                    }
                    let _ = link.c.skip(total as u32);
                    frames.push((hdr, total));
                }
                if broken {
                    break;
                }
                if link.c.flush() {
                    if let Some(tx) = &link.tx {
                        let _ = tx.chan.notify();
                    }
                }
                match link.c.prepare_wait() {
                    Ok(true) => break,
                    Ok(false) => {
                        if link.c.readable().unwrap_or(0) < ctrl::HEADER_LEN as u32 {
                            break;
                        }
                    }
                    Err(_) => {
                        broken = true;
                        break;
                    }
                }
            }
            if !broken && self.flush_link(link).is_err() {
                broken = true;
            }
        }
        if broken {
            self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
            self.link_down(st, peer, true);
            return;
        }
        for (buf, len) in frames {
            match ctrl::decode(&buf[..len], Channel::Link) {
                Ok((msg, _)) => self.on_frame(st, peer, msg),
                Err(_) => {
                    self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
                    self.link_down(st, peer, true);
                    return;
                }
            }
        }
        // Wake connections whose condition holds.
        if let Some(link) = st.links.get(&peer) {
            let shared = link.shared.clone();
            let mut list = lock(&shared.armed);
            list.retain(|w| match w.upgrade() {
                Some(c) => c.check_armed(),
                None => false,
            });
        }
    }

    fn on_frame(&self, st: &mut State, peer: DomId, msg: Message<'_>) {
        match msg {
            Message::ConnectRequest {
                conn_id,
                src_port,
                dst_port,
                sock_type,
                cookie,
                rx,
                ..
            } => {
                let reject = |s: &Self, st: &mut State, reason| {
                    s.counters.rejected.fetch_add(1, Ordering::Relaxed);
                    s.send_frame(st, peer, &Message::ConnectReject { conn_id, reason });
                };
                let Some(l) = st.listeners.get(&dst_port).cloned() else {
                    return reject(self, st, RejectReason::NoListener);
                };
                if sock_type != SockType::Stream {
                    return reject(self, st, RejectReason::WrongType);
                }
                if l.is_full() {
                    return reject(self, st, RejectReason::BacklogFull);
                }
                match self.accept_request(st, peer, conn_id, src_port, dst_port, cookie, &rx, &l) {
                    Ok(conn) => l.push(conn),
                    Err(e) => {
                        let reason = match e {
                            Error::Xen(_) => RejectReason::NoResources,
                            _ => RejectReason::BadRequest,
                        };
                        reject(self, st, reason)
                    }
                }
            }
            Message::ConnectAccept {
                conn_id,
                acceptor_id,
                cookie,
                rx,
                ..
            } => {
                let conn = st.conns.get(&conn_id).filter(|c| c.peer == peer).cloned();
                let ok = conn.as_ref().is_some_and(|c| {
                    let mut io = c.io();
                    if io.phase != ConnPhase::Connecting {
                        return false;
                    }
                    let _ = cookie;
                    match map_ring(
                        self.xen.as_ref(),
                        peer,
                        &rx,
                        &data_identity(peer, self.domid, acceptor_id, rx.order),
                    ) {
                        Ok(mapped) => {
                            let p = Producer::new(mapped.ring);
                            io.tx = Some(TxSide { p, mapped });
                            io.peer_id = acceptor_id;
                            io.kicker = st
                                .links
                                .get(&peer)
                                .and_then(|l| l.tx.as_ref().map(|t| t.chan.clone()));
                            io.phase = ConnPhase::Open;
                            true
                        }
                        Err(_) => {
                            io.release();
                            io.phase = ConnPhase::Failed(libc::EPROTO);
                            false
                        }
                    }
                });
                if let Some(c) = &conn {
                    c.signal();
                }
                if !ok {
                    self.counters.resets_sent.fetch_add(1, Ordering::Relaxed);
                    self.send_frame(
                        st,
                        peer,
                        &Message::Reset {
                            conn_id: acceptor_id,
                            reason: ResetReason::ProtocolError,
                        },
                    );
                }
            }
            Message::ConnectReject { conn_id, reason } => {
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer == peer).cloned() {
                    let e = match reason {
                        RejectReason::NoListener | RejectReason::BacklogFull => libc::ECONNREFUSED,
                        RejectReason::NoResources => libc::ENOBUFS,
                        RejectReason::Forbidden => libc::EACCES,
                        RejectReason::WrongType => libc::EPROTOTYPE,
                        RejectReason::BadRequest => libc::EPROTO,
                    };
                    {
                        let mut io = c.io();
                        if io.phase == ConnPhase::Connecting {
                            io.release();
                            io.phase = ConnPhase::Failed(e);
                        }
                    }
                    c.signal();
                }
            }
            Message::Close { conn_id } => {
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer == peer).cloned() {
                    {
                        let mut io = c.io();
                        io.peer_closed = true;
                        io.close_received = true;
                        // The peer no longer reads: drop our mapping of its
                        // ring. Our own ring stays until the data is read.
                        io.tx = None;
                    }
                    c.signal();
                }
            }
            Message::Reset { conn_id, .. } => {
                self.counters
                    .resets_received
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer == peer).cloned() {
                    {
                        let mut io = c.io();
                        io.close_received = true;
                        io.reset_local();
                    }
                    c.signal();
                    self.unregister(st, &c);
                }
            }
            // Carrier switching (RingOffer, Suspend, Resume) is the next
            // issue's; version 1 hosts without it ignore them.
            _ => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn accept_request(
        &self,
        st: &mut State,
        peer: DomId,
        their_id: u32,
        src_port: u32,
        dst_port: u32,
        _cookie: u64,
        rx: &ctrl::RingGrant,
        l: &Arc<ListenerShared>,
    ) -> Result<Arc<Conn>, Error> {
        let link = st.links.get(&peer).ok_or(Error::Protocol("no link"))?;
        let kicker = link.tx.as_ref().map(|t| t.chan.clone());
        let shared = link.shared.clone();
        let id = self.next_conn_id();
        let mapped = map_ring(
            self.xen.as_ref(),
            peer,
            rx,
            &data_identity(peer, self.domid, their_id, rx.order),
        )?;
        let owned = grant_ring(
            self.xen.as_ref(),
            self.domid,
            peer,
            RingGeometry::for_capacity(l.recv_buffer),
            id,
            false,
        )?;
        let grant = owned.grant;
        let c = Consumer::new(owned.ring);
        let mut io = ConnIo::new(Some(RxSide { c, owned }));
        let p = Producer::new(mapped.ring);
        io.tx = Some(TxSide { p, mapped });
        io.peer_id = their_id;
        io.kicker = kicker;
        io.phase = ConnPhase::Open;
        let conn = Conn::new(id, peer, dst_port, src_port, io, shared).map_err(Error::Io)?;
        st.conns.insert(id, conn.clone());
        if let Some(link) = st.links.get_mut(&peer) {
            link.conns.insert(id);
        }
        self.send_frame(
            st,
            peer,
            &Message::ConnectAccept {
                conn_id: their_id,
                acceptor_id: id,
                cookie: _cookie,
                rx: grant,
                tcp: TcpEndpoint::NONE,
            },
        );
        Ok(conn)
    }

    /// Ensures a link to `peer` exists and waits until it is up.
    fn ensure_link<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        peer: DomId,
        deadline: Instant,
    ) -> io::Result<MutexGuard<'a, State>> {
        if !st.links.contains_key(&peer) {
            self.create_link(&mut st, peer, None)?;
            // The peer may have offered first; pick its node up if so.
            self.on_peer_node(&mut st, peer);
        }
        loop {
            match st.links.get(&peer) {
                Some(l) if l.tx.is_some() => return Ok(st),
                Some(_) => {}
                None => return Err(errno(libc::EHOSTUNREACH)),
            }
            let now = Instant::now();
            if now >= deadline {
                // Nobody answered: withdraw the offer.
                if st
                    .links
                    .get(&peer)
                    .is_some_and(|l| l.tx.is_none() && l.conns.is_empty())
                {
                    self.link_down(&mut st, peer, false);
                }
                return Err(errno(libc::EHOSTUNREACH));
            }
            st = self
                .link_cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn start_connect(
        &self,
        peer: DomId,
        dst_port: u32,
        opts: SocketOptions,
        link_deadline: Instant,
    ) -> io::Result<Arc<Conn>> {
        let st = self.state();
        let mut st = self.ensure_link(st, peer, link_deadline)?;
        let id = self.next_conn_id();
        let geometry = RingGeometry::for_capacity(opts.recv_buffer.unwrap_or(self.cfg.recv_buffer));
        let owned = grant_ring(self.xen.as_ref(), self.domid, peer, geometry, id, false)?;
        let grant = owned.grant;
        let src_port = self.ephemeral_port(&mut st)?;
        let link = st
            .links
            .get_mut(&peer)
            .ok_or_else(|| errno(libc::EHOSTUNREACH))?;
        let c = Consumer::new(owned.ring);
        let io = ConnIo::new(Some(RxSide { c, owned }));
        let conn = Conn::new(id, peer, src_port, dst_port, io, link.shared.clone())?;
        link.conns.insert(id);
        st.used_ports.insert(src_port);
        st.conns.insert(id, conn.clone());
        self.send_frame(
            &mut st,
            peer,
            &Message::ConnectRequest {
                conn_id: id,
                src_port,
                dst_port,
                sock_type: SockType::Stream,
                cookie: random_u64(),
                rx: grant,
                tcp: TcpEndpoint::NONE,
            },
        );
        Ok(conn)
    }

    fn unregister(&self, st: &mut State, conn: &Arc<Conn>) {
        if st.conns.remove(&conn.id).is_some() {
            if let Some(l) = st.links.get_mut(&conn.peer) {
                l.conns.remove(&conn.id);
            }
            if !st.listeners.contains_key(&conn.local_port) {
                st.used_ports.remove(&conn.local_port);
            }
        }
    }

    /// Removes a connection that never opened (or was reset) from the tables.
    pub(crate) fn forget_conn(&self, conn: &Arc<Conn>) {
        let mut st = self.state();
        self.unregister(&mut st, conn);
    }

    /// The last handle of a connection went away: FIN, CLOSED, Close frame,
    /// release.
    pub(crate) fn close_conn(&self, conn: &Arc<Conn>) {
        let (send_close, send_reset, peer_id) = {
            let mut io = conn.io();
            let open = io.phase == ConnPhase::Open;
            let violation = io.violation.take().is_some();
            if open {
                io.shutdown_write();
                io.shutdown_read();
            }
            io.release();
            if open {
                io.phase = ConnPhase::Closed;
            }
            (open && !io.close_received, violation, io.peer_id)
        };
        let mut st = self.state();
        if send_reset {
            self.counters.resets_sent.fetch_add(1, Ordering::Relaxed);
            self.send_frame(
                &mut st,
                conn.peer,
                &Message::Reset {
                    conn_id: peer_id,
                    reason: ResetReason::ProtocolError,
                },
            );
        } else if send_close {
            self.send_frame(&mut st, conn.peer, &Message::Close { conn_id: peer_id });
        }
        self.unregister(&mut st, conn);
    }

    /// A ring violation was found by a reader or writer: tell the peer.
    pub(crate) fn report_violation(&self, conn: &Arc<Conn>) {
        let peer_id = {
            let mut io = conn.io();
            if io.violation.take().is_none() {
                return;
            }
            io.peer_id
        };
        self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
        self.counters.resets_sent.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state();
        self.send_frame(
            &mut st,
            conn.peer,
            &Message::Reset {
                conn_id: peer_id,
                reason: ResetReason::ProtocolError,
            },
        );
        self.unregister(&mut st, conn);
    }

    pub(crate) fn close_listener(&self, l: &Arc<ListenerShared>) {
        let pending = {
            let mut st = self.state();
            st.listeners.remove(&l.port);
            st.used_ports.remove(&l.port);
            l.take_all()
        };
        for c in pending {
            self.close_conn(&c);
        }
    }

    fn status(&self) -> Status {
        let st = self.state();
        let links = st
            .links
            .values()
            .map(|l| LinkStatus {
                peer: l.peer,
                generation: l.gen,
                peer_generation: l.peer_gen,
                up: l.tx.is_some(),
                connections: l.conns.len(),
                pending_frames: l.pending.len(),
            })
            .collect();
        let mut connections: Vec<ConnStatus> = st
            .conns
            .values()
            .map(|c| {
                let mut io = c.io();
                let rx_fill = io
                    .rx
                    .as_ref()
                    .map_or((0, 0), |r| (r.c.readable().unwrap_or(0), r.c.capacity()));
                let tx_fill = io
                    .tx
                    .as_mut()
                    .map_or((0, 0), |t| (t.p.unconsumed().unwrap_or(0), t.p.capacity()));
                ConnStatus {
                    id: c.id,
                    local: SockAddrXen::new(u32::from(self.domid), c.local_port),
                    peer: SockAddrXen::new(u32::from(c.peer), c.peer_port),
                    phase: io.phase,
                    rx_fill,
                    tx_fill,
                    bytes_in: io.bytes_in,
                    bytes_out: io.bytes_out,
                }
            })
            .collect();
        connections.sort_by_key(|c| c.id);
        let mut listeners: Vec<u32> = st.listeners.keys().copied().collect();
        listeners.sort_unstable();
        Status {
            domid: self.domid,
            backend: self.kind,
            links,
            connections,
            listeners,
            resets_sent: self.counters.resets_sent.load(Ordering::Relaxed),
            resets_received: self.counters.resets_received.load(Ordering::Relaxed),
            ring_errors: self.counters.ring_errors.load(Ordering::Relaxed),
            links_lost: self.counters.links_lost.load(Ordering::Relaxed),
            rejected: self.counters.rejected.load(Ordering::Relaxed),
        }
    }
}

struct PeerNode {
    gen: u32,
    ring_ref: u32,
    port: u32,
    peer_gen: u32,
}
