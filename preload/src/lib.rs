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

pub mod policy;
mod sys;

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use policy::{ConfigError, Policy};

/// Where `af_xen.ko` publishes its family number when it is loaded.
const FAMILY_PARAM: &str = "/sys/module/af_xen/parameters/family";
/// Published by an `af_xen.ko` that can take over a TCP socket.
const TCP_REDIRECT_PARAM: &str = "/sys/module/af_xen/parameters/tcp_redirect";
/// The config file read when `XENSOCK_PRELOAD_CONFIG` names none.
const DEFAULT_CONFIG: &str = "/etc/xensock/preload.conf";

/// What the kernel offers this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// No `af_xen.ko`.
    NoModule,
    /// `af_xen.ko` without the TCP take-over.
    NoRedirect,
    /// `af_xen.ko` that can take over TCP sockets.
    Redirect,
}

impl Kernel {
    fn probe() -> Kernel {
        if !Path::new(FAMILY_PARAM).exists() {
            Kernel::NoModule
        } else if !Path::new(TCP_REDIRECT_PARAM).exists() {
            Kernel::NoRedirect
        } else {
            Kernel::Redirect
        }
    }

    /// Why nothing is taken over, if nothing is.
    fn refusal(self) -> Option<&'static str> {
        match self {
            Kernel::NoModule => Some("af_xen.ko is not loaded"),
            Kernel::NoRedirect => Some("this af_xen.ko cannot take over TCP sockets"),
            Kernel::Redirect => None,
        }
    }
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

    /// Logs what becomes of one connect or listen: the policy's refusal,
    /// or why the kernel cannot take it (once per process).
    fn decide(&self, what: std::fmt::Arguments<'_>, allowed: Result<(), policy::Refusal>) {
        match (allowed, self.kernel.refusal()) {
            (Err(r), _) => self.log.line(format_args!("{what}: stays on TCP: {r}")),
            (Ok(()), Some(why)) => {
                self.tell_once(why);
                self.log.line(format_args!("{what}: stays on TCP: {why}"));
            }
            (Ok(()), None) => self.log.line(format_args!(
                "{what}: stays on TCP: the take-over is not built into this library yet"
            )),
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
    fn connect(&self, fd: RawFd, peer: SocketAddr) {
        let s = self.state();
        let allowed = match &s.policy {
            Ok(p) => p.allows_connect(peer),
            Err(_) => return,
        };
        s.decide(format_args!("connect fd {fd} to {peer}"), allowed);
    }

    fn listen(&self, fd: RawFd, local: Option<SocketAddr>) {
        let s = self.state();
        let Some(local) = local else { return };
        let allowed = match &s.policy {
            Ok(p) => p.allows_listen(local.port()),
            Err(_) => return,
        };
        s.decide(format_args!("listen fd {fd} on {local}"), allowed);
    }
}

static PRELOAD: Preload = Preload {
    state: OnceLock::new(),
};

extern "C" fn install() {
    sys::install(&PRELOAD);
}

/// Runs [`install`] when the library is loaded, before the program's main.
#[used]
#[link_section = ".init_array"]
static INSTALL: extern "C" fn() = install;
