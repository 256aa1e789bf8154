// SPDX-License-Identifier: MIT OR Apache-2.0
//! A non-blocking eventfd: the pollable readiness descriptor of every
//! stream and listener, and the manager thread's wake-up.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::{read_counter, write_counter};

#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no pointer arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable (a new edge for epoll users).
    pub(crate) fn signal(&self) {
        write_counter(self.0.as_fd(), 1);
    }

    /// Makes the descriptor unreadable again.
    pub(crate) fn drain(&self) {
        read_counter(self.0.as_fd());
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
