// SPDX-License-Identifier: MIT OR Apache-2.0
//! The floor: every `unsafe` block of the simulated host's library, each
//! with its `// SAFETY:` comment. `fdpass` is the host's Unix seqpacket
//! wire with descriptors attached, its memfds and eventfds; this file has
//! the mappings a domain's handle makes of grant pages and the process
//! calls of the host.

pub(crate) mod fdpass;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use xensock_xenif::PAGE_SIZE;

/// A range of this process's address space that this value owns, mapped
/// by [`Mapped::shared`] or [`Mapped::reserve`] and unmapped when dropped.
/// Shared memory: what others write into it is the ring protocol's
/// business, not this type's.
pub(crate) struct Mapped {
    addr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapped owns its range and hands out only its address; its own
// calls (mmap over the range, munmap when dropped) are the same from any
// thread.
unsafe impl Send for Mapped {}
// SAFETY: as above; `scrub` and `place` replace pages of the owned range
// in place (MAP_FIXED is atomic), which concurrent readers see as old or
// new pages, never as a hole.
unsafe impl Sync for Mapped {}

fn prot(writable: bool) -> libc::c_int {
    if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    }
}

fn mapped(p: *mut libc::c_void, len: usize) -> io::Result<Mapped> {
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let addr =
        NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
    Ok(Mapped { addr, len })
}

impl Mapped {
    /// `len` bytes of `fd` from its start, shared, where the kernel puts
    /// them.
    pub(crate) fn shared(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mapped> {
        // SAFETY: a fresh mapping at an address the kernel chooses
        // replaces nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot(writable),
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        mapped(p, len)
    }

    /// `len` bytes reserved with no access, for [`Mapped::place`] to fill.
    pub(crate) fn reserve(len: usize) -> io::Result<Mapped> {
        // SAFETY: a fresh anonymous mapping at an address the kernel
        // chooses replaces nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        mapped(p, len)
    }

    /// Maps `len` bytes of `fd` from `offset`, shared, at byte `at` of
    /// this range, replacing what is there. `InvalidInput` if that is not
    /// whole pages inside the range.
    pub(crate) fn place(
        &self,
        at: usize,
        len: usize,
        writable: bool,
        fd: BorrowedFd<'_>,
        offset: usize,
    ) -> io::Result<()> {
        let inside = at.checked_add(len).is_some_and(|end| end <= self.len);
        if !inside || !at.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "pages outside the mapped range",
            ));
        }
        let off = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        // SAFETY: `at..at+len` lies inside the range this value owns
        // (checked above), so MAP_FIXED replaces only its own pages.
        let p = unsafe {
            libc::mmap(
                self.addr.as_ptr().add(at).cast(),
                len,
                prot(writable),
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Replaces the whole range with private zero pages, in place: what a
    /// revoked grant or mapping shows from then on.
    pub(crate) fn scrub(&self, writable: bool) {
        // SAFETY: the range is this value's; MAP_FIXED replaces it
        // atomically, so concurrent readers see either the old page or a
        // zero page, never a hole.
        unsafe {
            libc::mmap(
                self.addr.as_ptr().cast(),
                self.len,
                prot(writable),
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the range is this value's, and nothing of this process
        // uses it once its owner is gone.
        unsafe { libc::munmap(self.addr.as_ptr().cast(), self.len) };
    }
}

/// Kills the process group that `pid` leads. The caller knows `pid` is its
/// unreaped child, so the pid cannot have been reused.
pub(crate) fn kill_process_group(pid: u32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
}

/// Waits until `pid` (our child) has exited, without reaping it.
pub(crate) fn wait_exited_no_reap(pid: u32) {
    loop {
        // SAFETY: siginfo_t is plain old data; all-zero is valid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes into the live `info`; WNOWAIT leaves the
        // child waitable so that its pid stays reserved.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, blocked in the calling thread and the
/// threads it spawns afterwards, so that one thread can wait for them
/// (the `xensock-sim` command stops its host cleanly on any of them).
pub struct StopSignals(libc::sigset_t);

impl StopSignals {
    /// Blocks the three signals in this thread.
    pub fn block() -> StopSignals {
        // SAFETY: sigset_t is plain old data and the sig* calls only touch
        // the local set and this thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            StopSignals(set)
        }
    }

    /// Waits for one of them.
    pub fn wait(&self) {
        let mut sig = 0;
        // SAFETY: the set is initialised (`block`); sigwait stores the
        // signal number in the live `sig`.
        unsafe { libc::sigwait(&self.0, &mut sig) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn place_refuses_pages_outside_the_range_and_fills_inside_it() {
        let mem = Mapped::reserve(2 * PAGE_SIZE).unwrap();
        let file = fdpass::memfd(PAGE_SIZE).unwrap();
        for (at, len) in [
            (2 * PAGE_SIZE, PAGE_SIZE),
            (PAGE_SIZE, 2 * PAGE_SIZE),
            (1, PAGE_SIZE),
            (0, 7),
        ] {
            let e = mem.place(at, len, true, file.as_fd(), 0).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "at {at} len {len}");
        }
        mem.place(PAGE_SIZE, PAGE_SIZE, true, file.as_fd(), 0)
            .unwrap();
        let other = Mapped::shared(file.as_fd(), PAGE_SIZE, true).unwrap();
        // SAFETY: both point at one live page of the same memfd.
        unsafe {
            other.as_ptr().write_volatile(42);
            assert_eq!(mem.as_ptr().add(PAGE_SIZE).read_volatile(), 42);
        }
        mem.scrub(true);
        // SAFETY: the page is still mapped, now a private zero page.
        assert_eq!(unsafe { mem.as_ptr().add(PAGE_SIZE).read_volatile() }, 0);
    }
}
