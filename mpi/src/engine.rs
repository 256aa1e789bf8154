// SPDX-License-Identifier: MIT OR Apache-2.0
//! The engine: one listener, one endpoint per peer rank, progress by
//! polling (Open MPI calls [`Engine::progress`] from its progress loop).
//!
//! Single-threaded by design: Open MPI drives a BTL from one thread unless
//! `MPI_THREAD_MULTIPLE` is asked for, and the component declines then.
//! Callbacks into Open MPI ([`Events`]) may call back into the engine
//! (a receive callback sends an acknowledgement, a send completion
//! schedules the next fragment), so every method takes `&self`, the parts
//! of an endpoint a callback may touch are separate cells, and no cell is
//! borrowed across a callback that could borrow it again.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::rc::Rc;
use std::time::{Duration, Instant};

use std::os::fd::AsFd;

use libxensock::{BackendKind, SockAddrXen, SocketOptions, XenListener, XenStream, PORT_ANY};
use xensock_discovery::peers::Discovery;
use xensock_discovery::xs::XsClient;

use crate::card::Card;
use crate::error::Error;
use crate::sys::Borrowed;
use crate::wire::{next_frame, FrameHeader, FrameKind, Hello, HEADER_LEN, HELLO_LEN};

/// How the engine is sized.
#[derive(Debug, Clone)]
pub struct Config {
    /// The largest fragment payload this rank sends or accepts (Open
    /// MPI's `max_send_size`, header included).
    pub max_payload: usize,
    /// Receive-ring size of each connection (`SO_RCVBUF`); `None` for
    /// the backend's default.
    pub recv_buffer: Option<usize>,
    /// How long finalize waits for queued fragments and byes to leave.
    pub linger: Duration,
    /// Over the kernel family, ask `FIONREAD` before reading: one more
    /// system call when data is there, but an empty poll then arms no
    /// notification, so the peer's send needs no event-channel kick.
    pub check_readable: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_payload: 256 * 1024,
            recv_buffer: None,
            linger: Duration::from_secs(5),
            check_readable: false,
        }
    }
}

/// What the engine tells its owner (Open MPI's side).
pub trait Events {
    /// A fragment for `tag` arrived from the endpoint whose cookie is
    /// `endpoint`; `payload` is valid during the call only.
    fn deliver(&self, endpoint: usize, tag: u8, payload: &[u8]);
    /// A send queued in place ([`Sent::Queued`]) finished (`ok`) or was
    /// dropped because its endpoint failed.
    fn completed(&self, send: usize, ok: bool);
    /// The endpoint failed: its peer is lost or broke the protocol.
    fn failed(&self, endpoint: usize, why: &Error);
    /// Something worth a verbose line that concerns no endpoint.
    fn note(&self, what: &str);
    /// A rank this engine has no endpoint for connected (Open MPI adds
    /// peers on other nodes lazily, at first send): the owner may add it
    /// now ([`Engine::add_endpoint`]); false if it will not.
    fn unknown_rank(&self, name: u64) -> bool;
}

/// What became of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// All bytes left or were copied: the caller's buffers are free.
    Done,
    /// Part of the caller's buffers is still to be written; they must
    /// stay valid until [`Events::completed`] names the send.
    Queued,
}

/// An endpoint's handle.
pub type EndpointId = u32;

/// At most this many accepted connections wait for their hello or for
/// their rank's endpoint; beyond, the oldest are dropped.
const MAX_STRAYS: usize = 1024;
/// Reads per endpoint and progress call (fairness between peers).
const READS_PER_PROGRESS: usize = 4;
/// The listener is polled every this many progress calls while a peer
/// has not connected to us yet: accepting is rare (once per peer) and
/// each poll costs a system call.
const ACCEPT_EVERY: u32 = 16;
/// ... and this often once every known peer has (for ranks added later).
const ACCEPT_IDLE_EVERY: u32 = 1024;

enum OutState {
    Idle,
    /// Connecting to this domid (the table's, at connect time).
    Connecting(XenStream, u32),
    Open(XenStream),
    Closed,
}

