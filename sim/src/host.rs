// SPDX-License-Identifier: MIT OR Apache-2.0
//! The simulated Xen host: domains, their xenstored and control sockets,
//! the grant table and event channels.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use xensock_xenif::xs_wire::XsErrno;
use xensock_xenif::{DomId, GrantRef, Port, XenError, PAGE_SIZE};

use crate::ctl::{self, Dec, Enc};
use crate::listen::Listener;
use crate::store::Quotas;
use crate::sys;
use crate::sys::fdpass::{self, SeqPacket};
use crate::xenstored::{Xenstored, XenstoredStats};

/// Largest number of pages in one grant or map request.
pub const MAX_PAGES_PER_CALL: usize = 1024;
/// First grant reference handed out (Xen reserves the first 8 entries).
pub const FIRST_GRANT_REF: GrantRef = 8;
/// Highest domid the sim hands out (`DOMID_FIRST_RESERVED - 1`).
pub const MAX_DOMID: DomId = 0x7fef;

/// Environment variable naming the sim directory.
pub const ENV_SIM_DIR: &str = "XENSOCK_SIM";
/// Environment variable naming the calling process's domid.
pub const ENV_SIM_DOMID: &str = "XENSOCK_SIM_DOMID";
/// The variable libxenstore (and our client) reads for the xenstored socket.
pub const ENV_XENSTORED_PATH: &str = "XENSTORED_PATH";

/// Errors of host operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A file or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No live domain has this domid.
    #[error("no such domain: {0}")]
    NoSuchDomain(DomId),
    /// The sim's xenstored refused a toolstack operation.
    #[error("xenstored: {0}")]
    Xenstore(XsErrno),
    /// A bad argument (duplicate UUID, domid space exhausted...).
    #[error("{0}")]
    Invalid(String),
    /// The host is shutting down.
    #[error("the sim host was shut down")]
    ShutDown,
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SimError {
    let context = context.into();
    move |source| SimError::Io { context, source }
}

/// Host settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Directory for the sockets; a fresh temporary directory (removed on
    /// shutdown) when `None`.
    pub dir: Option<PathBuf>,
    /// xenstored quotas.
    pub quotas: Quotas,
    /// Grant entries a domain may have in use at once.
    pub grants_per_domain: usize,
    /// Event-channel ports a domain may have open at once.
    pub ports_per_domain: usize,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            dir: None,
            quotas: Quotas::default(),
            grants_per_domain: 8192,
            ports_per_domain: 1023,
        }
    }
}

/// How to create a domain.
#[derive(Debug, Clone, Default)]
pub struct DomainConfig {
    /// The domain's name (`/local/domain/<id>/name`).
    pub name: String,
    /// Its UUID; random when `None`.
    pub uuid: Option<String>,
    /// Its tenant label, written by the toolstack (dom0) to
    /// `/local/domain/<id>/xensock/label`, readable but not writable by the
    /// guest.
    pub label: Option<String>,
}

impl DomainConfig {
    /// A domain called `name`.
    pub fn new(name: impl Into<String>) -> DomainConfig {
        DomainConfig {
            name: name.into(),
            ..DomainConfig::default()
        }
    }
    /// Sets the UUID.
    pub fn uuid(mut self, uuid: impl Into<String>) -> DomainConfig {
        self.uuid = Some(uuid.into());
        self
    }
    /// Sets the tenant label.
    pub fn label(mut self, label: impl Into<String>) -> DomainConfig {
        self.label = Some(label.into());
        self
    }
}

/// Where a migrating domain goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateTo {
    /// Save and restore on this host: same UUID, new domid.
    SameHost,
    /// Another host (named): the domain leaves this one; the toolstack
    /// records `/tool/xensock/moved/<uuid>` = host name before releasing it.
    OtherHost(String),
}

/// A live domain, and how its processes reach the sim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDomain {
    /// Current domid.
    pub domid: DomId,
    /// Name.
    pub name: String,
    /// UUID (stable across migration).
    pub uuid: String,
    /// Tenant label, if any.
    pub label: Option<String>,
    /// The sim directory.
    pub sim_dir: PathBuf,
}

impl SimDomain {
    /// `<dir>/dom<id>`.
    pub fn dir(&self) -> PathBuf {
        domain_dir(&self.sim_dir, self.domid)
    }
    /// The xenstored socket of this domain (use as `XENSTORED_PATH`).
    pub fn xenstored_path(&self) -> PathBuf {
        self.dir().join("xenstored.sock")
    }
    /// The control socket of this domain.
    pub fn control_path(&self) -> PathBuf {
        self.dir().join("control.sock")
    }
    /// Environment of a process of this domain: `XENSOCK_SIM`,
    /// `XENSOCK_SIM_DOMID` and `XENSTORED_PATH`.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV_SIM_DIR, self.sim_dir.display().to_string()),
            (ENV_SIM_DOMID, self.domid.to_string()),
            (
                ENV_XENSTORED_PATH,
                self.xenstored_path().display().to_string(),
            ),
        ]
    }
    /// A command that runs as a process of this domain.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env());
        c
    }
}

/// `<dir>/dom<id>`.
pub fn domain_dir(sim_dir: &Path, domid: DomId) -> PathBuf {
    sim_dir.join(format!("dom{domid}"))
}

