// SPDX-License-Identifier: MIT OR Apache-2.0
//! The carrier switch: one stream connection carried over a ring or a TCP
//! leg, switching between them without losing, duplicating or reordering a
//! byte (`docs/migration.md`).
//!
//! It needs proto, libc and [`crate::sys::eventfd`]. The decisions are proto's
//! (`switch::TxPath`, `switch::RxPath`); this module is their host: the
//! TCP legs ([`leg`]), frames on them ([`frames`]) and the switch that
//! moves bytes and answers the peer ([`switch`]). [`testbed`] wires two
//! switches together as two domains would be, for the tests and the
//! benchmark ([`bench`], feature `internals`).

#[cfg(feature = "internals")]
pub(crate) mod bench;
mod driver;
mod frames;
mod leg;
mod ring;
mod switch;
#[cfg(any(test, feature = "internals"))]
pub(crate) mod testbed;
#[cfg(test)]
mod tests;

pub(crate) use leg::{endpoint_of, socket_addr_of, LegListener, LegListenerConfig, LegStats};
pub(crate) use ring::{NewRing, RingRegion, SharedRing};
#[cfg(any(test, feature = "internals"))]
pub(crate) use switch::InitialRings;
pub(crate) use switch::{
    Doorbell, Kick, ReadyHook, RingAlloc, Seed, Switch, SwitchConfig, Trigger,
};
