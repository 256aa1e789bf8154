// SPDX-License-Identifier: MIT OR Apache-2.0
//! The floor: every `unsafe` block of this crate, each with its
//! `// SAFETY:` comment. `dev` is the real-Xen backend over `/dev/xen`
//! (the devices' ioctls and mappings); this file has the wait on an event
//! channel's descriptor that every backend's channel uses.

#[cfg(target_os = "linux")]
pub mod dev;

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;

/// Waits up to `ms` milliseconds (negative: without a bound) for `fd` to
/// become readable: whether it did. EINTR is retried.
pub fn poll_readable(fd: BorrowedFd<'_>, ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is a valid pollfd for the duration of the call and
        // the count is 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
