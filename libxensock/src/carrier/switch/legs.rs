// SPDX-License-Identifier: MIT OR Apache-2.0
//! The legs' sockets: connecting one without blocking, its options,
//! whether its peer answers, closing them quietly.

use super::*;

/// Sends FIN on each leg, then reads and drops what arrives until the
/// peer closes too or nothing came for a moment (at most `limit`).
pub(super) fn close_quietly(legs: Vec<Arc<TcpStream>>, limit: Duration) {
    for l in &legs {
        let _ = l.shutdown(std::net::Shutdown::Write);
    }
    let end = Instant::now() + limit;
    let mut open: Vec<&TcpStream> = legs.iter().map(|l| &**l).collect();
    let mut buf = [0u8; 4096];
    while !open.is_empty() && Instant::now() < end {
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|l| libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let n = crate::sys::poll(&mut fds, 50);
        if n <= 0 {
            return;
        }
        let mut still = Vec::new();
        for (l, f) in open.into_iter().zip(&fds) {
            if f.revents == 0 {
                still.push(l);
                continue;
            }
            let mut r = l;
            match r.read(&mut buf) {
                Ok(0) | Err(_) => {}
                Ok(_) => still.push(l),
            }
        }
        open = still;
    }
}

/// Polls `wake` and optionally `fd` for `events`, no timeout.
pub(super) fn sleep_on(wake: &EventFd, fd: Option<RawFd>, events: i16) {
    let mut fds = [
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: fd.unwrap_or(-1),
            events,
            revents: 0,
        },
    ];
    let n = if fd.is_some() { 2 } else { 1 };
    let r = crate::sys::poll(&mut fds[..n], -1);
    if r < 0 || fds[0].revents != 0 {
        wake.drain();
    }
}

/// Bytes written to `sock` and not yet acknowledged by the peer.
pub(super) fn unacked(sock: &TcpStream) -> i32 {
    crate::sys::unsent_bytes(sock.as_fd()).map_or(0, |n| i32::try_from(n).unwrap_or(i32::MAX))
}

/// A leg's socket options. No TCP_USER_TIMEOUT: besides a peer that stops
/// acknowledging, it ends a leg whose live peer keeps its window shut that
/// long (Linux's zero-window probing counts against it), so a reader that
/// stopped reading for `peer_lost_after` reset the connection; the bound
/// is the switch's own ([`leg_waits`], `check_stall`).
pub(super) fn set_leg_options(sock: &TcpStream) -> io::Result<()> {
    sock.set_nonblocking(true)?;
    sock.set_nodelay(true)
}

/// Starts a non-blocking connect of an outbound leg to `addr`.
pub(super) fn connect_start(addr: SocketAddr) -> io::Result<socket2::Socket> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.cloexec(),
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_nonblocking(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => Ok(sock),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(sock),
        Err(e) => Err(e),
    }
}

/// Whether a connect [`connect_start`] began has completed; its error if
/// it failed.
pub(super) fn connect_done(sock: &socket2::Socket) -> io::Result<bool> {
    if let Some(e) = sock.take_error()? {
        return Err(e);
    }
    match sock.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether `sock` waits for an answer from its peer: None when it holds no
/// unacknowledged byte (TIOCOUTQ); else whether a retransmission or a
/// window probe is outstanding (TCP_INFO's retransmits, probes). A peer
/// that answers zero-window probes clears `probes` with each answer, so a
/// reader that only stopped reading is not unanswered for long, however
/// far apart the probes have backed off; `check_stall` fails a leg only
/// after it stayed unanswered for the whole bound.
pub(super) fn leg_waits(sock: &TcpStream) -> Option<bool> {
    if unacked(sock) <= 0 {
        return None;
    }
    let info = crate::sys::tcp_info(sock.as_fd()).ok();
    Some(info.is_some_and(|i| i.tcpi_retransmits > 0 || i.tcpi_probes > 0))
}

/// Samples `leg` (`leg_waits`) into its answer clock (proto's liveness):
/// how long (ms) it has been unanswered without a break (None: answered,
/// or nothing held).
pub(super) fn sample_leg(leg: Option<&TcpStream>, clock: &mut Unanswered) -> Option<u64> {
    clock.look(leg.and_then(leg_waits), now_ms())
}
