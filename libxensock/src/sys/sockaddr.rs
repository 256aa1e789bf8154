// SPDX-License-Identifier: MIT OR Apache-2.0
//! `struct sockaddr_xen` bytes in and out of socket2's address storage.

use std::io;

use socket2::{SockAddr, SockAddrStorage};

/// An address of the socket layer made of `raw` (which starts with its
/// family), at most a `sockaddr_storage`.
pub(crate) fn from_bytes(raw: &[u8]) -> io::Result<SockAddr> {
    if raw.len() > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: the closure writes `raw.len()` bytes into the storage socket2
    // provides (a zeroed sockaddr_storage, so the copy stays inside it, as
    // checked above) and sets the length to exactly those bytes, which
    // start with the family: a valid address of that family.
    let ((), sa) = unsafe {
        SockAddr::try_init(|storage: *mut SockAddrStorage, len| {
            std::ptr::copy_nonoverlapping(raw.as_ptr(), storage.cast::<u8>(), raw.len());
            *len = raw.len() as libc::socklen_t;
            Ok(())
        })
    }?;
    Ok(sa)
}

/// The bytes of an address the kernel filled in.
pub(crate) fn bytes(sa: &SockAddr) -> &[u8] {
    let len = (sa.len() as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: `as_ptr` points at socket2's sockaddr_storage, of which the
    // first `len` bytes (bounded by its size above) were written by the
    // kernel; they are read as bytes while `sa` is borrowed.
    unsafe { std::slice::from_raw_parts(sa.as_ptr().cast::<u8>(), len) }
}
