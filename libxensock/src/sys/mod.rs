// SPDX-License-Identifier: MIT OR Apache-2.0
//! The floor: every `unsafe` block of the library, each with its
//! `// SAFETY:` comment, as small safe functions over libc (and over the
//! memory shared with other domains, [`shared`]). Nothing here calls
//! into the rest of the library.

pub(crate) mod eventfd;
#[cfg(any(test, feature = "internals"))]
pub(crate) mod memfd;
pub(crate) mod shared;
pub(crate) mod sockaddr;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `poll(2)` over `fds`: the raw result (-1 with errno set on failure).
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> libc::c_int {
    // SAFETY: `fds` is a valid array of its length for the whole call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }
}

/// Bytes waiting to be read on a socket (`FIONREAD`).
pub(crate) fn readable_bytes(fd: BorrowedFd<'_>) -> io::Result<usize> {
    int_ioctl(fd, libc::FIONREAD)
}

/// Bytes in a TCP socket's send queue, not yet acknowledged (`TIOCOUTQ`).
pub(crate) fn unsent_bytes(fd: BorrowedFd<'_>) -> io::Result<usize> {
    int_ioctl(fd, libc::TIOCOUTQ)
}

fn int_ioctl(fd: BorrowedFd<'_>, request: libc::Ioctl) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: both requests write one int to the pointer, which points at
    // `n` for the duration of the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), request, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// A TCP socket's `TCP_INFO`.
pub(crate) fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<libc::tcp_info> {
    // SAFETY: tcp_info is plain integers, for which all zeroes is valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for the call; the kernel writes
    // at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// A descriptor's status flags (`F_GETFL`).
pub(crate) fn status_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: fcntl with no pointer argument.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if fl < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// The real user id of this process.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid cannot fail and takes no arguments.
    unsafe { libc::getuid() }
}

/// Fills `buf` from the kernel's random source (`getrandom(2)`); whether
/// all of it was filled.
pub(crate) fn random_fill(buf: &mut [u8]) -> bool {
    // SAFETY: writes at most `buf.len()` bytes into `buf`.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    got == buf.len() as isize
}

/// Runs `f` when the process exits normally (`atexit(3)`).
pub(crate) fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: registers a function pointer with no captured state.
    unsafe { libc::atexit(f) == 0 }
}

/// Takes an exclusive `flock` on `fd` without waiting (`EWOULDBLOCK`:
/// another open file description holds it).
pub(crate) fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: flock on a descriptor, no pointers.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A new epoll instance, closed on exec.
pub(crate) fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: no pointer arguments.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ep) })
}

/// Adds `fd` to `ep` for input readiness, reported with `token`.
pub(crate) fn epoll_add(ep: BorrowedFd<'_>, fd: RawFd, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: `ev` is valid for the call; the kernel copies it.
    let rc = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `fd` from `ep` (already gone is not an error).
pub(crate) fn epoll_del(ep: BorrowedFd<'_>, fd: RawFd) {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: as in epoll_add.
    unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
}

/// Waits on `ep` for up to `timeout_ms` (-1: no limit): the raw result
/// (-1 with errno set on failure), the events in `events[..n]`.
pub(crate) fn epoll_wait(
    ep: BorrowedFd<'_>,
    events: &mut [libc::epoll_event],
    timeout_ms: libc::c_int,
) -> libc::c_int {
    let max = libc::c_int::try_from(events.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `events` has room for `max` entries for the whole call.
    unsafe { libc::epoll_wait(ep.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) }
}

/// A non-blocking monotonic timer descriptor, closed on exec.
pub(crate) fn timerfd_create() -> io::Result<OwnedFd> {
    // SAFETY: no pointer arguments.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Arms a timer descriptor once, `after` from now.
pub(crate) fn timerfd_arm(fd: BorrowedFd<'_>, after: std::time::Duration) {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: after.as_secs() as libc::time_t,
            tv_nsec: after.subsec_nanos() as libc::c_long,
        },
    };
    // SAFETY: a valid spec for the call; no old value wanted.
    unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
}

/// Reads a timer's or eventfd's 8-byte counter (non-blocking: nothing
/// there reads as 0).
pub(crate) fn read_counter(fd: BorrowedFd<'_>) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a local u64.
    unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut v as *mut u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
    v
}

/// Adds `v` to an eventfd's counter (EAGAIN, a saturated counter, means
/// it is readable already).
pub(crate) fn write_counter(fd: BorrowedFd<'_>, v: u64) {
    // SAFETY: writes 8 bytes from a local u64.
    unsafe {
        libc::write(
            fd.as_raw_fd(),
            (&v as *const u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
}

/// CPU time (user + system, all threads) this process used so far.
#[cfg(feature = "internals")]
pub(crate) fn cpu_time() -> std::time::Duration {
    // SAFETY: rusage is plain integers, for which all zeroes is valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a local rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Calls `handler` on each SIGPIPE from now on (tests that prove none is
/// raised).
#[cfg(test)]
pub(crate) fn on_sigpipe(handler: extern "C" fn(libc::c_int)) -> io::Result<()> {
    // SAFETY: sigaction is plain data, for which all zeroes is valid.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler as usize;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: `sa` is valid for the call; the handler is an `extern "C"`
    // function the caller keeps async-signal-safe.
    if unsafe { libc::sigaction(libc::SIGPIPE, &sa, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Accepts a connection on a listening socket, closed on exec.
pub(crate) fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: no address wanted (null pointers are allowed).
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: accept just installed this descriptor for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Receives one packet into `buf` and the first descriptor attached to it
/// (`SCM_RIGHTS`; any further ones are closed), retrying on EINTR.
pub(crate) fn recv_with_fd(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    nonblocking: bool,
) -> io::Result<(usize, Option<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let mut flags = MsgFlags::MSG_CMSG_CLOEXEC;
    if nonblocking {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    loop {
        let mut iov = [io::IoSliceMut::new(buf)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), flags) {
            Ok(msg) => {
                let mut fd = None;
                let cmsgs = msg
                    .cmsgs()
                    .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        for f in fds {
                            // SAFETY: the kernel just installed `f` in this
                            // process for us (SCM_RIGHTS); nothing else owns it.
                            let owned = unsafe { OwnedFd::from_raw_fd(f) };
                            if fd.is_none() {
                                fd = Some(owned);
                            }
                        }
                    }
                }
                return Ok((msg.bytes, fd));
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(io::Error::from_raw_os_error(e as i32)),
        }
    }
}
