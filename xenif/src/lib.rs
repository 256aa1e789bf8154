// SPDX-License-Identifier: MIT OR Apache-2.0
//! Xen interfaces shared by xensock's user-space crates.
//!
//! - [`xs_wire`]: the XenStore wire format (`io/xs_wire.h`): message header,
//!   message types, errno names, permission strings. Used by the XenStore
//!   client in `xensock-discovery` and the simulated xenstored in
//!   `xensock-sim`.
//! - [`XenBackend`] and friends: the grant-table / event-channel interface
//!   the user-space transport is written against.
//! - [`dev::DevXen`]: its implementation over the real `/dev/xen` devices
//!   (in `sys/`, with every `unsafe` block of the crate).
//!   The simulated host (`xensock-sim`) provides the other implementation.
//!
//! This crate has no test-only code and depends only on `libc` and
//! `thiserror`, so `libxensock` can depend on it directly.
#![deny(unsafe_code)]

mod backend;
#[allow(unsafe_code)] // the unsafe floor: every unsafe block, each with its SAFETY comment
mod sys;
pub mod xs_wire;

#[cfg(target_os = "linux")]
pub use sys::dev;
pub use sys::poll_readable;

pub use backend::{
    Access, DomId, EventChannel, GrantRef, GrantedRegion, MappedRegion, PeerState, Port,
    SharedRegion, UnmapNotify, XenBackend, XenError, PAGE_SIZE,
};
