// SPDX-License-Identifier: MIT OR Apache-2.0
//! A XenStore client: the `xs_wire.h` protocol over the xenstored unix
//! socket or `/dev/xen/xenbus`, with a blocking API ([`XsClient`]) and an
//! async one ([`AsyncXsClient`], watches as a [`futures_core::Stream`]).
//!
//! One reader thread per connection routes replies to their requests by
//! request id and watch events to their watches by token, so any number of
//! threads or tasks may use one client while events arrive. On a xenstored
//! socket their requests are in flight together. On `/dev/xen/xenbus`
//! (the device rules):
//! - One request is in flight at a time: a request is written only once
//!   the previous one has its reply. Linux's device queues a request's
//!   body by reference to the open file's one message buffer
//!   (`xenbus_dev_request_and_reply`), and the domain's `xenbus` thread
//!   copies it to the ring later, so a second request written meanwhile
//!   overwrites the first's body under the first's header. xenstored then
//!   reads a malformed request; Xen 4.17's aborts on some
//!   (`consider_message: Assertion 'conn->in == NULL' failed`), and with
//!   it every guest's XenStore stops (`docs/discovery.md`). libxenstore
//!   never meets this: it waits for each reply before the next request.
//! - That also keeps a WATCH or UNWATCH from being written while another
//!   request waits for its reply, which deadlocks the whole guest's
//!   XenStore (see `Core::send`).
//! - Transactions are opened one at a time per guest (a lock file held
//!   from start to end, [`TX_LOCK_ENV`]): the guest's one connection may
//!   hold 10 open transactions, shared by its kernel and every process,
//!   and Linux counts a refused user-space `TRANSACTION_START` twice on
//!   its way out (`xs_request_exit`), after which the guest can never
//!   suspend again (`xl save` and `xl migrate` time out).
//!
//! ```no_run
//! use xensock_discovery::xs::XsClient;
//! let xs = XsClient::open()?;          // XENSTORED_PATH, socket, or xenbus
//! xs.write("data/hello", "world")?;    // relative to /local/domain/<me>
//! let mut w = xs.watch("data")?;       // fires once at once, then on changes
//! let first = w.recv()?;
//! assert_eq!(first.path, "data");
//! xs.transaction(|tx| {
//!     let n: u32 = tx.read_string("data/n").map(|s| s.parse().unwrap_or(0)).unwrap_or(0);
//!     tx.write("data/n", (n + 1).to_string())
//! })?;
//! # Ok::<(), xensock_discovery::xs::XsError>(())
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xensock_xenif::xs_wire::{
    encode_message, split_strings, Header, MsgType, Perm, XsErrno, HEADER_LEN, PAYLOAD_MAX,
};

/// Where xenstored listens by default.
pub const DEFAULT_SOCKET: &str = "/var/run/xenstored/socket";
/// The guest's XenStore device.
pub const XENBUS_DEVICE: &str = "/dev/xen/xenbus";
/// Environment variable that overrides the path (as libxenstore does).
pub const ENV_XENSTORED_PATH: &str = "XENSTORED_PATH";

/// Transaction retries on `EAGAIN` before giving up.
pub const MAX_TRANSACTION_ATTEMPTS: usize = 64;

/// XenStore errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XsError {
    /// xenstored refused the request.
    #[error("xenstore {op} {path}: {errno}")]
    Daemon {
        /// The errno xenstored reported.
        errno: XsErrno,
        /// The operation.
        op: &'static str,
        /// The path (or argument) of the request.
        path: String,
    },
    /// The connection failed.
    #[error("xenstore connection: {0}")]
    Io(#[from] io::Error),
    /// The connection is closed (xenstored went away, or we were dropped).
    #[error("xenstore connection closed")]
    Closed,
    /// xenstored sent something that is not valid protocol.
    #[error("xenstore protocol error: {0}")]
    Protocol(String),
    /// A bad argument (NUL in a path, payload too long...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No XenStore to connect to.
    #[error("no XenStore available: {0}")]
    NotAvailable(String),
    /// A request of this connection went unanswered for the reply bound
    /// ([`REPLY_BOUND_ENV`]): the connection is given up (is xenstored
    /// alive?), and every request on it fails so from then on.
    #[error("xenstore {op} {path}: no answer within {after:?}; connection given up (is xenstored alive?)")]
    Unanswered {
        /// The operation.
        op: &'static str,
        /// The path (or argument) of the request.
        path: String,
        /// The bound that ran out.
        after: Duration,
    },
}

