// SPDX-License-Identifier: MIT OR Apache-2.0
//! The carrier switch's own tests: two switches wired together as two
//! domains would be ([`crate::carrier::testbed`], [`support`]), over memfd rings and loopback TCP legs.

mod hostile;
mod legs;
mod restored;
mod stream;
mod support;