/// Resource counters, to assert that a scenario leaked nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimStats {
    /// Live domains, dom0 included.
    pub domains: usize,
    /// Grant entries whose granter still offers them.
    pub grants: usize,
    /// Grant entries the granter ended while a peer still maps them (freed
    /// when the last mapping goes, as Xen defers).
    pub deferred_grants: usize,
    /// Live mappings of foreign grants.
    pub mappings: usize,
    /// Open event-channel ports.
    pub ports: usize,
    /// Open control connections.
    pub control_connections: usize,
    /// xenstored counters.
    pub xenstored: XenstoredStats,
}

impl SimStats {
    /// No grant, mapping or port is in use.
    pub fn grants_and_channels_released(&self) -> bool {
        self.grants == 0 && self.deferred_grants == 0 && self.mappings == 0 && self.ports == 0
    }
}

struct Mem {
    rw: OwnedFd,
    ro: OwnedFd,
}

#[derive(Debug, Clone, Copy, Default)]
struct Notify {
    clear: Option<usize>,
    event: Option<Port>,
}

struct GrantEntry {
    /// The allocation and page the ref names (while not released).
    alloc: u64,
    page: usize,
    grantee: DomId,
    peer_writable: bool,
    mapped: u32,
    released: bool,
}

struct Allocation {
    conn: u64,
    domid: DomId,
    refs: Vec<GrantRef>,
    mem: Arc<Mem>,
    notify: Notify,
}

struct MapRecord {
    conn: u64,
    domid: DomId,
    granter: DomId,
    refs: Vec<GrantRef>,
    writable: bool,
    pages: Vec<(Arc<Mem>, usize)>,
    notify: Notify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortState {
    Unbound,
    Connected(DomId, Port),
    Closed,
}

struct PortEntry {
    conn: u64,
    remote: DomId,
    /// Kicks for this port arrive here.
    inbound: Arc<OwnedFd>,
    /// Writing here kicks the other end.
    outbound: Arc<OwnedFd>,
    state: PortState,
}

struct CtlConn {
    domid: DomId,
    sock: SeqPacket,
    /// Number of revocations of this connection so far; every reply
    /// carries it so the client can tell resources created before a
    /// revocation it has already seen.
    generation: u32,
}

struct DomainSlot {
    info: SimDomain,
    listeners: Vec<Listener>,
    init_pid: Option<u32>,
}

struct HostState {
    domains: BTreeMap<DomId, DomainSlot>,
    next_domid: DomId,
    grants: HashMap<(DomId, GrantRef), GrantEntry>,
    allocations: HashMap<u64, Allocation>,
    mappings: HashMap<u64, MapRecord>,
    ports: HashMap<(DomId, Port), PortEntry>,
    conns: HashMap<u64, CtlConn>,
    next_id: u64,
    shut_down: bool,
}

struct HostInner {
    dir: PathBuf,
    cfg: SimConfig,
    xs: Arc<Xenstored>,
    st: Mutex<HostState>,
    tmp: Mutex<Option<tempfile::TempDir>>,
    waiters: Mutex<Vec<JoinHandle<()>>>,
    me: Weak<HostInner>,
}

/// A simulated Xen host. Runs in the calling process (threads); domains'
/// processes reach it through unix sockets under [`SimHost::dir`].
/// Dropping it destroys every domain (killing processes started with
/// [`SimHost::spawn_domain`]) and removes a temporary directory.
///
/// ```
/// use xensock_sim::{DomainConfig, SimHost, SimXen};
/// use xensock_xenif::{Access, XenBackend, SharedRegion, GrantedRegion};
/// let host = SimHost::start()?;
/// let a = host.create_domain(DomainConfig::new("a").label("blue"))?;
/// let b = host.create_domain(DomainConfig::new("b").label("blue"))?;
/// let xa = SimXen::connect(host.dir(), a.domid)?;
/// let xb = SimXen::connect(host.dir(), b.domid)?;
/// let g = xa.grant(b.domid, 1, Access::ReadWrite)?;
/// let m = xb.map(a.domid, g.refs(), Access::ReadOnly)?;
/// // SAFETY: both regions are one live page.
/// unsafe { g.as_ptr().write_volatile(42) };
/// assert_eq!(unsafe { m.as_ptr().read_volatile() }, 42);
/// drop((m, g));
/// assert!(host.stats().grants_and_channels_released());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SimHost {
    inner: Arc<HostInner>,
}

impl SimHost {
    /// Starts a host with default settings in a temporary directory.
    pub fn start() -> Result<SimHost, SimError> {
        SimHost::with_config(SimConfig::default())
    }