impl XsError {
    /// The xenstored errno, for [`XsError::Daemon`].
    pub fn errno(&self) -> Option<XsErrno> {
        match self {
            XsError::Daemon { errno, .. } => Some(*errno),
            _ => None,
        }
    }
    /// Whether xenstored reported `e`.
    pub fn is(&self, e: XsErrno) -> bool {
        self.errno() == Some(e)
    }
}

/// One watch event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// The path that changed (relative if the watch was relative).
    pub path: String,
    /// The watch's token.
    pub token: String,
}

enum ReplySink {
    Blocking(mpsc::SyncSender<Result<Vec<u8>, XsError>>),
    Async(tokio::sync::oneshot::Sender<Result<Vec<u8>, XsError>>),
    /// A request sent from `Drop` (unwatch, transaction abort): the reply
    /// is only counted, so that the connection knows it is quiet.
    Discard,
}

impl ReplySink {
    fn send(self, r: Result<Vec<u8>, XsError>) {
        match self {
            ReplySink::Blocking(s) => {
                let _ = s.send(r);
            }
            ReplySink::Async(s) => {
                let _ = s.send(r);
            }
            ReplySink::Discard => {}
        }
    }
}

struct Pending {
    ty: MsgType,
    op: &'static str,
    arg: String,
    sink: ReplySink,
    /// When it was written (the reply bound counts from here).
    sent: Instant,
}

/// A callback run on the connection's reader thread for each event of a
/// [`CallbackWatch`].
type EventCallback = Arc<dyn Fn(WatchEvent) + Send + Sync>;

enum EventSink {
    Blocking(mpsc::Sender<WatchEvent>),
    Async(tokio::sync::mpsc::UnboundedSender<WatchEvent>),
    Callback(EventCallback),
}

impl EventSink {
    fn send(&self, e: WatchEvent) {
        match self {
            EventSink::Blocking(s) => {
                let _ = s.send(e);
            }
            EventSink::Async(s) => {
                let _ = s.send(e);
            }
            EventSink::Callback(f) => f(e),
        }
    }
}

#[derive(Default)]
struct Routes {
    pending: HashMap<u32, Pending>,
    watches: HashMap<String, Arc<EventSink>>,
    closed: bool,
    /// The reply bound ran out on this connection (it is closed too).
    gave_up: Option<Duration>,
    /// A WATCH or UNWATCH is being written on a quiescing connection:
    /// nothing else may be sent until its write returns.
    watch_in_progress: bool,
}

/// Environment variable: how long a request may wait for xenstored's
/// answer, in milliseconds, before the connection is given up with
/// [`XsError::Unanswered`] (default 30000; 0 waits for ever). A dead
/// xenstored is then an error instead of a wait for ever. The connection
/// is not used again after that: on `/dev/xen/xenbus` a late answer to an
/// abandoned request, with a WATCH written meanwhile, would stop the
/// guest's whole xenbus (see `Core::send` in this module's source).
pub const REPLY_BOUND_ENV: &str = "XENSOCK_XS_REPLY_MS";
const REPLY_BOUND_DEFAULT: Duration = Duration::from_secs(30);

fn reply_bound_from_env() -> Duration {
    let Ok(v) = std::env::var(REPLY_BOUND_ENV) else {
        return REPLY_BOUND_DEFAULT;
    };
    match v.trim().parse::<u64>() {
        Ok(ms) => Duration::from_millis(ms),
        Err(_) => {
            tracing::warn!(
                "{REPLY_BOUND_ENV}={v:?} is not a number of milliseconds; using {REPLY_BOUND_DEFAULT:?}"
            );
            REPLY_BOUND_DEFAULT
        }
    }
}

