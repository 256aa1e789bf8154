// SPDX-License-Identifier: MIT OR Apache-2.0
//! `libxensock_preload.so`: unmodified TCP programs in Xen guests, run
//! with `LD_PRELOAD` (or `xensock run -- PROG ARGS`), get AF_XEN for their
//! connections to co-resident guests and the kernel's TCP for everything
//! else.
//!
//! The library puts itself in front of `connect` and `listen` only; the
//! data path (read, write, send, recv, poll, epoll, sendfile, splice) is
//! never interposed, and a program's descriptors are the kernel's sockets
//! at every moment. It decides, per connection, from the user's policy
//! (ports and addresses included or excluded: [`policy`]) and from what
//! the kernel offers: without `af_xen.ko`, or with one that cannot take
//! over a TCP socket, every connection stays on TCP, and the decision log
//! says so once. `XENSOCK_PRELOAD_LOG=1` logs every decision and its
//! reason to stderr (never into a stderr that is a socket),
//! `XENSOCK_PRELOAD_LOG=/path` appends them to a file.
#![deny(unsafe_code)]

pub mod policy;
#[allow(unsafe_code)] // the unsafe floor: every unsafe block, each with its SAFETY comment
mod sys;

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use policy::{ConfigError, Policy};
use sys::{Connect, XenSocket};

/// Where `af_xen.ko` publishes its family number when it is loaded.
const FAMILY_PARAM: &str = "/sys/module/af_xen/parameters/family";
/// The family the module's alias names (`net-pf-19`).
const FAMILY_DEFAULT: i32 = 19;
/// Published by an `af_xen.ko` that can take over a TCP socket.
const TCP_REDIRECT_PARAM: &str = "/sys/module/af_xen/parameters/tcp_redirect";
/// The config file read when `XENSOCK_PRELOAD_CONFIG` names none.
const DEFAULT_CONFIG: &str = "/etc/xensock/preload.conf";

/// How long a redirected connect waits for the co-resident guest's
/// answer before the connection goes to TCP instead: a live guest answers
/// within a link round trip (microseconds; the link's setup, the first
/// time, milliseconds); one that does not is saved, paused or dying.
const CONNECT_WAIT: Duration = Duration::from_secs(2);

/// What the kernel offers this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// No `af_xen.ko`.
    NoModule,
    /// `af_xen.ko` without the TCP take-over.
    NoRedirect,
    /// `af_xen.ko` that can take over TCP sockets: its family number.
    Redirect(i32),
}

impl Kernel {
    fn probe() -> Kernel {
        let read = || {
            std::fs::read_to_string(FAMILY_PARAM)
                .ok()
                .and_then(|v| v.trim().parse::<i32>().ok())
        };
        // Not loaded, but installed: a socket of the family its alias
        // names (net-pf-19) makes the kernel load it, as the header and
        // libxensock do; the socket itself is of no use.
        let family = read().or_else(|| {
            drop(sys::XenSocket::open(FAMILY_DEFAULT));
            read()
        });
        let redirect = std::fs::read_to_string(TCP_REDIRECT_PARAM)
            .map(|v| matches!(v.trim(), "Y" | "1"))
            .unwrap_or(false);
        match (family, redirect) {
            (None, _) => Kernel::NoModule,
            (Some(_), false) => Kernel::NoRedirect,
            (Some(f), true) => Kernel::Redirect(f),
        }
    }

    /// Why nothing is taken over, if nothing is.
    fn refusal(self) -> Option<&'static str> {
        match self {
            Kernel::NoModule => Some("af_xen.ko is not loaded"),
            Kernel::NoRedirect => Some("this af_xen.ko cannot take over TCP sockets"),
            Kernel::Redirect(_) => None,
        }
    }
}

