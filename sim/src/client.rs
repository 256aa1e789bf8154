// SPDX-License-Identifier: MIT OR Apache-2.0
//! The sim backend of [`XenBackend`]: a domain process's handle on the sim
//! host's grant table and event channels, over its control socket.
//!
//! Granted and mapped pages are memfd pages shared with the host and the
//! peer; event channels are pairs of eventfds. When the host revokes this
//! domain (destroy, migration), every live region of the handle is replaced
//! in place by private zero pages (so the shared memory really goes away
//! without faulting the process) and notifications stop reaching the peer.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use xensock_xenif::{
    Access, DomId, EventChannel, GrantRef, GrantedRegion, MappedRegion, PeerState, Port,
    SharedRegion, UnmapNotify, XenBackend, XenError, PAGE_SIZE,
};

use crate::ctl::{self, Dec, Enc};
use crate::host::{domain_dir, ENV_SIM_DIR, ENV_SIM_DOMID, MAX_PAGES_PER_CALL};
use crate::sys::fdpass::{self, SeqPacket};
use crate::sys::Mapped;

struct Reply {
    req_id: u32,
    status: u8,
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// A successful reply: results, descriptors, and the revocation generation
/// the resource belongs to.
struct Answer {
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
    generation: u64,
}

/// A live grant's or mapping's pages, as the revocation path scrubs them.
struct Region {
    mem: Arc<Mapped>,
    writable: bool,
}

#[derive(Default)]
struct Regions {
    live: HashMap<u64, Region>,
    next: u64,
}

struct ClientInner {
    sock: SeqPacket,
    request: Mutex<Receiver<Reply>>,
    next_req: AtomicU32,
    regions: Arc<Mutex<Regions>>,
    /// Bumped each time the host revokes this handle's resources.
    epoch: Arc<AtomicU64>,
    /// The host closed the connection (domain gone from this host).
    closed: Arc<AtomicBool>,
    domid: Arc<AtomicU16>,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.sock.shutdown();
        if let Some(r) = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = r.join();
        }
    }
}

fn os(op: &'static str) -> impl FnOnce(std::io::Error) -> XenError {
    move |source| XenError::Os { op, source }
}

/// Replaces a live shared region with private zero pages, in place.
fn scrub(r: &Region) {
    r.mem.scrub(r.writable);
}

impl ClientInner {
    fn call(&self, op: u8, args: Enc) -> Result<Answer, XenError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(XenError::Revoked);
        }
        let rx = self.request.lock().unwrap_or_else(|p| p.into_inner());
        let mut req_id = self.next_req.fetch_add(1, Ordering::Relaxed);
        if req_id == 0 {
            req_id = self.next_req.fetch_add(1, Ordering::Relaxed);
        }
        let mut msg = Enc::new().u32(req_id).u8(op).0;
        msg.extend_from_slice(&args.0);
        self.sock.send(&msg, &[]).map_err(|_| XenError::Revoked)?;
        loop {
            let r = rx.recv().map_err(|_| XenError::Revoked)?;
            if r.req_id != req_id {
                continue;
            }
            if r.status != 0 {
                return Err(ctl::err_from(
                    r.status,
                    String::from_utf8_lossy(&r.body).into_owned(),
                ));
            }
            let mut d = Dec(&r.body);
            let generation = d
                .u32()
                .map_err(|_| XenError::Invalid("short reply from the sim host".into()))?;
            return Ok(Answer {
                body: d.rest().to_vec(),
                fds: r.fds,
                generation: u64::from(generation),
            });
        }
    }

    /// Registers a new region for revocation, unless it already belongs to
    /// a revoked generation, in which case it is scrubbed right away.
    fn register(&self, r: Region, generation: u64) -> u64 {
        let mut regs = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        regs.next += 1;
        let k = regs.next;
        if self.epoch.load(Ordering::Acquire) == generation {
            regs.live.insert(k, r);
        } else {
            scrub(&r);
        }
        k
    }

    /// Unregisters a region: the revocation path no longer touches it,
    /// and it is unmapped when its owner lets go of it.
    fn forget(&self, key: u64) {
        let mut regs = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        regs.live.remove(&key);
    }

    fn current(&self, epoch: u64) -> Result<(), XenError> {
        if self.closed.load(Ordering::Acquire) || self.epoch.load(Ordering::Acquire) != epoch {
            return Err(XenError::Revoked);
        }
        Ok(())
    }
}