    /// Starts a host.
    pub fn with_config(cfg: SimConfig) -> Result<SimHost, SimError> {
        let (dir, tmp) = match &cfg.dir {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(io_err(format!("creating {}", d.display())))?;
                (d.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("xensock-sim-")
                    .tempdir()
                    .map_err(io_err("creating a temporary directory"))?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let xs = Xenstored::new(cfg.quotas.clone());
        xs.init_dom0().map_err(SimError::Xenstore)?;
        let inner = Arc::new_cyclic(|me| HostInner {
            dir: dir.clone(),
            cfg,
            xs,
            st: Mutex::new(HostState {
                domains: BTreeMap::new(),
                next_domid: 1,
                grants: HashMap::new(),
                allocations: HashMap::new(),
                mappings: HashMap::new(),
                ports: HashMap::new(),
                conns: HashMap::new(),
                next_id: 1,
                shut_down: false,
            }),
            tmp: Mutex::new(tmp),
            waiters: Mutex::new(Vec::new()),
            me: me.clone(),
        });
        let dom0 = SimDomain {
            domid: 0,
            name: "Domain-0".into(),
            uuid: "00000000-0000-0000-0000-000000000000".into(),
            label: None,
            sim_dir: dir,
        };
        let listeners = inner.listeners(&dom0)?;
        inner.lock().domains.insert(
            0,
            DomainSlot {
                info: dom0,
                listeners,
                init_pid: None,
            },
        );
        Ok(SimHost { inner })
    }

    /// The sim directory (`XENSOCK_SIM`).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Dom0 (privileged; where the agent runs).
    pub fn dom0(&self) -> SimDomain {
        self.domain(0).unwrap_or_else(|| SimDomain {
            domid: 0,
            name: "Domain-0".into(),
            uuid: "00000000-0000-0000-0000-000000000000".into(),
            label: None,
            sim_dir: self.inner.dir.clone(),
        })
    }

    /// A live domain by domid.
    pub fn domain(&self, domid: DomId) -> Option<SimDomain> {
        self.inner
            .lock()
            .domains
            .get(&domid)
            .map(|d| d.info.clone())
    }

    /// All live domains, dom0 first.
    pub fn domains(&self) -> Vec<SimDomain> {
        self.inner
            .lock()
            .domains
            .values()
            .map(|d| d.info.clone())
            .collect()
    }

    /// Creates and introduces a domain: its xenstore nodes, sockets, and
    /// `@introduceDomain`.
    pub fn create_domain(&self, cfg: DomainConfig) -> Result<SimDomain, SimError> {
        self.inner.create_domain(cfg)
    }

    /// Creates a domain whose lifetime is that of a process: `cmd` runs
    /// with the domain's environment in its own process group; when it
    /// exits the domain is destroyed, and destroying the domain kills the
    /// group.
    pub fn spawn_domain(
        &self,
        cfg: DomainConfig,
        cmd: Command,
    ) -> Result<(SimDomain, u32), SimError> {
        let dom = self.inner.create_domain(cfg)?;
        match self.inner.spawn_init(&dom, cmd) {
            Ok(pid) => Ok((dom, pid)),
            Err(e) => {
                let _ = self.inner.destroy_domain(dom.domid);
                Err(e)
            }
        }
    }

    /// Destroys a domain: its grants end (deferred while peers map them),
    /// its mappings and ports go, its xenstore nodes are removed,
    /// `@releaseDomain` fires, its processes' connections are closed.
    /// Unmap notifications do not fire: a dying domain's kernel runs no
    /// unmap code.
    pub fn destroy_domain(&self, domid: DomId) -> Result<(), SimError> {
        self.inner.destroy_domain(domid)
    }

    /// Migrates a domain. Same host: it gets a new domid (returned), its
    /// grants, mappings and channels are torn down, its processes keep
    /// their connections under the new identity; `@introduceDomain` (new)
    /// fires before `@releaseDomain` (old), as with `xl migrate` to
    /// localhost. Another host: the domain leaves (like destroy) after the
    /// toolstack marks it moved.
    pub fn migrate_domain(&self, domid: DomId, to: MigrateTo) -> Result<Option<DomId>, SimError> {
        self.inner.migrate_domain(domid, to)
    }

    /// Marks a domain as moved to host `dest` while it stays on this one,
    /// as dom0 does for a drill of the migration switch
    /// (`/tool/xensock/away/<uuid>` = `dest`): the xensock agent then
    /// separates it from its peers as if it had left. Its grants, channels
    /// and processes are untouched.
    pub fn mark_away(&self, domid: DomId, dest: &str) -> Result<(), SimError> {
        let uuid = self
            .domain(domid)
            .ok_or(SimError::NoSuchDomain(domid))?
            .uuid;
        self.inner
            .xs
            .tool_write(
                &format!("{}/{uuid}", xensock_proto::store::TOOL_AWAY),
                dest.as_bytes(),
            )
            .map_err(SimError::Xenstore)
    }

    /// Removes [`SimHost::mark_away`]'s marking: the agent makes the
    /// domain co-resident with its peers again.
    pub fn mark_back(&self, domid: DomId) -> Result<(), SimError> {
        let uuid = self
            .domain(domid)
            .ok_or(SimError::NoSuchDomain(domid))?
            .uuid;
        match self
            .inner
            .xs
            .tool_rm(&format!("{}/{uuid}", xensock_proto::store::TOOL_AWAY))
        {
            Err(XsErrno::NoEnt) | Ok(()) => Ok(()),
            Err(e) => Err(SimError::Xenstore(e)),
        }
    }

    /// Resource counters.
    pub fn stats(&self) -> SimStats {
        let st = self.inner.lock();
        SimStats {
            domains: st.domains.len(),
            grants: st.grants.values().filter(|g| !g.released).count(),
            deferred_grants: st.grants.values().filter(|g| g.released).count(),
            mappings: st.mappings.len(),
            ports: st.ports.len(),
            control_connections: st.conns.len(),
            xenstored: self.inner.xs.stats(),
        }
    }

    /// A privileged xenstore write by the toolstack.
    pub fn xenstore_write(&self, path: &str, value: &[u8]) -> Result<(), SimError> {
        self.inner
            .xs
            .tool_write(path, value)
            .map_err(SimError::Xenstore)
    }

    /// A privileged xenstore read by the toolstack.
    pub fn xenstore_read(&self, path: &str) -> Result<Vec<u8>, SimError> {
        self.inner.xs.tool_read(path).map_err(SimError::Xenstore)
    }

    /// Destroys every domain, closes every connection and removes a
    /// temporary directory. Also done on drop.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Drop for SimHost {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

fn random_uuid() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    if b == [0u8; 16] {
        // No /dev/urandom: derive something unique from time and pid.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b[..16].copy_from_slice(&(t ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn valid_uuid(u: &str) -> bool {
    let parts: Vec<&str> = u.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl HostInner {
    fn lock(&self) -> MutexGuard<'_, HostState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn listeners(&self, dom: &SimDomain) -> Result<Vec<Listener>, SimError> {
        let dir = dom.dir();
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let domid = dom.domid;
        let xs = self.xs.clone();
        let xsl = Listener::stream(
            &dom.xenstored_path(),
            format!("xs-accept-{domid}"),
            move |s| {
                if let Err(e) = xs.serve(s, u32::from(domid)) {
                    tracing::warn!("xenstored: cannot serve a connection: {e}");
                }
            },
        )
        .map_err(io_err(format!(
            "binding {}",
            dom.xenstored_path().display()
        )))?;
        let me = self.me.clone();
        let ctl = Listener::seqpacket(
            &dom.control_path(),
            format!("ctl-accept-{domid}"),
            move |s| {
                let me = me.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("ctl-{domid}"))
                    .spawn(move || serve_control(me, s, domid));
                if let Err(e) = spawned {
                    tracing::warn!("sim host: cannot serve a control connection: {e}");
                }
            },
        )
        .map_err(io_err(format!("binding {}", dom.control_path().display())))?;
        Ok(vec![xsl, ctl])
    }

    fn create_domain(&self, cfg: DomainConfig) -> Result<SimDomain, SimError> {
        let uuid = match cfg.uuid {
            Some(u) if valid_uuid(&u) => u.to_ascii_lowercase(),
            Some(u) => return Err(SimError::Invalid(format!("not a UUID: {u:?}"))),
            None => random_uuid(),
        };
        if cfg.name.is_empty() || cfg.name.contains('\0') {
            return Err(SimError::Invalid(
                "domain name must be non-empty text".into(),
            ));
        }
        let mut st = self.lock();
        if st.shut_down {
            return Err(SimError::ShutDown);
        }
        if st.domains.values().any(|d| d.info.uuid == uuid) {
            return Err(SimError::Invalid(format!(
                "a domain with UUID {uuid} already runs here"
            )));
        }
        if st.next_domid > MAX_DOMID {
            return Err(SimError::Invalid("domid space exhausted".into()));
        }
        let domid = st.next_domid;
        st.next_domid += 1;
        let info = SimDomain {
            domid,
            name: cfg.name,
            uuid,
            label: cfg.label,
            sim_dir: self.dir.clone(),
        };
        let listeners = self.listeners(&info)?;
        st.domains.insert(
            domid,
            DomainSlot {
                info: info.clone(),
                listeners,
                init_pid: None,
            },
        );
        drop(st);
        let _ = self.xs.tool_rm(&format!(
            "{}/{}",
            xensock_proto::store::TOOL_MOVED,
            info.uuid
        ));
        self.xs
            .introduce_domain(
                u32::from(domid),
                &info.name,
                &info.uuid,
                info.label.as_deref(),
            )
            .map_err(SimError::Xenstore)?;
        Ok(info)
    }

    fn spawn_init(&self, dom: &SimDomain, mut cmd: Command) -> Result<u32, SimError> {
        cmd.envs(dom.env());
        cmd.process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(io_err("spawning the domain's process"))?;
        let pid = child.id();
        if let Some(slot) = self.lock().domains.get_mut(&dom.domid) {
            slot.init_pid = Some(pid);
        }
        let me = self.me.clone();
        let domid = dom.domid;
        let waiter = std::thread::Builder::new()
            .name(format!("init-{domid}"))
            .spawn(move || {
                sys::wait_exited_no_reap(pid);
                let host = me.upgrade();
                // The domain may have migrated since: find it by its process.
                let target = host.as_ref().and_then(|h| {
                    let mut st = h.lock();
                    st.domains
                        .iter_mut()
                        .find(|(_, s)| s.init_pid == Some(pid))
                        .map(|(d, s)| {
                            s.init_pid = None;
                            *d
                        })
                });
                let _ = child.wait();
                if let (Some(h), Some(d)) = (host, target) {
                    let _ = h.destroy_domain(d);
                }
            })
            .map_err(io_err("spawning a waiter thread"))?;
        self.waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(waiter);
        Ok(pid)
    }

    /// Tears down everything the domain's processes hold, without unmap
    /// notifications, and tells its control connections. `new` is the new
    /// domid for a same-host migration (connections stay), `None` when the
    /// domain is gone from this host (connections are closed).
    fn revoke(&self, st: &mut HostState, domid: DomId, new: Option<DomId>) {
        let allocs: Vec<u64> = st
            .allocations
            .iter()
            .filter(|(_, a)| a.domid == domid)
            .map(|(id, _)| *id)
            .collect();
        for id in allocs {
            release_allocation(st, id, false);
        }
        let maps: Vec<u64> = st
            .mappings
            .iter()
            .filter(|(_, m)| m.domid == domid)
            .map(|(id, _)| *id)
            .collect();
        for id in maps {
            release_mapping(st, id, false);
        }
        let ports: Vec<(DomId, Port)> = st.ports.keys().filter(|k| k.0 == domid).copied().collect();
        for k in ports {
            close_port(st, k);
        }
        let ids: Vec<u64> = st
            .conns
            .iter()
            .filter(|(_, c)| c.domid == domid)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(c) = st.conns.get_mut(&id) {
                c.generation = c.generation.wrapping_add(1);
                let push = Enc::new()
                    .u32(0)
                    .u8(ctl::PUSH_REVOKED)
                    .u32(new.map(u32::from).unwrap_or(u32::MAX))
                    .u32(c.generation)
                    .0;
                let _ = c.sock.send(&push, &[]);
                match new {
                    Some(n) => c.domid = n,
                    None => {
                        c.sock.shutdown();
                        st.conns.remove(&id);
                    }
                }
            }
        }
    }

    fn destroy_domain(&self, domid: DomId) -> Result<(), SimError> {
        if domid == 0 {
            return Err(SimError::Invalid("dom0 cannot be destroyed".into()));
        }
        let mut st = self.lock();
        let slot = st
            .domains
            .remove(&domid)
            .ok_or(SimError::NoSuchDomain(domid))?;
        self.revoke(&mut st, domid, None);
        drop(st);
        if let Some(pid) = slot.init_pid {
            // the group leader is our unreaped child (the waiter clears
            // init_pid before reaping)
            sys::kill_process_group(pid);
        }
        drop(slot.listeners);
        let _ = std::fs::remove_dir_all(slot.info.dir());
        self.xs
            .release_domain(u32::from(domid), Some(&slot.info.uuid));
        Ok(())
    }

    fn migrate_domain(&self, domid: DomId, to: MigrateTo) -> Result<Option<DomId>, SimError> {
        if domid == 0 {
            return Err(SimError::Invalid("dom0 cannot migrate".into()));
        }
        match to {
            MigrateTo::OtherHost(dest) => {
                let uuid = self
                    .lock()
                    .domains
                    .get(&domid)
                    .map(|d| d.info.uuid.clone())
                    .ok_or(SimError::NoSuchDomain(domid))?;
                self.xs
                    .tool_write(
                        &format!("{}/{uuid}", xensock_proto::store::TOOL_MOVED),
                        dest.as_bytes(),
                    )
                    .map_err(SimError::Xenstore)?;
                let mut st = self.lock();
                let slot = st
                    .domains
                    .remove(&domid)
                    .ok_or(SimError::NoSuchDomain(domid))?;
                self.revoke(&mut st, domid, None);
                drop(st);
                drop(slot.listeners);
                let _ = std::fs::remove_dir_all(slot.info.dir());
                self.xs
                    .release_domain(u32::from(domid), Some(&slot.info.uuid));
                Ok(None)
            }
            MigrateTo::SameHost => {
                let mut st = self.lock();
                if st.next_domid > MAX_DOMID {
                    return Err(SimError::Invalid("domid space exhausted".into()));
                }
                let old = st
                    .domains
                    .remove(&domid)
                    .ok_or(SimError::NoSuchDomain(domid))?;
                let new = st.next_domid;
                st.next_domid += 1;
                self.revoke(&mut st, domid, Some(new));
                let info = SimDomain {
                    domid: new,
                    ..old.info.clone()
                };
                let listeners = match self.listeners(&info) {
                    Ok(l) => l,
                    Err(e) => {
                        drop(st);
                        drop(old.listeners);
                        self.xs
                            .release_domain(u32::from(domid), Some(&old.info.uuid));
                        return Err(e);
                    }
                };
                st.domains.insert(
                    new,
                    DomainSlot {
                        info: info.clone(),
                        listeners,
                        init_pid: old.init_pid,
                    },
                );
                drop(st);
                // Restore side first, as the toolstack does, then the
                // source goes away.
                self.xs
                    .introduce_domain(
                        u32::from(new),
                        &info.name,
                        &info.uuid,
                        info.label.as_deref(),
                    )
                    .map_err(SimError::Xenstore)?;
                self.xs.reassign_domain(u32::from(domid), u32::from(new));
                drop(old.listeners);
                let _ = std::fs::remove_dir_all(old.info.dir());
                self.xs.release_domain(u32::from(domid), None);
                Ok(Some(new))
            }
        }
    }

    fn shutdown(&self) {
        let domids: Vec<DomId> = {
            let mut st = self.lock();
            if st.shut_down {
                return;
            }
            st.shut_down = true;
            st.domains.keys().copied().filter(|d| *d != 0).collect()
        };
        for d in domids {
            let _ = self.destroy_domain(d);
        }
        let dom0 = {
            let mut st = self.lock();
            self.revoke(&mut st, 0, None);
            st.domains.remove(&0)
        };
        drop(dom0);
        self.xs.close_all();
        let waiters: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|p| p.into_inner()));
        for w in waiters {
            let _ = w.join();
        }
        if let Some(t) = self.tmp.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.close();
        }
    }

    // ---- control protocol ------------------------------------------------

    fn handle(&self, conn: u64, msg: &[u8]) -> (Vec<u8>, Vec<Arc<OwnedFd>>) {
        let mut d = Dec(msg);
        let (Ok(req_id), Ok(op)) = (d.u32(), d.u8()) else {
            return (
                reply_err(0, &XenError::Invalid("short message".into())),
                Vec::new(),
            );
        };
        let mut st = self.lock();
        let (result, generation) = match st.conns.get(&conn) {
            None => (Err(XenError::Revoked), 0),
            Some(c) => {
                let (domid, generation) = (c.domid, c.generation);
                (self.op(&mut st, conn, domid, op, &mut d), generation)
            }
        };
        match result {
            Ok((enc, fds)) => {
                let mut out = Enc::new().u32(req_id).u8(0).u32(generation).0;
                out.extend_from_slice(&enc.0);
                (out, fds)
            }
            Err(e) => (reply_err(req_id, &e), Vec::new()),
        }
    }

    fn op(
        &self,
        st: &mut HostState,
        conn: u64,
        domid: DomId,
        op: u8,
        d: &mut Dec<'_>,
    ) -> Result<(Enc, Vec<Arc<OwnedFd>>), XenError> {
        let short = |_| XenError::Invalid("malformed request".into());
        match op {
            ctl::OP_WHOAMI => Ok((Enc::new().u16(domid), Vec::new())),
            ctl::OP_GRANT => {
                let peer = d.u16().map_err(short)?;
                let pages = d.u32().map_err(short)? as usize;
                let flags = d.u8().map_err(short)?;
                if pages == 0 || pages > MAX_PAGES_PER_CALL {
                    return Err(XenError::Invalid(format!(
                        "page count {pages} not in 1..={MAX_PAGES_PER_CALL}"
                    )));
                }
                let used = st.grants.keys().filter(|(g, _)| *g == domid).count();
                if used + pages > self.cfg.grants_per_domain {
                    return Err(XenError::Exhausted(format!(
                        "grant table of domain {domid} is full"
                    )));
                }
                let rw = fdpass::memfd(pages * PAGE_SIZE).map_err(|source| XenError::Os {
                    op: "memfd_create",
                    source,
                })?;
                let ro = fdpass::reopen_read_only(&rw).map_err(|source| XenError::Os {
                    op: "reopen memfd read-only",
                    source,
                })?;
                let mem = Arc::new(Mem { rw, ro });
                let mut refs = Vec::with_capacity(pages);
                let mut r = FIRST_GRANT_REF;
                while refs.len() < pages {
                    if !st.grants.contains_key(&(domid, r)) {
                        refs.push(r);
                    }
                    r += 1;
                }
                let id = next_id(st);
                for (page, &r) in refs.iter().enumerate() {
                    st.grants.insert(
                        (domid, r),
                        GrantEntry {
                            alloc: id,
                            page,
                            grantee: peer,
                            peer_writable: flags & 1 != 0,
                            mapped: 0,
                            released: false,
                        },
                    );
                }
                let mut enc = Enc::new().u64(id).u32(refs.len() as u32);
                for r in &refs {
                    enc = enc.u32(*r);
                }
                let fd = dup_arc(&mem.rw)?;
                st.allocations.insert(
                    id,
                    Allocation {
                        conn,
                        domid,
                        refs,
                        mem,
                        notify: Notify::default(),
                    },
                );
                Ok((enc, vec![fd]))
            }
            ctl::OP_UNGRANT => {
                let id = d.u64().map_err(short)?;
                owned_by(st.allocations.get(&id).map(|a| a.conn), conn, "grant")?;
                release_allocation(st, id, true);
                Ok((Enc::new(), Vec::new()))
            }
            ctl::OP_GRANT_NOTIFY | ctl::OP_MAP_NOTIFY => {
                let id = d.u64().map_err(short)?;
                let flags = d.u8().map_err(short)?;
                let offset = d.u64().map_err(short)? as usize;
                let port = d.u32().map_err(short)?;
                let notify = Notify {
                    clear: (flags & ctl::NOTIFY_CLEAR != 0).then_some(offset),
                    event: (flags & ctl::NOTIFY_EVENT != 0).then_some(port),
                };
                let (len, writable, slot) = if op == ctl::OP_GRANT_NOTIFY {
                    let a = st.allocations.get_mut(&id).filter(|a| a.conn == conn);
                    let a = a.ok_or_else(|| XenError::NotFound(format!("grant {id}")))?;
                    (a.refs.len() * PAGE_SIZE, true, &mut a.notify)
                } else {
                    let m = st.mappings.get_mut(&id).filter(|m| m.conn == conn);
                    let m = m.ok_or_else(|| XenError::NotFound(format!("mapping {id}")))?;
                    (m.refs.len() * PAGE_SIZE, m.writable, &mut m.notify)
                };
                if let Some(off) = notify.clear {
                    if off >= len {
                        return Err(XenError::Invalid(format!(
                            "clear_byte offset {off} outside region of {len} bytes"
                        )));
                    }
                    if !writable {
                        return Err(XenError::Invalid(
                            "clear_byte needs a writable mapping".into(),
                        ));
                    }
                }
                *slot = notify;
                Ok((Enc::new(), Vec::new()))
            }
            ctl::OP_MAP => {
                let granter = d.u16().map_err(short)?;
                let flags = d.u8().map_err(short)?;
                let refs = d.u32_list(MAX_PAGES_PER_CALL).map_err(short)?;
                let writable = flags & 1 != 0;
                if refs.is_empty() {
                    return Err(XenError::Invalid("no grant refs".into()));
                }
                let mut pages = Vec::with_capacity(refs.len());
                for &r in &refs {
                    let e = st.grants.get(&(granter, r)).ok_or_else(|| {
                        XenError::NotFound(format!("domain {granter} has no grant ref {r}"))
                    })?;
                    if e.released {
                        return Err(XenError::NotFound(format!(
                            "grant ref {r} of domain {granter} was ended"
                        )));
                    }
                    if e.grantee != domid {
                        return Err(XenError::PermissionDenied(format!(
                            "grant ref {r} of domain {granter} is not granted to domain {domid}"
                        )));
                    }
                    if writable && !e.peer_writable {
                        return Err(XenError::PermissionDenied(format!(
                            "grant ref {r} of domain {granter} is read-only"
                        )));
                    }
                    let mem = st
                        .allocations
                        .get(&e.alloc)
                        .map(|a| a.mem.clone())
                        .ok_or_else(|| XenError::NotFound(format!("grant ref {r}")))?;
                    pages.push((mem, e.page));
                }
                // One descriptor per distinct allocation.
                let mut fds: Vec<Arc<OwnedFd>> = Vec::new();
                let mut seen: Vec<*const Mem> = Vec::new();
                let mut enc_pages = Vec::new();
                for (mem, page) in &pages {
                    let key = Arc::as_ptr(mem);
                    let idx = match seen.iter().position(|p| *p == key) {
                        Some(i) => i,
                        None => {
                            if seen.len() == fdpass::MAX_FDS {
                                return Err(XenError::Invalid(
                                    "refs span too many separate grants".into(),
                                ));
                            }
                            seen.push(key);
                            fds.push(dup_arc(if writable { &mem.rw } else { &mem.ro })?);
                            seen.len() - 1
                        }
                    };
                    enc_pages.push((idx as u32, *page as u32));
                }
                for &r in &refs {
                    if let Some(e) = st.grants.get_mut(&(granter, r)) {
                        e.mapped += 1;
                    }
                }
                let id = next_id(st);
                let mut enc = Enc::new().u64(id).u32(enc_pages.len() as u32);
                for (i, p) in enc_pages {
                    enc = enc.u32(i).u32(p);
                }
                st.mappings.insert(
                    id,
                    MapRecord {
                        conn,
                        domid,
                        granter,
                        refs,
                        writable,
                        pages,
                        notify: Notify::default(),
                    },
                );
                Ok((enc, fds))
            }
            ctl::OP_UNMAP => {
                let id = d.u64().map_err(short)?;
                owned_by(st.mappings.get(&id).map(|m| m.conn), conn, "mapping")?;
                release_mapping(st, id, true);
                Ok((Enc::new(), Vec::new()))
            }
            ctl::OP_EVTCHN_UNBOUND => {
                let remote = d.u16().map_err(short)?;
                let port = self.free_port(st, domid)?;
                let inbound = Arc::new(new_eventfd()?);
                let outbound = Arc::new(new_eventfd()?);
                st.ports.insert(
                    (domid, port),
                    PortEntry {
                        conn,
                        remote,
                        inbound: inbound.clone(),
                        outbound: outbound.clone(),
                        state: PortState::Unbound,
                    },
                );
                Ok((Enc::new().u32(port), vec![inbound, outbound]))
            }
            ctl::OP_EVTCHN_BIND => {
                let remote = d.u16().map_err(short)?;
                let rport = d.u32().map_err(short)?;
                let (inbound, outbound) = {
                    let r = st.ports.get(&(remote, rport)).ok_or_else(|| {
                        XenError::NotFound(format!("domain {remote} has no port {rport}"))
                    })?;
                    // Xen's evtchn_close leaves the other end of an
                    // interdomain channel unbound for the closer's domain:
                    // it may bind that port again.
                    if !matches!(r.state, PortState::Unbound | PortState::Closed) {
                        return Err(XenError::Invalid(format!(
                            "port {rport} of domain {remote} is not unbound"
                        )));
                    }
                    if r.remote != domid {
                        return Err(XenError::PermissionDenied(format!(
                            "port {rport} of domain {remote} is offered to domain {}, not {domid}",
                            r.remote
                        )));
                    }
                    (r.outbound.clone(), r.inbound.clone())
                };
                let port = self.free_port(st, domid)?;
                st.ports.insert(
                    (domid, port),
                    PortEntry {
                        conn,
                        remote,
                        inbound: inbound.clone(),
                        outbound: outbound.clone(),
                        state: PortState::Connected(remote, rport),
                    },
                );
                if let Some(r) = st.ports.get_mut(&(remote, rport)) {
                    r.state = PortState::Connected(domid, port);
                }
                Ok((Enc::new().u32(port), vec![inbound, outbound]))
            }
            ctl::OP_EVTCHN_CLOSE => {
                let port = d.u32().map_err(short)?;
                owned_by(st.ports.get(&(domid, port)).map(|p| p.conn), conn, "port")?;
                close_port(st, (domid, port));
                Ok((Enc::new(), Vec::new()))
            }
            ctl::OP_EVTCHN_STATUS => {
                let port = d.u32().map_err(short)?;
                let p = st
                    .ports
                    .get(&(domid, port))
                    .ok_or_else(|| XenError::NotFound(format!("port {port}")))?;
                let s = match p.state {
                    PortState::Unbound => ctl::PORT_UNBOUND,
                    PortState::Connected(..) => ctl::PORT_CONNECTED,
                    PortState::Closed => ctl::PORT_CLOSED,
                };
                Ok((Enc::new().u8(s), Vec::new()))
            }
            _ => Err(XenError::Invalid(format!("unknown operation {op}"))),
        }
    }

    fn free_port(&self, st: &HostState, domid: DomId) -> Result<Port, XenError> {
        let used = st.ports.keys().filter(|k| k.0 == domid).count();
        if used >= self.cfg.ports_per_domain {
            return Err(XenError::Exhausted(format!(
                "domain {domid} has no free event-channel port"
            )));
        }
        let mut p = 1;
        while st.ports.contains_key(&(domid, p)) {
            p += 1;
        }
        Ok(p)
    }

    fn conn_closed(&self, conn: u64) {
        let mut st = self.lock();
        if st.conns.remove(&conn).is_none() {
            return;
        }
        // A process died or closed its handle: its kernel (here, the host)
        // runs the unmap notifications, mappings first, then its grants,
        // then closes its ports.
        let maps: Vec<u64> = st
            .mappings
            .iter()
            .filter(|(_, m)| m.conn == conn)
            .map(|(id, _)| *id)
            .collect();
        for id in maps {
            release_mapping(&mut st, id, true);
        }
        let allocs: Vec<u64> = st
            .allocations
            .iter()
            .filter(|(_, a)| a.conn == conn)
            .map(|(id, _)| *id)
            .collect();
        for id in allocs {
            release_allocation(&mut st, id, true);
        }
        let ports: Vec<(DomId, Port)> = st
            .ports
            .iter()
            .filter(|(_, p)| p.conn == conn)
            .map(|(k, _)| *k)
            .collect();
        for k in ports {
            close_port(&mut st, k);
        }
    }
}

