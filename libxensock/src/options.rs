// SPDX-License-Identifier: MIT OR Apache-2.0
//! Per-socket options, the same for every backend.

/// Per-socket options: the `SO_RCVBUF` and `listen(backlog)` equivalents.
#[derive(Debug, Clone, Copy, Default)]
pub struct SocketOptions {
    /// Receive ring size in bytes (power of two, 2 KiB..4 MiB); `None` for
    /// the transport's default. The peer's send ring is our receive ring,
    /// so this is also the peer's `SO_SNDBUF`.
    pub recv_buffer: Option<usize>,
    /// Listener backlog; `None` for the transport's default.
    pub backlog: Option<usize>,
}
