// SPDX-License-Identifier: GPL-2.0
//! How a connection's bytes travel.
//!
//! - `ring`: one direction over a shared-memory ring (`Pipe`): our granted
//!   pages, the peer's mapped pages, or local memory for loopback.
//! - `leg`: the TCP legs that carry a connection while its peer is on
//!   another host, and their listener.
//! - `switch`: moving a connection from its rings to TCP legs and back
//!   without losing, duplicating or reordering a byte.

pub(crate) mod leg;
pub(crate) mod ring;
pub(crate) mod switch;