fn owned_by(owner: Option<u64>, conn: u64, what: &str) -> Result<(), XenError> {
    match owner {
        Some(c) if c == conn => Ok(()),
        _ => Err(XenError::NotFound(format!("no such {what} on this handle"))),
    }
}

fn next_id(st: &mut HostState) -> u64 {
    let id = st.next_id;
    st.next_id += 1;
    id
}

fn dup_arc(fd: &OwnedFd) -> Result<Arc<OwnedFd>, XenError> {
    fd.try_clone()
        .map(Arc::new)
        .map_err(|source| XenError::Os { op: "dup", source })
}

fn new_eventfd() -> Result<OwnedFd, XenError> {
    fdpass::eventfd().map_err(|source| XenError::Os {
        op: "eventfd",
        source,
    })
}

fn reply_err(req_id: u32, e: &XenError) -> Vec<u8> {
    Enc::new()
        .u32(req_id)
        .u8(ctl::err_code(e) as u8)
        .bytes(e.to_string().as_bytes())
        .0
}

fn run_notify(st: &HostState, domid: DomId, n: Notify, pages: &[(Arc<Mem>, usize)]) {
    if let Some(off) = n.clear {
        if let Some((mem, page)) = pages.get(off / PAGE_SIZE) {
            if let Err(e) = fdpass::clear_byte(mem.rw.as_fd(), page * PAGE_SIZE + off % PAGE_SIZE) {
                tracing::warn!("unmap notify: clearing byte failed: {e}");
            }
        }
    }
    if let Some(port) = n.event {
        if let Some(p) = st.ports.get(&(domid, port)) {
            if matches!(p.state, PortState::Connected(..)) {
                let _ = fdpass::kick(p.outbound.as_fd());
            }
        }
    }
}

