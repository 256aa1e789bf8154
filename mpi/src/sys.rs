// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the engine's safety rests on: a fragment's bytes that Open MPI
//! keeps alive until the send completes, and the engine handed between
//! threads under one lock.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Bytes owned by the caller of [`crate::Engine::send_in_place`], held
/// by address until they are written.
pub(crate) struct Borrowed {
    ptr: *const u8,
    len: usize,
}

impl Borrowed {
    /// Remembers where `bytes` are. Taking the address is safe; reading
    /// it later relies on `send_in_place`'s contract.
    pub(crate) fn new(bytes: &[u8]) -> Borrowed {
        Borrowed {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: a Borrowed is made only by `Engine::send`, for a send
        // whose caller promised (`Engine::send_in_place`'s contract) that
        // the bytes stay valid and unchanged until the send completes;
        // the queue entry holding this Borrowed is dropped at completion
        // or when the endpoint fails, before the caller is told.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The engine as the C side holds it: the engine is single-threaded
/// (`Rc`, `RefCell`), and under `MPI_THREAD_MULTIPLE` Open MPI calls the
/// BTL from any thread. Every access goes through one reentrant lock
/// (`ffi`), so threads take turns and only the thread holding the lock
/// touches the engine; reentry from a callback stays on that thread.
pub(crate) struct Confined<T>(pub(crate) T);

// SAFETY: the one Confined is the engine inside the ReentrantMutex of
// `ffi::XsbtlEngine` and is reachable only through it; the mutex orders
// all accesses from different threads (each thread's accesses
// happen-before the next holder's), so the Rc counts and RefCell flags
// inside are never touched by two threads at once, which is all that
// makes them !Send.
unsafe impl<T> Send for Confined<T> {}

/// Bytes readable on a kernel socket (`FIONREAD`), asked without reading:
/// `af_xen.ko` answers from the ring's indices and, unlike a read that
/// finds the ring empty, asks the peer for no notification.
pub(crate) fn readable(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points
    // to `n`; `fd` is a live descriptor for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}
