// SPDX-License-Identifier: MIT OR Apache-2.0
//! # xensock-proto
//!
//! The xensock wire protocol, shared by the AF_XEN kernel module and the
//! user-space transport: one source of truth, so a fix here fixes both.
//!
//! * [`layout`]: the `#[repr(C)]` shared pages: ring header (identity,
//!   producer and consumer lines), ring geometry, grant directory.
//! * [`ring`]: the single-producer/single-consumer byte ring over any
//!   [`ring::RingMemory`], with event-index notification suppression and
//!   validation of everything the peer writes.
//! * [`mem`]: [`ring::RingMemory`] over raw shared memory.
//! * [`record`]: record framing for `SOCK_SEQPACKET` messages over the
//!   byte ring (header, validation, whole-record publication).
//! * [`store`]: every XenStore node xensock reads or writes.
//! * [`link`]: the link handshake's node values, states and what a half
//!   read back means.
//! * [`ctrl`]: the versioned control-message codec for the link and the TCP
//!   leg, strict on untrusted input.
//! * [`switch`]: the ring <-> TCP carrier state machine, with byte offsets
//!   as sequence numbers.
//! * [`offer`]: the offer clock, when a direction on TCP offers a new ring
//!   and when it gives an unanswered offer up.
//!
//! The crate is `no_std`, has no dependencies in its default build, does no
//! I/O and never panics on input from a peer. `docs/protocol.md` in the
//! repository describes the protocol with diagrams.
//!
//! ```
//! use core::ptr::NonNull;
//! use xensock_proto::layout::{RingGeometry, RingHeader, RingIdentity, DATA_RING_MAGIC};
//! use xensock_proto::mem::RawRing;
//! use xensock_proto::ring::{Consumer, Producer};
//!
//! // One page, 128-byte aligned, standing in for a granted page.
//! #[repr(C, align(4096))]
//! struct Page([u8; 4096]);
//! let mut page = Box::new(Page([0; 4096]));
//! let geometry = RingGeometry::new(11).unwrap();
//! let base = NonNull::new(page.0.as_mut_ptr()).unwrap();
//! // SAFETY: the page outlives the ring and is only used through it.
//! let ring = unsafe { RawRing::from_region(base, 4096, geometry) }.unwrap();
//! ring.header().init(&RingIdentity {
//!     magic: DATA_RING_MAGIC, order: 11, owner_domid: 1, peer_domid: 2, conn_id: 1, epoch: 0,
//! });
//!
//! let mut tx = Producer::new(ring);
//! let mut rx = Consumer::new(ring);
//! assert_eq!(tx.write(b"hello").unwrap(), 5);
//! let mut buf = [0u8; 16];
//! assert_eq!(rx.read(&mut buf).unwrap(), 5);
//! assert_eq!(&buf[..5], b"hello");
//! ```

#![no_std]
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

// The fuzzing build (and only it) links std: `arbitrary`'s derives need it.
#[cfg(feature = "arbitrary")]
extern crate std;

pub mod control_stream;
pub mod ctrl;
pub mod dial;
#[cfg(feature = "arbitrary")]
#[allow(unsafe_code)] // the fuzz targets build rings over raw memory
pub mod fuzzing;
pub mod layout;
pub mod leg;
pub mod link;
pub mod link_half;
pub mod liveness;
#[allow(unsafe_code)] // proto's floor: the ring over raw shared memory
pub mod mem;
pub mod offer;
pub mod record;
pub mod ring;
pub mod store;
pub mod switch;
