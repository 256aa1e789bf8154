// SPDX-License-Identifier: MIT OR Apache-2.0
//! A program's streams and listeners relayed through the guest's daemon
//! ([`crate::daemon`]): where the kernel family is not loaded and a daemon
//! answers, [`crate::XenStream`] and [`crate::XenListener`] go through it,
//! each connection one end of a Unix stream socket pair in the program.
//! `wire.rs` is the request protocol both sides speak.

mod client;
mod wire;

pub use client::present;
pub(crate) use client::{connect_via, listen_via, RelayListener, RelayStream};
pub(crate) use wire::*;
pub use wire::{socket_path, ENV_DAEMON_SOCKET};
