// SPDX-License-Identifier: MIT OR Apache-2.0
//! The simulated xenstored: the XenStore wire protocol over unix sockets,
//! one listening socket per domain so that every connection has a domain
//! identity (dom0 privileged, domUs not).
//!
//! Each connection has a reader thread (parses and executes requests under
//! the global lock) and a writer thread (drains the connection's queue of
//! replies and watch events), so a client that stops reading cannot stall
//! the daemon; a client whose backlog exceeds [`MAX_BACKLOG`] is dropped,
//! as xenstored drops connections it cannot serve. Malformed input yields an
//! error reply (`EINVAL`, `ENOSYS`...) or, for a length above
//! `XENSTORE_PAYLOAD_MAX`, a closed connection; never a panic.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, MutexGuard};

use xensock_xenif::xs_wire::{
    split_strings, Header, MsgType, Perm, PermAccess, XsErrno, HEADER_LEN, PAYLOAD_MAX,
    REL_PATH_MAX,
};

use crate::store::{
    canonicalize, domain_home, is_child, perm_bits, Caller, Fire, Quotas, Store, PERM_OWNER,
    PERM_READ, PERM_WRITE,
};

/// Bytes of replies and events queued for one connection before the daemon
/// gives up on it.
pub const MAX_BACKLOG: usize = 8 << 20;

const INTRODUCE_DOMAIN: &str = "@introduceDomain";
const RELEASE_DOMAIN: &str = "@releaseDomain";

struct WatchReg {
    /// Canonical path, or an `@` name.
    path: String,
    token: Vec<u8>,
    /// The path as the client gave it, when relative.
    relative: Option<String>,
}

struct TxState {
    store: Store,
    fires: Vec<Fire>,
    /// The domain migrated while the transaction was open: it can only fail.
    doomed: bool,
}

struct Outbox {
    tx: Sender<Vec<u8>>,
    queued: Arc<AtomicUsize>,
    stream: UnixStream,
}

impl Outbox {
    fn push(&self, msg: Vec<u8>) {
        let n = msg.len();
        if self.queued.fetch_add(n, Ordering::AcqRel) + n > MAX_BACKLOG {
            tracing::warn!("xenstored: dropping a connection that does not read its replies");
            let _ = self.stream.shutdown(Shutdown::Both);
            return;
        }
        let _ = self.tx.send(msg);
    }
}

struct ConnState {
    domid: u32,
    watches: Vec<WatchReg>,
    transactions: HashMap<u32, TxState>,
    next_tx: u32,
    out: Outbox,
}

impl ConnState {
    fn caller(&self) -> Caller {
        Caller {
            domid: self.domid,
            privileged: self.domid == 0,
        }
    }

    fn event(&self, path: &str, token: &[u8]) {
        let mut payload = Vec::with_capacity(path.len() + token.len() + 2);
        payload.extend_from_slice(path.as_bytes());
        payload.push(0);
        payload.extend_from_slice(token);
        payload.push(0);
        self.out
            .push(message(Header::new(MsgType::WatchEvent, 0, 0, 0), &payload));
    }
}

struct State {
    store: Store,
    conns: HashMap<u64, ConnState>,
    next_conn: u64,
    special_perms: HashMap<&'static str, Vec<Perm>>,
    introduced: HashSet<u32>,
}

/// Counters for tests and the CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XenstoredStats {
    /// Open client connections.
    pub connections: usize,
    /// Registered watches.
    pub watches: usize,
    /// Open transactions.
    pub transactions: usize,
    /// Nodes in the tree.
    pub nodes: usize,
}

/// The daemon. Shared by the listeners of every domain.
pub(crate) struct Xenstored {
    state: Mutex<State>,
    quotas: Quotas,
}

fn message(mut hdr: Header, payload: &[u8]) -> Vec<u8> {
    hdr.len = payload.len() as u32;
    let mut m = Vec::with_capacity(HEADER_LEN + payload.len());
    m.extend_from_slice(&hdr.encode());
    m.extend_from_slice(payload);
    m
}

fn error_payload(e: XsErrno) -> Vec<u8> {
    let mut p = e.name().as_bytes().to_vec();
    p.push(0);
    p
}

const OK: &[u8] = b"OK\0";

