// SPDX-License-Identifier: MIT OR Apache-2.0
//! Rings as the switch sees them: a [`RawRing`] plus whatever keeps its
//! memory mapped: grant mappings from the transport, memfd mappings in the
//! testbed.

use std::sync::Arc;

use xensock_proto::mem::RawRing;

/// Memory holding one ring; the ring stays valid while the value lives.
pub(crate) trait RingRegion: Send + Sync {
    /// The ring over this memory.
    fn ring(&self) -> RawRing;

    /// Whether this is a mapping of a peer's ring whose pages are gone:
    /// this guest was suspended (saved, migrated) since it was made. Never for a ring of our own.
    fn stale(&self) -> bool {
        false
    }
}

/// A ring shared between the switch and whoever supplied it.
pub(crate) type SharedRing = Arc<dyn RingRegion>;

/// A receive ring just made for an offer: the owner's view, and the view
/// to hand to the sender (on a real host: a grant it maps).
pub(crate) struct NewRing {
    /// The receiver's mapping.
    pub local: SharedRing,
    /// The sender's mapping.
    pub for_peer: SharedRing,
}