/// A domain process's handle on the sim host (grants, mappings, event
/// channels). Cheap to clone; resources keep the connection alive.
///
/// The host ties every resource to the connection: when the process dies
/// or the last clone and resource are dropped, the host releases them and
/// runs the configured unmap notifications.
#[derive(Clone)]
pub struct SimXen {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for SimXen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimXen")
            .field("domid", &self.domid())
            .finish()
    }
}

impl SimXen {
    /// Connects as domain `domid` of the sim in `sim_dir`.
    pub fn connect(sim_dir: &Path, domid: DomId) -> Result<SimXen, XenError> {
        let path = domain_dir(sim_dir, domid).join("control.sock");
        let sock = SeqPacket::connect(&path).map_err(|e| {
            XenError::Unavailable(format!("sim control socket {}: {e}", path.display()))
        })?;
        let reader_sock = sock.try_clone().map_err(os("dup control socket"))?;
        let (tx, rx) = channel::<Reply>();
        let regions = Arc::new(Mutex::new(Regions::default()));
        let epoch = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let domid_cell = Arc::new(AtomicU16::new(domid));
        let (r2, e2, c2, d2) = (
            regions.clone(),
            epoch.clone(),
            closed.clone(),
            domid_cell.clone(),
        );
        let reader = std::thread::Builder::new()
            .name("simxen-reader".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let (n, fds) = match reader_sock.recv(&mut buf) {
                        Ok((0, _)) | Err(_) => break,
                        Ok(x) => x,
                    };
                    let mut d = Dec(&buf[..n]);
                    let Ok(req_id) = d.u32() else { continue };
                    if req_id == 0 {
                        if d.u8() == Ok(ctl::PUSH_REVOKED) {
                            let new = d.u32().unwrap_or(u32::MAX);
                            let generation = d.u32().unwrap_or(u32::MAX);
                            let mut regs = r2.lock().unwrap_or_else(|p| p.into_inner());
                            e2.store(u64::from(generation), Ordering::Release);
                            for (_, r) in regs.live.drain() {
                                scrub(&r);
                            }
                            match u16::try_from(new) {
                                Ok(n) => d2.store(n, Ordering::Release),
                                Err(_) => c2.store(true, Ordering::Release),
                            }
                        }
                        continue;
                    }
                    let Ok(status) = d.u8() else { continue };
                    let body = d.rest().to_vec();
                    if tx
                        .send(Reply {
                            req_id,
                            status,
                            body,
                            fds,
                        })
                        .is_err()
                    {
                        break;
                    }
                }
                c2.store(true, Ordering::Release);
            })
            .map_err(os("spawning the sim client thread"))?;
        let x = SimXen {
            inner: Arc::new(ClientInner {
                sock,
                request: Mutex::new(rx),
                next_req: AtomicU32::new(1),
                regions,
                epoch,
                closed,
                domid: domid_cell,
                reader: Mutex::new(Some(reader)),
            }),
        };
        // Confirms that the host accepted us under this identity.
        let a = x.inner.call(ctl::OP_WHOAMI, Enc::new())?;
        x.inner.epoch.store(a.generation, Ordering::Release);
        let who = Dec(&a.body)
            .u16()
            .map_err(|_| XenError::Invalid("bad WHOAMI reply".into()))?;
        x.inner.domid.store(who, Ordering::Release);
        Ok(x)
    }

    /// Connects using `XENSOCK_SIM` and `XENSOCK_SIM_DOMID`.
    pub fn from_env() -> Result<SimXen, XenError> {
        let dir = std::env::var_os(ENV_SIM_DIR)
            .ok_or_else(|| XenError::Unavailable(format!("{ENV_SIM_DIR} is not set")))?;
        let domid = std::env::var(ENV_SIM_DOMID)
            .map_err(|_| XenError::Unavailable(format!("{ENV_SIM_DOMID} is not set")))?;
        let domid: DomId = domid
            .trim()
            .parse()
            .map_err(|_| XenError::Invalid(format!("{ENV_SIM_DOMID}={domid:?} is not a domid")))?;
        SimXen::connect(Path::new(&dir), domid)
    }

    /// This domain's current domid (changes when it migrates).
    pub fn domid(&self) -> DomId {
        self.inner.domid.load(Ordering::Acquire)
    }

    /// Whether the host has closed this handle (domain destroyed or moved
    /// to another host).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    fn notify_args(id: u64, n: UnmapNotify) -> Enc {
        let mut flags = 0;
        if n.clear_byte.is_some() {
            flags |= ctl::NOTIFY_CLEAR;
        }
        if n.send_event.is_some() {
            flags |= ctl::NOTIFY_EVENT;
        }
        Enc::new()
            .u64(id)
            .u8(flags)
            .u64(n.clear_byte.unwrap_or(0) as u64)
            .u32(n.send_event.unwrap_or(0))
    }
}