/// Why a connection the policy allows stays on TCP after all.
#[derive(Debug)]
enum Fallback {
    /// No co-resident guest has the address (the common case: a peer on
    /// another host, or a guest that does not run xensock).
    NotCoResident(IpAddr),
    /// The guest does not listen on the AF_XEN twin of the port.
    NotListening { domid: u32, port: u16 },
    /// The guest did not answer within [`CONNECT_WAIT`].
    NoAnswer { domid: u32 },
    /// Another AF_XEN listener has the port (without SO_REUSEPORT on both).
    PortTaken(u16),
    /// A step failed: which, and the error.
    Step(&'static str, std::io::Error),
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fallback::NotCoResident(ip) => write!(f, "no co-resident guest has {ip}"),
            Fallback::NotListening { domid, port } => {
                write!(f, "dom{domid} does not listen on AF_XEN port {port}")
            }
            Fallback::NoAnswer { domid } => write!(
                f,
                "dom{domid} did not answer within {} ms",
                CONNECT_WAIT.as_millis()
            ),
            Fallback::PortTaken(port) => {
                write!(f, "another listener has AF_XEN port {port}")
            }
            Fallback::Step(step, e) => write!(f, "{step}: {e}"),
        }
    }
}

/// Makes the program's listening TCP socket `fd` (bound to `local`) a dual
/// listener: an AF_XEN listener on the port of the same number, which the
/// module moves into `fd` with the TCP listener inside it. Nothing of the
/// program's socket changes unless it succeeds.
fn dual_listener(
    family: i32,
    fd: RawFd,
    local: SocketAddr,
    backlog: libc::c_int,
) -> Result<(), Fallback> {
    let x = XenSocket::open(family).map_err(|e| Fallback::Step("AF_XEN socket", e))?;
    x.listen_on(
        family,
        u32::from(local.port()),
        backlog,
        sys::reuses_port(fd),
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::EADDRINUSE) => Fallback::PortTaken(local.port()),
        _ => Fallback::Step("AF_XEN listen", e),
    })?;
    x.graft_into(fd, local)
        .map_err(|e| Fallback::Step("take-over", e))
}

/// Connects the program's TCP socket `fd` to `peer` over AF_XEN: the
/// guest that has the address, the AF_XEN port of the same number; then
/// the module moves that connection into `fd`. Ok: the guest's domid.
/// Nothing of the program's socket changes unless it succeeds.
fn redirect(family: i32, fd: RawFd, peer: SocketAddr) -> Result<u32, Fallback> {
    let x = XenSocket::open(family).map_err(|e| Fallback::Step("AF_XEN socket", e))?;
    let domid = x.resolve(peer.ip()).map_err(|e| match e.raw_os_error() {
        Some(libc::EHOSTUNREACH) => Fallback::NotCoResident(peer.ip()),
        _ => Fallback::Step("resolve", e),
    })?;
    x.set_connect_timeout(CONNECT_WAIT)
        .map_err(|e| Fallback::Step("SO_SNDTIMEO", e))?;
    x.connect(family, domid, u32::from(peer.port()))
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => Fallback::NotListening {
                domid,
                port: peer.port(),
            },
            Some(libc::EINPROGRESS | libc::ETIMEDOUT) => Fallback::NoAnswer { domid },
            _ => Fallback::Step("AF_XEN connect", e),
        })?;
    x.graft_into(fd, peer)
        .map_err(|e| Fallback::Step("take-over", e))?;
    Ok(domid)
}

/// Where decisions are logged.
enum Log {
    Off,
    Stderr,
    File(std::path::PathBuf),
}

impl Log {
    fn from_env() -> Log {
        match std::env::var_os("XENSOCK_PRELOAD_LOG") {
            None => Log::Off,
            Some(v) if v.is_empty() || v == "0" => Log::Off,
            Some(v) if v == "1" || v == "stderr" => Log::Stderr,
            Some(v) => Log::File(v.into()),
        }
    }

    fn line(&self, msg: std::fmt::Arguments<'_>) {
        let line = format!("xensock-preload[{}]: {msg}\n", std::process::id());
        match self {
            Log::Off => {}
            Log::Stderr if !sys::is_socket(2) => {
                let _ = sys::write_stderr(line.as_bytes());
            }
            Log::Stderr => {}
            Log::File(p) => {
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                {
                    let _ = f.write_all(line.as_bytes());
                }
            }
        }
    }
}

/// The process's decisions, made once at its first connect or listen.
struct State {
    policy: Result<Policy, ConfigError>,
    kernel: Kernel,
    log: Log,
    /// The one-time notice (why nothing is taken over) was logged.
    told: AtomicBool,
}

