// SPDX-License-Identifier: MIT OR Apache-2.0
//! Starting a transport: on the simulated host, on a backend, from the
//! environment, the process-wide one; its claim and its leg listener.

use super::*;

pub(super) static GLOBAL: OnceLock<Transport> = OnceLock::new();

/// The lock file of a transport's claim ([`crate::claim`]): the guest's
/// over `/dev/xen`; next to the domain's XenStore socket otherwise (one
/// per simulated domain).
pub(super) fn claim_path(kind: BackendKind, xs: &XsClient) -> PathBuf {
    match (kind, xs.connection_path().parent()) {
        (BackendKind::DevXen, _) | (_, None) => crate::claim::guest_claim_path(),
        (_, Some(dir)) => dir.join("xensock-transport.lock"),
    }
}

pub(super) fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // getrandom(2) rather than opening /dev/urandom: this runs on every
    // connect (the cookie), where an open and a close showed up in profiles.
    if !sys::random_fill(&mut b) {
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

pub(super) fn random_u64() -> u64 {
    u64::from(random_u32()) << 32 | u64::from(random_u32())
}

/// No backend in this process's domain: the error says why, with the
/// reasons [`crate::backend()`] found for each candidate.
pub(super) fn no_backend(report: &crate::backend::BackendReport) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("no xensock backend here: {}", report.why()),
    )
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
        let epoll = sys::epoll_create()?;
        let sink = Arc::new(WatchSink {
            events: Mutex::new(Vec::new()),
            wake: EventFd::new()?,
        });
        epoll_add(&epoll, sink.wake.as_raw_fd(), 0)?;
        let kick_timer = sys::timerfd_create()?;
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
                failed_attach: HashMap::new(),
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
        inner.add_watch(store::DOMID).map_err(Error::from)?;
        {
            let st = inner.state();
            inner.refresh_peers(&st).map_err(Error::from)?;
        }
        // Not dropped when the process exits: its connections end then as
        // dropping it would end them.
        exit::end_at_process_exit(&inner);
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
    /// When neither exists: an error of kind [`io::ErrorKind::Unsupported`]
    /// whose message gives `backend()`'s reasons. Over `/dev/xen` it refuses to start,
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
                    .read_string(store::DOMID)
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
                Err(no_backend(&report))
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
            let inner = Arc::downgrade(&t.owner.inner);
            let answer = move |cmd: &str| {
                let t = Transport::global_of(&inner.upgrade()?)?;
                Some(t.control_answer(cmd))
            };
            match crate::control::ControlServer::start(answer) {
                Ok(c) => {
                    // The guest's suspend hook finds us through the claim,
                    // whichever user it runs as.
                    t.owner.claim.record(Some(c.path()));
                    *lock(&t.owner.control) = Some(c);
                }
                Err(e) => tracing::warn!("no control socket: {e}"),
            }
        }
        Ok(t)
    }

    /// The answer to a command on the control socket (`xensock status`,
    /// `suspend`, `resume`).
    pub(super) fn control_answer(&self, cmd: &str) -> String {
        match cmd {
            "status" => self.status().render(),
            "status-fields" => self.status().render_fields(),
            "suspend" => {
                let moved = self.suspend();
                format!(
                    "suspended: {moved} connections left their rings; {} still hold shared pages\n",
                    self.shared_pages_held()
                )
            }
            "resume" => format!(
                "resumed: domid {}{}\n",
                self.domid(),
                if self.resume() { " (new)" } else { "" }
            ),
            other => format!("unknown command {other:?}\n"),
        }
    }

    /// The process-wide transport, if `inner` is its (only it serves a
    /// control socket).
    pub(crate) fn global_of(inner: &Arc<Inner>) -> Option<Transport> {
        GLOBAL
            .get()
            .filter(|t| Arc::ptr_eq(&t.owner.inner, inner))
            .cloned()
    }
}

/// The transport's leg listener and the endpoint peers reach it at. In the
/// sim every domain is a process of this machine: loopback. On Xen: all
/// addresses, advertised as the first address discovery would advertise.
/// `None` (and `TcpEndpoint::NONE`) when it cannot be set up: connections
/// then have no TCP fallback.
pub(super) fn leg_listener(kind: BackendKind) -> (Option<Arc<LegListener>>, TcpEndpoint) {
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
