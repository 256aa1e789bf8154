// SPDX-License-Identifier: MIT OR Apache-2.0
//! The user-space transport: one per process and domain. It owns the links
//! (one per peer domain, set up once through XenStore), dispatches control
//! frames in a manager thread, and creates connections with their own data
//! rings. See `docs/protocol.md` section 6.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
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
use xensock_proto::mem::RawRing;
use xensock_proto::ring::{Consumer, Field, Producer, RingMemory};
use xensock_xenif::xs_wire::{Perm, PermAccess, XsErrno};
use xensock_xenif::{DomId, EventChannel, UnmapNotify, XenBackend};

use crate::addr::{SockAddrXen, DOMID_ANY, DOMID_FIRST_RESERVED, DOMID_SELF, PORT_ANY};
use crate::backend::{BackendKind, Dyn, DynXen};
use crate::carrier::{
    endpoint_of, socket_addr_of, Engine, EngineConfig, LegListener, LegListenerConfig, LegStats,
    NewRing, RingAlloc, Seed, Trigger,
};
use crate::conn::{
    lock, Conn, ConnIo, ConnPhase, KickWait, LinkShared, RxSide, TxSide, NOT_WAITING,
};
use crate::error::{errno, Error};
use crate::evfd::EventFd;
use crate::listener::{ListenerShared, XenListener};
use crate::rings::HeldRing;
use crate::rings::{
    data_identity, get_byte, grant_ring, link_identity, map_ring, reinit_ring, set_byte,
    verify_fresh, MappedRing, OwnedRing, LINK_MAPPER_ALIVE_OFFSET, LINK_OWNER_ALIVE_OFFSET,
};
use crate::stream::XenStream;

/// XenStore directory, relative to a domain's home, under which a domain
/// publishes one node per peer it has a link with: `data/xensock/link/<peer>`.
pub const LINK_DIR: &str = xensock_discovery::layout::LINK_DIR;

/// `state` of a link node once our half is advertised (`XenbusStateInitialised`).
pub const STATE_INITIALISED: &str = "3";
/// `state` once we mapped the peer's page and bound its port (`XenbusStateConnected`).
pub const STATE_CONNECTED: &str = "4";
/// `state` of a withdrawn half-link in a directory dom0 made (`XenbusStateClosed`).
pub const STATE_CLOSED: &str = "6";

/// Key of a link node that advertises ring reuse (`docs/protocol.md` 6.6):
/// "1" when this side keeps rings granted and mapped across connections
/// and speaks `RingRetire`. Absent (the kernel module today): no reuse.
pub const FEATURE_RING_REUSE: &str = "feature-ring-reuse";

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

/// Settings of a [`Transport`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Receive ring size (bytes, rounded up to a power of two between 2 KiB
    /// and 4 MiB) for new connections: the `SO_RCVBUF` default.
    pub recv_buffer: usize,
    /// Listener backlog default.
    pub backlog: usize,
    /// How long `connect` waits for a new link to a known peer to come up
    /// before failing with `EHOSTUNREACH` (a domain discovery does not know
    /// fails at once). 30 s by default, or `XENSOCK_LINK_TIMEOUT_MS`: a
    /// first link takes milliseconds on hardware but 5-10 s between guests
    /// emulated by QEMU TCG (the lab), where xenstored and both guests
    /// share two host CPUs.
    pub link_timeout: Duration,
    /// How long `connect` waits for the link and the answer together when
    /// no timeout is given. 60 s by default, or `XENSOCK_CONNECT_TIMEOUT_MS`.
    pub connect_timeout: Duration,
    /// How long a blocking read or write spins on the ring before sleeping.
    pub busy_poll: Duration,
    /// Keep data rings granted and mapped across connections on links whose
    /// peer advertises it too (`feature-ring-reuse`): a connect then costs
    /// no grant, map or unmap. Off, this transport behaves like a peer that
    /// does not know the feature (as the kernel module today).
    pub ring_reuse: bool,
    /// Domids this transport may link with when the dom0 agent publishes
    /// no co-residency table for this domain. `None`: the domids of the
    /// static peer list named by `XENSOCK_PEERS`, if set. With neither a
    /// table nor a list, any domid is tried (and only the link timeout
    /// tells that nobody answers).
    pub static_peers: Option<Vec<DomId>>,
    /// Migration: once a connection has left its ring, how long its TCP
    /// legs may take to come up (and, once up, how long sent data may stay
    /// unacknowledged) before it fails with `ECONNRESET`. 10 s by default,
    /// or `XENSOCK_PEER_LOST_MS`.
    pub peer_lost_after: Duration,
    /// Give connections a TCP carrier (a leg listener on this host's
    /// address, the endpoint and cookie in the handshake). Off: connections
    /// live and die with their ring, as before migration support.
    pub tcp_carrier: bool,
}

/// Environment variable overriding [`Config::peer_lost_after`] (milliseconds).
pub const ENV_PEER_LOST_MS: &str = "XENSOCK_PEER_LOST_MS";

/// Environment variable overriding [`Config::link_timeout`] (milliseconds).
pub const ENV_LINK_TIMEOUT_MS: &str = "XENSOCK_LINK_TIMEOUT_MS";
/// Environment variable overriding [`Config::connect_timeout`] (milliseconds).
pub const ENV_CONNECT_TIMEOUT_MS: &str = "XENSOCK_CONNECT_TIMEOUT_MS";

fn parse_ms(name: &str, value: &str) -> io::Result<Duration> {
    value
        .trim()
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}={value:?}: expected a whole number of milliseconds"),
            )
        })
}

/// A duration in milliseconds from the environment: `Ok(None)` when unset.
fn env_ms(name: &str) -> io::Result<Option<Duration>> {
    match std::env::var(name) {
        Ok(v) => parse_ms(name, &v).map(Some),
        Err(_) => Ok(None),
    }
}

/// The domids of the static peer list `XENSOCK_PEERS` names: `Ok(None)`
/// when unset, an error naming the file when it cannot be loaded.
fn env_static_peers() -> io::Result<Option<Vec<DomId>>> {
    let Some(f) = std::env::var_os(xensock_discovery::peers::ENV_PEERS_FILE) else {
        return Ok(None);
    };
    let list = xensock_discovery::peers::StaticPeers::load(&f).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}={f:?}: {e}", xensock_discovery::peers::ENV_PEERS_FILE),
        )
    })?;
    Ok(Some(list.peers.iter().filter_map(|p| p.domid).collect()))
}

impl Default for Config {
    /// The defaults, with `XENSOCK_LINK_TIMEOUT_MS`,
    /// `XENSOCK_CONNECT_TIMEOUT_MS` and `XENSOCK_PEERS` applied. A
    /// malformed value is left out here and reported by the transport's
    /// constructors (`InvalidInput`, naming the variable).
    fn default() -> Config {
        Config {
            recv_buffer: 256 * 1024,
            backlog: 128,
            link_timeout: env_ms(ENV_LINK_TIMEOUT_MS)
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(30)),
            connect_timeout: env_ms(ENV_CONNECT_TIMEOUT_MS)
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(60)),
            busy_poll: Duration::from_micros(50),
            ring_reuse: true,
            static_peers: None,
            peer_lost_after: env_ms(ENV_PEER_LOST_MS)
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(10)),
            tcp_carrier: true,
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
    /// Connections ever handed to a carrier engine (0: the link manager
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
/// ([`XenListener::bind`], [`XenStream::connect`], chosen by
/// [`crate::backend()`]). Tests and the demo run several simulated
/// domains in one process, one `Transport` each ([`Transport::sim`]).
///
/// One `Transport` per domain at a time: the XenStore link nodes are per
/// domain, so a transport takes the domain's claim ([`crate::claim`]) and
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

static GLOBAL: OnceLock<Transport> = OnceLock::new();

/// The longest a process's exit waits for its TCP-carried connections'
/// bytes to be acknowledged ([`Inner::end_at_exit`]).
const EXIT_LINGER: Duration = Duration::from_secs(2);

/// `atexit` hook of the process-wide transport: the orderly part of
/// dropping it (connections ended, links down, XenStore nodes withdrawn,
/// control socket removed).
extern "C" fn global_at_exit() {
    if let Some(t) = GLOBAL.get() {
        if let Ok(mut c) = t.owner.control.try_lock() {
            c.take();
        }
        t.owner.inner.end_at_exit();
    }
}

/// The lock file of a transport's claim ([`crate::claim`]): the guest's
/// over `/dev/xen`; next to the domain's XenStore socket otherwise (one
/// per simulated domain).
fn claim_path(kind: BackendKind, xs: &XsClient) -> PathBuf {
    match (kind, xs.connection_path().parent()) {
        (BackendKind::DevXen, _) | (_, None) => crate::claim::guest_claim_path(),
        (_, Some(dir)) => dir.join("xensock-transport.lock"),
    }
}

fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // getrandom(2) rather than opening /dev/urandom: this runs on every
    // connect (the cookie), where an open and a close showed up in profiles.
    // SAFETY: writes at most 4 bytes into `b`.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if got != b.len() as isize {
        if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
            let _ = io::Read::read_exact(&mut f, &mut b);
        }
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
        if kind == BackendKind::DevXen && crate::kernel::loaded_family().is_some() {
            // Both would own this domain's `data/xensock/link` nodes and
            // tear down each other's links.
            return Err(io::Error::other(
                "af_xen.ko is loaded in this domain and owns its xensock links: \
                 use the kernel family (XenStream::connect / XenListener::bind \
                 choose it) or unload the module to run the user-space transport",
            ));
        }
        // One process of the domain runs its transport: a second would take
        // over the link nodes and break the first one's connections.
        let claim = crate::claim::Claim::take(&claim_path(kind, &xs))?;
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
        });
        epoll_add(&epoll, sink.wake.as_raw_fd(), 0)?;
        // SAFETY: timerfd_create has no pointer arguments.
        let tfd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if tfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let kick_timer = unsafe { OwnedFd::from_raw_fd(tfd) };
        epoll_add(&epoll, kick_timer.as_raw_fd(), KICK_TIMER_TOKEN)?;
        // a malformed setting is an error here, not silently the default
        env_ms(ENV_LINK_TIMEOUT_MS)?;
        env_ms(ENV_CONNECT_TIMEOUT_MS)?;
        env_ms(ENV_PEER_LOST_MS)?;
        let static_peers = match cfg.static_peers.clone() {
            Some(v) => Some(v),
            None => env_static_peers()?,
        }
        .map(|v| v.into_iter().collect());
        let (legs, leg_endpoint) = if cfg.tcp_carrier {
            leg_listener(kind)
        } else {
            (None, TcpEndpoint::NONE)
        };
        let inner = Arc::new_cyclic(|weak| Inner {
            xen: Box::new(Dyn(backend)),
            xs,
            domid: AtomicU16::new(domid),
            weak: weak.clone(),
            legs,
            leg_endpoint,
            kind,
            cfg,
            watches: Mutex::new(Watches::default()),
            static_peers,
            state: Mutex::new(State {
                links: HashMap::new(),
                listeners: HashMap::new(),
                conns: HashMap::new(),
                used_ports: HashSet::new(),
                dead_gens: HashMap::new(),
                vanished: HashSet::new(),
                next_port: EPHEMERAL_PORT_FIRST,
            }),
            link_cv: Condvar::new(),
            epoll,
            sink,
            stop: AtomicBool::new(false),
            next_conn: AtomicU32::new(1),
            counters: Counters::default(),
            kick_timer,
            kick_timer_armed: AtomicBool::new(false),
            carriers: std::sync::atomic::AtomicUsize::new(0),
            suspended: AtomicBool::new(false),
        });
        // Links of an earlier process of this domain are dead.
        if let Ok(peers) = inner.xs.directory(&inner.link_dir_abs()) {
            for p in peers.iter().filter_map(|p| p.parse::<DomId>().ok()) {
                inner.withdraw_node(p, false);
            }
        }
        // The agent's table for us: its changes change whom we watch.
        inner.add_watch(&inner.table_dir()).map_err(Error::from)?;
        // Our own `domid` (relative: it follows the domain): it fires after
        // a migration, the user-space transport's resume hook.
        inner.add_watch("domid").map_err(Error::from)?;
        {
            let st = inner.state();
            inner.refresh_peers(&st).map_err(Error::from)?;
        }
        let mut threads = Vec::new();
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
                control: Mutex::new(None),
                claim,
            }),
        })
    }

    /// The user-space backend [`crate::backend()`] reports
    /// (`user_space`), for this process's domain: real `/dev/xen` devices,
    /// else the simulated host named by `XENSOCK_SIM`/`XENSOCK_SIM_DOMID`.
    /// `ENODEV` when neither exists. Over `/dev/xen` it refuses to start,
    /// saying why, while `af_xen.ko` is loaded: both would own the
    /// domain's XenStore link nodes (`XenStream::connect` and
    /// `XenListener::bind` use the kernel family then).
    pub fn from_env() -> io::Result<Transport> {
        let report = crate::backend::backend();
        match report.user_space {
            BackendKind::DevXen if report.kind == BackendKind::Kernel => {
                // Both would own this domain's XenStore link nodes and
                // withdraw each other's links.
                Err(io::Error::other(format!(
                    "af_xen.ko is loaded in this domain (family {}) and owns its xensock links; \
                     XenStream and XenListener use it; unload the module to run the \
                     user-space transport instead",
                    report.family.unwrap_or_default()
                )))
            }
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
            BackendKind::Kernel | BackendKind::Daemon | BackendKind::None => {
                Err(errno(libc::ENODEV))
            }
        }
    }

    /// The process-wide transport (created on first use with
    /// [`Transport::from_env`]).
    pub fn global() -> io::Result<Transport> {
        if let Some(t) = GLOBAL.get() {
            return Ok(t.clone());
        }
        let t = Transport::from_env()?;
        let mut first = false;
        let t = GLOBAL
            .get_or_init(|| {
                first = true;
                t
            })
            .clone();
        if first {
            // Other processes (`xensock status`, `xensock suspend`) reach
            // this transport through its control socket.
            match crate::control::ControlServer::start(Arc::downgrade(&t.owner.inner)) {
                Ok(c) => {
                    // The guest's suspend hook finds us through the claim,
                    // whichever user it runs as.
                    t.owner.claim.record(Some(c.path()));
                    *lock(&t.owner.control) = Some(c);
                }
                Err(e) => tracing::warn!("no control socket: {e}"),
            }
            // A static is never dropped: withdraw our XenStore nodes and
            // close the connections at exit, as dropping it would.
            // SAFETY: registers a plain `extern "C" fn()` with no captures.
            unsafe { libc::atexit(global_at_exit) };
        }
        Ok(t)
    }

    /// The process-wide transport, if `inner` is its (only it serves a
    /// control socket).
    pub(crate) fn global_of(inner: &Arc<Inner>) -> Option<Transport> {
        GLOBAL
            .get()
            .filter(|t| Arc::ptr_eq(&t.owner.inner, inner))
            .cloned()
    }

    /// This domain's id.
    pub fn domid(&self) -> DomId {
        self.owner.inner.domid()
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
        Ok(XenStream::new(self.clone(), conn))
    }

    /// Starts a connect and returns at once, as a non-blocking `connect`
    /// returning `EINPROGRESS`: the stream is in non-blocking mode and
    /// still connecting. Its descriptor becomes readable when the answer
    /// comes; [`XenStream::finish_connect`] then reports the outcome
    /// (`WouldBlock` while still in progress), and
    /// [`XenStream::take_error`] the failure. Reads and writes return
    /// `WouldBlock` until the connection is open. There is no timeout:
    /// drop the stream to abandon the attempt.
    ///
    /// The only blocking part is bringing up the link to a domain this
    /// transport has no link with yet (XenStore, up to
    /// `Config::link_timeout`); an async caller runs
    /// [`Transport::prepare_link`] on a thread that may block first when
    /// [`Transport::link_ready`] is false.
    pub fn connect_nonblocking(
        &self,
        addr: impl crate::ToXenAddr,
        opts: SocketOptions,
    ) -> io::Result<XenStream> {
        let addr = addr.to_xen_addr()?;
        let peer = self.check_connect_addr(&addr)?;
        let inner = &self.owner.inner;
        let link_deadline = Instant::now() + inner.cfg.link_timeout;
        let conn = inner.start_connect(peer, addr.port, opts, link_deadline)?;
        conn.nonblocking.store(true, Ordering::Release);
        Ok(XenStream::new(self.clone(), conn))
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
        let engines = inner.freeze_conns(None, Trigger::LocalMove);
        let deadline = Instant::now() + inner.cfg.peer_lost_after;
        while Instant::now() < deadline && !engines.iter().all(|e| e.failed() || e.status().legs_up)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Nothing shared may stay through the save: a PV guest restored
        // with gntdev mappings of another domain's pages crashed in the
        // lab. The links go (control rings, event channels, kept and
        // pooled rings; the peers see them withdrawn), offers not taken
        // are dropped, and rings the connections still drain are waited
        // for. No link comes up again until `resume` or a new domid.
        for e in &engines {
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
        tracing::info!(connections = engines.len(), "suspended");
        engines.len()
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
    /// Both sides keep rings across connections (`feature-ring-reuse`).
    pub ring_reuse: bool,
    /// Our idle receive rings, kept granted for the next connections.
    pub pooled_rings: usize,
    /// Our receive rings of closed connections the peer may still write.
    pub lent_rings: usize,
    /// Peer rings we keep mapped for the next connections.
    pub kept_mappings: usize,
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
    /// Which carrier moves the bytes.
    pub carrier: Carrier,
}

impl Status {
    /// The status as `xensock status` prints it.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "domain {} ({:?}): {} links, {} connections, {} listeners; resets sent {} received {}; ring errors {}; links lost {}; refused {}",
            self.domid,
            self.backend,
            self.links.len(),
            self.connections.len(),
            self.listeners.len(),
            self.resets_sent,
            self.resets_received,
            self.ring_errors,
            self.links_lost,
            self.rejected
        );
        match self.tcp_endpoint {
            Some(ep) => {
                let l = &self.legs;
                let _ = writeln!(
                    o,
                    "  TCP carrier at {ep}: legs accepted {}, refused: bad cookie {}, unknown connection {}, malformed {}, timed out {}",
                    l.accepted, l.bad_cookie, l.unknown_conn, l.malformed, l.timed_out
                );
            }
            None => {
                let _ = writeln!(o, "  no TCP carrier (connections cannot survive a move)");
            }
        }
        for l in &self.links {
            let _ = writeln!(
                o,
                "  link to domain {}: {}, {} connections, {} frames queued; ring reuse {}: {} rings pooled, {} lent, {} peer rings kept mapped",
                l.peer,
                if l.up { "up" } else { "offered" },
                l.connections,
                l.pending_frames,
                if l.ring_reuse { "on" } else { "off" },
                l.pooled_rings,
                l.lent_rings,
                l.kept_mappings
            );
        }
        for c in &self.connections {
            let _ = writeln!(
                o,
                "  {} -> {} {:?} rx {}/{} tx {}/{} in {} out {}; carrier: {}",
                c.local,
                c.peer,
                c.phase,
                c.rx_fill.0,
                c.rx_fill.1,
                c.tx_fill.0,
                c.tx_fill.1,
                c.bytes_in,
                c.bytes_out,
                c.carrier
            );
        }
        o
    }
}

/// A connection's carrier, as [`Transport::status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carrier {
    /// The transport's ring fast path (never switched).
    Ring,
    /// The carrier engine (the connection switched at least once).
    Engine {
        /// Sending direction: `ring`, `frozen` or `tcp`.
        tx: &'static str,
        /// Receiving direction: `ring`, `draining`, `tcp` or `offered`.
        rx: &'static str,
        /// Times our sending direction moved to TCP.
        tx_to_tcp: u64,
        /// Times our sending direction moved onto a new ring.
        tx_to_ring: u64,
        /// Times our receiving direction moved onto a new ring.
        rx_to_ring: u64,
        /// Both TCP legs are up.
        legs_up: bool,
        /// Why the connection failed, if it did.
        failure: Option<String>,
    },
}

impl Carrier {
    /// Carrier switches so far (both directions).
    pub fn switches(&self) -> u64 {
        match self {
            Carrier::Ring => 0,
            Carrier::Engine {
                tx_to_tcp,
                tx_to_ring,
                rx_to_ring,
                ..
            } => tx_to_tcp + tx_to_ring + rx_to_ring,
        }
    }
}

impl std::fmt::Display for Carrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Carrier::Ring => f.write_str("ring"),
            Carrier::Engine {
                tx,
                rx,
                tx_to_tcp,
                tx_to_ring,
                rx_to_ring,
                legs_up,
                failure,
            } => {
                write!(
                    f,
                    "tx {tx} rx {rx}, switches: tx to tcp {tx_to_tcp}, tx to ring {tx_to_ring}, rx to ring {rx_to_ring}; legs {}",
                    if *legs_up { "up" } else { "down" }
                )?;
                if let Some(why) = failure {
                    write!(f, "; failed: {why}")?;
                }
                Ok(())
            }
        }
    }
}

/// The TCP legs refused or accepted by this transport's leg listener.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LegCounters {
    /// Legs authenticated and handed to their connection.
    pub accepted: u64,
    /// Refused: a registered connection, the wrong cookie.
    pub bad_cookie: u64,
    /// Refused: no such connection (by the hello deadline).
    pub unknown_conn: u64,
    /// Refused: not a well-formed hello.
    pub malformed: u64,
    /// Refused: no hello in time (or too many unauthenticated legs).
    pub timed_out: u64,
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
    /// XenStore paths the transport watches (sorted).
    pub watched: Vec<String>,
    /// Where peers reach our TCP carrier (`None`: no TCP fallback).
    pub tcp_endpoint: Option<std::net::SocketAddr>,
    /// Legs our leg listener took or refused.
    pub legs: LegCounters,
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

