// SPDX-License-Identifier: MIT OR Apache-2.0
//! The process-wide transport's control socket: how `xensock status`
//! shows the connections of other processes of this domain, and how the
//! guest's suspend/resume scripts reach every transport (`xensock
//! suspend`, `xensock resume`: the user-space transport's migration hook).
//!
//! One Unix stream socket per process in [`run_dir`], named after the pid.
//! A client writes one line (`status`, `suspend` or `resume`) and reads
//! the answer until the server closes. Only the process-wide transport
//! ([`crate::Transport::global`]) serves one; the socket is owner-only
//! (the directory is made mode 0700).

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::transport::{Inner, Transport};

/// Environment variable naming the directory of control sockets.
pub const ENV_RUN_DIR: &str = "XENSOCK_RUN_DIR";

/// Where control sockets live: `$XENSOCK_RUN_DIR`, else
/// `$XDG_RUNTIME_DIR/xensock`, else `/tmp/xensock-<uid>`.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(ENV_RUN_DIR) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("xensock");
    }
    // SAFETY: getuid has no preconditions.
    PathBuf::from(format!("/tmp/xensock-{}", unsafe { libc::getuid() }))
}

/// Serves a transport's control socket until dropped.
pub(crate) struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub(crate) fn start(inner: Weak<Inner>) -> io::Result<ControlServer> {
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let path = dir.join(format!("{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("xensock-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s2.load(Ordering::Acquire) {
                        return;
                    }
                    let (Ok(conn), Some(inner)) = (conn, inner.upgrade()) else {
                        continue;
                    };
                    if let Some(t) = Transport::global_of(&inner) {
                        let _ = serve(conn, t);
                    }
                }
            })?;
        Ok(ControlServer {
            path,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: UnixStream, t: Transport) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let mut out = &conn;
    match line.trim() {
        "status" => write!(out, "{}", t.status().render()),
        "suspend" => {
            let moved = t.suspend();
            writeln!(
                out,
                "suspended: {moved} connections left their rings; {} still hold shared pages",
                t.shared_pages_held()
            )
        }
        "resume" => writeln!(
            out,
            "resumed: domid {}{}",
            t.domid(),
            if t.resume() { " (new)" } else { "" }
        ),
        other => writeln!(out, "unknown command {other:?}"),
    }
}

/// Sends `cmd` to every transport's control socket on this machine (of
/// this user); returns (pid, answer) for each that answered. Sockets of
/// processes that are gone are removed.
pub fn broadcast(cmd: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(run_dir()) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Some(pid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let mut s = match UnixStream::connect(&path) {
            Ok(s) => s,
            Err(_) => {
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        if writeln!(s, "{cmd}").is_err() {
            continue;
        }
        let mut answer = String::new();
        let _ = io::Read::read_to_string(&mut s, &mut answer);
        out.push((pid, answer));
    }
    out.sort_by_key(|(p, _)| *p);
    out
}
