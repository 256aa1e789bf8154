// SPDX-License-Identifier: MIT OR Apache-2.0
//! The crate's one `unsafe` block: registering a socket's descriptor with
//! tokio's reactor.

use std::io;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub(crate) fn register<T: std::os::fd::AsRawFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `inner` is a libxensock socket that owns its descriptor (an
    // AF_XEN socket or the transport's eventfd); the
    // descriptor stays open and unchanged until the socket is dropped,
    // which happens only when the AsyncFd (its owner) is dropped or
    // `into_inner` is called.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE | Interest::WRITABLE) }
        .map_err(io::Error::from)
}
