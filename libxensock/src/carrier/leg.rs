// SPDX-License-Identifier: MIT OR Apache-2.0
//! The TCP leg's listening side: one listener per transport that takes
//! connections from peers, authenticates each by its first frame
//! (`TcpHello{conn_id, cookie}`) and hands it to the connection it names.
//!
//! One thread serves every pending socket with `poll`, reading at most the
//! 16 bytes of the hello from each, so a slow or silent client costs a slot
//! until its deadline and never blocks the others. A wrong cookie, an
//! unknown connection id, a malformed first frame or a timeout closes the
//! socket and is counted.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xensock_proto::ctrl::{TcpEndpoint, HELLO_LEN};
use xensock_proto::leg::{admit, Admission, Refusal, HELLO_TIMEOUT_MS};

use crate::sys::eventfd::EventFd;

/// Where an authenticated leg goes.
pub(crate) type Deliver = Arc<dyn Fn(TcpStream) + Send + Sync>;

struct Registration {
    cookie: u64,
    deliver: Deliver,
}

/// Counters of what the listener refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LegStats {
    /// Legs authenticated and handed over.
    pub accepted: u64,
    /// Right connection id, wrong cookie.
    pub bad_cookie: u64,
    /// No connection with that id.
    pub unknown_conn: u64,
    /// First frame malformed or not a `TcpHello`, or closed before it.
    pub malformed: u64,
    /// No complete hello within the deadline (or evicted when too many
    /// were pending).
    pub timed_out: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    bad_cookie: AtomicU64,
    unknown_conn: AtomicU64,
    malformed: AtomicU64,
    timed_out: AtomicU64,
}

struct Shared {
    registry: Mutex<HashMap<u32, Registration>>,
    counters: Counters,
    stop: AtomicBool,
    wake: EventFd,
}

/// Listener settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LegListenerConfig {
    /// How long a client may take to send its hello.
    pub hello_timeout: Duration,
    /// Unauthenticated sockets held at once; the oldest is dropped beyond.
    pub max_pending: usize,
}

impl Default for LegListenerConfig {
    fn default() -> Self {
        LegListenerConfig {
            hello_timeout: Duration::from_millis(HELLO_TIMEOUT_MS),
            max_pending: 256,
        }
    }
}

/// The per-transport TCP listener for connection legs.
pub(crate) struct LegListener {
    shared: Arc<Shared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl LegListener {
    /// Listens on `ip` at an ephemeral port.
    pub(crate) fn bind(ip: IpAddr, config: LegListenerConfig) -> io::Result<LegListener> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            registry: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            wake: EventFd::new()?,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("xensock-legs".into())
            .spawn(move || serve(listener, s, config))?;
        Ok(LegListener {
            shared,
            addr,
            thread: Some(thread),
        })
    }

    /// The address peers connect to.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address as it travels in `ConnectRequest`/`ConnectAccept`.
    pub(crate) fn endpoint(&self) -> TcpEndpoint {
        endpoint_of(self.addr)
    }

    /// Routes legs that present `conn_id` and `cookie` to `deliver`,
    /// including one that arrived shortly before (see [`serve`]).
    pub(crate) fn register(&self, conn_id: u32, cookie: u64, deliver: Deliver) {
        lock(&self.shared.registry).insert(conn_id, Registration { cookie, deliver });
        self.shared.wake.signal();
    }

    /// Stops routing legs for `conn_id`.
    pub(crate) fn unregister(&self, conn_id: u32) {
        lock(&self.shared.registry).remove(&conn_id);
    }

    /// Counters so far.
    pub(crate) fn stats(&self) -> LegStats {
        let c = &self.shared.counters;
        LegStats {
            accepted: c.accepted.load(Ordering::Relaxed),
            bad_cookie: c.bad_cookie.load(Ordering::Relaxed),
            unknown_conn: c.unknown_conn.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            timed_out: c.timed_out.load(Ordering::Relaxed),
        }
    }
}

impl Drop for LegListener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `TcpEndpoint` for `addr` (IPv4 as IPv4-mapped IPv6).
pub(crate) fn endpoint_of(addr: SocketAddr) -> TcpEndpoint {
    let v6 = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    TcpEndpoint {
        addr: v6.octets(),
        port: addr.port(),
    }
}

/// The socket address of `ep`, `None` when the peer has no TCP fallback.
pub(crate) fn socket_addr_of(ep: &TcpEndpoint) -> Option<SocketAddr> {
    if ep.port == 0 {
        return None;
    }
    let v6 = Ipv6Addr::from(ep.addr);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    };
    Some(SocketAddr::new(ip, ep.port))
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock is a bug elsewhere; the data is still
    // consistent enough to shut down with.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Pending {
    sock: TcpStream,
    buf: [u8; HELLO_LEN],
    have: usize,
    deadline: Instant,
}

