// SPDX-License-Identifier: MIT OR Apache-2.0
//! Sharing a guest's user-space transport between processes:
//! `xensock daemon`.
//!
//! One process per guest runs the user-space transport (its XenStore link
//! nodes are per domain, one claim per guest, [`crate::hooks::ENV_CLAIM_PATH`]). The daemon is that process for
//! everyone else: it runs the transport and serves requests on a Unix
//! `SOCK_SEQPACKET` socket ([`socket_path`], mode 0666). Where the kernel
//! family is not loaded and the daemon answers, [`crate::XenStream`] and
//! [`crate::XenListener`] go through it: each connection is then one end
//! of a Unix stream socket pair in the program, which the daemon relays to
//! and from the xensock connection. The program's descriptor is a plain
//! socket (poll, epoll, fork and exec work as with any), and a program
//! that exits or dies closes only its own connections.
//!
//! The relay costs a copy each way in the daemon, so a program that has
//! the guest to itself is faster with its own transport (the daemon not
//! running), and one that needs speed in many processes with `af_xen.ko`.
//! A peer's reset reaches the program as end of stream (a Unix socket
//! carries no reset); writes after it fail with `EPIPE`.
//!
//! Wire: one seqpacket connection per request; packets are text.
//! - `connect DOMID PORT TIMEOUT_MS` (0: the transport's default) is
//!   answered `ok LDOMID LPORT PDOMID PPORT` with the program's end of the
//!   pair attached (`SCM_RIGHTS`), or `err ERRNO MESSAGE`.
//! - `listen DOMID PORT BACKLOG` (0: the default) is answered
//!   `ok LDOMID LPORT` or `err ...`; then
//!   each accepted connection comes as `conn PDOMID PPORT` with its end
//!   attached. The listener lives as long as the request's connection.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{bind, listen, Backlog, UnixAddr};

use crate::addr::SockAddrXen;
use crate::listener::XenListener;
use crate::options::SocketOptions;
use crate::relay::*;
pub use crate::relay::{present, socket_path, ENV_DAEMON_SOCKET};
use crate::stream::XenStream;
use crate::transport::Transport;

/// Serves `transport` to this guest's processes on `path` until an error
/// stops accepting. Each request gets a thread; each relayed connection
/// two.
pub fn serve(transport: &Transport, path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        // a socket left by a daemon that is gone (a live one holds the
        // transport's claim, so we would not have got here)
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(_) => {}
    }
    let sock = seqpacket()?;
    bind(sock.as_raw_fd(), &UnixAddr::new(path).map_err(nix_err)?).map_err(nix_err)?;
    // any user's program may use the guest's transport, as any may open
    // a socket
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    listen(&sock, Backlog::new(128).map_err(nix_err)?).map_err(nix_err)?;
    tracing::info!(path = %path.display(), "xensock daemon serving");
    loop {
        let c = match crate::sys::accept(sock.as_fd()) {
            Ok(c) => c,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ECONNABORTED)) => {
                continue
            }
            Err(e) => return Err(e),
        };
        let t = transport.clone();
        std::thread::Builder::new()
            .name("xensock-daemon-req".into())
            .spawn(move || {
                if let Err(e) = handle(&t, c) {
                    tracing::debug!("daemon request: {e}");
                }
            })?;
    }
}

fn send_error(c: &OwnedFd, e: &io::Error) -> io::Result<()> {
    let code = e.raw_os_error().unwrap_or(libc::EIO);
    send_packet(c.as_raw_fd(), &format!("err {code} {e}"), None)
}