enum Part {
    Owned(Vec<u8>),
    Header([u8; HELLO_LEN], usize),
    Borrowed(Borrowed),
}

impl Part {
    fn bytes(&self) -> &[u8] {
        match self {
            Part::Owned(v) => v,
            Part::Header(b, n) => &b[..*n],
            Part::Borrowed(b) => b.as_slice(),
        }
    }
}

struct Queued {
    parts: Vec<Part>,
    sent: usize,
    total: usize,
    cookie: Option<usize>,
    /// A fragment (not the hello or the bye).
    fragment: bool,
}

impl Queued {
    fn fragment(parts: Vec<Part>, cookie: Option<usize>) -> Queued {
        let total = parts.iter().map(|p| p.bytes().len()).sum();
        Queued {
            parts,
            sent: 0,
            total,
            cookie,
            fragment: true,
        }
    }

    /// The hello or the bye.
    fn control(bytes: [u8; HELLO_LEN], len: usize) -> Queued {
        Queued {
            fragment: false,
            ..Queued::fragment(vec![Part::Header(bytes, len)], None)
        }
    }

    /// The unsent bytes as slices for one `writev`.
    fn unsent(&self) -> Vec<IoSlice<'_>> {
        let mut skip = self.sent;
        let mut v = Vec::with_capacity(self.parts.len());
        for p in &self.parts {
            let b = p.bytes();
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            v.push(IoSlice::new(&b[skip..]));
            skip = 0;
        }
        v
    }
}

struct Outgoing {
    state: OutState,
    queue: VecDeque<Queued>,
}

struct Incoming {
    stream: Option<XenStream>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    bye: bool,
}

struct Endpoint {
    name: u64,
    card: Card,
    cookie: usize,
    out: RefCell<Outgoing>,
    inc: RefCell<Incoming>,
    failed: Cell<bool>,
}

struct Stray {
    stream: Option<XenStream>,
    hello: [u8; HELLO_LEN],
    got: usize,
    name: Option<u64>,
    /// Whether the owner was asked to add the rank ([`Events::unknown_rank`]).
    asked: bool,
}