/// What a grant or mapping tells the host when it goes: after its pages
/// are unmapped (it is declared after them), unless the host revoked it.
struct HostRelease {
    client: Arc<ClientInner>,
    op: u8,
    id: u64,
    epoch: u64,
}

impl Drop for HostRelease {
    fn drop(&mut self) {
        if self.client.current(self.epoch).is_ok() {
            let _ = self.client.call(self.op, Enc::new().u64(self.id));
        }
    }
}

/// Pages granted through the sim.
pub struct SimGrant {
    key: u64,
    mem: Arc<Mapped>,
    release: HostRelease,
    refs: Vec<GrantRef>,
    peer: DomId,
    peer_access: Access,
}

impl std::fmt::Debug for SimGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimGrant")
            .field("refs", &self.refs)
            .field("peer", &self.peer)
            .finish()
    }
}

impl SharedRegion for SimGrant {
    fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
    fn writable(&self) -> bool {
        true
    }
    fn peer(&self) -> DomId {
        self.peer
    }
}

impl GrantedRegion for SimGrant {
    fn refs(&self) -> &[GrantRef] {
        &self.refs
    }
    fn peer_access(&self) -> Access {
        self.peer_access
    }
    fn set_unmap_notify(&mut self, notify: UnmapNotify) -> Result<(), XenError> {
        let r = &self.release;
        r.client.current(r.epoch)?;
        r.client
            .call(ctl::OP_GRANT_NOTIFY, SimXen::notify_args(r.id, notify))
            .map(drop)
    }
}

impl Drop for SimGrant {
    fn drop(&mut self) {
        // then the pages go (`mem`), then the host hears (`release`)
        self.release.client.forget(self.key);
    }
}

/// A peer's pages mapped through the sim.
pub struct SimMapping {
    key: u64,
    mem: Arc<Mapped>,
    release: HostRelease,
    writable: bool,
    peer: DomId,
}

impl std::fmt::Debug for SimMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMapping")
            .field("len", &self.mem.len())
            .field("peer", &self.peer)
            .field("writable", &self.writable)
            .finish()
    }
}

impl SharedRegion for SimMapping {
    fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn peer(&self) -> DomId {
        self.peer
    }
}

impl MappedRegion for SimMapping {
    fn set_unmap_notify(&mut self, notify: UnmapNotify) -> Result<(), XenError> {
        let r = &self.release;
        r.client.current(r.epoch)?;
        r.client
            .call(ctl::OP_MAP_NOTIFY, SimXen::notify_args(r.id, notify))
            .map(drop)
    }
}

impl Drop for SimMapping {
    fn drop(&mut self) {
        // then the pages go (`mem`), then the host hears (`release`)
        self.release.client.forget(self.key);
    }
}