use crate::tx_gate::TxGate;
pub use crate::tx_gate::TX_LOCK_ENV;
struct Core {
    fd: OwnedFd,
    write_lock: Mutex<()>,
    routes: Mutex<Routes>,
    /// Signalled when `routes.pending` shrinks or a watch write ends.
    quiet: Condvar,
    /// Linux's `/dev/xen/xenbus` rules (see the module notes).
    device_rules: bool,
    /// A unix socket (dom0's xenstored), not a device.
    is_socket: bool,
    next_req: AtomicU32,
    next_token: AtomicU64,
    wake: OwnedFd,
    reader: Mutex<Option<JoinHandle<()>>>,
    path: PathBuf,
    /// The reply bound in ms (0: none), read by the reader thread.
    reply_bound_ms: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Core {
    fn drop(&mut self) {
        crate::sys::eventfd_signal(self.wake.as_fd());
        if let Some(r) = lock(&self.reader).take() {
            // The reader itself may drop the last reference while routing a
            // message; it exits on its own then.
            if r.thread().id() != std::thread::current().id() {
                let _ = r.join();
            }
        }
    }
}

fn reply_error(p: &Pending, payload: &[u8]) -> XsError {
    match XsErrno::from_name(payload) {
        Some(errno) => XsError::Daemon {
            errno,
            op: p.op,
            path: p.arg.clone(),
        },
        None => XsError::Protocol(format!(
            "unknown error {:?}",
            String::from_utf8_lossy(payload)
        )),
    }
}

impl Core {
    /// Connects to a socket or a device. `device_rules` applies Linux's
    /// `/dev/xen/xenbus` rules (see [`Core::device_rules`]); `None`
    /// decides by the file type (a character device gets them).
    fn connect(path: &Path, device_rules: Option<bool>) -> Result<Arc<Core>, XsError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| XsError::NotAvailable(format!("{}: {e}", path.display())))?;
        let is_socket = meta.file_type().is_socket();
        let fd: OwnedFd = if is_socket {
            UnixStream::connect(path)?.into()
        } else {
            // (std opens with O_CLOEXEC)
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?
                .into()
        };
        let wake = crate::sys::eventfd()?;
        let core = Arc::new(Core {
            fd,
            write_lock: Mutex::new(()),
            routes: Mutex::new(Routes::default()),
            quiet: Condvar::new(),
            device_rules: device_rules.unwrap_or(!is_socket),
            is_socket,
            next_req: AtomicU32::new(1),
            next_token: AtomicU64::new(1),
            wake,
            reader: Mutex::new(None),
            path: path.to_path_buf(),
            reply_bound_ms: AtomicU64::new(
                u64::try_from(reply_bound_from_env().as_millis()).unwrap_or(u64::MAX),
            ),
        });
        let weak = Arc::downgrade(&core);
        let fd = core.fd.as_raw_fd();
        let wake = core.wake.as_raw_fd();
        let handle = std::thread::Builder::new()
            .name("xenstore-reader".into())
            .spawn(move || read_loop(weak, fd, wake))?;
        *lock(&core.reader) = Some(handle);
        Ok(core)
    }

    fn next_req_id(&self) -> u32 {
        let mut req = self.next_req.fetch_add(1, Ordering::Relaxed);
        if req == 0 {
            req = self.next_req.fetch_add(1, Ordering::Relaxed);
        }
        req
    }

    /// Sends one request; its reply goes to `p.sink`.
    ///
    /// Under the device rules (Linux's `/dev/xen/xenbus`) a request is
    /// written only when no other request of this connection is waiting
    /// for its reply, and nothing else is written until a watch's write
    /// returns (the module notes say why for every request). The kernel handles a WATCH written to the
    /// device synchronously: `xenbus_file_write` holds the file's
    /// `msgbuffer_mutex` while it waits for xenstored's answer, and the
    /// domain's single `xenbus` thread, delivering the reply to an earlier
    /// request of the same file, needs that mutex too
    /// (`xenbus_dev_queue_reply`). A reply that arrives in between would
    /// therefore block the xenbus thread for good, and with it every
    /// XenStore request of the whole guest (threads sleep in `xs_talkv`).
    fn send(&self, ty: MsgType, tx: u32, payload: &[u8], p: Pending) -> Result<(), XsError> {
        let req = self.next_req_id();
        let msg = encode_message(ty, req, tx, payload)
            .map_err(|e| XsError::InvalidArgument(e.to_string()))?;
        let is_watch = self.device_rules && matches!(ty, MsgType::Watch | MsgType::Unwatch);
        {
            let mut r = lock(&self.routes);
            if self.device_rules {
                while !r.closed
                    && r.gave_up.is_none()
                    && (r.watch_in_progress || !r.pending.is_empty())
                {
                    r = self.quiet.wait(r).unwrap_or_else(|p| p.into_inner());
                }
            }
            if let Some(after) = r.gave_up {
                return Err(XsError::Unanswered {
                    op: p.op,
                    path: p.arg,
                    after,
                });
            }
            if r.closed {
                return Err(XsError::Closed);
            }
            r.pending.insert(req, p);
            if is_watch {
                r.watch_in_progress = true;
            }
        }
        let written = {
            let _w = lock(&self.write_lock);
            write_all(self.fd.as_raw_fd(), &msg, self.is_socket)
        };
        if is_watch || written.is_err() {
            let mut r = lock(&self.routes);
            if is_watch {
                r.watch_in_progress = false;
            }
            if written.is_err() {
                r.pending.remove(&req);
            }
            drop(r);
            self.quiet.notify_all();
        }
        written.map_err(XsError::from)
    }

    /// Sends without waiting for the reply (used from Drop).
    fn send_detached(&self, ty: MsgType, tx: u32, payload: &[u8]) {
        let _ = self.send(
            ty,
            tx,
            payload,
            Pending {
                ty,
                op: "detached",
                arg: String::new(),
                sink: ReplySink::Discard,
                sent: Instant::now(),
            },
        );
    }

    fn call(
        &self,
        ty: MsgType,
        tx: u32,
        payload: &[u8],
        op: &'static str,
        arg: &str,
    ) -> Result<Vec<u8>, XsError> {
        let (s, r) = mpsc::sync_channel(1);
        self.send(
            ty,
            tx,
            payload,
            Pending {
                ty,
                op,
                arg: arg.to_string(),
                sink: ReplySink::Blocking(s),
                sent: Instant::now(),
            },
        )?;
        r.recv().map_err(|_| XsError::Closed)?
    }

    fn call_async(
        &self,
        ty: MsgType,
        tx: u32,
        payload: &[u8],
        op: &'static str,
        arg: &str,
    ) -> impl Future<Output = Result<Vec<u8>, XsError>> {
        let (s, r) = tokio::sync::oneshot::channel();
        let sent = self.send(
            ty,
            tx,
            payload,
            Pending {
                ty,
                op,
                arg: arg.to_string(),
                sink: ReplySink::Async(s),
                sent: Instant::now(),
            },
        );
        async move {
            sent?;
            r.await.map_err(|_| XsError::Closed)?
        }
    }

    fn new_token(&self) -> String {
        format!(
            "xensock-{}",
            self.next_token.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// Writes all of `buf`. On a socket with `send(MSG_NOSIGNAL)`: a
/// xenstored that went away must give this process an error, not a
/// SIGPIPE (whose default action ends it); a device takes `write`.
fn write_all(fd: i32, mut buf: &[u8], socket: bool) -> io::Result<()> {
    while !buf.is_empty() {
        let n = crate::sys::send_or_write(fd, buf, socket);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

fn read_loop(core: std::sync::Weak<Core>, fd: i32, wake: i32) {
    let mut buf: Vec<u8> = Vec::with_capacity(2 * (HEADER_LEN + PAYLOAD_MAX));
    let mut chunk = vec![0u8; 16 * 1024];
    let reason = 'outer: loop {
        let mut pfds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // With a reply bound, look at the oldest request once a second.
        let bound = match core.upgrade() {
            Some(c) => Duration::from_millis(c.reply_bound_ms.load(Ordering::Relaxed)),
            None => return,
        };
        let timeout = if bound.is_zero() { -1 } else { 1000 };
        let rc = crate::sys::poll(&mut pfds, timeout);
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break XsError::Closed;
        }
        if pfds[1].revents != 0 {
            break XsError::Closed;
        }
        if !bound.is_zero() {
            if let Some(e) = core.upgrade().and_then(|c| unanswered(&c, bound)) {
                break e;
            }
        }
        if pfds[0].revents == 0 {
            continue;
        }
        let n = crate::sys::read(fd, &mut chunk);
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                continue;
            }
            break XsError::Io(e);
        }
        if n == 0 {
            break XsError::Closed;
        }
        buf.extend_from_slice(&chunk[..n as usize]);
        let Some(core) = core.upgrade() else {
            return;
        };
        while buf.len() >= HEADER_LEN {
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&buf[..HEADER_LEN]);
            let h = Header::decode(&h);
            let len = h.len as usize;
            if len > PAYLOAD_MAX {
                break 'outer XsError::Protocol(format!("message of {len} bytes from xenstored"));
            }
            if buf.len() < HEADER_LEN + len {
                break;
            }
            let payload: Vec<u8> = buf[HEADER_LEN..HEADER_LEN + len].to_vec();
            buf.drain(..HEADER_LEN + len);
            dispatch(&core, h, payload);
        }
    };
    if let Some(core) = core.upgrade() {
        let (pending, _watches) = {
            let mut r = lock(&core.routes);
            r.closed = true;
            if let XsError::Unanswered { after, .. } = &reason {
                r.gave_up = Some(*after);
            }
            (
                std::mem::take(&mut r.pending),
                std::mem::take(&mut r.watches),
            )
        };
        core.quiet.notify_all();
        for (_, p) in pending {
            let e = match &reason {
                XsError::Protocol(s) => XsError::Protocol(s.clone()),
                XsError::Unanswered { after, .. } => XsError::Unanswered {
                    op: p.op,
                    path: p.arg.clone(),
                    after: *after,
                },
                _ => XsError::Closed,
            };
            p.sink.send(Err(e));
        }
    }
}