fn handle(t: &Transport, c: OwnedFd) -> io::Result<()> {
    let (text, _) = recv_packet(c.as_fd(), false)?;
    let word = text.split(' ').next().unwrap_or("");
    match (word, numbers::<3>(&text, 1)) {
        ("connect", Some([domid, port, ms])) => {
            let addr = SockAddrXen::new(domid, port);
            let r = if ms == 0 {
                t.connect(addr)
            } else {
                t.connect_timeout(addr, Duration::from_millis(u64::from(ms)))
            };
            let x = match r {
                Ok(x) => x,
                Err(e) => return send_error(&c, &e),
            };
            let (mine, theirs) = UnixStream::pair()?;
            let (l, p) = (x.local_addr()?, x.peer_addr()?);
            send_packet(
                c.as_raw_fd(),
                &format!("ok {} {} {} {}", l.domid, l.port, p.domid, p.port),
                Some(theirs.as_raw_fd()),
            )?;
            drop(theirs);
            relay(x, mine);
            Ok(())
        }
        ("listen", Some([domid, port, backlog])) => {
            let opts = SocketOptions {
                backlog: (backlog > 0).then_some(backlog as usize),
                ..SocketOptions::default()
            };
            let l = match t.bind_with(SockAddrXen::new(domid, port), opts) {
                Ok(l) => l,
                Err(e) => return send_error(&c, &e),
            };
            let local = l.local_addr()?;
            send_packet(
                c.as_raw_fd(),
                &format!("ok {} {}", local.domid, local.port),
                None,
            )?;
            serve_listener(&l, &c)
        }
        _ => send_error(&c, &io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// Whether the program closed its end of a request's connection.
fn hung_up(c: &OwnedFd) -> bool {
    let mut p = [nix::poll::PollFd::new(
        c.as_fd(),
        nix::poll::PollFlags::empty(),
    )];
    matches!(nix::poll::poll(&mut p, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

fn serve_listener(l: &XenListener, c: &OwnedFd) -> io::Result<()> {
    loop {
        match l.accept_timeout(Duration::from_millis(250)) {
            Ok((x, peer)) => {
                let (mine, theirs) = UnixStream::pair()?;
                if send_packet(
                    c.as_raw_fd(),
                    &format!("conn {} {}", peer.domid, peer.port),
                    Some(theirs.as_raw_fd()),
                )
                .is_err()
                {
                    // the program is gone: so is its listener
                    return Ok(());
                }
                drop(theirs);
                std::thread::Builder::new()
                    .name("xensock-daemon-conn".into())
                    .spawn(move || relay(x, mine))?;
            }
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {}
            Err(e) => return Err(e),
        }
        if hung_up(c) {
            return Ok(());
        }
    }
}

/// How one direction of a relay ended.
enum CopyEnd {
    /// The source's end of stream, passed on.
    Eof,
    /// The destination refused the bytes (its reader is gone).
    WriteFailed,
    /// The source failed (a reset).
    ReadFailed,
}

/// Copies `from` to `to` until one of them ends.
fn copy_until(mut from: impl Read, mut to: impl Write) -> CopyEnd {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return CopyEnd::Eof,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return CopyEnd::WriteFailed;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return CopyEnd::ReadFailed,
        }
    }
}

/// Copies both ways between a xensock connection and the program's end of
/// its socket pair until both directions ended.
fn relay(x: XenStream, u: UnixStream) {
    let (Ok(x2), Ok(u2)) = (x.try_clone(), u.try_clone()) else {
        return;
    };
    let down = std::thread::Builder::new()
        .name("xensock-daemon-rx".into())
        .spawn(move || {
            // peer -> program
            let _ = match copy_until(&x2, &u2) {
                CopyEnd::Eof => u2.shutdown(Shutdown::Write),
                // the program closed: what the peer sends is refused, as
                // TCP resets after a close
                CopyEnd::WriteFailed => x2.shutdown(Shutdown::Both),
                CopyEnd::ReadFailed => u2.shutdown(Shutdown::Both),
            };
        });
    // program -> peer
    let _ = match copy_until(&u, &x) {
        CopyEnd::Eof => x.shutdown(Shutdown::Write),
        CopyEnd::WriteFailed => u.shutdown(Shutdown::Both),
        CopyEnd::ReadFailed => x.shutdown(Shutdown::Both),
    };
    // The program may still read after its half-close; once it closed the
    // socket altogether (it exited, or died), the connection ends.
    let mut p = [nix::poll::PollFd::new(
        u.as_fd(),
        nix::poll::PollFlags::empty(),
    )];
    loop {
        match nix::poll::poll(&mut p, nix::poll::PollTimeout::from(1000u16)) {
            Ok(n) if n > 0 => break,
            _ => {}
        }
        if down.as_ref().is_ok_and(|d| d.is_finished()) {
            break;
        }
    }
    let _ = x.shutdown(Shutdown::Both);
    if let Ok(d) = down {
        let _ = d.join();
    }
}
