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
//! (the directory is made mode 0700). Its path is also written into the
//! domain's transport claim ([`crate::claim`]), where a root suspend hook
//! finds it whichever user runs the transport.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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
    PathBuf::from(format!("/tmp/xensock-{}", crate::sys::uid()))
}

/// Serves a transport's control socket until dropped.
pub(crate) struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Serves `answer(command)` to each process that asks (`None`: the
    /// transport is going, nothing is answered).
    pub(crate) fn start(
        answer: impl Fn(&str) -> Option<String> + Send + 'static,
    ) -> io::Result<ControlServer> {
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
                    if let Ok(conn) = conn {
                        let _ = serve(conn, &answer);
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

impl ControlServer {
    /// The socket's path.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
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

fn serve(conn: UnixStream, answer: &impl Fn(&str) -> Option<String>) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    match answer(line.trim()) {
        Some(text) => (&conn).write_all(text.as_bytes()),
        None => Ok(()),
    }
}

/// Whether `path` looks like process `pid`'s control socket: named
/// `<pid>.sock`, a socket, owned by the user the process runs as. The
/// claim file is writable by every user, so a root hook must not write
/// to whatever socket it names.
fn is_control_socket_of(path: &std::path::Path, pid: u32) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let named = path.file_name().and_then(|n| n.to_str()) == Some(&format!("{pid}.sock"));
    let (Ok(sock), Ok(proc_dir)) = (
        std::fs::symlink_metadata(path),
        std::fs::metadata(format!("/proc/{pid}")),
    ) else {
        return false;
    };
    named && sock.file_type().is_socket() && sock.uid() == proc_dir.uid()
}

/// Sends `cmd` to every transport's control socket on this machine: this
/// user's (in [`run_dir`]) and the one of the process holding the guest's
/// `/dev/xen` transport ([`crate::claim`]), whichever user runs it (root
/// may connect to any user's socket: the guest's suspend hook runs as
/// root). Returns (pid, answer) for each that answered. Sockets of
/// processes that are gone are removed.
pub fn broadcast(cmd: &str) -> Vec<(u32, String)> {
    let mut targets: Vec<(u32, PathBuf)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(run_dir()) {
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
            targets.push((pid, path));
        }
    }
    if let Some(h) = crate::claim::holder(&crate::claim::guest_claim_path()) {
        if let Some(c) = h.control.filter(|c| is_control_socket_of(c, h.pid)) {
            if !targets.iter().any(|(_, p)| *p == c) {
                targets.push((h.pid, c));
            }
        }
    }
    let mut out = Vec::new();
    for (pid, path) in targets {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The suspend hook reaches the guest's transport through its claim
    /// even when the transport's socket is not in the caller's run
    /// directory (another user's process).
    #[test]
    fn broadcast_reaches_the_claim_holder_outside_the_run_dir() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        let other = dir.path().join("other-user");
        std::fs::create_dir(&other).unwrap();
        // a live process of the socket's owner stands for the holder
        let mut holder = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = holder.id();
        let sock = other.join(format!("{pid}.sock"));
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&conn).read_line(&mut line).unwrap();
            let mut out = &conn;
            write!(out, "got {}", line.trim()).unwrap();
        });
        let claim_path = dir.path().join("claim");
        let claim = crate::claim::Claim::take(&claim_path).unwrap();
        claim.record(Some(&sock));
        // as if another process held it
        let text = std::fs::read_to_string(&claim_path).unwrap();
        std::fs::write(
            &claim_path,
            text.replace(
                &format!("pid {}", std::process::id()),
                &format!("pid {pid}"),
            ),
        )
        .unwrap();
        std::env::set_var(ENV_RUN_DIR, &run);
        std::env::set_var(crate::claim::ENV_CLAIM_PATH, &claim_path);
        let answers = broadcast("suspend");
        std::env::remove_var(ENV_RUN_DIR);
        std::env::remove_var(crate::claim::ENV_CLAIM_PATH);
        server.join().unwrap();
        assert_eq!(answers, vec![(pid, "got suspend".to_string())]);
        // a claim naming a socket that is not its holder's is not followed
        let stray = other.join("stray.sock");
        let _l = UnixListener::bind(&stray).unwrap();
        assert!(!is_control_socket_of(&stray, pid));
        assert!(!is_control_socket_of(&sock, pid + 1_000_000));
        let _ = holder.kill();
        let _ = holder.wait();
        drop(claim);
    }
}
