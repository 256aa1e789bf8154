// SPDX-License-Identifier: MIT OR Apache-2.0
//! A program's side: connects and listens through the daemon.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::socket::{connect, UnixAddr};

use super::wire::*;
use crate::addr::SockAddrXen;
use crate::options::SocketOptions;

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
