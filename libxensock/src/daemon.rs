// SPDX-License-Identifier: MIT OR Apache-2.0
//! Sharing a guest's user-space transport between processes:
//! `xensock daemon`.
//!
//! One process per guest runs the user-space transport (its XenStore link
//! nodes are per domain, [`crate::claim`]). The daemon is that process for
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

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::socket::{
    bind, connect, listen, sendmsg, socket, AddressFamily, Backlog, ControlMessage, MsgFlags,
    SockFlag, SockType, UnixAddr,
};

use crate::{SockAddrXen, SocketOptions, Transport, XenStream};

/// Environment variable naming the daemon's socket ([`socket_path`]).
pub const ENV_DAEMON_SOCKET: &str = "XENSOCK_DAEMON_SOCKET";

/// The daemon's socket: `$XENSOCK_DAEMON_SOCKET`, else
/// `/run/xensock/daemon.sock`.
pub fn socket_path() -> PathBuf {
    std::env::var_os(ENV_DAEMON_SOCKET)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/xensock/daemon.sock"))
}

/// The largest request or answer packet.
const PACKET_MAX: usize = 512;

fn nix_err(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Sends one packet, with `fd` attached if given.
fn send_packet(sock: RawFd, text: &str, fd: Option<RawFd>) -> io::Result<()> {
    let iov = [IoSlice::new(text.as_bytes())];
    let fds;
    let cmsgs: &[ControlMessage] = match fd {
        Some(f) => {
            fds = [f];
            &[ControlMessage::ScmRights(&fds)]
        }
        None => &[],
    };
    sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map_err(nix_err)?;
    Ok(())
}

/// Receives one packet and the descriptor attached to it, if any. An
/// empty text is the other side's close.
fn recv_packet(sock: BorrowedFd<'_>, nonblocking: bool) -> io::Result<(String, Option<OwnedFd>)> {
    let mut buf = [0u8; PACKET_MAX];
    let (n, fd) = crate::sys::recv_with_fd(sock, &mut buf, nonblocking)?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    Ok((text, fd))
}

/// A Unix `SOCK_SEQPACKET` socket, closed on exec.
fn seqpacket() -> io::Result<OwnedFd> {
    socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(nix_err)
}

fn protocol_error(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("xensock daemon: {what}"),
    )
}

/// An `err` answer as the error it names.
fn answer_error(text: &str) -> io::Error {
    let mut parts = text.splitn(3, ' ');
    let _ = parts.next();
    match parts.next().and_then(|e| e.parse::<i32>().ok()) {
        Some(code) => io::Error::from_raw_os_error(code),
        None => protocol_error(&format!("unexpected answer {text:?}")),
    }
}

fn numbers<const N: usize>(text: &str, skip: usize) -> Option<[u32; N]> {
    let mut out = [0u32; N];
    let mut it = text.split(' ').skip(skip);
    for o in out.iter_mut() {
        *o = it.next()?.parse().ok()?;
    }
    Some(out)
}

// ---- client ------------------------------------------------------------------

/// The daemon's socket, if one exists (whether a daemon answers on it is
/// known on the first request).
pub fn present() -> Option<PathBuf> {
    let p = socket_path();
    std::fs::metadata(&p)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|_| p)
}

/// Opens a request's connection; `None` when no daemon answers there (a
/// socket file left by a daemon that is gone).
fn request(path: &Path, text: &str) -> io::Result<Option<OwnedFd>> {
    let sock = seqpacket()?;
    let addr = UnixAddr::new(path).map_err(nix_err)?;
    match connect(sock.as_raw_fd(), &addr) {
        Ok(()) => {}
        Err(nix::Error::ECONNREFUSED | nix::Error::ENOENT) => return Ok(None),
        Err(e) => return Err(nix_err(e)),
    }
    send_packet(sock.as_raw_fd(), text, None)?;
    Ok(Some(sock))
}

/// A connection relayed by the daemon: our end of its socket pair.
#[derive(Debug)]
pub(crate) struct RelayStream {
    pub(crate) sock: UnixStream,
    pub(crate) local: SockAddrXen,
    pub(crate) peer: SockAddrXen,
}

impl RelayStream {
    pub(crate) fn recv_buffer_size(&self) -> usize {
        socket2::SockRef::from(&self.sock)
            .recv_buffer_size()
            .unwrap_or(0)
    }

    pub(crate) fn send_buffer_size(&self) -> usize {
        socket2::SockRef::from(&self.sock)
            .send_buffer_size()
            .unwrap_or(0)
    }

    pub(crate) fn bytes_readable(&self) -> usize {
        crate::sys::readable_bytes(self.sock.as_fd()).unwrap_or(0)
    }

    /// `send` with `MSG_NOSIGNAL`: once the daemon closed its end a plain
    /// `write` would raise SIGPIPE, whose default action ends a program
    /// that did not ignore it (a C program, an MPI rank).
    pub(crate) fn send(&self, buf: &[u8]) -> io::Result<usize> {
        socket2::SockRef::from(&self.sock).send_with_flags(buf, libc::MSG_NOSIGNAL)
    }

    /// [`RelayStream::send`] of several buffers.
    pub(crate) fn send_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        socket2::SockRef::from(&self.sock).send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }

    pub(crate) fn try_clone(&self) -> io::Result<RelayStream> {
        Ok(RelayStream {
            sock: self.sock.try_clone()?,
            local: self.local,
            peer: self.peer,
        })
    }
}

