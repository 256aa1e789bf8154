// SPDX-License-Identifier: MIT OR Apache-2.0
//! Co-residency discovery for xensock.
//!
//! - [`xs`]: our own XenStore client (the `xs_wire.h` protocol over the
//!   xenstored socket or `/dev/xen/xenbus`), blocking and async.
//! - [`advert`]: a guest advertises its addresses and xensock version.
//! - [`agent`]: the dom0 agent that publishes, for each guest, the peers of
//!   its tenant that run on the same host (`xensock-agent`).
//! - [`peers`]: a guest asks "is this IP co-resident, which domid/UUID is
//!   it?", watches for peers arriving, leaving and migrating, or uses an
//!   explicit peer list when there is no agent.
//!
//! The XenStore layout is in [`layout`] and `docs/discovery.md`.
#![deny(unsafe_code)]

pub mod advert;
pub mod agent;
pub mod layout;
pub mod peers;
#[allow(unsafe_code)] // the unsafe floor: every unsafe block, each with its SAFETY comment
mod sys;
mod tx_gate;
pub mod xs;

pub use xensock_xenif::DomId;
