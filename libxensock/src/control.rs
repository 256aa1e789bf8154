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
//! (the directory is made mode 0700, and one that is a symbolic link or
//! another user's is refused, never followed or changed). Its path is also written into the
//! domain's transport claim ([`crate::claim`]), where a root suspend hook
//! finds it whichever user runs the transport.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Environment variable naming the directory of control sockets.
pub const ENV_RUN_DIR: &str = "XENSOCK_RUN_DIR";

/// Where this user's control sockets live: `$XENSOCK_RUN_DIR`, else
/// `$XDG_RUNTIME_DIR/xensock`, else for root `/run/xensock/control`, else
/// `/run/user/<uid>/xensock` when the user has that runtime directory,
/// else `/tmp/xensock-<uid>`: a user with no login session (a service, a
/// program started by `su` or a lab script) has no runtime directory, and
/// without a control socket the guest's suspend hook cannot reach its
/// transport (a guest saved with the transport's mappings in place
/// crashes). There the directory is made 0700 and used only if it is a
/// directory of this user's, not a link, so what
/// another user put in `/tmp` first is refused, never followed.
pub fn run_dir() -> io::Result<PathBuf> {
    if let Some(d) = std::env::var_os(ENV_RUN_DIR) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return Ok(PathBuf::from(d).join("xensock"));
    }
    let uid = crate::sys::uid();
    if uid == 0 {
        return Ok(PathBuf::from("/run/xensock/control"));
    }
    let user = PathBuf::from(format!("/run/user/{uid}"));
    if user.is_dir() {
        return Ok(user.join("xensock"));
    }
    Ok(PathBuf::from(format!("/tmp/xensock-{uid}")))
}

/// Checks that `dir` is this user's private directory (a directory, not
/// a symbolic link, owned by this user), making it (mode 0700) if
/// `create` and it does not exist, and taking group and other access
/// away if it has them. The default lies in the world-writable `/tmp`,
/// where another user may have put anything first: nothing is followed,
/// and a path that is not ours is refused with the reason, never changed.
fn private_dir(dir: &Path, create: bool) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    let refuse = |kind: io::ErrorKind, why: String| {
        Err(io::Error::new(
            kind,
            format!(
                "run directory {}: {why}; refusing to use it (remove it, or set {ENV_RUN_DIR})",
                dir.display()
            ),
        ))
    };
    if create {
        // the parents are the user's own choice ($XENSOCK_RUN_DIR,
        // $XDG_RUNTIME_DIR) or /tmp; the directory itself is made, not
        // found, where it can be
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return refuse(e.kind(), format!("cannot be made: {e}")),
        }
    }
    // opened without following a link, then checked and changed through
    // the descriptor: what is checked is what is changed
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir);
    let f = match opened {
        Ok(f) => f,
        // (a link gives ENOTDIR with O_DIRECTORY, ELOOP without)
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            let link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
            let why = if link {
                "is a symbolic link"
            } else {
                "is not a directory"
            };
            return refuse(io::ErrorKind::InvalidInput, why.into());
        }
        Err(e) => return Err(e),
    };
    let m = f.metadata()?;
    let me = crate::sys::uid();
    if m.uid() != me {
        return refuse(
            io::ErrorKind::PermissionDenied,
            format!("belongs to uid {}, not to this user (uid {me})", m.uid()),
        );
    }
    if m.mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
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
        let dir = run_dir()?;
        private_dir(&dir, true)?;
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
/// `/dev/xen` transport (its claim, a lock file: [`ENV_CLAIM_PATH`](crate::hooks::ENV_CLAIM_PATH)), whichever user runs it (root
/// may connect to any user's socket: the guest's suspend hook runs as
/// root). Returns (pid, answer) for each that answered. Sockets of
/// processes that are gone are removed.
pub fn broadcast(cmd: &str) -> Vec<(u32, String)> {
    let mut targets: Vec<(u32, PathBuf)> = Vec::new();
    // only a run directory that is ours: the sockets of processes that are
    // gone are removed from it
    let entries = match run_dir().and_then(|dir| private_dir(&dir, false).map(|()| dir)) {
        Ok(dir) => std::fs::read_dir(&dir).ok(),
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("{e}");
            }
            None
        }
    };
    if let Some(entries) = entries {
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
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    /// A symbolic link planted where the run directory should be is
    /// refused: its target keeps its mode, and no socket is put in it.
    #[test]
    fn a_symlink_as_the_run_directory_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let planted = dir.path().join("xensock-0");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let e = private_dir(&planted, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(mode(&victim), 0o755);
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
        // broadcast does not read it either (nothing is removed from it)
        let e = private_dir(&planted, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    /// A file where the directory should be is refused; a missing one is
    /// made 0700; one of ours open to others is closed to them.
    #[test]
    fn the_run_directory_is_made_private_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = private_dir(&file, true).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        let fresh = dir.path().join("a").join("run");
        private_dir(&fresh, true).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        private_dir(&open, true).unwrap();
        assert_eq!(mode(&open), 0o700);
        let missing = dir.path().join("missing");
        let e = private_dir(&missing, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(!missing.exists());
    }

    /// A directory of another user is refused (run as root: /tmp's owner
    /// is root, so a directory owned by nobody stands for it).
    #[test]
    fn another_users_run_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        if crate::sys::uid() == 0 {
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
        } else {
            // not root: a directory of root's stands for another user's
            let root_owned = Path::new("/");
            let e = private_dir(root_owned, false).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            return;
        }
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&theirs, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("uid 65534"), "{e}");
        assert_eq!(mode(&theirs), 0o777);
    }

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