/// One rank's side of the BTL.
pub struct Engine {
    listener: XenListener,
    card: Card,
    name: u64,
    discovery: Option<Discovery>,
    config: Config,
    endpoints: RefCell<Vec<Option<Rc<Endpoint>>>>,
    strays: RefCell<Vec<Stray>>,
    ticks: Cell<u32>,
    busy: Cell<bool>,
    backend: String,
    /// Lifecycle lines (connecting, connected, attached) waiting for the
    /// next progress call to hand them to [`Events::note`].
    notes: RefCell<Vec<String>>,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl Engine {
    /// Binds this rank's listener and reads who and where it is: its
    /// card, to publish through the modex. `name` is the rank's Open MPI
    /// process name.
    pub fn open(name: u64, config: Config) -> Result<Engine, Error> {
        let report = libxensock::backend();
        let opts = SocketOptions {
            recv_buffer: config.recv_buffer,
            backlog: Some(256),
        };
        let listener =
            XenListener::bind_with(SockAddrXen::new(libxensock::DOMID_SELF, PORT_ANY), opts)
                .map_err(|e| {
                    Error::Unavailable(format!("bind: {e}; {}", report.reasons.join("; ")))
                })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Unavailable(format!("listener: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::Unavailable(format!("listener address: {e}")))?;
        let uuid = own_uuid().unwrap_or_default();
        let card = Card {
            domid: local.domid,
            port: local.port,
            uuid,
            addrs: xensock_discovery::advert::local_addresses().unwrap_or_default(),
        };
        Ok(Engine {
            listener,
            card,
            name,
            discovery: Discovery::from_env().ok(),
            config,
            endpoints: RefCell::new(Vec::new()),
            strays: RefCell::new(Vec::new()),
            ticks: Cell::new(0),
            busy: Cell::new(false),
            backend: report.kind.to_string(),
            notes: RefCell::new(Vec::new()),
        })
    }

    fn trace(&self, line: impl FnOnce() -> String) {
        if let Ok(mut n) = self.notes.try_borrow_mut() {
            n.push(line());
        }
    }

    /// This rank's card.
    pub fn card(&self) -> &Card {
        &self.card
    }

    /// Which backend carries the connections.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Whether this BTL should carry traffic to the rank that published
    /// `peer`: another guest on this host. `Err` says why not.
    pub fn reachable(&self, peer: &Card) -> Result<u32, String> {
        if self.card.same_guest(peer) {
            return Err("same guest (shared memory is faster)".into());
        }
        self.current_domid(peer)
    }

    /// The peer's domid now: the co-residency table by UUID (a restored
    /// or migrated guest has a new domid), else by address.
    fn current_domid(&self, peer: &Card) -> Result<u32, String> {
        let Some(d) = &self.discovery else {
            return Err("no co-residency table (no dom0 agent, no XENSOCK_PEERS)".into());
        };
        if !peer.uuid.is_empty() {
            match d.lookup_uuid(&peer.uuid) {
                Ok(Some(l)) => return Ok(l.domid.map_or(peer.domid, u32::from)),
                Ok(None) => {}
                Err(e) => return Err(format!("co-residency table: {e}")),
            }
        }
        for ip in &peer.addrs {
            match d.lookup_ip(*ip) {
                Ok(Some(l)) => return Ok(l.domid.map_or(peer.domid, u32::from)),
                Ok(None) => {}
                Err(e) => return Err(format!("co-residency table: {e}")),
            }
        }
        Err(format!(
            "domain {} ({}) is not co-resident",
            peer.domid,
            peer.uuid_or("no uuid")
        ))
    }

    /// Adds the rank named `name` that published `card`; `cookie` comes
    /// back in [`Events`] calls about it.
    pub fn add_endpoint(&self, name: u64, card: Card, cookie: usize) -> EndpointId {
        let ep = Rc::new(Endpoint {
            name,
            card,
            cookie,
            out: RefCell::new(Outgoing {
                state: OutState::Idle,
                queue: VecDeque::new(),
            }),
            inc: RefCell::new(Incoming {
                stream: None,
                buf: Vec::new(),
                start: 0,
                end: 0,
                bye: false,
            }),
            failed: Cell::new(false),
        });
        let mut eps = self.endpoints.borrow_mut();
        match eps.iter().position(Option::is_none) {
            Some(i) => {
                eps[i] = Some(ep);
                i as EndpointId
            }
            None => {
                eps.push(Some(ep));
                (eps.len() - 1) as EndpointId
            }
        }
    }

    fn by_name(&self, name: u64) -> Option<Rc<Endpoint>> {
        self.endpoints
            .borrow()
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .cloned()
    }

    fn endpoint(&self, id: EndpointId) -> Result<Rc<Endpoint>, Error> {
        self.endpoints
            .borrow()
            .get(id as usize)
            .and_then(Clone::clone)
            .ok_or(Error::NoEndpoint(id))
    }

    /// Sends one fragment; bytes the connection cannot take now are
    /// copied and leave from [`Engine::progress`].
    pub fn send_copy(&self, id: EndpointId, tag: u8, parts: &[&[u8]]) -> Result<(), Error> {
        self.send(id, tag, parts, None).map(|_| ())
    }

    /// Sends one fragment, keeping the caller's buffers for what the
    /// connection cannot take now.
    ///
    /// # Safety
    /// When this returns [`Sent::Queued`], the memory of `parts` must stay
    /// valid and unchanged until [`Events::completed`] is called with
    /// `cookie`.
    // an unsafe contract, no unsafe block: sys.rs holds the caller's bytes
    #[allow(unsafe_code)]
    pub unsafe fn send_in_place(
        &self,
        id: EndpointId,
        tag: u8,
        parts: &[&[u8]],
        cookie: usize,
    ) -> Result<Sent, Error> {
        self.send(id, tag, parts, Some(cookie))
    }

    fn send(
        &self,
        id: EndpointId,
        tag: u8,
        parts: &[&[u8]],
        cookie: Option<usize>,
    ) -> Result<Sent, Error> {
        let ep = self.endpoint(id)?;
        if ep.failed.get() {
            return Err(Error::PeerLost(format!(
                "rank {:#x} failed earlier",
                ep.name
            )));
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.config.max_payload {
            return Err(Error::TooLarge {
                len,
                limit: self.config.max_payload,
            });
        }
        let header = FrameHeader::data(tag, len)?.encode();
        let Ok(mut out) = ep.out.try_borrow_mut() else {
            return Err(Error::PeerLost(format!(
                "rank {:#x}: send while its queue is being written",
                ep.name
            )));
        };
        if matches!(out.state, OutState::Idle) {
            self.start_connect(&ep, &mut out)?;
        }
        let mut sent = 0;
        if let (OutState::Open(s), true) = (&out.state, out.queue.is_empty()) {
            let mut slices = Vec::with_capacity(parts.len() + 1);
            slices.push(IoSlice::new(&header));
            slices.extend(parts.iter().map(|p| IoSlice::new(p)));
            // A failed write queues everything: the next progress meets
            // the error again and fails the endpoint with a report.
            sent = write_all_now(s, &slices).unwrap_or(0);
            if sent == HEADER_LEN + len {
                return Ok(Sent::Done);
            }
        }
        // Queue the rest: the header's remainder by value, the payload by
        // reference when the caller keeps it, else copied.
        let mut q = Vec::with_capacity(parts.len() + 1);
        let mut skip = sent;
        let mut hdr = [0u8; HELLO_LEN];
        if skip < HEADER_LEN {
            hdr[..HEADER_LEN - skip].copy_from_slice(&header[skip..]);
            q.push(Part::Header(hdr, HEADER_LEN - skip));
            skip = 0;
        } else {
            skip -= HEADER_LEN;
        }
        for p in parts {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            let rest = &p[skip..];
            skip = 0;
            q.push(match cookie {
                Some(_) => Part::Borrowed(Borrowed::new(rest)),
                None => Part::Owned(rest.to_vec()),
            });
        }
        let borrowed = q.iter().any(|p| matches!(p, Part::Borrowed(_)));
        out.queue
            .push_back(Queued::fragment(q, cookie.filter(|_| borrowed)));
        Ok(if borrowed { Sent::Queued } else { Sent::Done })
    }

    fn start_connect(&self, ep: &Endpoint, out: &mut Outgoing) -> Result<(), Error> {
        let domid = self.current_domid(&ep.card).map_err(Error::PeerLost)?;
        let opts = SocketOptions {
            recv_buffer: self.config.recv_buffer,
            backlog: None,
        };
        let addr = SockAddrXen::new(domid, ep.card.port);
        let stream =
            XenStream::connect_nonblocking(addr, opts).map_err(|source| Error::Connect {
                domid,
                port: ep.card.port,
                source,
            })?;
        self.trace(|| {
            format!(
                "rank {:#x}: connecting to domain {domid} port {}",
                ep.name, ep.card.port
            )
        });
        let hello = Hello { name: self.name }.encode();
        out.queue.push_front(Queued::control(hello, HELLO_LEN));
        out.state = OutState::Connecting(stream, domid);
        Ok(())
    }

    /// Moves bytes: accepts connections, writes queued fragments, reads
    /// and delivers arrived ones. Returns how many fragments and
    /// completions it handled.
    pub fn progress(&self, events: &dyn Events) -> usize {
        if self.busy.replace(true) {
            return 0;
        }
        let tick = self.ticks.get().wrapping_add(1);
        self.ticks.set(tick);
        let mut n = 0;
        let accept_now = tick.is_multiple_of(ACCEPT_IDLE_EVERY)
            || (tick.is_multiple_of(ACCEPT_EVERY) && self.awaiting_peer());
        if accept_now || !self.strays.borrow().is_empty() {
            self.accept(events);
        }
        let count = self.endpoints.borrow().len();
        for i in 0..count {
            let Some(ep) = self.endpoints.borrow().get(i).and_then(Clone::clone) else {
                continue;
            };
            if ep.failed.get() {
                continue;
            }
            match self.flush(&ep, events) {
                Ok(k) => n += k,
                Err(e) => {
                    self.fail(&ep, e, events);
                    continue;
                }
            }
            match self.pump(&ep, events) {
                Ok(k) => n += k,
                Err(e) => self.fail(&ep, e, events),
            }
        }
        if !self.notes.borrow().is_empty() {
            let notes = std::mem::take(&mut *self.notes.borrow_mut());
            for line in notes {
                events.note(&line);
            }
        }
        self.busy.set(false);
        n
    }

    /// Whether some endpoint's peer has not connected to us yet.
    fn awaiting_peer(&self) -> bool {
        self.endpoints.borrow().iter().flatten().any(|e| {
            !e.failed.get()
                && e.inc
                    .try_borrow()
                    .is_ok_and(|i| i.stream.is_none() && !i.bye)
        })
    }

    fn accept(&self, events: &dyn Events) {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if let Err(e) = stream.set_nonblocking(true) {
                        events.note(&format!("connection from {from}: {e}"));
                        continue;
                    }
                    let mut strays = self.strays.borrow_mut();
                    if strays.len() >= MAX_STRAYS {
                        strays.remove(0);
                        events.note("too many connections without a rank; dropped the oldest");
                    }
                    strays.push(Stray {
                        stream: Some(stream),
                        hello: [0; HELLO_LEN],
                        got: 0,
                        name: None,
                        asked: false,
                    });
                }
                Err(e) if would_block(&e) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    events.note(&format!("accept: {e}"));
                    break;
                }
            }
        }
        let mut strays = self.strays.borrow_mut();
        let mut i = 0;
        while i < strays.len() {
            let keep = self.claim(&mut strays[i], events);
            if keep {
                i += 1;
            } else {
                strays.swap_remove(i);
            }
        }
    }