/// The single string of a one-argument request: exactly one NUL, at the end.
fn onearg(payload: &[u8]) -> Result<&str, XsErrno> {
    match payload.iter().position(|&b| b == 0) {
        Some(i) if i + 1 == payload.len() => {
            std::str::from_utf8(&payload[..i]).map_err(|_| XsErrno::Inval)
        }
        _ => Err(XsErrno::Inval),
    }
}

fn utf8(b: &[u8]) -> Result<&str, XsErrno> {
    std::str::from_utf8(b).map_err(|_| XsErrno::Inval)
}

/// `atoi` as xenstored uses it for domids: leading digits, else 0.
fn atoi(s: &str) -> u64 {
    s.bytes().take_while(u8::is_ascii_digit).fold(0u64, |a, d| {
        a.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    })
}

fn readable(c: Caller, perms: &[Perm]) -> bool {
    !perms.is_empty() && perm_bits(c, perms) & PERM_READ != 0
}

impl Xenstored {
    pub(crate) fn new(quotas: Quotas) -> Arc<Xenstored> {
        let mut special_perms = HashMap::new();
        special_perms.insert(INTRODUCE_DOMAIN, vec![Perm::new(PermAccess::None, 0)]);
        special_perms.insert(RELEASE_DOMAIN, vec![Perm::new(PermAccess::None, 0)]);
        let mut introduced = HashSet::new();
        introduced.insert(0);
        Arc::new(Xenstored {
            state: Mutex::new(State {
                store: Store::new(),
                conns: HashMap::new(),
                next_conn: 1,
                special_perms,
                introduced,
            }),
            quotas,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in this file; keep
        // serving with the state as it is rather than cascading panics.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stats(&self) -> XenstoredStats {
        let st = self.lock();
        XenstoredStats {
            connections: st.conns.len(),
            watches: st.conns.values().map(|c| c.watches.len()).sum(),
            transactions: st.conns.values().map(|c| c.transactions.len()).sum(),
            nodes: st.store.len(),
        }
    }

    /// Serves one accepted connection for `domid` on the calling thread's
    /// behalf: spawns its reader and writer threads.
    pub(crate) fn serve(self: &Arc<Self>, stream: UnixStream, domid: u32) -> std::io::Result<()> {
        let write_half = stream.try_clone()?;
        // A client that stops reading cannot pin the writer forever.
        write_half.set_write_timeout(Some(std::time::Duration::from_secs(10)))?;
        let shutdown_half = stream.try_clone()?;
        let (tx, rx) = channel::<Vec<u8>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let id = {
            let mut st = self.lock();
            let id = st.next_conn;
            st.next_conn += 1;
            st.conns.insert(
                id,
                ConnState {
                    domid,
                    watches: Vec::new(),
                    transactions: HashMap::new(),
                    next_tx: 1,
                    out: Outbox {
                        tx,
                        queued: queued.clone(),
                        stream: shutdown_half,
                    },
                },
            );
            id
        };
        std::thread::Builder::new()
            .name(format!("xs-write-{id}"))
            .spawn(move || {
                let mut w = write_half;
                for msg in rx {
                    queued.fetch_sub(msg.len(), Ordering::AcqRel);
                    if w.write_all(&msg).is_err() {
                        let _ = w.shutdown(Shutdown::Both);
                        break;
                    }
                }
            })?;
        let me = self.clone();
        std::thread::Builder::new()
            .name(format!("xs-read-{id}"))
            .spawn(move || {
                me.read_loop(id, stream);
                me.lock().conns.remove(&id);
            })?;
        Ok(())
    }

    fn read_loop(&self, id: u64, mut stream: UnixStream) {
        let mut hdr = [0u8; HEADER_LEN];
        let mut payload = vec![0u8; PAYLOAD_MAX];
        loop {
            if stream.read_exact(&mut hdr).is_err() {
                break;
            }
            let h = Header::decode(&hdr);
            let len = h.len as usize;
            if len > PAYLOAD_MAX {
                tracing::debug!(len, "xenstored: oversized message, closing connection");
                break;
            }
            if stream.read_exact(&mut payload[..len]).is_err() {
                break;
            }
            self.process(id, h, &payload[..len]);
        }
        // Dropping the connection's state closes its queue: the writer
        // sends what is queued (replies to requests read so far), then the
        // socket closes with the last descriptor.
    }

    fn process(&self, id: u64, h: Header, payload: &[u8]) {
        let mut guard = self.lock();
        let st = &mut *guard;
        if !st.conns.contains_key(&id) {
            return;
        }
        let reply_hdr = Header {
            msg_type: h.msg_type,
            req_id: h.req_id,
            tx_id: h.tx_id,
            len: 0,
        };
        let result = self.execute(st, id, h, payload);
        let Some(conn) = st.conns.get(&id) else {
            return;
        };
        match result {
            Ok(Reply { payload, after }) => {
                if payload.len() > PAYLOAD_MAX {
                    let mut eh = reply_hdr;
                    eh.msg_type = MsgType::Error.as_u32();
                    conn.out.push(message(eh, &error_payload(XsErrno::TooBig)));
                } else {
                    conn.out.push(message(reply_hdr, &payload));
                }
                for (path, token) in after {
                    conn.event(&path, &token);
                }
            }
            Err(e) => {
                let mut eh = reply_hdr;
                eh.msg_type = MsgType::Error.as_u32();
                conn.out.push(message(eh, &error_payload(e)));
            }
        }
    }

    fn execute(&self, st: &mut State, id: u64, h: Header, p: &[u8]) -> Result<Reply, XsErrno> {
        let q = &self.quotas;
        let conn = st.conns.get(&id).ok_or(XsErrno::Io)?;
        let caller = conn.caller();
        let Some(ty) = h.msg_type() else {
            return Err(XsErrno::NoSys);
        };
        use MsgType as T;
        if matches!(
            ty,
            T::Control
                | T::Introduce
                | T::Release
                | T::IsDomainIntroduced
                | T::Resume
                | T::SetTarget
        ) && !caller.privileged
        {
            return Err(XsErrno::Acces);
        }
        // Requests other than watch management may name a transaction.
        if !matches!(ty, T::Watch | T::Unwatch) && h.tx_id != 0 {
            match conn.transactions.get(&h.tx_id) {
                None => return Err(XsErrno::NoEnt),
                Some(t) if t.doomed && ty != T::TransactionEnd => return Err(XsErrno::Again),
                Some(_) => {}
            }
        }
        let tx_id = h.tx_id;
        match ty {
            T::Read => {
                let path = canonicalize(caller.domid, onearg(p)?);
                let v = view(st, id, tx_id).read(caller, q, &path)?;
                Ok(Reply::data(v))
            }
            T::Directory => {
                let path = canonicalize(caller.domid, onearg(p)?);
                let (children, _) = view(st, id, tx_id).directory(caller, q, &path)?;
                let mut out = Vec::new();
                for c in children {
                    out.extend_from_slice(c.as_bytes());
                    out.push(0);
                }
                Ok(Reply::data(out))
            }
            T::DirectoryPart => {
                let (parts, _) = split_strings(p);
                if parts.len() != 2 {
                    return Err(XsErrno::Inval);
                }
                let path = canonicalize(caller.domid, utf8(parts[0])?);
                let off = atoi(utf8(parts[1])?) as usize;
                let (children, gen) = view(st, id, tx_id).directory(caller, q, &path)?;
                Ok(Reply::data(directory_part(&children, gen, off)))
            }
            T::GetPerms => {
                let path = canonicalize(caller.domid, onearg(p)?);
                let perms = view(st, id, tx_id).get_perms(caller, q, &path)?;
                let mut out = Vec::new();
                for perm in perms {
                    out.extend_from_slice(perm.to_string().as_bytes());
                    out.push(0);
                }
                Ok(Reply::data(out))
            }
            T::Write => {
                let nul = p.iter().position(|&b| b == 0).ok_or(XsErrno::Inval)?;
                let path = canonicalize(caller.domid, utf8(&p[..nul])?);
                let value = &p[nul + 1..];
                let fires = view_mut(st, id, tx_id).write(caller, q, &path, value)?;
                self.fire_or_queue(st, id, tx_id, fires);
                Ok(Reply::ok())
            }
            T::Mkdir => {
                let path = canonicalize(caller.domid, onearg(p)?);
                let fires = view_mut(st, id, tx_id).mkdir(caller, q, &path)?;
                self.fire_or_queue(st, id, tx_id, fires);
                Ok(Reply::ok())
            }
            T::Rm => {
                let path = canonicalize(caller.domid, onearg(p)?);
                let fires = view_mut(st, id, tx_id).rm(caller, q, &path)?;
                self.fire_or_queue(st, id, tx_id, fires);
                Ok(Reply::ok())
            }
            T::SetPerms => {
                let (parts, _) = split_strings(p);
                if parts.len() < 2 {
                    return Err(XsErrno::Inval);
                }
                let nperms = parts.len() - 1;
                if !caller.privileged && nperms > q.perms_per_node {
                    return Err(XsErrno::NoSpc);
                }
                let perms = parts[1..]
                    .iter()
                    .map(|s| Perm::parse(s))
                    .collect::<Option<Vec<Perm>>>()
                    .ok_or(XsErrno::Inval)?;
                let name = utf8(parts[0])?;
                if name.starts_with('@') {
                    let key = match name {
                        INTRODUCE_DOMAIN => INTRODUCE_DOMAIN,
                        RELEASE_DOMAIN => RELEASE_DOMAIN,
                        _ => return Err(XsErrno::Inval),
                    };
                    let cur = st.special_perms.get(key).cloned().unwrap_or_default();
                    if perm_bits(caller, &cur) & (PERM_WRITE | PERM_OWNER)
                        != PERM_WRITE | PERM_OWNER
                    {
                        return Err(XsErrno::Acces);
                    }
                    st.special_perms.insert(key, perms);
                    return Ok(Reply::ok());
                }
                let path = canonicalize(caller.domid, name);
                let fires = view_mut(st, id, tx_id).set_perms(caller, q, &path, perms)?;
                self.fire_or_queue(st, id, tx_id, fires);
                Ok(Reply::ok())
            }
            T::Watch => {
                let (parts, _) = split_strings(p);
                if parts.len() != 2 {
                    return Err(XsErrno::Inval);
                }
                let given = utf8(parts[0])?;
                let token = parts[1].to_vec();
                let (path, relative) = watch_path(caller.domid, given, q)?;
                let conn = st.conns.get(&id).ok_or(XsErrno::Io)?;
                if conn
                    .watches
                    .iter()
                    .any(|w| w.path == path && w.token == token)
                {
                    return Err(XsErrno::Exist);
                }
                if !caller.privileged {
                    let count: usize = st
                        .conns
                        .values()
                        .filter(|c| c.domid == caller.domid)
                        .map(|c| c.watches.len())
                        .sum();
                    if count >= q.watches_per_domain {
                        return Err(XsErrno::TooBig);
                    }
                }
                let conn = st.conns.get_mut(&id).ok_or(XsErrno::Io)?;
                conn.watches.push(WatchReg {
                    path: path.clone(),
                    token: token.clone(),
                    relative: relative.then(|| given.to_string()),
                });
                // xenstored fires every new watch once, right after the ack.
                let shown = if relative { given.to_string() } else { path };
                Ok(Reply {
                    payload: OK.to_vec(),
                    after: vec![(shown, token)],
                })
            }
            T::Unwatch => {
                let (parts, _) = split_strings(p);
                if parts.len() != 2 {
                    return Err(XsErrno::Inval);
                }
                let path = canonicalize(caller.domid, utf8(parts[0])?);
                let conn = st.conns.get_mut(&id).ok_or(XsErrno::Io)?;
                let before = conn.watches.len();
                conn.watches
                    .retain(|w| !(w.path == path && w.token == parts[1]));
                if conn.watches.len() == before {
                    return Err(XsErrno::NoEnt);
                }
                Ok(Reply::ok())
            }
            T::TransactionStart => {
                onearg(p)?;
                if tx_id != 0 {
                    return Err(XsErrno::Busy);
                }
                let snapshot = st.store.begin_transaction();
                let conn = st.conns.get_mut(&id).ok_or(XsErrno::Io)?;
                if !caller.privileged && conn.transactions.len() >= q.transactions_per_connection {
                    return Err(XsErrno::NoSpc);
                }
                let mut tid = conn.next_tx;
                while tid == 0 || conn.transactions.contains_key(&tid) {
                    tid = tid.wrapping_add(1);
                }
                conn.next_tx = tid.wrapping_add(1);
                conn.transactions.insert(
                    tid,
                    TxState {
                        store: snapshot,
                        fires: Vec::new(),
                        doomed: false,
                    },
                );
                Ok(Reply::data(format!("{tid}\0").into_bytes()))
            }
            T::TransactionEnd => {
                let arg = onearg(p)?;
                let commit = match arg {
                    "T" => true,
                    "F" => false,
                    _ => return Err(XsErrno::Inval),
                };
                if tx_id == 0 {
                    return Err(XsErrno::NoEnt);
                }
                let conn = st.conns.get_mut(&id).ok_or(XsErrno::Io)?;
                let tx = conn.transactions.remove(&tx_id).ok_or(XsErrno::NoEnt)?;
                if !commit {
                    return Ok(Reply::ok());
                }
                if tx.doomed {
                    return Err(XsErrno::Again);
                }
                st.store.commit(tx.store)?;
                self.fire(st, &tx.fires);
                Ok(Reply::ok())
            }
            T::GetDomainPath => {
                let d = atoi(onearg(p)?);
                Ok(Reply::data(
                    format!("{}\0", domain_home(d as u32)).into_bytes(),
                ))
            }
            T::IsDomainIntroduced => {
                let d = atoi(onearg(p)?) as u32;
                let yes = st.introduced.contains(&d);
                Ok(Reply::data(if yes {
                    b"T\0".to_vec()
                } else {
                    b"F\0".to_vec()
                }))
            }
            T::ResetWatches => {
                let conn = st.conns.get_mut(&id).ok_or(XsErrno::Io)?;
                conn.watches.clear();
                conn.transactions.clear();
                Ok(Reply::ok())
            }
            // Domains are introduced by the sim host, not over the wire.
            T::Control | T::Introduce | T::Release | T::Resume | T::SetTarget => {
                Err(XsErrno::NoSys)
            }
            T::WatchEvent | T::Error => Err(XsErrno::NoSys),
        }
    }

    fn fire_or_queue(&self, st: &mut State, id: u64, tx_id: u32, fires: Vec<Fire>) {
        if tx_id != 0 {
            if let Some(t) = st
                .conns
                .get_mut(&id)
                .and_then(|c| c.transactions.get_mut(&tx_id))
            {
                t.fires.extend(fires);
            }
            return;
        }
        self.fire(st, &fires);
    }

    fn fire(&self, st: &State, fires: &[Fire]) {
        for f in fires {
            for conn in st.conns.values() {
                let c = conn.caller();
                let permitted = f.old_perms.as_deref().is_some_and(|p| readable(c, p))
                    || readable(c, &f.perms)
                    || f.parent_perms.as_deref().is_some_and(|p| readable(c, p));
                if !permitted {
                    continue;
                }
                for w in &conn.watches {
                    if w.path.starts_with('@') {
                        continue;
                    }
                    let hit = if f.exact {
                        w.path == f.path
                    } else {
                        is_child(&f.path, &w.path)
                    };
                    if hit {
                        conn.event(&shown_path(conn.domid, w, &f.path), &w.token);
                    }
                }
            }
        }
    }

    fn fire_special(&self, st: &State, name: &str) {
        let perms = st.special_perms.get(name).cloned().unwrap_or_default();
        for conn in st.conns.values() {
            if !readable(conn.caller(), &perms) {
                continue;
            }
            for w in conn.watches.iter().filter(|w| w.path == name) {
                conn.event(name, &w.token);
            }
        }
    }

    /// Toolstack work when a domain is created: the nodes libxl writes
    /// (home readable by the guest, `domid`, `name`, `vm`, a guest-owned
    /// `data/`, `/vm/<uuid>`), then `@introduceDomain`.
    pub(crate) fn introduce_domain(
        &self,
        domid: u32,
        name: &str,
        uuid: &str,
        label: Option<&str>,
    ) -> Result<(), XsErrno> {
        let mut st = self.lock();
        let home = domain_home(domid);
        let ro = [
            Perm::new(PermAccess::None, 0),
            Perm::new(PermAccess::Read, domid),
        ];
        let rw = [Perm::new(PermAccess::None, domid)];
        let vm = format!("/vm/{uuid}");
        let mut fires = Vec::new();
        let s = &mut st.store;
        fires.extend(s.tool_write(&home, b"", &ro)?);
        fires.extend(s.tool_write(&format!("{home}/domid"), domid.to_string().as_bytes(), &ro)?);
        fires.extend(s.tool_write(&format!("{home}/name"), name.as_bytes(), &ro)?);
        fires.extend(s.tool_write(&format!("{home}/vm"), vm.as_bytes(), &ro)?);
        fires.extend(s.tool_write(&format!("{home}/data"), b"", &rw)?);
        if let Some(label) = label {
            fires.extend(s.tool_write(
                &format!("{home}/{}", xensock_proto::store::XENSOCK),
                b"",
                &ro,
            )?);
            fires.extend(s.tool_write(
                &format!("{home}/{}", xensock_proto::store::LABEL),
                label.as_bytes(),
                &ro,
            )?);
        }
        fires.extend(s.tool_write(&vm, b"", &ro)?);
        fires.extend(s.tool_write(&format!("{vm}/uuid"), uuid.as_bytes(), &ro)?);
        fires.extend(s.tool_write(&format!("{vm}/name"), name.as_bytes(), &ro)?);
        st.introduced.insert(domid);
        self.fire(&st, &fires);
        self.fire_special(&st, INTRODUCE_DOMAIN);
        Ok(())
    }

    /// Dom0's own nodes, written once at start (as `xen-init-dom0` does).
    pub(crate) fn init_dom0(&self) -> Result<(), XsErrno> {
        let mut st = self.lock();
        let ro = [Perm::new(PermAccess::None, 0)];
        let s = &mut st.store;
        s.tool_write("/local/domain/0", b"", &ro)?;
        s.tool_write("/local/domain/0/domid", b"0", &ro)?;
        s.tool_write("/local/domain/0/name", b"Domain-0", &ro)?;
        s.tool_write(
            "/local/domain/0/vm",
            b"/vm/00000000-0000-0000-0000-000000000000",
            &ro,
        )?;
        Ok(())
    }

    /// A domain died or left the host: the toolstack removes its nodes, its
    /// connections are closed, xenstored forgets it and fires
    /// `@releaseDomain`.
    pub(crate) fn release_domain(&self, domid: u32, uuid: Option<&str>) {
        let mut st = self.lock();
        let mut fires = Vec::new();
        let dom0 = Caller::dom0();
        let q = Quotas::default();
        if let Ok(f) = st.store.rm(dom0, &q, &domain_home(domid)) {
            fires.extend(f);
        }
        if let Some(uuid) = uuid {
            if let Ok(f) = st.store.rm(dom0, &q, &format!("/vm/{uuid}")) {
                fires.extend(f);
            }
        }
        st.store.forget_domain(domid);
        st.introduced.remove(&domid);
        for conn in st.conns.values().filter(|c| c.domid == domid) {
            let _ = conn.out.stream.shutdown(Shutdown::Both);
        }
        self.fire(&st, &fires);
        self.fire_special(&st, RELEASE_DOMAIN);
    }

    /// Same-host migration: the guest's connections carry over to its new
    /// domid, as a guest kernel's xenbus reconnects on resume. Open
    /// transactions can only fail with `EAGAIN`; relative watches follow the
    /// new home and every watch fires once, as after re-registration.
    pub(crate) fn reassign_domain(&self, old: u32, new: u32) {
        let mut st = self.lock();
        for conn in st.conns.values_mut().filter(|c| c.domid == old) {
            conn.domid = new;
            for t in conn.transactions.values_mut() {
                t.doomed = true;
            }
            for w in &mut conn.watches {
                if let Some(rel) = &w.relative {
                    w.path = canonicalize(new, rel);
                }
            }
            for w in &conn.watches {
                let shown = w.relative.clone().unwrap_or_else(|| w.path.clone());
                conn.event(&shown, &w.token);
            }
        }
    }

    /// Privileged write from the host (e.g. migration markers).
    pub(crate) fn tool_write(&self, path: &str, value: &[u8]) -> Result<(), XsErrno> {
        let mut st = self.lock();
        let fires = st
            .store
            .write(Caller::dom0(), &Quotas::default(), path, value)?;
        self.fire(&st, &fires);
        Ok(())
    }

    /// Privileged removal from the host.
    pub(crate) fn tool_rm(&self, path: &str) -> Result<(), XsErrno> {
        let mut st = self.lock();
        let fires = st.store.rm(Caller::dom0(), &Quotas::default(), path)?;
        self.fire(&st, &fires);
        Ok(())
    }

    /// Privileged read from the host.
    pub(crate) fn tool_read(&self, path: &str) -> Result<Vec<u8>, XsErrno> {
        self.lock()
            .store
            .read(Caller::dom0(), &Quotas::default(), path)
    }

    /// Closes every connection (host shutdown).
    pub(crate) fn close_all(&self) {
        let st = self.lock();
        for conn in st.conns.values() {
            let _ = conn.out.stream.shutdown(Shutdown::Both);
        }
    }
}

struct Reply {
    payload: Vec<u8>,
    /// Watch events to send after the reply, as (path, token).
    after: Vec<(String, Vec<u8>)>,
}

impl Reply {
    fn ok() -> Reply {
        Reply::data(OK.to_vec())
    }
    fn data(payload: Vec<u8>) -> Reply {
        Reply {
            payload,
            after: Vec::new(),
        }
    }
}

fn view(st: &State, id: u64, tx_id: u32) -> &Store {
    match st.conns.get(&id).and_then(|c| c.transactions.get(&tx_id)) {
        Some(t) if tx_id != 0 => &t.store,
        _ => &st.store,
    }
}

fn view_mut(st: &mut State, id: u64, tx_id: u32) -> &mut Store {
    let State { conns, store, .. } = st;
    match conns
        .get_mut(&id)
        .and_then(|c| c.transactions.get_mut(&tx_id))
    {
        Some(t) if tx_id != 0 => &mut t.store,
        _ => store,
    }
}

fn watch_path(domid: u32, given: &str, q: &Quotas) -> Result<(String, bool), XsErrno> {
    if given.starts_with('@') {
        if given.len() > REL_PATH_MAX {
            return Err(XsErrno::Inval);
        }
        return Ok((given.to_string(), false));
    }
    let relative = !given.starts_with('/');
    let path = canonicalize(domid, given);
    if !crate::store::is_valid_path(&path, q.max_path_len) {
        return Err(XsErrno::Inval);
    }
    Ok((path, relative))
}

/// The event path a watch reports: relative watches see paths relative to
/// the domain's home.
fn shown_path(domid: u32, w: &WatchReg, fired: &str) -> String {
    if w.relative.is_some() {
        let home = domain_home(domid);
        if let Some(rest) = fired.strip_prefix(&home) {
            return rest.strip_prefix('/').unwrap_or(rest).to_string();
        }
    }
    fired.to_string()
}

/// `XS_DIRECTORY_PART` reply: the node generation, then as many child names
/// from byte offset `off` as fit; a final empty string marks the end.
fn directory_part(children: &[String], generation: u64, off: usize) -> Vec<u8> {
    let mut all = Vec::new();
    for c in children {
        all.extend_from_slice(c.as_bytes());
        all.push(0);
    }
    let mut out = format!("{generation}\0").into_bytes();
    if off >= all.len() {
        out.push(0);
        return out;
    }
    let max = PAYLOAD_MAX - out.len() - 1;
    let mut len = 0;
    let mut pos = off;
    while pos < all.len() {
        let end = all[pos..]
            .iter()
            .position(|&b| b == 0)
            .map(|i| pos + i + 1)
            .unwrap_or(all.len());
        if len + (end - pos) > max {
            break;
        }
        len += end - pos;
        pos = end;
    }
    out.extend_from_slice(&all[off..off + len]);
    if off + len == all.len() {
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_part_chunks() {
        let kids: Vec<String> = vec!["a".into(), "bb".into()];
        assert_eq!(directory_part(&kids, 7, 0), b"7\0a\0bb\0\0");
        assert_eq!(directory_part(&kids, 7, 2), b"7\0bb\0\0");
        assert_eq!(directory_part(&kids, 7, 5), b"7\0\0");
        // Many long names: the first chunk stops before PAYLOAD_MAX.
        let many: Vec<String> = (0..100).map(|i| format!("{i:0>60}")).collect();
        let first = directory_part(&many, 1, 0);
        assert!(first.len() <= PAYLOAD_MAX);
        assert_ne!(&first[first.len() - 2..], b"\0\0");
    }

    #[test]
    fn onearg_rules() {
        assert_eq!(onearg(b"/a\0"), Ok("/a"));
        assert_eq!(onearg(b"/a"), Err(XsErrno::Inval));
        assert_eq!(onearg(b"/a\0b\0"), Err(XsErrno::Inval));
        assert_eq!(onearg(b""), Err(XsErrno::Inval));
        assert_eq!(atoi("12ab"), 12);
        assert_eq!(atoi("x"), 0);
    }
}