/// The oldest request of `core` that has waited longer than `bound`, as
/// the error that gives the connection up.
fn unanswered(core: &Core, bound: Duration) -> Option<XsError> {
    let r = lock(&core.routes);
    let oldest = r.pending.values().min_by_key(|p| p.sent)?;
    (oldest.sent.elapsed() > bound).then(|| XsError::Unanswered {
        op: oldest.op,
        path: oldest.arg.clone(),
        after: bound,
    })
}

fn dispatch(core: &Core, h: Header, payload: Vec<u8>) {
    if h.msg_type() == Some(MsgType::WatchEvent) {
        let (parts, _) = split_strings(&payload);
        if parts.len() >= 2 {
            let ev = WatchEvent {
                path: String::from_utf8_lossy(parts[0]).into_owned(),
                token: String::from_utf8_lossy(parts[1]).into_owned(),
            };
            // Outside the lock: a callback may take its own locks.
            let sink = lock(&core.routes).watches.get(&ev.token).cloned();
            if let Some(s) = sink {
                s.send(ev);
            }
        }
        return;
    }
    let Some(p) = lock(&core.routes).pending.remove(&h.req_id) else {
        return;
    };
    if core.device_rules {
        core.quiet.notify_all();
    }
    let r = if h.msg_type() == Some(MsgType::Error) {
        Err(reply_error(&p, &payload))
    } else if h.msg_type() != Some(p.ty) {
        Err(XsError::Protocol(format!(
            "reply type {} to a {:?} request",
            h.msg_type, p.ty
        )))
    } else {
        Ok(payload)
    };
    p.sink.send(r);
}