/// One end of a sim event channel: kicks arrive on an eventfd.
pub struct SimChannel {
    client: Arc<ClientInner>,
    epoch: u64,
    port: Port,
    remote: DomId,
    inbound: OwnedFd,
    outbound: OwnedFd,
}

impl std::fmt::Debug for SimChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimChannel")
            .field("port", &self.port)
            .field("remote", &self.remote)
            .finish()
    }
}

impl AsFd for SimChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inbound.as_fd()
    }
}

impl AsRawFd for SimChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inbound.as_raw_fd()
    }
}

impl EventChannel for SimChannel {
    fn local_port(&self) -> Port {
        self.port
    }
    fn wait_readable(&self, timeout_ms: i32) -> std::io::Result<bool> {
        xensock_xenif::poll_readable(self.inbound.as_fd(), timeout_ms)
    }
    fn remote_domid(&self) -> DomId {
        self.remote
    }
    fn notify(&self) -> Result<(), XenError> {
        self.client.current(self.epoch)?;
        fdpass::kick(self.outbound.as_fd()).map_err(os("kick event channel"))
    }
    fn ack(&self) -> Result<bool, XenError> {
        fdpass::drain(self.inbound.as_fd()).map_err(os("read event channel"))
    }
    fn peer_state(&self) -> Result<PeerState, XenError> {
        self.client.current(self.epoch)?;
        let a = self
            .client
            .call(ctl::OP_EVTCHN_STATUS, Enc::new().u32(self.port))?;
        Ok(match Dec(&a.body).u8() {
            Ok(ctl::PORT_UNBOUND) => PeerState::Unbound,
            Ok(ctl::PORT_CONNECTED) => PeerState::Connected,
            Ok(ctl::PORT_CLOSED) => PeerState::Closed,
            _ => PeerState::Unknown,
        })
    }
}

impl Drop for SimChannel {
    fn drop(&mut self) {
        if self.client.current(self.epoch).is_ok() {
            let _ = self
                .client
                .call(ctl::OP_EVTCHN_CLOSE, Enc::new().u32(self.port));
        }
    }
}

fn take_fds<const N: usize>(fds: Vec<OwnedFd>) -> Result<[OwnedFd; N], XenError> {
    fds.try_into()
        .map_err(|_| XenError::Invalid("sim host sent the wrong number of descriptors".into()))
}

impl XenBackend for SimXen {
    type Grant = SimGrant;
    type Mapping = SimMapping;
    type Channel = SimChannel;