/// How often the manager retries ring offers for connections on TCP.
const CARRIER_SWEEP: Duration = Duration::from_millis(20);
/// How long a domain that offered a ring for a connection whose peer it is
/// not (yet) has to take ours, proving it is the peer (as the kernel
/// module's offer timeout).
const UNPROVEN_OFFER_TIMEOUT: Duration = Duration::from_secs(15);
/// The sweep's interval doubles up to this while no carrier connection has
/// a usable link or a kept offer (nothing a sweep could do), and is back
/// at `CARRIER_SWEEP` after any event: every 20 ms it cost the process
/// 20-40 ms of CPU per second in a lab guest with its links down, on the
/// streaming application's vCPU (docs/lab.md).
const CARRIER_SWEEP_IDLE_MAX: Duration = Duration::from_millis(320);

fn manager_thread(inner: Arc<Inner>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut last_sweep = Instant::now();
    let mut sweep_every = CARRIER_SWEEP;
    while !inner.stop.load(Ordering::Acquire) {
        let carriers = inner.carriers.load(Ordering::Relaxed) > 0;
        if carriers && last_sweep.elapsed() >= sweep_every {
            last_sweep = Instant::now();
            sweep_every = if inner.sweep_carriers() {
                CARRIER_SWEEP
            } else {
                (sweep_every * 2).min(CARRIER_SWEEP_IDLE_MAX)
            };
        }
        let timeout = if carriers {
            sweep_every
                .saturating_sub(last_sweep.elapsed())
                .as_millis()
                .max(1) as i32
        } else {
            -1
        };
        // SAFETY: `events` has room for its length; the epoll fd is ours.
        let n = unsafe {
            libc::epoll_wait(
                inner.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout,
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
        if n > 0 {
            // something changed: a link, the table, a kick; sweep soon
            sweep_every = CARRIER_SWEEP;
        }
        let mut ready = Vec::new();
        let mut owed = false;
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token == 0 {
                inner.sink.wake.drain();
            } else if token == KICK_TIMER_TOKEN {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a local u64; non-blocking.
                unsafe { libc::read(inner.kick_timer.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
                // Before scanning: a Close sent after this re-arms it.
                inner.kick_timer_armed.store(false, Ordering::Release);
                owed = true;
            } else {
                ready.push((token - 1) as DomId);
            }
        }
        let evs = std::mem::take(&mut *lock(&inner.sink.events));
        if evs.iter().any(|p| p == "domid") {
            inner.check_domid();
        }
        if evs.iter().any(|p| inner.is_table_event(p)) {
            // Failures leave the watches as they were; the next table
            // event (or connect) tries again.
            let _ = inner.refresh_peers(&inner.state());
            inner.follow_table();
        }
        let mut st = inner.state();
        if evs.iter().any(|p| inner.is_gone_event(p)) {
            let vanished: Vec<DomId> = st.vanished.iter().copied().collect();
            for p in vanished {
                inner.end_dead_peer(&mut st, p);
            }
        }
        let mut peers: Vec<DomId> = evs.iter().filter_map(|p| inner.is_link_event(p)).collect();
        peers.sort_unstable();
        peers.dedup();
        for p in peers {
            inner.on_peer_node(&mut st, p);
        }
        let active = !ready.is_empty();
        for p in ready {
            inner.service_link(&mut st, p);
        }
        if owed {
            let peers: Vec<DomId> = st
                .links
                .iter()
                .filter(|(_, l)| l.kick_owed)
                .map(|(p, _)| *p)
                .collect();
            for p in peers {
                if let Some(link) = st.links.get_mut(&p) {
                    if inner.flush_link(link).is_err() {
                        inner.link_down(&mut st, p, true);
                    }
                }
            }
        }
        drop(st);
        if active {
            inner.spin_links();
        }
    }
}

/// The transport's leg listener and the endpoint peers reach it at. In the
/// sim every domain is a process of this machine: loopback. On Xen: all
/// addresses, advertised as the first address discovery would advertise.
/// `None` (and `TcpEndpoint::NONE`) when it cannot be set up: connections
/// then have no TCP fallback.
fn leg_listener(kind: BackendKind) -> (Option<Arc<LegListener>>, TcpEndpoint) {
    let cfg = LegListenerConfig::default();
    let (bind, advertised): (IpAddr, Option<IpAddr>) = match kind {
        BackendKind::Sim => (IpAddr::V4(Ipv4Addr::LOCALHOST), None),
        _ => {
            let ip = xensock_discovery::advert::local_addresses()
                .ok()
                .and_then(|v| v.into_iter().next());
            // Peers connect to the advertised address only: a listener of
            // its family. (An IPv4 leg accepted on `[::]` is an IPv6
            // socket carrying v4-mapped traffic, a different path through
            // the kernel from the plain TCP it is measured against.)
            match ip {
                Some(IpAddr::V4(_)) => (IpAddr::V4(Ipv4Addr::UNSPECIFIED), ip),
                _ => (IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), ip),
            }
        }
    };
    // `[::]` needs IPv6 in the guest's kernel; IPv4 alone does too.
    let listener = match LegListener::bind(bind, cfg).or_else(|e| match bind {
        IpAddr::V6(_) => LegListener::bind(IpAddr::V4(Ipv4Addr::UNSPECIFIED), cfg),
        _ => Err(e),
    }) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("no TCP carrier: leg listener on {bind}: {e}");
            return (None, TcpEndpoint::NONE);
        }
    };
    let port = listener.local_addr().port();
    let endpoint = match (kind, advertised) {
        (BackendKind::Sim, _) => listener.endpoint(),
        (_, Some(ip)) => endpoint_of(SocketAddr::new(ip, port)),
        (_, None) => {
            tracing::warn!("no TCP carrier: this domain has no address to advertise");
            return (None, TcpEndpoint::NONE);
        }
    };
    (Some(Arc::new(listener)), endpoint)
}

impl Inner {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn domid(&self) -> DomId {
        self.domid.load(Ordering::Acquire)
    }

    fn link_dir_abs(&self) -> String {
        format!("/local/domain/{}/{LINK_DIR}", self.domid())
    }

    fn my_node(&self, peer: DomId) -> String {
        format!("{}/{peer}", self.link_dir_abs())
    }

    fn peer_node(&self, peer: DomId) -> String {
        format!("/local/domain/{peer}/{LINK_DIR}/{}", self.domid())
    }

    /// The agent's co-residency table for us.
    fn table_dir(&self) -> String {
        format!(
            "/local/domain/{}/{}/{}",
            self.domid(),
            xensock_discovery::layout::XENSOCK,
            xensock_discovery::layout::PEERS
        )
    }

