// SPDX-License-Identifier: MIT OR Apache-2.0
//! The engine's errors.

/// What went wrong, with what it was about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No xensock backend in this process (no `af_xen.ko`, no `/dev/xen`,
    /// no simulated host), or the listener could not be bound.
    #[error("xensock is not available here: {0}")]
    Unavailable(String),
    /// A peer's modex card is not one this BTL can read.
    #[error("unreadable modex card: {0}")]
    Card(String),
    /// The peer broke the framing (garbage, a bad hello).
    #[error("protocol error from the peer: {0}")]
    Protocol(String),
    /// A frame larger than this rank accepts.
    #[error("a frame of {len} bytes, the limit is {limit}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Connecting to the peer failed.
    #[error("connect to domain {domid} port {port}: {source}")]
    Connect {
        /// The domain tried.
        domid: u32,
        /// Its port.
        port: u32,
        /// Why.
        source: std::io::Error,
    },
    /// The connection to the peer failed or ended without its bye.
    #[error("lost the peer: {0}")]
    PeerLost(String),
    /// No endpoint of that id (removed, or never added).
    #[error("no endpoint {0}")]
    NoEndpoint(u32),
}