    /// Reads a stray's hello and hands it to its rank's endpoint. False
    /// when the stray is done with (attached, or dropped).
    fn claim(&self, s: &mut Stray, events: &dyn Events) -> bool {
        let Some(stream) = s.stream.as_ref() else {
            return false;
        };
        if s.name.is_none() {
            loop {
                match (&*stream).read(&mut s.hello[s.got..]) {
                    Ok(0) => return false,
                    Ok(k) => {
                        s.got += k;
                        if s.got == HELLO_LEN {
                            break;
                        }
                    }
                    Err(e) if would_block(&e) => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        events.note(&format!("connection before its hello: {e}"));
                        return false;
                    }
                }
            }
            match Hello::decode(&s.hello) {
                Ok(h) => s.name = Some(h.name),
                Err(e) => {
                    events.note(&format!("dropped a connection: {e}"));
                    return false;
                }
            }
        }
        let name = s.name.unwrap_or_default();
        let mut ep = self.by_name(name);
        if ep.is_none() && !s.asked {
            s.asked = true;
            ep = if events.unknown_rank(name) {
                self.by_name(name)
            } else {
                None
            };
            if ep.is_none() {
                // Unread, its sender would fill the ring and wait for
                // ever; closed, it fails that endpoint with a report.
                events.note(&format!(
                    "a connection from rank {name:#x}, which this BTL cannot reach; closed"
                ));
                return false;
            }
        }
        let Some(ep) = ep else { return true };
        let Ok(mut inc) = ep.inc.try_borrow_mut() else {
            return true;
        };
        if inc.stream.is_some() {
            events.note(&format!("a second connection from rank {name:#x}; dropped"));
            return false;
        }
        inc.stream = s.stream.take();
        self.trace(|| format!("rank {name:#x}: its connection is attached"));
        inc.buf = vec![0; HEADER_LEN + self.config.max_payload];
        false
    }

    /// Writes what the endpoint has queued.
    fn flush(&self, ep: &Endpoint, events: &dyn Events) -> Result<usize, Error> {
        let mut done = Vec::new();
        {
            let Ok(mut out) = ep.out.try_borrow_mut() else {
                return Ok(0);
            };
            if out.queue.is_empty() {
                return Ok(0);
            }
            out.state = match std::mem::replace(&mut out.state, OutState::Closed) {
                OutState::Connecting(s, domid) => match s.finish_connect() {
                    Ok(()) => {
                        self.trace(|| format!("rank {:#x}: connected", ep.name));
                        OutState::Open(s)
                    }
                    Err(e) if would_block(&e) => {
                        out.state = OutState::Connecting(s, domid);
                        return Ok(0);
                    }
                    Err(source) => {
                        return Err(Error::Connect {
                            domid,
                            port: ep.card.port,
                            source,
                        })
                    }
                },
                other => other,
            };
            let Outgoing { state, queue } = &mut *out;
            let OutState::Open(s) = state else {
                return Ok(0);
            };
            while let Some(q) = queue.front_mut() {
                let wrote = write_all_now(s, &q.unsent())
                    .map_err(|e| Error::PeerLost(format!("send: {e}")))?;
                q.sent += wrote;
                if q.sent < q.total {
                    break;
                }
                if let Some(c) = queue.pop_front().and_then(|q| q.cookie) {
                    done.push(c);
                }
            }
        }
        for c in &done {
            events.completed(*c, true);
        }
        Ok(done.len())
    }

    /// Reads and delivers what arrived from the endpoint's peer.
    fn pump(&self, ep: &Endpoint, events: &dyn Events) -> Result<usize, Error> {
        let Ok(mut inc) = ep.inc.try_borrow_mut() else {
            return Ok(0);
        };
        let Incoming {
            stream,
            buf,
            start,
            end,
            bye,
        } = &mut *inc;
        let Some(s) = stream.as_ref() else {
            return Ok(0);
        };
        if self.config.check_readable
            && s.backend_kind() == BackendKind::Kernel
            && *start == *end
            && matches!(crate::sys::readable(s.as_fd()), Ok(0))
        {
            return Ok(0);
        }
        let mut delivered = 0;
        for _ in 0..READS_PER_PROGRESS {
            if *start > 0 && *start == *end {
                *start = 0;
                *end = 0;
            } else if *start > 0 && buf.len() - *end < HEADER_LEN + 4096 {
                buf.copy_within(*start..*end, 0);
                *end -= *start;
                *start = 0;
            }
            let room = buf.len() - *end;
            if room == 0 {
                break;
            }
            let k = match (&*s).read(&mut buf[*end..]) {
                Ok(0) if *bye && *start == *end => {
                    *stream = None;
                    return Ok(delivered);
                }
                Ok(0) => {
                    return Err(Error::PeerLost(if *start == *end {
                        "the connection ended without a bye".into()
                    } else {
                        "the connection ended inside a fragment".into()
                    }))
                }
                Ok(k) => k,
                Err(e) if would_block(&e) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::PeerLost(format!("receive: {e}"))),
            };
            *end += k;
            // A read that did not fill the room took all there was: the
            // next would only say so, at the price of a system call on the
            // latency path.
            let drained = k < room;
            while let Some((h, size)) = next_frame(&buf[*start..*end], self.config.max_payload)? {
                if *bye {
                    return Err(Error::Protocol("a frame after the bye".into()));
                }
                let body = *start + HEADER_LEN;
                match h.kind {
                    FrameKind::Data => {
                        events.deliver(ep.cookie, h.tag, &buf[body..*start + size]);
                        delivered += 1;
                    }
                    FrameKind::Bye => *bye = true,
                }
                *start += size;
            }
            if drained {
                break;
            }
        }
        Ok(delivered)
    }

    fn fail(&self, ep: &Endpoint, why: Error, events: &dyn Events) {
        if ep.failed.replace(true) {
            return;
        }
        let dropped: Vec<usize> = match ep.out.try_borrow_mut() {
            Ok(mut out) => {
                out.state = OutState::Closed;
                out.queue.drain(..).filter_map(|q| q.cookie).collect()
            }
            Err(_) => Vec::new(),
        };
        if let Ok(mut inc) = ep.inc.try_borrow_mut() {
            inc.stream = None;
        }
        // The report first: Open MPI may abort the process at the first
        // failed completion, and the reason must be out by then.
        events.failed(ep.cookie, &why);
        for c in dropped {
            events.completed(c, false);
        }
    }

    /// Says goodbye to the endpoint's peer and forgets it: queued
    /// fragments leave first (up to the configured linger), then a bye,
    /// so the peer can tell a finished rank from a lost one.
    pub fn remove_endpoint(&self, id: EndpointId, events: &dyn Events) {
        let Ok(ep) = self.endpoint(id) else { return };
        self.say_bye(&ep, events);
        if let Some(slot) = self.endpoints.borrow_mut().get_mut(id as usize) {
            *slot = None;
        }
    }

    fn say_bye(&self, ep: &Endpoint, events: &dyn Events) {
        if ep.failed.get() {
            return;
        }
        let bye = FrameHeader::bye().encode();
        let mut hdr = [0u8; HELLO_LEN];
        hdr[..HEADER_LEN].copy_from_slice(&bye);
        if let Ok(mut out) = ep.out.try_borrow_mut() {
            if matches!(out.state, OutState::Idle | OutState::Closed) {
                return;
            }
            out.queue.push_back(Queued::control(hdr, HEADER_LEN));
        }
        let deadline = Instant::now() + self.config.linger;
        // Fragments the peer never got.
        let data_left = || {
            ep.out
                .try_borrow()
                .is_ok_and(|o| o.queue.iter().any(|q| q.fragment))
        };
        loop {
            if let Err(e) = self.flush(ep, events) {
                if data_left() {
                    self.fail(ep, e, events);
                } else {
                    // Both ranks finalize at once: the peer may close its
                    // end before our bye arrives, and has all it wanted by
                    // then (Open MPI's finalize fences before it removes
                    // peers).
                    events.note(&format!("rank {:#x}: bye not sent: {e}", ep.name));
                    ep.failed.set(true);
                }
                return;
            }
            let Ok(out) = ep.out.try_borrow() else { return };
            if out.queue.is_empty() {
                if let OutState::Open(s) = &out.state {
                    let _ = s.shutdown(Shutdown::Write);
                }
                return;
            }
            drop(out);
            if Instant::now() >= deadline {
                let why = format!("still queued after {:?} of linger", self.config.linger);
                if data_left() {
                    // Not delivered: said as a failure, never dropped quietly.
                    self.fail(ep, Error::PeerLost(format!("fragments {why}")), events);
                } else {
                    events.note(&format!("rank {:#x}: bye {why}", ep.name));
                }
                return;
            }
            // The peer is in finalize too and reading; give it the CPU.
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Says goodbye to every peer (finalize).
    pub fn close(&self, events: &dyn Events) {
        let ids: Vec<EndpointId> = self
            .endpoints
            .borrow()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_some())
            .map(|(i, _)| i as EndpointId)
            .collect();
        for id in ids {
            self.remove_endpoint(id, events);
        }
        self.strays.borrow_mut().clear();
    }
}

/// Writes as much of `slices` as the stream takes without waiting.
fn write_all_now(s: &XenStream, slices: &[IoSlice<'_>]) -> io::Result<usize> {
    let total: usize = slices.iter().map(|b| b.len()).sum();
    let mut sent = 0;
    while sent < total {
        let rest = advance(slices, sent);
        match (&*s).write_vectored(&rest) {
            Ok(0) if sent == 0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(0) => break,
            Ok(k) => sent += k,
            Err(e) if would_block(&e) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // What left before the error counts; the error comes back
            // at the next write.
            Err(_) if sent > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

fn advance<'a>(slices: &'a [IoSlice<'a>], mut skip: usize) -> Vec<IoSlice<'a>> {
    let mut v = Vec::with_capacity(slices.len());
    for b in slices {
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        v.push(IoSlice::new(&b[skip..]));
        skip = 0;
    }
    v
}

/// This guest's UUID, from its `vm` node.
fn own_uuid() -> Option<String> {
    let xs = XsClient::open().ok()?;
    let domid = xs.read_string(xensock_discovery::layout::DOMID).ok()?;
    xensock_discovery::agent::domain_uuid(&xs, domid.trim()).ok()
}