    /// Where dom0 notes peers destroyed for good: `xensock/gone/<domid>`.
    fn gone_dir(&self) -> String {
        format!(
            "/local/domain/{}/{}/{}",
            self.domid(),
            xensock_discovery::layout::XENSOCK,
            xensock_discovery::layout::GONE
        )
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
            self.xs.try_read(&format!("{}/state", self.peer_node(peer))),
            Ok(Some(v)) if std::str::from_utf8(&v).ok().map(str::trim) == Some(STATE_CLOSED)
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
            if let Some(e) = c.engine() {
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

    // ---- discovery and watches -------------------------------------------

    /// Registers a watch on `path` whose events go to the manager thread.
    fn add_watch(&self, path: &str) -> Result<(), XsError> {
        let mut w = lock(&self.watches);
        if w.by_path.contains_key(path) {
            return Ok(());
        }
        let sink = self.sink.clone();
        let watch = self.xs.watch_with(path, move |ev| sink.push(ev.path))?;
        tracing::debug!(path, "watching");
        w.by_path.insert(path.to_string(), watch);
        Ok(())
    }

    /// Re-reads whom we may link with (the agent's table, link directories
    /// dom0 made for us, the static list) and makes the watches follow:
    /// one on each candidate peer's `link/<me>` node (its offers, and its
    /// removal when the peer's domain dies), plus, only when neither a
    /// table nor a static list exists, `/local/domain`, the one way to hear
    /// an offer from a domain we know nothing about.
    fn refresh_peers(&self, st: &State) -> Result<(), XsError> {
        let ids = |path: &str| -> Result<Option<HashSet<DomId>>, XsError> {
            match self.xs.directory(path) {
                Ok(v) => Ok(Some(v.iter().filter_map(|d| d.parse().ok()).collect())),
                Err(e) if e.is(XsErrno::NoEnt) || e.is(XsErrno::Acces) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let table = ids(&self.table_dir())?;
        let dom0_dirs = ids(&self.link_dir_abs())?.unwrap_or_default();
        let unknown: Vec<DomId> = {
            let w = lock(&self.watches);
            table
                .iter()
                .flatten()
                .filter(|d| !w.uuids.contains_key(d))
                .copied()
                .collect()
        };
        for d in unknown {
            if let Ok(Some(u)) = self.xs.try_read(&format!("{}/{d}/uuid", self.table_dir())) {
                let u = String::from_utf8_lossy(&u).trim().to_ascii_lowercase();
                lock(&self.watches).uuids.insert(d, u);
            }
        }
        let candidates: HashSet<DomId> = table
            .iter()
            .flatten()
            .chain(self.static_peers.iter().flatten())
            .chain(dom0_dirs.iter())
            .chain(st.links.keys())
            .copied()
            .filter(|&p| p != self.domid())
            .collect();
        let broad = table.is_none() && self.static_peers.is_none();
        let mut wanted: HashSet<String> = candidates.iter().map(|&p| self.peer_node(p)).collect();
        wanted.insert(self.table_dir());
        wanted.insert(self.gone_dir());
        wanted.insert("domid".to_string());
        if broad {
            wanted.insert("/local/domain".to_string());
        }
        {
            let mut w = lock(&self.watches);
            w.table = table;
            w.dom0_dirs = dom0_dirs;
            // Dropping a watch unregisters it.
            w.by_path.retain(|path, _| wanted.contains(path));
        }
        let mut sorted: Vec<&String> = wanted.iter().collect();
        sorted.sort();
        for path in sorted {
            self.add_watch(path)?;
        }
        Ok(())
    }

    /// Whether the agent says `peer` left this host (or was marked away)
    /// rather than died: its `xensock/moved/<uuid>` note in our table.
    fn peer_moved(&self, peer: DomId) -> bool {
        let Some(uuid) = lock(&self.watches).uuids.get(&peer).cloned() else {
            return false;
        };
        let note = format!(
            "/local/domain/{}/{}/{}/{uuid}",
            self.domid(),
            xensock_discovery::layout::XENSOCK,
            xensock_discovery::layout::MOVED
        );
        matches!(self.xs.try_read(&note), Ok(Some(_)))
    }

    /// After a table change: connections to peers that left the table
    /// with a `moved` note leave their rings (`LocalMove`, safe whatever
    /// the peer does: nothing past what we consumed is trusted), before
    /// the link is withdrawn under them.
    fn follow_table(&self) {
        let gone: Vec<DomId> = {
            let st = self.state();
            let w = lock(&self.watches);
            let Some(table) = w.table.as_ref() else {
                return;
            };
            let mut v: Vec<DomId> = st
                .conns
                .values()
                .filter(|c| c.engine().map_or(true, |e| e.on_ring()) && !table.contains(&c.peer()))
                .map(|c| c.peer())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        for peer in gone {
            if self.peer_moved(peer) {
                tracing::info!(peer, "peer left the co-residency table for another host");
                self.freeze_ring_conns(peer);
            }
        }
        let mut st = self.state();
        // A carrier connection's peer listed under a new domid with the
        // same UUID (it moved on this host): dom0 says where it is, so the
        // connection follows at once (no proof needed from the peer; and
        // when both ends moved, nothing else could tell either of them).
        let renamed: Vec<(Arc<Conn>, DomId)> = {
            let w = lock(&self.watches);
            let Some(table) = w.table.as_ref() else {
                return;
            };
            st.conns
                .values()
                .filter(|c| c.engine().is_some() && !table.contains(&c.peer()))
                .filter_map(|c| {
                    let uuid = w.uuids.get(&c.peer())?;
                    let now = table
                        .iter()
                        .find(|d| w.uuids.get(d) == Some(uuid))
                        .copied()?;
                    Some((c.clone(), now))
                })
                .collect()
        };
        for (conn, now) in renamed {
            tracing::info!(
                conn = conn.id,
                old = conn.peer(),
                new = now,
                "the agent lists the peer under a new domid"
            );
            lock(&conn.pending_offer).take();
            self.rehome(&mut st, &conn, now);
        }
        // Peers of moved connections that are co-resident again: a link,
        // whose coming up offers rings.
        let back: Vec<DomId> = {
            let w = lock(&self.watches);
            let Some(table) = w.table.as_ref() else {
                return;
            };
            let mut v: Vec<DomId> = st
                .conns
                .values()
                .filter(|c| c.engine().is_some() && table.contains(&c.peer()))
                .map(|c| c.peer())
                .filter(|p| !st.links.contains_key(p))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        for peer in back {
            tracing::info!(peer, "peer co-resident again: new link");
            if self.create_link(&mut st, peer, None).is_ok() {
                self.on_peer_node(&mut st, peer);
            }
        }
    }

    /// Whether discovery allows a link to `peer`: false when the agent's
    /// table (or the static list) exists and names neither it nor a link
    /// directory dom0 made for it, or when dom0 learns from xenstored that
    /// no such domain exists. Reads XenStore afresh: a
    /// connect must not fail on a table event not yet processed.
    fn may_link(&self, st: &State, peer: DomId) -> bool {
        if self.domid() == 0 {
            if let Ok(false) = self.xs.is_domain_introduced(u32::from(peer)) {
                return false;
            }
        }
        if self.refresh_peers(st).is_err() {
            // XenStore trouble is no evidence against the peer.
            return true;
        }
        let w = lock(&self.watches);
        if w.table.is_none() && self.static_peers.is_none() {
            return true;
        }
        w.table.as_ref().is_some_and(|t| t.contains(&peer))
            || self
                .static_peers
                .as_ref()
                .is_some_and(|s| s.contains(&peer))
            || w.dom0_dirs.contains(&peer)
    }

    /// `Some(peer)` if `path` is (inside) a peer's link node for us.
    fn is_link_event(&self, path: &str) -> Option<DomId> {
        let rest = path.strip_prefix("/local/domain/")?;
        let (peer, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix(LINK_DIR)?.strip_prefix('/')?;
        let me = self.domid().to_string();
        let tail = rest.strip_prefix(me.as_str())?;
        if !(tail.is_empty() || tail.starts_with('/')) {
            return None;
        }
        let peer: DomId = peer.parse().ok()?;
        (peer != self.domid()).then_some(peer)
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

    /// After a kick, keeps servicing links for `Config::busy_poll` (renewed
    /// by every frame) before the manager sleeps in epoll again: the next
    /// frame (an answer, a client's next connect) often follows within
    /// microseconds, and a sleeping manager costs a scheduler wake-up per
    /// frame. Yields between looks, as blocked readers do, and takes the
    /// state lock only when it is free. Kicks (for control or data rings)
    /// are taken from epoll without sleeping, so no link waits for another;
    /// a XenStore watch or the kick timer ends the spin (the main loop
    /// handles those).
    fn spin_links(&self) {
        let mut end = Instant::now() + self.cfg.busy_poll;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        while Instant::now() < end && !self.stop.load(Ordering::Acquire) {
            std::thread::yield_now();
            // SAFETY: room for 8 events; the epoll fd is ours; no sleep.
            let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), evs.as_mut_ptr(), 8, 0) };
            let Ok(n) = usize::try_from(n) else {
                return;
            };
            let kicked = &evs[..n];
            if kicked
                .iter()
                .any(|e| e.u64 == 0 || e.u64 == KICK_TIMER_TOKEN)
            {
                // Level-triggered: the main loop's epoll_wait sees it again.
                return;
            }
            let mut st = match self.state.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            let mut peers: Vec<DomId> = kicked.iter().map(|e| (e.u64 - 1) as DomId).collect();
            peers.extend(
                st.links
                    .iter()
                    .filter(|(_, l)| l.c.readable().is_ok_and(|n| n as usize >= ctrl::HEADER_LEN))
                    .map(|(p, _)| *p),
            );
            peers.sort_unstable();
            peers.dedup();
            for p in &peers {
                self.service_link(&mut st, *p);
            }
            if !peers.is_empty() {
                end = Instant::now() + self.cfg.busy_poll;
            }
        }
    }

    /// Services `peer`'s link from the calling thread when a frame is
    /// waiting and the manager thread is not at it: a waiter that takes its
    /// own answer off the control ring saves two thread wake-ups.
    pub(crate) fn poll_link(&self, peer: DomId) {
        let mut st = match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        let waiting = st
            .links
            .get(&peer)
            .is_some_and(|l| l.c.readable().is_ok_and(|n| n as usize >= ctrl::HEADER_LEN));
        if waiting {
            self.service_link(&mut st, peer);
        }
    }

    // ---- rings kept across connections (docs/protocol.md 6.6) -----------

    /// A receive ring for our connection `conn_id`: an idle one of the
    /// link's pool, re-initialised, else a fresh grant.
    fn take_rx_ring(
        &self,
        st: &mut State,
        peer: DomId,
        geometry: RingGeometry,
        conn_id: u32,
    ) -> Result<OwnedRing, Error> {
        let order = geometry.order() as u8;
        let pooled = st
            .links
            .get_mut(&peer)
            .filter(|l| l.reuse)
            .and_then(|l| l.rings.pool.get_mut(&order)?.pop());
        let ring = match pooled {
            Some(ring) => {
                reinit_ring(&ring, self.domid(), peer, conn_id);
                ring
            }
            None => grant_ring(
                self.xen.as_ref(),
                self.domid(),
                peer,
                geometry,
                conn_id,
                false,
            )?,
        };
        // Our reader has not waited yet: say so, rather than leave the
        // event index at 0, which reads as "waiting at 0" (see close_conn).
        ring.ring
            .store(Field::DataEvent, NOT_WAITING, Ordering::Release);
        Ok(ring)
    }

    /// Maps the ring `peer` offered in `grant`, reusing a mapping kept from
    /// an earlier connection if it names the same pages. A kept mapping is
    /// checked like a fresh one (identity) and must start from zero.
    fn map_peer_ring(
        &self,
        st: &mut State,
        peer: DomId,
        grant: &ctrl::RingGrant,
        expected: &RingIdentity,
    ) -> Result<MappedRing, Error> {
        let kept = st.links.get_mut(&peer).and_then(|l| {
            let i = l
                .rings
                .mapped
                .iter()
                .position(|(g, _)| g.header_ref == grant.header_ref)?;
            l.rings.mapped.remove(i)
        });
        if let Some((g, m)) = kept {
            if g.order == grant.order && g.dir_ref == grant.dir_ref {
                m.ring.header().verify(expected).map_err(Error::Layout)?;
                verify_fresh(&m.ring)?;
                return Ok(m);
            }
            // Same header page, other geometry: the peer is confused; map
            // what it says now (and let the identity check decide).
        }
        map_ring(self.xen.as_ref(), peer, grant, expected)
    }

    /// Keeps our mapping of a peer ring we will not write any more, for
    /// the peer to re-offer. Dropped (unmapped) when reuse is off.
    fn keep_mapping(&self, st: &mut State, peer: DomId, tx: TxSide) {
        let Some(link) = st.links.get_mut(&peer).filter(|l| l.reuse) else {
            return;
        };
        link.rings.mapped.push_back((tx.grant, tx.mapped));
        while link.rings.mapped.len() > MAPPED_KEPT_MAX {
            link.rings.mapped.pop_front();
        }
    }

    /// Our receive ring is idle and the peer no longer writes it: into the
    /// pool, or, past the pool's bound, retired (the peer is told to unmap
    /// it, and our grant ends; Xen defers that until the peer has unmapped).
    fn pool_rx_ring(&self, st: &mut State, peer: DomId, ring: OwnedRing) {
        let Some(link) = st.links.get_mut(&peer).filter(|l| l.reuse) else {
            return;
        };
        let size = ring.ring.geometry().data_size();
        let cap = (POOL_BYTES_PER_ORDER / size.max(1)).clamp(1, POOL_PER_ORDER);
        let pool = link.rings.pool.entry(ring.grant.order).or_default();
        if pool.len() < cap {
            pool.push(ring);
            return;
        }
        let grant = ring.grant;
        drop(ring);
        self.send_frame(st, peer, &Message::RingRetire { ring: grant });
    }

    /// Where our receive ring goes when our side of a cleanly closed
    /// connection is done: the pool if the peer already said it stopped
    /// writing (its `Close`), else lent until it does.
    fn release_rx_ring(&self, st: &mut State, conn: &Conn, ring: OwnedRing, peer_done: bool) {
        if peer_done {
            self.pool_rx_ring(st, conn.peer(), ring);
        } else if let Some(link) = st.links.get_mut(&conn.peer()).filter(|l| l.reuse) {
            link.rings.lent.insert(conn.id, ring);
        }
    }

    fn link_reuses_rings(&self, st: &State, peer: DomId) -> bool {
        st.links.get(&peer).is_some_and(|l| l.reuse)
    }

    // ---- links ----------------------------------------------------------

    /// Creates our half of a link to `peer` (grant, port, XenStore node).
    fn create_link(&self, st: &mut State, peer: DomId, peer_gen: Option<u32>) -> Result<(), Error> {
        if self.suspended.load(Ordering::Acquire) {
            // Its grants and mappings would go into the save.
            return Err(Error::Io(errno(libc::EAGAIN)));
        }
        // a peer we link with again is alive
        st.vanished.remove(&peer);
        let rx = grant_ring(
            self.xen.as_ref(),
            self.domid(),
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
        let me = self.domid();
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
            if self.cfg.ring_reuse {
                tx.write(&format!("{node}/{FEATURE_RING_REUSE}"), "1")?;
            }
            tx.write(&format!("{node}/state"), STATE_INITIALISED)?;
            Ok(!exists)
        })?;
        epoll_add(&self.epoll, rx_chan.as_raw_fd(), u64::from(peer) + 1)?;
        tracing::info!(peer, gen, answering = peer_gen, "link offered");
        // When the peer's domain is destroyed, xenstored reports the removal
        // of its node only to watchers of that path (it may already be
        // watched: a candidate peer).
        let _ = self.add_watch(&self.peer_node(peer));
        let c = Consumer::new(rx.ring);
        let shared = Arc::new(LinkShared::new(rx_chan.as_fd().try_clone_to_owned().ok()));
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
                shared,
                conns: HashSet::new(),
                peer_seen_alive: false,
                owner_seen_alive: false,
                created_dir,
                reuse: false,
                kick_owed: false,
                rings: RingCache::default(),
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
            &link_identity(peer, self.domid()),
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
        link.reuse = self.cfg.ring_reuse && info.ring_reuse;
        tracing::info!(peer, gen = link.gen, peer_gen = info.gen, "link up");
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
                ring_reuse: num(FEATURE_RING_REUSE)? == Some(1),
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
        if self.suspended.load(Ordering::Acquire) && !st.links.contains_key(&peer) {
            // Answered after the resume (which offers a link itself).
            return;
        }
        let info = match self.read_peer_node(peer) {
            Ok(i) => i,
            Err(_) => return,
        };
        let Some(info) = info else {
            // Node gone: the peer tore its link down or its domain died.
            if st.links.get(&peer).is_some_and(|l| l.peer_gen.is_some()) {
                self.link_down(st, peer, true);
            } else if self.peer_retracted(peer) {
                // retracted after we saw the link die: saved or migrating
                st.vanished.remove(&peer);
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
                } else {
                    self.offer_carriers(st, peer);
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
        } else {
            self.offer_carriers(st, peer);
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
        tracing::info!(peer, lost, gen = link.gen, "link down");
        if let Some(g) = link.peer_gen {
            st.dead_gens.insert(peer, g);
        }
        epoll_del(&self.epoll, link.rx_chan.as_raw_fd());
        // Ring offers that went over this link can no longer be taken.
        for c in st.conns.values() {
            let mut offered = lock(&c.offered_to);
            if let (Some((to, epoch, _)), Some(e)) = (*offered, c.engine()) {
                if to == peer && e.withdraw_offer(epoch) {
                    *offered = None;
                    tracing::info!(conn = c.id, peer, epoch, "ring offer withdrawn");
                }
            }
        }
        let moved = lost && self.peer_moved(peer);
        if lost && !moved && !self.peer_retracted(peer) {
            st.vanished.insert(peer);
        } else {
            st.vanished.remove(&peer);
        }
        for id in &link.conns {
            // A connection on its carrier engine goes on over TCP (its legs
            // are its own); it comes back to a ring on a new link. The
            // link's event channel goes with the link.
            if let Some(c) = st.conns.get(id).filter(|c| c.engine().is_some()) {
                // one back on a ring of this link leaves it: its kicks go
                // with the link (whatever the peer does, LocalMove trusts
                // nothing past what was consumed)
                if let Some(e) = c.engine().filter(|e| e.on_ring()) {
                    match e.freeze(Trigger::LocalMove) {
                        Ok(()) => {
                            tracing::info!(conn = c.id, "connection leaves its ring with its link")
                        }
                        Err(err) => tracing::warn!(conn = c.id, "freeze: {err}"),
                    }
                }
                lock(&c.carrier_kick).take();
                c.io().kicker = None;
                continue;
            }
            // The agent says the peer moved: this one leaves its rings now.
            if moved {
                if let Some(c) = st.conns.get(id).cloned() {
                    if let Some(e) = self.escalate(&c) {
                        if e.freeze(Trigger::LocalMove).is_ok() {
                            continue;
                        }
                    }
                }
            }
            // One whose peer ended its half stays readable until closed.
            if let Some(c) = st.conns.get(id).filter(|c| c.io().end_with_link()) {
                c.signal();
                continue;
            }
            if let Some(conn) = st.conns.remove(id) {
                st.used_ports.remove(&conn.local_port);
                conn.io().reset_local();
                conn.signal();
            }
        }
        for l in st.listeners.values() {
            l.drop_peer(peer);
        }
        // dom0 may have noted the peer gone before its link was seen to go
        self.end_dead_peer(st, peer);
        let created = link.created_dir;
        drop(link);
        self.withdraw_node(peer, created);
        // Stop watching a peer that is no candidate any more (a link it
        // offered while only the broad watch knew it).
        let keep = {
            let w = lock(&self.watches);
            w.table.as_ref().is_some_and(|t| t.contains(&peer))
                || w.dom0_dirs.contains(&peer)
                || self
                    .static_peers
                    .as_ref()
                    .is_some_and(|s| s.contains(&peer))
        };
        if !keep {
            lock(&self.watches).by_path.remove(&self.peer_node(peer));
        }
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
            // Gone already (dom0 removed it: the pair ended): writing
            // `state` would recreate it.
            if tx.try_read(&node)?.is_none() {
                return Ok(());
            }
            for name in [
                "ring-ref",
                "event-channel",
                "generation",
                "peer-generation",
                FEATURE_RING_REUSE,
            ] {
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
        self.flush_link_with(link, true)
    }

    /// [`Inner::flush_link`]; with `kick` false the kick decision is left
    /// to the next flush (which covers these frames too) or the kick timer.
    fn flush_link_with(&self, link: &mut Link, kick: bool) -> Result<(), Error> {
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
        if !kick {
            link.kick_owed = true;
            return Ok(());
        }
        link.kick_owed = false;
        if tx.p.flush() {
            let _ = tx.chan.notify();
        }
        Ok(())
    }

    /// Sends `msg` without a kick of its own (see `CLOSE_KICK_DELAY`).
    fn send_frame_lazy(&self, st: &mut State, peer: DomId, msg: &Message<'_>) {
        if !self.queue_frame(st, peer, msg, false) {
            return;
        }
        if !self.kick_timer_armed.swap(true, Ordering::AcqRel) {
            let spec = libc::itimerspec {
                it_interval: libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: libc::timespec {
                    tv_sec: 0,
                    tv_nsec: CLOSE_KICK_DELAY.as_nanos() as libc::c_long,
                },
            };
            // SAFETY: a valid timer descriptor and spec; no old value wanted.
            unsafe {
                libc::timerfd_settime(self.kick_timer.as_raw_fd(), 0, &spec, std::ptr::null_mut())
            };
        }
    }

    fn send_frame(&self, st: &mut State, peer: DomId, msg: &Message<'_>) {
        self.queue_frame(st, peer, msg, true);
    }

    /// Queues `msg` on the link to `peer` and flushes what fits (kicking
    /// the peer only if `kick`); a broken ring takes the link down. False
    /// when nothing was queued or the link went down.
    fn queue_frame(&self, st: &mut State, peer: DomId, msg: &Message<'_>, kick: bool) -> bool {
        let Some(link) = st.links.get_mut(&peer) else {
            return false;
        };
        let mut buf = [0u8; ctrl::MAX_CONTROL_FRAME];
        let Ok(len) = msg.encode(&mut buf) else {
            return false;
        };
        link.pending.push_back((buf, len));
        if self.flush_link_with(link, kick).is_err() {
            self.counters.ring_errors.fetch_add(1, Ordering::Relaxed);
            self.link_down(st, peer, true);
            return false;
        }
        true
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
        // First: a kick from a peer that moved here may be the first one
        // for a connection that follows it now.
        self.check_rehomes(st, peer);
        self.ring_carriers(st, peer);
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
                tcp,
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
                let req = Request {
                    their_id: conn_id,
                    src_port,
                    dst_port,
                    cookie,
                    tcp,
                };
                match self.accept_request(st, peer, &req, &rx, &l) {
                    Ok(conn) => {
                        self.freeze_if_suspended(&conn);
                        l.push(conn)
                    }
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
                tcp,
            } => {
                let conn = st
                    .conns
                    .get(&conn_id)
                    .filter(|c| c.peer() == peer)
                    .filter(|c| c.cookie.load(Ordering::Relaxed) == cookie)
                    .cloned();
                if let Some(c) = &conn {
                    *lock(&c.peer_tcp) = socket_addr_of(&tcp);
                }
                let kicker = st
                    .links
                    .get(&peer)
                    .and_then(|l| l.tx.as_ref().map(|t| t.chan.clone()));
                let ok = match &conn {
                    Some(c) => {
                        let mut io = c.io();
                        if io.phase != ConnPhase::Connecting {
                            false
                        } else {
                            let expected = data_identity(peer, self.domid(), acceptor_id, rx.order);
                            match self.map_peer_ring(st, peer, &rx, &expected) {
                                Ok(mapped) => {
                                    let p = Producer::new(mapped.ring);
                                    p.memory().store(
                                        Field::SpaceEvent,
                                        NOT_WAITING,
                                        Ordering::Release,
                                    );
                                    io.tx = Some(TxSide {
                                        p,
                                        mapped,
                                        grant: rx,
                                    });
                                    io.peer_id = acceptor_id;
                                    io.kicker = kicker;
                                    io.phase = ConnPhase::Open;
                                    true
                                }
                                Err(_) => {
                                    io.release();
                                    io.phase = ConnPhase::Failed(libc::EPROTO);
                                    false
                                }
                            }
                        }
                    }
                    None => false,
                };
                if let Some(c) = &conn {
                    c.signal();
                    if ok {
                        self.freeze_if_suspended(c);
                    }
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
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer() == peer).cloned() {
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
                let reuse = self.link_reuses_rings(st, peer);
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer() == peer).cloned() {
                    let (tx, answer) = {
                        let mut io = c.io();
                        io.peer_closed = true;
                        io.close_received = true;
                        // The peer no longer reads: stop writing its ring
                        // (kept mapped for reuse, else unmapped). Our own
                        // ring stays until the data is read.
                        let tx = io.tx.take();
                        // On a reuse link our Close tells the peer that we
                        // no longer write its ring, so it may pool it.
                        let answer = reuse && !io.close_sent && io.phase == ConnPhase::Open;
                        if answer {
                            io.close_sent = true;
                        }
                        (tx, answer.then_some(io.peer_id))
                    };
                    if let Some(tx) = tx {
                        self.keep_mapping(st, peer, tx);
                    }
                    if let Some(peer_id) = answer {
                        self.send_frame_lazy(st, peer, &Message::Close { conn_id: peer_id });
                    }
                    c.signal();
                } else if let Some(ring) = st
                    .links
                    .get_mut(&peer)
                    .and_then(|l| l.rings.lent.remove(&conn_id))
                {
                    // Closed here first; now the peer stopped writing too.
                    self.pool_rx_ring(st, peer, ring);
                }
            }
            Message::Reset { conn_id, .. } => {
                self.counters
                    .resets_received
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(c) = st.conns.get(&conn_id).filter(|c| c.peer() == peer).cloned() {
                    {
                        let mut io = c.io();
                        io.close_received = true;
                        io.reset_local();
                    }
                    c.signal();
                    self.unregister(st, &c);
                } else if let Some(link) = st.links.get_mut(&peer) {
                    // A ring lent after a clean close: the peer's state is
                    // unknown, so it is not reused.
                    link.rings.lent.remove(&conn_id);
                }
            }
            Message::RingRetire { ring } => {
                if let Some(link) = st.links.get_mut(&peer) {
                    link.rings
                        .mapped
                        .retain(|(g, _)| g.header_ref != ring.header_ref);
                }
            }
            Message::RingOffer { conn_id, rx } => self.on_ring_offer(st, peer, conn_id, &rx),
            // Suspend and Resume are not used: each side's triggers come
            // from its own hooks and discovery (docs/migration.md).
            _ => {}
        }
    }

    fn accept_request(
        &self,
        st: &mut State,
        peer: DomId,
        req: &Request,
        rx: &ctrl::RingGrant,
        l: &Arc<ListenerShared>,
    ) -> Result<Arc<Conn>, Error> {
        let Request {
            their_id,
            src_port,
            dst_port,
            cookie,
            tcp,
        } = *req;
        let link = st.links.get(&peer).ok_or(Error::Protocol("no link"))?;
        let kicker = link.tx.as_ref().map(|t| t.chan.clone());
        let shared = link.shared.clone();
        let id = self.next_conn_id();
        let expected = data_identity(peer, self.domid(), their_id, rx.order);
        let mapped = self.map_peer_ring(st, peer, rx, &expected)?;
        let owned = self.take_rx_ring(st, peer, RingGeometry::for_capacity(l.recv_buffer), id)?;
        let grant = owned.grant;
        let c = Consumer::new(owned.ring);
        let mut io = ConnIo::new(Some(RxSide { c, owned }));
        let p = Producer::new(mapped.ring);
        p.memory()
            .store(Field::SpaceEvent, NOT_WAITING, Ordering::Release);
        io.tx = Some(TxSide {
            p,
            mapped,
            grant: *rx,
        });
        io.peer_id = their_id;
        io.kicker = kicker;
        io.phase = ConnPhase::Open;
        let conn = Conn::new(id, peer, dst_port, src_port, io, shared).map_err(Error::Io)?;
        conn.cookie.store(cookie, Ordering::Relaxed);
        *lock(&conn.peer_tcp) = socket_addr_of(&tcp);
        st.conns.insert(id, conn.clone());
        if let Some(link) = st.links.get_mut(&peer) {
            link.conns.insert(id);
        }
        // Before our answer leaves (it lets the peer open legs to us).
        self.register_legs(&conn);
        self.send_frame(
            st,
            peer,
            &Message::ConnectAccept {
                conn_id: their_id,
                acceptor_id: id,
                cookie,
                rx: grant,
                tcp: self.leg_endpoint,
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
        // Suspended: no new link (it would go into the save); wait for the
        // resume.
        while self.suspended.load(Ordering::Acquire) && !st.links.contains_key(&peer) {
            let now = Instant::now();
            if now >= deadline {
                return Err(errno(libc::EHOSTUNREACH));
            }
            st = self
                .link_cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if !st.links.contains_key(&peer) {
            // A domain discovery does not know is unreachable now, not
            // after the link timeout.
            if !self.may_link(&st, peer) {
                return Err(errno(libc::EHOSTUNREACH));
            }
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
        let owned = self.take_rx_ring(&mut st, peer, geometry, id)?;
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
        let cookie = random_u64();
        conn.cookie.store(cookie, Ordering::Relaxed);
        // Before the cookie leaves: the peer may open a leg at once.
        self.register_legs(&conn);
        self.send_frame(
            &mut st,
            peer,
            &Message::ConnectRequest {
                conn_id: id,
                src_port,
                dst_port,
                sock_type: SockType::Stream,
                cookie,
                rx: grant,
                tcp: self.leg_endpoint,
            },
        );
        Ok(conn)
    }

    fn unregister(&self, st: &mut State, conn: &Arc<Conn>) {
        if st.conns.remove(&conn.id).is_some() {
            if let Some(l) = st.links.get_mut(&conn.peer()) {
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
        // (The engine's lock must not be held while the state's is taken.)
        let engine = lock(&conn.engine).take();
        if let Some(engine) = engine {
            {
                let mut st = self.state();
                if let Some(l) = st.links.get_mut(&conn.peer()) {
                    l.conns.remove(&conn.id);
                }
                self.unregister(&mut st, conn);
                conn.io().phase = ConnPhase::Closed;
            }
            // End of stream after what was written, delivered on whichever
            // carrier is current before the legs close (a lingering close,
            // off the caller's thread).
            let _ = engine.shutdown_write();
            let linger = self.cfg.peer_lost_after;
            let spawned = std::thread::Builder::new()
                .name("xensock-linger".into())
                .spawn(move || engine.linger(linger));
            if let Err(e) = spawned {
                tracing::warn!("closing a carrier connection at once: {e}");
            }
            return;
        }
        let mut st = self.state();
        self.close_ring_conn(&mut st, conn);
    }

    /// [`Inner::close_conn`] for a connection on rings (no engine).
    fn close_ring_conn(&self, st: &mut State, conn: &Arc<Conn>) {
        let reuse = self.link_reuses_rings(st, conn.peer());
        let mut lazy = false;
        let (send_close, send_reset, peer_id, kept) = {
            let mut io = conn.io();
            let open = io.phase == ConnPhase::Open;
            let violation = io.violation.take().is_some();
            if open {
                // The Close frame that follows kicks the peer's link when
                // it is asleep: no separate kick for the flags then.
                let quiet = !violation && !io.close_sent && (reuse || !io.close_received);
                io.shutdown_write_kick(!quiet);
                io.shutdown_read_kick(!quiet);
                // On a reuse link the Close itself need not kick unless the
                // peer sleeps on one of the rings.
                lazy = quiet && reuse && !io.peer_waiting();
            }
            // A clean close on a reuse link keeps both rings (docs/protocol.md
            // 6.6); anything else releases them.
            let kept = (open && reuse && !violation).then(|| {
                let peer_done = io.close_received;
                (io.tx.take(), io.rx.take().map(|r| (r.owned, peer_done)))
            });
            io.release();
            if open {
                io.phase = ConnPhase::Closed;
            }
            let send_close = open && !io.close_sent && (reuse || !io.close_received);
            if send_close {
                io.close_sent = true;
            }
            (send_close, violation, io.peer_id, kept)
        };
        if let Some((tx, rx)) = kept {
            if let Some(tx) = tx {
                self.keep_mapping(st, conn.peer(), tx);
            }
            if let Some((ring, peer_done)) = rx {
                self.release_rx_ring(st, conn, ring, peer_done);
            }
        }
        if send_reset {
            self.counters.resets_sent.fetch_add(1, Ordering::Relaxed);
            self.send_frame(
                st,
                conn.peer(),
                &Message::Reset {
                    conn_id: peer_id,
                    reason: ResetReason::ProtocolError,
                },
            );
        } else if send_close && lazy {
            self.send_frame_lazy(st, conn.peer(), &Message::Close { conn_id: peer_id });
        } else if send_close {
            self.send_frame(st, conn.peer(), &Message::Close { conn_id: peer_id });
        }
        self.unregister(st, conn);
    }

    /// The process exits with its transport. Its open connections end as
    /// a TCP socket's do when its process exits: what was written is
    /// delivered, then end of stream (a reset would lose what the peer has
    /// not read yet). On rings that costs nothing, the peer reads from its
    /// own ring after we are gone; a connection on TCP lingers until the
    /// peer has acknowledged its bytes, for at most [`EXIT_LINGER`] in all.
    /// Then the links go. Best effort: it gives up on a lock another thread
    /// holds.
    fn end_at_exit(&self) {
        self.stop.store(true, Ordering::Release);
        self.sink.wake.signal();
        let engines: Vec<Arc<Engine>> = match self.state.try_lock() {
            Ok(st) => st
                .conns
                .values()
                .filter_map(|c| c.engine.try_lock().ok().and_then(|e| e.clone()))
                .collect(),
            Err(_) => return,
        };
        let deadline = Instant::now() + EXIT_LINGER.min(self.cfg.peer_lost_after);
        for e in &engines {
            if e.shutdown_write().is_ok() {
                e.linger(deadline.saturating_duration_since(Instant::now()));
            }
        }
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        let on_rings: Vec<Arc<Conn>> = st
            .conns
            .values()
            .filter(|c| c.engine.try_lock().is_ok_and(|e| e.is_none()))
            .cloned()
            .collect();
        for c in &on_rings {
            self.close_ring_conn(&mut st, c);
        }
        let peers: Vec<DomId> = st.links.keys().copied().collect();
        for p in peers {
            self.link_down(&mut st, p, false);
        }
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
            conn.peer(),
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

    // ---- the carrier engine (docs/migration.md) ----------------------------

    /// Routes legs presenting this connection's id and cookie to it: the
    /// first one hands the connection to its carrier engine (the peer left
    /// the ring).
    fn register_legs(&self, conn: &Arc<Conn>) {
        let Some(legs) = &self.legs else {
            return;
        };
        let (wi, wc) = (self.weak.clone(), Arc::downgrade(conn));
        legs.register(
            conn.id,
            conn.cookie.load(Ordering::Relaxed),
            Arc::new(move |sock| {
                let (Some(inner), Some(conn)) = (wi.upgrade(), wc.upgrade()) else {
                    return;
                };
                // A leg can overtake the `ConnectAccept` that opens us.
                let end = Instant::now() + inner.cfg.link_timeout;
                while conn.io().phase == ConnPhase::Connecting && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(1));
                }
                match inner.escalate(&conn) {
                    Some(e) => e.adopt_leg(sock),
                    None => drop(sock),
                }
            }),
        );
    }

    /// Hands an open connection from the ring fast path to its carrier
    /// engine, once: the engine takes the rings and the switch state as they
    /// stand. `None` when the connection has no TCP carrier (the peer sent
    /// no endpoint, or we have no leg listener) or is not open with both
    /// rings.
    pub(crate) fn escalate(&self, conn: &Arc<Conn>) -> Option<Arc<Engine>> {
        let legs = self.legs.clone()?;
        let mut slot = lock(&conn.engine);
        if let Some(e) = slot.as_ref() {
            return Some(e.clone());
        }
        let peer_tcp = (*lock(&conn.peer_tcp))?;
        let mut io = conn.io();
        if io.phase != ConnPhase::Open || io.tx.is_none() || io.rx.is_none() {
            return None;
        }
        let (tx, rx) = (io.tx.take()?, io.rx.take()?);
        let order = rx.owned.grant.order;
        let tx_ring = tx.mapped.ring;
        let rx_ring = rx.owned.ring;
        let seed = Seed {
            tx_path: io.tx_path.clone(),
            producer: Some((tx.p, HeldRing::shared(tx_ring, tx.mapped))),
            rx_path: io.rx_path.clone(),
            consumer: Some((rx.c, HeldRing::shared(rx_ring, rx.owned))),
            delivered: io.bytes_in,
        };
        *lock(&conn.carrier_kick) = io.kicker.clone();
        conn.offer_target.store(conn.peer(), Ordering::Release);
        let cfg = EngineConfig {
            peer_lost_after: self.cfg.peer_lost_after,
            ..EngineConfig::new(
                conn.id,
                io.peer_id,
                conn.cookie.load(Ordering::Relaxed),
                Some(peer_tcp),
            )
        };
        let wc = Arc::downgrade(conn);
        let kick: crate::carrier::Kick = Arc::new(move || {
            if let Some(c) = wc.upgrade() {
                if let Some(k) = lock(&c.carrier_kick).as_ref() {
                    let _ = k.notify();
                }
            }
        });
        let wc = Arc::downgrade(conn);
        let ready: crate::carrier::ReadyHook = Arc::new(move || {
            if let Some(c) = wc.upgrade() {
                c.signal();
            }
        });
        let alloc = self.ring_alloc(conn, order);
        match Engine::start_seeded(
            cfg,
            seed,
            legs,
            conn.doorbell.clone(),
            kick,
            alloc,
            Some(ready),
        ) {
            Ok(e) => {
                let e = Arc::new(e);
                io.carried = true;
                *slot = Some(e.clone());
                self.carriers.fetch_add(1, Ordering::Relaxed);
                drop(io);
                drop(slot);
                tracing::info!(
                    conn = conn.id,
                    peer = conn.peer(),
                    "connection handed to its carrier engine"
                );
                // Waiters on the fast path retry on the engine.
                conn.signal();
                Some(e)
            }
            Err(err) => {
                tracing::warn!(conn = conn.id, "carrier engine: {err}");
                io.reset_local();
                drop(io);
                conn.signal();
                None
            }
        }
    }

    /// Makes receive rings for a connection's offers: granted to the
    /// domain the offer goes to, identity epoch as the engine says.
    fn ring_alloc(&self, conn: &Arc<Conn>, order: u8) -> RingAlloc {
        let (wi, wc) = (self.weak.clone(), Arc::downgrade(conn));
        Box::new(move |epoch| {
            let (Some(inner), Some(c)) = (wi.upgrade(), wc.upgrade()) else {
                return Err(errno(libc::ECONNRESET));
            };
            let geometry = RingGeometry::new(u32::from(order))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            let (me, to) = (inner.domid(), c.offer_target.load(Ordering::Acquire));
            let mut owned = grant_ring(inner.xen.as_ref(), me, to, geometry, c.id, false)
                .map_err(io::Error::from)?;
            owned.ring.header().init(&RingIdentity {
                epoch,
                ..data_identity(me, to, c.id, order)
            });
            owned
                .ring
                .store(Field::DataEvent, NOT_WAITING, Ordering::Release);
            owned.grant.epoch = epoch;
            *lock(&c.offered_grant) = Some(owned.grant);
            let ring = owned.ring;
            let local = HeldRing::shared(ring, owned);
            Ok(NewRing {
                for_peer: local.clone(),
                local,
            })
        })
    }

    /// Carrier connections to `peer`, for triggers and offers.
    fn carriers_to(&self, st: &State, peer: DomId) -> Vec<(Arc<Conn>, Arc<Engine>)> {
        if self.carriers.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        st.conns
            .values()
            .filter(|c| c.peer() == peer)
            .filter_map(|c| c.engine().map(|e| (c.clone(), e)))
            .collect()
    }

    /// The link to `peer` is up: every carrier connection to it offers a
    /// ring for its receiving direction (when that is on TCP), to return
    /// to the rings.
    fn offer_carriers(&self, st: &mut State, peer: DomId) {
        for (conn, engine) in self.carriers_to(st, peer) {
            self.rehome(st, &conn, peer);
            self.offer_ring_to(st, &conn, &engine, peer);
        }
    }

    /// Puts a carrier connection on the link to `peer` (kicks, doorbell).
    fn rehome(&self, st: &mut State, conn: &Arc<Conn>, peer: DomId) {
        let old = conn.peer();
        if old != peer {
            if let Some(l) = st.links.get_mut(&old) {
                l.conns.remove(&conn.id);
            }
            conn.set_peer(peer);
            tracing::info!(
                conn = conn.id,
                old,
                new = peer,
                "peer moved: connection follows"
            );
        }
        if let Some(l) = st.links.get_mut(&peer) {
            l.conns.insert(conn.id);
            let chan = l.tx.as_ref().map(|t| t.chan.clone());
            *lock(&conn.carrier_kick) = chan.clone();
            // Kicks we gave before, through the old link, were lost: one
            // now, so that a peer waiting on one of the rings looks again.
            if let Some(c) = &chan {
                let _ = c.notify();
            }
        }
        // Kicks for it may have come before it was on this link.
        conn.doorbell.ring();
    }

    fn offer_ring_to(&self, st: &mut State, conn: &Arc<Conn>, engine: &Engine, to: DomId) {
        if self.suspended.load(Ordering::Acquire) {
            return;
        }
        // Not over a link whose peer is gone (a migration we have not
        // processed yet): the offer could never be taken.
        if !link_usable(st, to) {
            return;
        }
        conn.offer_target.store(to, Ordering::Release);
        match engine.offer_ring() {
            Ok(Some((epoch, _))) => {
                let Some(grant) = lock(&conn.offered_grant).take() else {
                    return;
                };
                *lock(&conn.offered_to) = Some((to, epoch, Instant::now()));
                let peer_id = conn.io().peer_id;
                tracing::info!(conn = conn.id, to, epoch, "ring offered");
                self.send_frame(
                    st,
                    to,
                    &Message::RingOffer {
                        conn_id: peer_id,
                        rx: grant,
                    },
                );
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(conn = conn.id, "ring offer: {e}"),
        }
    }

    /// A peer's `RingOffer` for our sending direction. From the domain the
    /// connection is on: taken. From another domain (the peer may have
    /// moved there): nothing proves it is the peer, since a `RingOffer`
    /// carries no secret, so we offer our own ring to it first and take its
    /// offer only once the peer, over its cookie-authenticated leg, has
    /// switched onto that ring (`RingFrom`): only the domain we granted it
    /// to can have been offered it.
    fn on_ring_offer(&self, st: &mut State, peer: DomId, conn_id: u32, rx: &ctrl::RingGrant) {
        let Some(conn) = st.conns.get(&conn_id).cloned() else {
            return;
        };
        let Some(engine) = conn.engine() else {
            return;
        };
        if self.suspended.load(Ordering::Acquire) {
            // The move would take the ring away again: kept for a resume
            // without a move (after a move the peer offers anew, and this
            // grant, made for our old domid, is of no use).
            *lock(&conn.pending_offer) = Some((peer, *rx));
            return;
        }
        if conn.peer() != peer {
            *lock(&conn.pending_offer) = Some((peer, *rx));
            let offered = *lock(&conn.offered_to);
            if offered.map(|(to, ..)| to) != Some(peer) {
                self.offer_ring_to(st, &conn, &engine, peer);
            }
            self.check_rehome(st, &conn, &engine);
            return;
        }
        self.take_offer(st, &conn, &engine, peer, rx);
        self.offer_ring_to(st, &conn, &engine, peer);
    }

    fn take_offer(
        &self,
        st: &mut State,
        conn: &Arc<Conn>,
        engine: &Engine,
        peer: DomId,
        rx: &ctrl::RingGrant,
    ) {
        let peer_id = conn.io().peer_id;
        let expected = RingIdentity {
            epoch: rx.epoch,
            ..data_identity(peer, self.domid(), peer_id, rx.order)
        };
        let mapped = match map_ring(self.xen.as_ref(), peer, rx, &expected) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(conn = conn.id, peer, "ring offer not mapped: {e}");
                return;
            }
        };
        self.rehome(st, conn, peer);
        let ring = mapped.ring;
        match engine.accept_ring_offer(rx.epoch, HeldRing::shared(ring, mapped)) {
            Ok(true) => tracing::info!(conn = conn.id, peer, epoch = rx.epoch, "back on a ring"),
            Ok(false) => tracing::debug!(conn = conn.id, epoch = rx.epoch, "stale ring offer"),
            Err(e) => tracing::warn!(conn = conn.id, "ring offer: {e}"),
        }
    }

    /// A connection holding an offer from another domain: once our
    /// receiving direction reads the ring we offered that domain, the peer
    /// is there; move the connection and take its offer.
    fn check_rehome(&self, st: &mut State, conn: &Arc<Conn>, engine: &Engine) {
        let Some((from, grant)) = *lock(&conn.pending_offer) else {
            return;
        };
        let Some((to, epoch, _)) = *lock(&conn.offered_to) else {
            return;
        };
        if from != to {
            return;
        }
        let rx = engine.status().rx;
        let on_it =
            matches!(rx, xensock_proto::switch::RxState::Ring { epoch: e, .. } if e == epoch);
        if !on_it {
            tracing::trace!(
                conn = conn.id,
                from,
                epoch,
                ?rx,
                "waiting for the peer on our ring"
            );
            return;
        }
        *lock(&conn.pending_offer) = None;
        self.take_offer(st, conn, engine, from, &grant);
    }

    /// Retries what a carrier connection on TCP needs to return to a ring
    /// (an offer refused for now by the engine, e.g. before the sender's
    /// freeze notice arrived, or voided by a later freeze), and moves
    /// connections whose peer proved to be on another domain. Returns
    /// whether any of them could use a sweep: a usable link to its
    /// target, or an offer kept for later.
    fn sweep_carriers(&self) -> bool {
        let mut st = self.state();
        let conns: Vec<(Arc<Conn>, Arc<Engine>)> = st
            .conns
            .values()
            .filter_map(|c| c.engine().map(|e| (c.clone(), e)))
            .collect();
        let mut busy = false;
        for (conn, engine) in conns {
            if engine.failed() {
                continue;
            }
            let target = match *lock(&conn.pending_offer) {
                Some((from, _)) if !link_usable(&st, conn.peer()) => from,
                _ => conn.peer(),
            };
            if link_usable(&st, target) {
                busy = true;
                self.offer_ring_to(&mut st, &conn, &engine, target);
            }
            // An offer from the peer's own domain kept while suspended:
            // nothing to do with it before `resume` (which wakes us), so it
            // does not keep the sweep at its fastest meanwhile (it cost the
            // suspended lab guest ~3% of its CPU).
            let kept = *lock(&conn.pending_offer);
            busy |= kept.is_some() && !self.suspended.load(Ordering::Acquire);
            if let Some((from, grant)) = kept {
                if from == conn.peer() && !self.suspended.load(Ordering::Acquire) {
                    *lock(&conn.pending_offer) = None;
                    self.take_offer(&mut st, &conn, &engine, from, &grant);
                }
            }
            self.check_rehome(&mut st, &conn, &engine);
            self.drop_unproven(&conn, &engine);
        }
        busy
    }

    /// Our ring offered to a domain that is not the connection's peer
    /// (whose own offer named the connection: the peer, moved, or a guest
    /// posing as it) and not taken within [`UNPROVEN_OFFER_TIMEOUT`]: that
    /// domain is not the peer. The offer is abandoned (`Consumed` for its
    /// epoch tells the sender, should it have switched after all), its
    /// kept offer dropped, and the next candidate gets our ring; until
    /// then, one silent guest posing as the peer kept the connection on
    /// TCP for good.
    fn drop_unproven(&self, conn: &Arc<Conn>, engine: &Engine) {
        let mut offered = lock(&conn.offered_to);
        let Some((to, epoch, at)) = *offered else {
            return;
        };
        if to == conn.peer() || at.elapsed() < UNPROVEN_OFFER_TIMEOUT {
            return;
        }
        if engine.abandon_offer(epoch) {
            tracing::info!(
                conn = conn.id,
                to,
                epoch,
                "unanswered ring offer to a domain not the peer's: abandoned"
            );
        }
        *offered = None;
        drop(offered);
        let mut kept = lock(&conn.pending_offer);
        if kept.is_some_and(|(from, _)| from == to) {
            *kept = None;
        }
    }

    /// Connections waiting to follow a peer that may have moved to `peer`.
    fn check_rehomes(&self, st: &mut State, peer: DomId) {
        if self.carriers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let waiting: Vec<(Arc<Conn>, Arc<Engine>)> = st
            .conns
            .values()
            .filter(|c| lock(&c.pending_offer).is_some_and(|(from, _)| from == peer))
            .filter_map(|c| c.engine().map(|e| (c.clone(), e)))
            .collect();
        for (conn, engine) in waiting {
            self.check_rehome(st, &conn, &engine);
        }
    }

    /// Rings the doorbells of carrier connections on `peer`'s link.
    fn ring_carriers(&self, st: &State, peer: DomId) {
        for (conn, _) in self.carriers_to(st, peer) {
            conn.doorbell.ring();
        }
    }

    /// Freezes every open stream connection (to `peer` only, if given):
    /// each is handed to its carrier engine and leaves its rings. Returns
    /// the engines.
    fn freeze_conns(&self, peer: Option<DomId>, trigger: Trigger) -> Vec<Arc<Engine>> {
        let conns: Vec<Arc<Conn>> = self
            .state()
            .conns
            .values()
            .filter(|c| peer.map_or(true, |p| c.peer() == p))
            .cloned()
            .collect();
        let mut engines = Vec::new();
        for c in conns {
            if let Some(e) = self.escalate(&c) {
                match e.freeze(trigger) {
                    Ok(()) => {
                        tracing::info!(conn = c.id, ?trigger, "connection leaves its ring");
                        engines.push(e);
                    }
                    Err(err) => tracing::warn!(conn = c.id, "freeze: {err}"),
                }
            }
        }
        engines
    }

    /// Connections to `peer` still on a ring (their first, or one their
    /// carrier engine came back to) leave it: the peer moved away.
    fn freeze_ring_conns(&self, peer: DomId) {
        let conns: Vec<Arc<Conn>> = self
            .state()
            .conns
            .values()
            .filter(|c| c.peer() == peer && c.engine().map_or(true, |e| e.on_ring()))
            .cloned()
            .collect();
        for c in conns {
            if let Some(e) = self.escalate(&c) {
                match e.freeze(Trigger::LocalMove) {
                    Ok(()) => {
                        tracing::info!(conn = c.id, trigger = ?Trigger::LocalMove, "connection leaves its ring")
                    }
                    Err(err) => tracing::warn!(conn = c.id, "freeze: {err}"),
                }
            }
        }
    }

    /// A connection opened between the suspend hook and the move leaves
    /// its rings at once, as those opened before did.
    fn freeze_if_suspended(&self, conn: &Arc<Conn>) {
        if !self.suspended.load(Ordering::Acquire) {
            return;
        }
        if let Some(e) = self.escalate(conn) {
            if let Err(err) = e.freeze(Trigger::LocalMove) {
                tracing::warn!(conn = conn.id, "freeze: {err}");
            }
        }
    }

    /// Our own domid changed (same-host migration): the old links are
    /// dead (connections on the ring fast path with them; carrier
    /// connections go on over TCP), XenStore paths follow the new domid,
    /// and new links to the carriers' peers bring them back to rings.
    /// Returns whether it changed.
    pub(crate) fn check_domid(&self) -> bool {
        let Ok(v) = self.xs.read_string("domid") else {
            return false;
        };
        let Ok(new) = v.trim().parse::<DomId>() else {
            return false;
        };
        // Under the state lock: the watch and the resume hook may both look.
        let mut st = self.state();
        let old = self.domid();
        if new == old {
            return false;
        }
        tracing::info!(old, new, "this domain migrated");
        self.suspended.store(false, Ordering::Release);
        let peers: Vec<DomId> = st.links.keys().copied().collect();
        for p in peers {
            self.link_down(&mut st, p, true);
        }
        self.domid.store(new, Ordering::Release);
        st.dead_gens.clear();
        // Offers kept while suspended were granted to our old domid.
        for c in st.conns.values() {
            lock(&c.pending_offer).take();
        }
        // Watches of paths named after the old domid go; `domid` (relative)
        // and the broad `/local/domain` stay registered, so that an offer
        // made to the new domid while the others are re-registered is
        // not missed.
        lock(&self.watches)
            .by_path
            .retain(|path, _| path == "domid" || path == "/local/domain");
        let _ = self.add_watch("domid");
        let _ = self.add_watch(&self.table_dir());
        let _ = self.refresh_peers(&st);
        self.relink_carriers(&mut st);
        self.link_cv.notify_all();
        true
    }

    /// Offers a link to the peer of every carrier connection that has
    /// none (after a move or a suspend), whose coming up offers rings.
    fn relink_carriers(&self, st: &mut State) {
        let mut peers: Vec<DomId> = st
            .conns
            .values()
            .filter(|c| c.engine().is_some())
            .map(|c| c.peer())
            .collect();
        peers.sort_unstable();
        peers.dedup();
        for p in peers {
            if !st.links.contains_key(&p) && self.create_link(st, p, None).is_ok() {
                self.on_peer_node(st, p);
            }
        }
    }

    /// Links, and connections whose engine holds a ring: what a save
    /// would carry in grant mappings.
    fn shared_pages_held(&self) -> usize {
        let st = self.state();
        st.links.len()
            + st.conns
                .values()
                .filter(|c| c.engine().is_some_and(|e| e.holds_rings()))
                .count()
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
                ring_reuse: l.reuse,
                pooled_rings: l.rings.pool.values().map(Vec::len).sum(),
                lent_rings: l.rings.lent.len(),
                kept_mappings: l.rings.mapped.len(),
            })
            .collect();
        let mut connections: Vec<ConnStatus> = st
            .conns
            .values()
            .map(|c| {
                let mut moved = None;
                let carrier = match c.engine() {
                    None => Carrier::Ring,
                    Some(e) => {
                        use xensock_proto::switch::{RxState, TxState};
                        let s = e.status();
                        moved = Some((s.delivered, s.sent));
                        Carrier::Engine {
                            tx: match s.tx {
                                TxState::Ring { .. } => "ring",
                                TxState::Frozen { .. } => "frozen",
                                TxState::Tcp => "tcp",
                            },
                            rx: match s.rx {
                                RxState::Ring { .. } => "ring",
                                RxState::Draining { .. } => "draining",
                                RxState::Tcp => "tcp",
                                _ => "offered",
                            },
                            tx_to_tcp: s.tx_to_tcp,
                            tx_to_ring: s.tx_to_ring,
                            rx_to_ring: s.rx_to_ring,
                            legs_up: s.legs_up,
                            failure: s.failure,
                        }
                    }
                };
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
                    local: SockAddrXen::new(u32::from(self.domid()), c.local_port),
                    peer: SockAddrXen::new(u32::from(c.peer()), c.peer_port),
                    phase: io.phase,
                    rx_fill,
                    tx_fill,
                    bytes_in: moved.map_or(io.bytes_in, |m| m.0),
                    bytes_out: moved.map_or(io.bytes_out, |m| m.1),
                    carrier,
                }
            })
            .collect();
        connections.sort_by_key(|c| c.id);
        let mut listeners: Vec<u32> = st.listeners.keys().copied().collect();
        listeners.sort_unstable();
        Status {
            domid: self.domid(),
            backend: self.kind,
            links,
            connections,
            listeners,
            resets_sent: self.counters.resets_sent.load(Ordering::Relaxed),
            resets_received: self.counters.resets_received.load(Ordering::Relaxed),
            ring_errors: self.counters.ring_errors.load(Ordering::Relaxed),
            links_lost: self.counters.links_lost.load(Ordering::Relaxed),
            rejected: self.counters.rejected.load(Ordering::Relaxed),
            watched: {
                let mut v: Vec<String> = lock(&self.watches).by_path.keys().cloned().collect();
                v.sort();
                v
            },
            tcp_endpoint: socket_addr_of(&self.leg_endpoint),
            legs: self.legs.as_ref().map_or_else(LegCounters::default, |l| {
                let LegStats {
                    accepted,
                    bad_cookie,
                    unknown_conn,
                    malformed,
                    timed_out,
                } = l.stats();
                LegCounters {
                    accepted,
                    bad_cookie,
                    unknown_conn,
                    malformed,
                    timed_out,
                }
            }),
        }
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

struct PeerNode {
    gen: u32,
    ring_ref: u32,
    port: u32,
    peer_gen: u32,
    ring_reuse: bool,
}

#[cfg(test)]
mod env_tests {
    use super::*;

    #[test]
    fn millisecond_settings_parse_or_name_the_variable() {
        assert_eq!(
            parse_ms(ENV_LINK_TIMEOUT_MS, " 1500 ").unwrap(),
            Duration::from_millis(1500)
        );
        for bad in ["", "1.5", "-3", "30s", "abc"] {
            let e = parse_ms(ENV_LINK_TIMEOUT_MS, bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains(ENV_LINK_TIMEOUT_MS), "{e}");
        }
    }
}