    fn grant(&self, peer: DomId, pages: usize, access: Access) -> Result<SimGrant, XenError> {
        if pages == 0 || pages > MAX_PAGES_PER_CALL {
            return Err(XenError::Invalid(format!(
                "page count {pages} not in 1..={MAX_PAGES_PER_CALL}"
            )));
        }
        let flags = u8::from(access == Access::ReadWrite);
        let Answer {
            body,
            fds,
            generation: epoch,
        } = self.inner.call(
            ctl::OP_GRANT,
            Enc::new().u16(peer).u32(pages as u32).u8(flags),
        )?;
        let mut d = Dec(&body);
        let bad = |_| XenError::Invalid("bad grant reply".into());
        let id = d.u64().map_err(bad)?;
        let refs = d.u32_list(MAX_PAGES_PER_CALL).map_err(bad)?;
        let [fd] = take_fds::<1>(fds)?;
        let len = pages * PAGE_SIZE;
        let mem = match Mapped::shared(fd.as_fd(), len, true) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                let _ = self.inner.call(ctl::OP_UNGRANT, Enc::new().u64(id));
                return Err(XenError::Os {
                    op: "mmap grant",
                    source: e,
                });
            }
        };
        let key = self.inner.register(
            Region {
                mem: mem.clone(),
                writable: true,
            },
            epoch,
        );
        Ok(SimGrant {
            key,
            mem,
            release: HostRelease {
                client: self.inner.clone(),
                op: ctl::OP_UNGRANT,
                id,
                epoch,
            },
            refs,
            peer,
            peer_access: access,
        })
    }

    fn map(&self, peer: DomId, refs: &[GrantRef], access: Access) -> Result<SimMapping, XenError> {
        if refs.is_empty() || refs.len() > MAX_PAGES_PER_CALL {
            return Err(XenError::Invalid(format!(
                "ref count {} not in 1..={MAX_PAGES_PER_CALL}",
                refs.len()
            )));
        }
        let writable = access == Access::ReadWrite;
        let mut args = Enc::new()
            .u16(peer)
            .u8(u8::from(writable))
            .u32(refs.len() as u32);
        for r in refs {
            args = args.u32(*r);
        }
        let Answer {
            body,
            fds,
            generation: epoch,
        } = self.inner.call(ctl::OP_MAP, args)?;
        let id_and_pages = (|| {
            let mut d = Dec(&body);
            let id = d.u64()?;
            let n = d.u32()? as usize;
            let mut pages = Vec::with_capacity(n.min(MAX_PAGES_PER_CALL));
            for _ in 0..n {
                pages.push((d.u32()? as usize, d.u32()? as usize));
            }
            Ok::<_, ctl::Short>((id, pages))
        })();
        let (id, pages) = id_and_pages.map_err(|_| XenError::Invalid("bad map reply".into()))?;
        let undo = |e: XenError| {
            let _ = self.inner.call(ctl::OP_UNMAP, Enc::new().u64(id));
            e
        };
        if pages.len() != refs.len() || pages.iter().any(|(fd, _)| *fd >= fds.len()) {
            return Err(undo(XenError::Invalid("inconsistent map reply".into())));
        }
        let len = refs.len() * PAGE_SIZE;
        // Reserve the whole range, then place each run of pages into it.
        let mem = Mapped::reserve(len).map_err(|source| {
            undo(XenError::Os {
                op: "reserve mapping",
                source,
            })
        })?;
        let mut i = 0;
        while i < pages.len() {
            let (fd, first) = pages[i];
            let mut run = 1;
            while i + run < pages.len() && pages[i + run] == (fd, first + run) {
                run += 1;
            }
            if let Err(source) = mem.place(
                i * PAGE_SIZE,
                run * PAGE_SIZE,
                writable,
                fds[fd].as_fd(),
                first * PAGE_SIZE,
            ) {
                // the reservation goes with `mem`
                return Err(undo(XenError::Os {
                    op: "mmap grant",
                    source,
                }));
            }
            i += run;
        }
        let mem = Arc::new(mem);
        let key = self.inner.register(
            Region {
                mem: mem.clone(),
                writable,
            },
            epoch,
        );
        Ok(SimMapping {
            key,
            mem,
            release: HostRelease {
                client: self.inner.clone(),
                op: ctl::OP_UNMAP,
                id,
                epoch,
            },
            writable,
            peer,
        })
    }

    fn alloc_unbound(&self, remote: DomId) -> Result<SimChannel, XenError> {
        let Answer {
            body,
            fds,
            generation: epoch,
        } = self
            .inner
            .call(ctl::OP_EVTCHN_UNBOUND, Enc::new().u16(remote))?;
        let port = Dec(&body)
            .u32()
            .map_err(|_| XenError::Invalid("bad reply".into()))?;
        let [inbound, outbound] = take_fds::<2>(fds)?;
        Ok(SimChannel {
            client: self.inner.clone(),
            epoch,
            port,
            remote,
            inbound,
            outbound,
        })
    }

    fn bind_interdomain(&self, remote: DomId, remote_port: Port) -> Result<SimChannel, XenError> {
        let Answer {
            body,
            fds,
            generation: epoch,
        } = self
            .inner
            .call(ctl::OP_EVTCHN_BIND, Enc::new().u16(remote).u32(remote_port))?;
        let port = Dec(&body)
            .u32()
            .map_err(|_| XenError::Invalid("bad reply".into()))?;
        let [inbound, outbound] = take_fds::<2>(fds)?;
        Ok(SimChannel {
            client: self.inner.clone(),
            epoch,
            port,
            remote,
            inbound,
            outbound,
        })
    }
}
