// SPDX-License-Identifier: MIT OR Apache-2.0
//! The crate's floor: every `unsafe` block, each with its `// SAFETY:`
//! comment, as small safe functions over libc. Nothing here calls into
//! the rest of the crate.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Takes an exclusive `flock` on `fd` without waiting (`EWOULDBLOCK`:
/// another open file description holds it).
pub(crate) fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: flock on a descriptor, no memory passed.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A new eventfd (blocking), closed on exec.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: no pointer arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the eventfd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd's counter (makes it readable).
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    unsafe { libc::write(fd.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
}

/// `send(MSG_NOSIGNAL)` (a socket) or `write` (a device) of `buf`: the
/// raw result (-1 with errno set on failure).
pub(crate) fn send_or_write(fd: RawFd, buf: &[u8], socket: bool) -> isize {
    if socket {
        // SAFETY: sends from a live buffer of the given length.
        unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) }
    } else {
        // SAFETY: writes from a live buffer of the given length.
        unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) }
    }
}

/// `read` into `buf`: the raw result (-1 with errno set on failure).
pub(crate) fn read(fd: RawFd, buf: &mut [u8]) -> isize {
    // SAFETY: reads into a live buffer of the given length.
    unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) }
}

/// `poll(2)` over `fds`: the raw result (-1 with errno set on failure).
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> libc::c_int {
    // SAFETY: `fds` is a valid array of its length for the whole call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }
}

/// Every address of this machine's interfaces (`getifaddrs`).
pub(crate) fn interface_addresses() -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned; ifa_addr
        // is null or points to a sockaddr of the family it names.
        unsafe {
            let ifa = &*cur;
            let sa = ifa.ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.push(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}