fn release_allocation(st: &mut HostState, id: u64, notify: bool) {
    let Some(a) = st.allocations.remove(&id) else {
        return;
    };
    if notify {
        let pages: Vec<(Arc<Mem>, usize)> = (0..a.refs.len()).map(|i| (a.mem.clone(), i)).collect();
        run_notify(st, a.domid, a.notify, &pages);
    }
    for r in a.refs {
        let key = (a.domid, r);
        let remove = match st.grants.get_mut(&key) {
            Some(e) if e.mapped == 0 => true,
            Some(e) => {
                e.released = true;
                false
            }
            None => false,
        };
        if remove {
            st.grants.remove(&key);
        }
    }
}

fn release_mapping(st: &mut HostState, id: u64, notify: bool) {
    let Some(m) = st.mappings.remove(&id) else {
        return;
    };
    if notify {
        run_notify(st, m.domid, m.notify, &m.pages);
    }
    for r in m.refs {
        let key = (m.granter, r);
        let remove = match st.grants.get_mut(&key) {
            Some(e) => {
                e.mapped = e.mapped.saturating_sub(1);
                e.released && e.mapped == 0
            }
            None => false,
        };
        if remove {
            st.grants.remove(&key);
        }
    }
}

fn close_port(st: &mut HostState, key: (DomId, Port)) {
    let Some(p) = st.ports.remove(&key) else {
        return;
    };
    if let PortState::Connected(rd, rp) = p.state {
        if let Some(r) = st.ports.get_mut(&(rd, rp)) {
            r.state = PortState::Closed;
        }
    }
}

fn serve_control(me: Weak<HostInner>, sock: SeqPacket, domid: DomId) {
    let Some(host) = me.upgrade() else {
        return;
    };
    let id = {
        let mut st = host.lock();
        if st.shut_down || !st.domains.contains_key(&domid) {
            return;
        }
        let Ok(clone) = sock.try_clone() else {
            return;
        };
        let id = next_id(&mut st);
        st.conns.insert(
            id,
            CtlConn {
                domid,
                sock: clone,
                generation: 0,
            },
        );
        id
    };
    drop(host);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sock.recv(&mut buf) {
            Ok((0, _)) | Err(_) => break,
            Ok((n, _fds)) => n,
        };
        let Some(host) = me.upgrade() else {
            break;
        };
        let (reply, fds) = host.handle(id, &buf[..n]);
        drop(host);
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        if sock.send(&reply, &borrowed).is_err() {
            break;
        }
    }
    if let Some(host) = me.upgrade() {
        host.conn_closed(id);
    }
}