fn relay_stream(fd: OwnedFd, local: SockAddrXen, peer: SockAddrXen) -> RelayStream {
    RelayStream {
        sock: UnixStream::from(fd),
        local,
        peer,
    }
}

/// Connects through the daemon at `path`; `Ok(None)` if none answers there.
pub(crate) fn connect_via(
    path: &Path,
    addr: SockAddrXen,
    timeout: Option<Duration>,
) -> io::Result<Option<RelayStream>> {
    let ms = timeout.map_or(0, |t| t.as_millis().clamp(1, u128::from(u32::MAX)));
    let Some(req) = request(path, &format!("connect {} {} {ms}", addr.domid, addr.port))? else {
        return Ok(None);
    };
    let (text, fd) = recv_packet(req.as_fd(), false)?;
    if text.starts_with("err ") {
        return Err(answer_error(&text));
    }
    match (numbers::<4>(&text, 1), fd) {
        (Some([ld, lp, pd, pp]), Some(fd)) if text.starts_with("ok ") => Ok(Some(relay_stream(
            fd,
            SockAddrXen::new(ld, lp),
            SockAddrXen::new(pd, pp),
        ))),
        _ => Err(protocol_error(&format!("unexpected answer {text:?}"))),
    }
}

/// A listener in the daemon: the request's connection, on which accepted
/// connections arrive.
#[derive(Debug)]
pub(crate) struct RelayListener {
    ctrl: OwnedFd,
    local: SockAddrXen,
    nonblocking: AtomicBool,
}

/// Binds through the daemon at `path`; `Ok(None)` if none answers there.
pub(crate) fn listen_via(
    path: &Path,
    addr: SockAddrXen,
    opts: SocketOptions,
) -> io::Result<Option<RelayListener>> {
    let backlog = opts.backlog.unwrap_or(0);
    let Some(req) = request(
        path,
        &format!("listen {} {} {backlog}", addr.domid, addr.port),
    )?
    else {
        return Ok(None);
    };
    let (text, _) = recv_packet(req.as_fd(), false)?;
    if text.starts_with("err ") {
        return Err(answer_error(&text));
    }
    match numbers::<2>(&text, 1) {
        Some([ld, lp]) if text.starts_with("ok ") => Ok(Some(RelayListener {
            ctrl: req,
            local: SockAddrXen::new(ld, lp),
            nonblocking: AtomicBool::new(false),
        })),
        _ => Err(protocol_error(&format!("unexpected answer {text:?}"))),
    }
}

impl RelayListener {
    pub(crate) fn local_addr(&self) -> SockAddrXen {
        self.local
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) {
        self.nonblocking.store(nonblocking, Ordering::Relaxed);
    }

    pub(crate) fn accept(&self) -> io::Result<(RelayStream, SockAddrXen)> {
        self.next_conn(self.nonblocking.load(Ordering::Relaxed))
    }

    pub(crate) fn accept_timeout(
        &self,
        timeout: Duration,
    ) -> io::Result<(RelayStream, SockAddrXen)> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let mut p = [nix::poll::PollFd::new(
            self.ctrl.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let wait = nix::poll::PollTimeout::try_from(ms).unwrap_or(nix::poll::PollTimeout::MAX);
        if nix::poll::poll(&mut p, wait).map_err(nix_err)? == 0 {
            return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
        }
        self.next_conn(false)
    }

    /// The next `conn` packet and its descriptor.
    fn next_conn(&self, nonblocking: bool) -> io::Result<(RelayStream, SockAddrXen)> {
        let (text, fd) = recv_packet(self.ctrl.as_fd(), nonblocking)?;
        if text.is_empty() {
            // the daemon went away: the listener is gone
            return Err(io::Error::from_raw_os_error(libc::ECONNABORTED));
        }
        match (numbers::<2>(&text, 1), fd) {
            (Some([pd, pp]), Some(fd)) if text.starts_with("conn ") => {
                let peer = SockAddrXen::new(pd, pp);
                Ok((relay_stream(fd, self.local, peer), peer))
            }
            _ => Err(protocol_error(&format!("unexpected packet {text:?}"))),
        }
    }
}

impl AsRawFd for RelayListener {
    fn as_raw_fd(&self) -> RawFd {
        self.ctrl.as_raw_fd()
    }
}

impl AsFd for RelayListener {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.ctrl.as_fd()
    }
}

// ---- server ------------------------------------------------------------------

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

fn serve_listener(l: &crate::XenListener, c: &OwnedFd) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    static SIGPIPES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    extern "C" fn count_sigpipe(_: libc::c_int) {
        SIGPIPES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writing to a relayed connection whose daemon end is gone is an
    /// EPIPE for the program, never a SIGPIPE (which would end an MPI rank
    /// or any C program that did not ignore it).
    #[test]
    fn writing_after_the_daemon_closed_is_an_error_not_a_sigpipe() {
        crate::sys::on_sigpipe(count_sigpipe).unwrap();
        let (ours, daemons) = UnixStream::pair().unwrap();
        drop(daemons);
        let s = relay_stream(
            OwnedFd::from(ours),
            SockAddrXen::new(1, 1),
            SockAddrXen::new(2, 2),
        );
        let e = s.send(b"abc").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
        let e = s
            .send_vectored(&[io::IoSlice::new(b"a"), io::IoSlice::new(b"b")])
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
        assert_eq!(SIGPIPES.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