impl State {
    fn load() -> State {
        let path = std::env::var_os("XENSOCK_PRELOAD_CONFIG")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| DEFAULT_CONFIG.into());
        let file = std::fs::read_to_string(&path).ok();
        let env = |key: &str| std::env::var(format!("XENSOCK_PRELOAD_{}", key.to_uppercase())).ok();
        let state = State {
            policy: Policy::load(file.as_deref(), env),
            kernel: Kernel::probe(),
            log: Log::from_env(),
            told: AtomicBool::new(false),
        };
        if let Err(e) = &state.policy {
            // a bad setting is worth saying without being asked
            let log = match state.log {
                Log::Off => &Log::Stderr,
                ref l => l,
            };
            log.line(format_args!(
                "configuration ignored, every connection stays on TCP: {e}"
            ));
        }
        state
    }

    /// Logs why nothing at all is taken over, once per process.
    fn tell_once(&self, why: &str) {
        if !self.told.swap(true, Ordering::AcqRel) {
            self.log
                .line(format_args!("every connection stays on TCP: {why}"));
        }
    }

    /// Whether one connect or listen may be taken over: the policy's
    /// refusal, or why the kernel cannot take it (once per process), is
    /// logged; Some(family) if it may.
    fn allowed(
        &self,
        what: std::fmt::Arguments<'_>,
        allowed: Result<(), policy::Refusal>,
    ) -> Option<i32> {
        match (allowed, self.kernel) {
            (Err(r), _) => {
                self.log.line(format_args!("{what}: stays on TCP: {r}"));
                None
            }
            (Ok(()), Kernel::Redirect(family)) => Some(family),
            (Ok(()), k) => {
                let why = k.refusal().unwrap_or("");
                self.tell_once(why);
                self.log.line(format_args!("{what}: stays on TCP: {why}"));
                None
            }
        }
    }
}

struct Preload {
    state: OnceLock<State>,
}

impl Preload {
    fn state(&self) -> &State {
        self.state.get_or_init(State::load)
    }
}

impl sys::Hooks for Preload {
    fn connect(&self, fd: RawFd, peer: SocketAddr) -> Connect {
        let s = self.state();
        let allowed = match &s.policy {
            Ok(p) => p.allows_connect(peer),
            Err(_) => return Connect::Tcp,
        };
        let Some(family) = s.allowed(format_args!("connect fd {fd} to {peer}"), allowed) else {
            return Connect::Tcp;
        };
        match redirect(family, fd, peer) {
            Ok(domid) => {
                s.log.line(format_args!(
                    "connect fd {fd} to {peer}: AF_XEN to dom{domid} port {}",
                    peer.port()
                ));
                Connect::Done
            }
            Err(why) => {
                s.log.line(format_args!(
                    "connect fd {fd} to {peer}: stays on TCP: {why}"
                ));
                Connect::Tcp
            }
        }
    }

    fn listening(&self, fd: RawFd, local: Option<SocketAddr>, backlog: libc::c_int) {
        let s = self.state();
        let Some(local) = local else { return };
        let allowed = match &s.policy {
            Ok(p) => p.allows_listen(local),
            Err(_) => return,
        };
        let Some(family) = s.allowed(format_args!("listen fd {fd} on {local}"), allowed) else {
            return;
        };
        match dual_listener(family, fd, local, backlog) {
            Ok(()) => s.log.line(format_args!(
                "listen fd {fd} on {local}: TCP clients and co-resident guests' over AF_XEN port {}",
                local.port()
            )),
            Err(why) => s.log.line(format_args!(
                "listen fd {fd} on {local}: TCP clients only: {why}"
            )),
        }
    }
}

static PRELOAD: Preload = Preload {
    state: OnceLock::new(),
};

extern "C" fn install() {
    sys::install(&PRELOAD);
}

/// Runs [`install`] when the library is loaded, before the program's main.
// The library's one entry point from the loader, an FFI boundary.
#[allow(unsafe_code)]
#[used]
#[link_section = ".init_array"]
static INSTALL: extern "C" fn() = install;