fn check_path(path: &str) -> Result<(), XsError> {
    if path.is_empty() || path.contains('\0') {
        return Err(XsError::InvalidArgument(format!("bad path {path:?}")));
    }
    Ok(())
}

fn one(path: &str) -> Result<Vec<u8>, XsError> {
    check_path(path)?;
    let mut p = path.as_bytes().to_vec();
    p.push(0);
    Ok(p)
}

fn write_payload(path: &str, value: &[u8]) -> Result<Vec<u8>, XsError> {
    let mut p = one(path)?;
    p.extend_from_slice(value);
    Ok(p)
}

fn perms_payload(path: &str, perms: &[Perm]) -> Result<Vec<u8>, XsError> {
    if perms.is_empty() {
        return Err(XsError::InvalidArgument("empty permission list".into()));
    }
    let mut p = one(path)?;
    for perm in perms {
        p.extend_from_slice(perm.to_string().as_bytes());
        p.push(0);
    }
    Ok(p)
}

fn parse_list(payload: &[u8]) -> Vec<String> {
    split_strings(payload)
        .0
        .into_iter()
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn parse_perms(payload: &[u8]) -> Result<Vec<Perm>, XsError> {
    split_strings(payload)
        .0
        .into_iter()
        .map(|s| {
            Perm::parse(s).ok_or_else(|| {
                XsError::Protocol(format!("bad permission {:?}", String::from_utf8_lossy(s)))
            })
        })
        .collect()
}

fn to_string(v: Vec<u8>) -> Result<String, XsError> {
    String::from_utf8(v).map_err(|_| XsError::Protocol("value is not UTF-8".into()))
}

fn watch_payload(path: &str, token: &str) -> Result<Vec<u8>, XsError> {
    let mut p = one(path)?;
    p.extend_from_slice(token.as_bytes());
    p.push(0);
    Ok(p)
}

/// Generates the node operations shared by clients and transactions.
macro_rules! blocking_ops {
    ($t:ty) => {
        impl $t {
            /// Reads a node's value.
            pub fn read(&self, path: &str) -> Result<Vec<u8>, XsError> {
                self.core()
                    .call(MsgType::Read, self.tx(), &one(path)?, "read", path)
            }
            /// Reads a node's value as UTF-8.
            pub fn read_string(&self, path: &str) -> Result<String, XsError> {
                to_string(self.read(path)?)
            }
            /// Reads a node, `None` if it does not exist.
            pub fn try_read(&self, path: &str) -> Result<Option<Vec<u8>>, XsError> {
                match self.read(path) {
                    Ok(v) => Ok(Some(v)),
                    Err(e) if e.is(XsErrno::NoEnt) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            /// Writes a node, creating it and missing parents.
            pub fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<(), XsError> {
                self.core()
                    .call(
                        MsgType::Write,
                        self.tx(),
                        &write_payload(path, value.as_ref())?,
                        "write",
                        path,
                    )
                    .map(drop)
            }
            /// Creates a node with an empty value if it does not exist.
            pub fn mkdir(&self, path: &str) -> Result<(), XsError> {
                self.core()
                    .call(MsgType::Mkdir, self.tx(), &one(path)?, "mkdir", path)
                    .map(drop)
            }
            /// Removes a node and everything below it.
            pub fn rm(&self, path: &str) -> Result<(), XsError> {
                self.core()
                    .call(MsgType::Rm, self.tx(), &one(path)?, "rm", path)
                    .map(drop)
            }
            /// Names of a node's children.
            pub fn directory(&self, path: &str) -> Result<Vec<String>, XsError> {
                self.core()
                    .call(
                        MsgType::Directory,
                        self.tx(),
                        &one(path)?,
                        "directory",
                        path,
                    )
                    .map(|p| parse_list(&p))
            }
            /// A node's permissions (owner first).
            pub fn get_perms(&self, path: &str) -> Result<Vec<Perm>, XsError> {
                let p = self.core().call(
                    MsgType::GetPerms,
                    self.tx(),
                    &one(path)?,
                    "get_perms",
                    path,
                )?;
                parse_perms(&p)
            }
            /// Sets a node's permissions (owner first), as `xenstore-chmod`.
            pub fn set_perms(&self, path: &str, perms: &[Perm]) -> Result<(), XsError> {
                self.core()
                    .call(
                        MsgType::SetPerms,
                        self.tx(),
                        &perms_payload(path, perms)?,
                        "set_perms",
                        path,
                    )
                    .map(drop)
            }
        }
    };
}

/// Generates the async node operations.
macro_rules! async_ops {
    ($t:ty) => {
        impl $t {
            /// Reads a node's value.
            pub async fn read(&self, path: &str) -> Result<Vec<u8>, XsError> {
                let p = one(path)?;
                self.core()
                    .call_async(MsgType::Read, self.tx(), &p, "read", path)
                    .await
            }
            /// Reads a node's value as UTF-8.
            pub async fn read_string(&self, path: &str) -> Result<String, XsError> {
                to_string(self.read(path).await?)
            }
            /// Reads a node, `None` if it does not exist.
            pub async fn try_read(&self, path: &str) -> Result<Option<Vec<u8>>, XsError> {
                match self.read(path).await {
                    Ok(v) => Ok(Some(v)),
                    Err(e) if e.is(XsErrno::NoEnt) => Ok(None),
                    Err(e) => Err(e),
                }
            }
            /// Writes a node, creating it and missing parents.
            pub async fn write(&self, path: &str, value: impl AsRef<[u8]>) -> Result<(), XsError> {
                let p = write_payload(path, value.as_ref())?;
                self.core()
                    .call_async(MsgType::Write, self.tx(), &p, "write", path)
                    .await
                    .map(drop)
            }
            /// Creates a node with an empty value if it does not exist.
            pub async fn mkdir(&self, path: &str) -> Result<(), XsError> {
                let p = one(path)?;
                self.core()
                    .call_async(MsgType::Mkdir, self.tx(), &p, "mkdir", path)
                    .await
                    .map(drop)
            }
            /// Removes a node and everything below it.
            pub async fn rm(&self, path: &str) -> Result<(), XsError> {
                let p = one(path)?;
                self.core()
                    .call_async(MsgType::Rm, self.tx(), &p, "rm", path)
                    .await
                    .map(drop)
            }
            /// Names of a node's children.
            pub async fn directory(&self, path: &str) -> Result<Vec<String>, XsError> {
                let p = one(path)?;
                self.core()
                    .call_async(MsgType::Directory, self.tx(), &p, "directory", path)
                    .await
                    .map(|p| parse_list(&p))
            }
            /// A node's permissions (owner first).
            pub async fn get_perms(&self, path: &str) -> Result<Vec<Perm>, XsError> {
                let p = one(path)?;
                let r = self
                    .core()
                    .call_async(MsgType::GetPerms, self.tx(), &p, "get_perms", path)
                    .await?;
                parse_perms(&r)
            }
            /// Sets a node's permissions (owner first).
            pub async fn set_perms(&self, path: &str, perms: &[Perm]) -> Result<(), XsError> {
                let p = perms_payload(path, perms)?;
                self.core()
                    .call_async(MsgType::SetPerms, self.tx(), &p, "set_perms", path)
                    .await
                    .map(drop)
            }
        }
    };
}

/// A blocking XenStore connection. Cheap to clone (clones share the
/// connection); usable from many threads at once.
#[derive(Clone)]
pub struct XsClient {
    core: Arc<Core>,
}

impl std::fmt::Debug for XsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XsClient")
            .field("path", &self.core.path)
            .finish()
    }
}

impl XsClient {
    /// Connects to the XenStore of this machine: `$XENSTORED_PATH` if set,
    /// else the xenstored socket if present (dom0), else `/dev/xen/xenbus`
    /// (a guest).
    pub fn open() -> Result<XsClient, XsError> {
        XsClient::open_path(&default_path()?)
    }

    /// Connects to a xenstored unix socket or a xenbus device.
    pub fn open_path(path: impl AsRef<Path>) -> Result<XsClient, XsError> {
        Ok(XsClient {
            core: Core::connect(path.as_ref(), None)?,
        })
    }

    /// Connects to `path` with the rules of Linux's `/dev/xen/xenbus`
    /// whatever it is: one request in flight at a time, and transactions
    /// opened one at a time per guest (see the module notes).
    /// [`XsClient::open_path`] applies them to character devices by
    /// itself; this is for tests that play the device over a socket.
    pub fn open_path_with_device_rules(path: impl AsRef<Path>) -> Result<XsClient, XsError> {
        Ok(XsClient {
            core: Core::connect(path.as_ref(), Some(true))?,
        })
    }

    /// The socket or device this client is connected to.
    pub fn connection_path(&self) -> &Path {
        &self.core.path
    }

    /// How long a request may wait for its answer before the connection
    /// is given up ([`XsError::Unanswered`]); zero waits for ever. The
    /// default comes from [`REPLY_BOUND_ENV`].
    pub fn set_reply_bound(&self, bound: Duration) {
        let ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
        self.core.reply_bound_ms.store(ms, Ordering::Relaxed);
    }

    fn core(&self) -> &Core {
        &self.core
    }

    fn tx(&self) -> u32 {
        0
    }

    /// Watches `path` and hands each event to `f`, which runs on the
    /// connection's reader thread: it must be quick and must not use this
    /// connection (queue the event and wake a thread of your own). The
    /// first event arrives at once. Dropping the [`CallbackWatch`] removes
    /// the watch; never drop it from inside `f`.
    pub fn watch_with(
        &self,
        path: &str,
        f: impl Fn(WatchEvent) + Send + Sync + 'static,
    ) -> Result<CallbackWatch, XsError> {
        let token = self.core.new_token();
        let payload = watch_payload(path, &token)?;
        lock(&self.core.routes)
            .watches
            .insert(token.clone(), Arc::new(EventSink::Callback(Arc::new(f))));
        if let Err(e) = self.core.call(MsgType::Watch, 0, &payload, "watch", path) {
            lock(&self.core.routes).watches.remove(&token);
            return Err(e);
        }
        Ok(CallbackWatch {
            core: self.core.clone(),
            path: path.to_string(),
            token,
        })
    }

    /// The async API on the same connection.
    pub fn to_async(&self) -> AsyncXsClient {
        AsyncXsClient {
            core: self.core.clone(),
        }
    }

    /// `/local/domain/<domid>`, as xenstored computes it.
    pub fn get_domain_path(&self, domid: u32) -> Result<String, XsError> {
        let arg = domid.to_string();
        let p = self.core.call(
            MsgType::GetDomainPath,
            0,
            &one(&arg)?,
            "get_domain_path",
            &arg,
        )?;
        Ok(parse_list(&p).into_iter().next().unwrap_or_default())
    }

    /// Whether xenstored knows domain `domid` (`IS_DOMAIN_INTRODUCED`).
    /// Privileged: guests get `EACCES` from xenstored since XSA-115.
    pub fn is_domain_introduced(&self, domid: u32) -> Result<bool, XsError> {
        let arg = domid.to_string();
        let p = self.core.call(
            MsgType::IsDomainIntroduced,
            0,
            &one(&arg)?,
            "is_domain_introduced",
            &arg,
        )?;
        match parse_list(&p).first().map(String::as_str) {
            Some("T") => Ok(true),
            Some("F") => Ok(false),
            _ => Err(XsError::Protocol(format!(
                "IS_DOMAIN_INTRODUCED answered {:?}",
                String::from_utf8_lossy(&p)
            ))),
        }
    }

    /// Watches `path` (and everything below it; `@introduceDomain` and
    /// `@releaseDomain` for domain events). The first event arrives at once,
    /// as xenstored fires every new watch. Dropping the [`Watch`] removes it.
    pub fn watch(&self, path: &str) -> Result<Watch, XsError> {
        self.watch_paths(&[path])
    }

    /// One [`Watch`] delivering the events of several paths (each gets its
    /// own token; [`WatchEvent::token`] tells them apart).
    pub fn watch_paths(&self, paths: &[&str]) -> Result<Watch, XsError> {
        let (s, r) = mpsc::channel();
        let mut w = Watch {
            core: self.core.clone(),
            regs: Vec::new(),
            rx: r,
        };
        for path in paths {
            let token = self.core.new_token();
            let payload = watch_payload(path, &token)?;
            lock(&self.core.routes)
                .watches
                .insert(token.clone(), Arc::new(EventSink::Blocking(s.clone())));
            if let Err(e) = self.core.call(MsgType::Watch, 0, &payload, "watch", path) {
                lock(&self.core.routes).watches.remove(&token);
                return Err(e);
            }
            w.regs.push((path.to_string(), token));
        }
        Ok(w)
    }

    /// Starts a transaction. Prefer [`XsClient::transaction`], which
    /// retries on conflicts.
    pub fn transaction_start(&self) -> Result<Transaction, XsError> {
        let gate = if self.core.device_rules {
            TxGate::acquire()
        } else {
            None
        };
        let p = self
            .core
            .call(MsgType::TransactionStart, 0, b"\0", "transaction_start", "")?;
        let id = parse_tx_id(&p)?;
        Ok(Transaction {
            core: self.core.clone(),
            id,
            done: false,
            _gate: gate,
        })
    }

    /// Runs `f` in a transaction and commits it, starting over when the
    /// commit fails with `EAGAIN` (someone changed what `f` looked at), up
    /// to [`MAX_TRANSACTION_ATTEMPTS`] times. An error from `f` aborts.
    pub fn transaction<T>(
        &self,
        mut f: impl FnMut(&Transaction) -> Result<T, XsError>,
    ) -> Result<T, XsError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let tx = self.transaction_start()?;
            let value = match f(&tx) {
                Ok(v) => v,
                Err(e) => {
                    let _ = tx.abort();
                    if e.is(XsErrno::Again) && attempt < MAX_TRANSACTION_ATTEMPTS {
                        continue;
                    }
                    return Err(e);
                }
            };
            match tx.commit() {
                Ok(()) => return Ok(value),
                Err(e) if e.is(XsErrno::Again) && attempt < MAX_TRANSACTION_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

blocking_ops!(XsClient);

fn default_path() -> Result<PathBuf, XsError> {
    if let Some(p) = std::env::var_os(ENV_XENSTORED_PATH) {
        return Ok(PathBuf::from(p));
    }
    for p in [DEFAULT_SOCKET, XENBUS_DEVICE, "/proc/xen/xenbus"] {
        if Path::new(p).exists() {
            return Ok(PathBuf::from(p));
        }
    }
    Err(XsError::NotAvailable(format!(
        "no {DEFAULT_SOCKET} or {XENBUS_DEVICE}, and {ENV_XENSTORED_PATH} is not set"
    )))
}

fn parse_tx_id(p: &[u8]) -> Result<u32, XsError> {
    parse_list(p)
        .first()
        .and_then(|s| s.parse().ok())
        .filter(|id| *id != 0)
        .ok_or_else(|| XsError::Protocol("bad transaction id".into()))
}

fn end_payload(commit: bool) -> &'static [u8] {
    if commit {
        b"T\0"
    } else {
        b"F\0"
    }
}

mod async_client;
mod handles;

pub use async_client::{AsyncTransaction, AsyncWatch, AsyncXsClient};
pub use handles::{CallbackWatch, Transaction, Watch};
