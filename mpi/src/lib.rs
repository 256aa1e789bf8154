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
#![deny(unsafe_code)]

pub mod card;
mod engine;
mod error;
#[allow(unsafe_code)] // the C ABI Open MPI's component calls
pub mod ffi;
#[allow(unsafe_code)] // the unsafe floor: every unsafe block, each with its SAFETY comment
mod sys;
pub mod wire;

pub use card::Card;
pub use engine::{Config, EndpointId, Engine, Events, Sent};
pub use error::Error;
