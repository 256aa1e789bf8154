// SPDX-License-Identifier: MIT OR Apache-2.0
//! The carrier engine: one stream connection carried over a ring or a TCP
//! leg, switching between them without losing, duplicating or reordering a
//! byte (issue #7, `docs/migration.md`).
//!
//! Self-contained so the user-space transport can adopt it: it needs proto,
//! libc and [`crate::evfd`]. The decisions are proto's (`switch::TxPath`,
//! `switch::RxPath`); this module is their host: the TCP legs
//! ([`leg`]), frames on them ([`frames`]) and the engine that moves bytes
//! and answers the peer ([`engine`]).

mod driver;
mod engine;
mod frames;
mod leg;
mod ring;

// The surface the transport will use; nothing in the crate does yet.
#[allow(unused_imports)]
pub(crate) use engine::{
    Doorbell, Engine, EngineConfig, EngineStatus, InitialRings, Kick, ReadyHook, RingAlloc, Seed,
    Trigger,
};
#[allow(unused_imports)]
pub(crate) use leg::{endpoint_of, socket_addr_of, LegListener, LegListenerConfig, LegStats};
#[allow(unused_imports)]
pub(crate) use ring::{MemfdRing, NewRing, RingRegion, SharedRing};
// The frame code alone, for the lab bench's framed-TCP row (a plain socket
// carrying the carrier's frames, to tell the frames' cost from the engine's).
#[allow(unused_imports)]
pub(crate) use frames::{send_raw, Frame, Inbox, Incoming, Outbox};
