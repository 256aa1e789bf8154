// SPDX-License-Identifier: MIT OR Apache-2.0
//! # xensock-btl
//!
//! The transport engine of Open MPI's `xensock` BTL: ranks in different,
//! co-resident Xen guests exchange Open MPI fragments over xensock stream
//! connections (AF_XEN sockets where `af_xen.ko` is loaded, else
//! libxensock's user-space transport). `c/btl_xensock.c` is the part
//! Open MPI's macros force into C (the component and module tables,
//! descriptors, the modex); everything it does with bytes goes through
//! the functions of [`ffi`], which drive an [`Engine`].
//!
//! Each ordered pair of ranks has one connection, opened by the sender
//! at its first fragment: the sender writes a [`wire::Hello`] and then
//! frames, the receiver only reads. One-way connections need no rule for
//! two ranks that connect to each other at once.
//!
//! A guest that is saved and restored, or moves away and back, keeps its
//! connections: the carrier under each one moves to TCP and back (see
//! libxensock and `af_xen.ko`), and the engine sees only a stream.

pub mod card;
mod engine;
pub mod ffi;
mod sys;
pub mod wire;

pub use card::Card;
pub use engine::{Config, EndpointId, Engine, Events, Sent};

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