/// A leg whose complete hello named a connection not registered (yet):
/// parked until its deadline ([`admit`]).
struct Parked {
    hello: [u8; HELLO_LEN],
    sock: TcpStream,
    deadline: Instant,
}

impl Shared {
    /// proto's admission step for a complete hello, done: the leg handed
    /// over, closed and counted, or given back to park.
    fn admit(&self, p: Parked) -> Option<Parked> {
        // the deadline on proto's clock: now is 0, the deadline what is left
        let left_ms = p
            .deadline
            .saturating_duration_since(Instant::now())
            .as_millis();
        let registry = lock(&self.registry);
        let verdict = admit(
            &p.hello,
            |id| registry.get(&id).map(|r| r.cookie),
            0,
            u64::try_from(left_ms).unwrap_or(u64::MAX),
        );
        let counter = match verdict {
            Admission::Accept { conn_id } => {
                let deliver = registry.get(&conn_id).map(|r| r.deliver.clone());
                // Delivery may take the connection's lock: not under ours.
                drop(registry);
                if let Some(deliver) = deliver {
                    self.counters.accepted.fetch_add(1, Ordering::Relaxed);
                    deliver(p.sock);
                }
                return None;
            }
            Admission::Park { .. } => return Some(p),
            Admission::Refuse(Refusal::Malformed) => &self.counters.malformed,
            Admission::Refuse(Refusal::BadCookie) => &self.counters.bad_cookie,
            Admission::Refuse(Refusal::UnknownConn) => &self.counters.unknown_conn,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// The listener thread. Legs are handed over only after a complete,
/// well-formed hello with the right cookie for a registered connection.
fn serve(listener: TcpListener, shared: Arc<Shared>, config: LegListenerConfig) {
    let mut pending: Vec<Pending> = Vec::new();
    let mut parked: Vec<Parked> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let timeout = pending
            .iter()
            .map(|p| p.deadline)
            .chain(parked.iter().map(|p| p.deadline))
            .map(|d| d.saturating_duration_since(now))
            .min()
            .map(|d| d.as_millis().clamp(1, i32::MAX as u128) as i32)
            .unwrap_or(-1);
        let mut fds = vec![
            libc::pollfd {
                fd: shared.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        fds.extend(pending.iter().map(|p| libc::pollfd {
            fd: p.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let r = crate::sys::poll(&mut fds, timeout);
        if r < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // poll only fails on EINTR/ENOMEM/EFAULT/EINVAL: back off and retry.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        shared.wake.drain();
        // Pending sockets first (indices match fds[2..]).
        let mut keep = Vec::with_capacity(pending.len());
        for (p, fd) in pending.into_iter().zip(&fds[2..]) {
            if fd.revents == 0 {
                if Instant::now() >= p.deadline {
                    shared.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                } else {
                    keep.push(p);
                }
                continue;
            }
            match read_hello(p, &shared) {
                Hello::Incomplete(p) if Instant::now() < p.deadline => keep.push(p),
                Hello::Incomplete(_) => {
                    shared.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                }
                Hello::Unknown(p) => parked.push(p),
                Hello::Done => {}
            }
        }
        pending = keep;
        parked = parked.into_iter().filter_map(|p| shared.admit(p)).collect();
        // New connections.
        if fds[1].revents != 0 {
            loop {
                match listener.accept() {
                    Ok((sock, _)) => {
                        if sock.set_nonblocking(true).is_err() {
                            continue;
                        }
                        if pending.len() >= config.max_pending.max(1) {
                            pending.remove(0);
                            shared.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                        }
                        pending.push(Pending {
                            sock,
                            buf: [0; HELLO_LEN],
                            have: 0,
                            deadline: Instant::now() + config.hello_timeout,
                        });
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // ECONNABORTED, EMFILE, ENOBUFS: the listener stays
                    // readable, so back off instead of spinning on it.
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        break;
                    }
                }
            }
        }
    }
}

enum Hello {
    Incomplete(Pending),
    Unknown(Parked),
    Done,
}

/// Reads what the client sent and acts on a complete hello.
fn read_hello(mut p: Pending, shared: &Shared) -> Hello {
    loop {
        match (&p.sock).read(&mut p.buf[p.have..]) {
            Ok(0) => {
                shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
                return Hello::Done;
            }
            Ok(n) => {
                p.have += n;
                if p.have == HELLO_LEN {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Hello::Incomplete(p),
            Err(_) => {
                shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
                return Hello::Done;
            }
        }
    }
    match shared.admit(Parked {
        hello: p.buf,
        sock: p.sock,
        deadline: p.deadline,
    }) {
        Some(parked) => Hello::Unknown(parked),
        None => Hello::Done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip() {
        for s in ["127.0.0.1:4000", "[::1]:5000", "[fe80::1]:1"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(socket_addr_of(&endpoint_of(a)), Some(a));
        }
        assert_eq!(socket_addr_of(&TcpEndpoint::NONE), None);
    }
}
