// SPDX-License-Identifier: MIT OR Apache-2.0
//! The daemon's wire: text packets on a Unix `SOCK_SEQPACKET` socket,
//! descriptors attached with `SCM_RIGHTS` (see the module's docs).

use std::io::{self, IoSlice};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::socket::{
    sendmsg, socket, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};
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
pub(crate) const PACKET_MAX: usize = 512;

pub(crate) fn nix_err(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Sends one packet, with `fd` attached if given.
pub(crate) fn send_packet(sock: RawFd, text: &str, fd: Option<RawFd>) -> io::Result<()> {
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
pub(crate) fn recv_packet(
    sock: BorrowedFd<'_>,
    nonblocking: bool,
) -> io::Result<(String, Option<OwnedFd>)> {
    let mut buf = [0u8; PACKET_MAX];
    let (n, fd) = crate::sys::recv_with_fd(sock, &mut buf, nonblocking)?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    Ok((text, fd))
}

/// A Unix `SOCK_SEQPACKET` socket, closed on exec.
pub(crate) fn seqpacket() -> io::Result<OwnedFd> {
    socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(nix_err)
}

pub(crate) fn protocol_error(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("xensock daemon: {what}"),
    )
}

/// An `err` answer as the error it names.
pub(crate) fn answer_error(text: &str) -> io::Error {
    let mut parts = text.splitn(3, ' ');
    let _ = parts.next();
    match parts.next().and_then(|e| e.parse::<i32>().ok()) {
        Some(code) => io::Error::from_raw_os_error(code),
        None => protocol_error(&format!("unexpected answer {text:?}")),
    }
}

pub(crate) fn numbers<const N: usize>(text: &str, skip: usize) -> Option<[u32; N]> {
    let mut out = [0u32; N];
    let mut it = text.split(' ').skip(skip);
    for o in out.iter_mut() {
        *o = it.next()?.parse().ok()?;
    }
    Some(out)
}
