// SPDX-License-Identifier: MIT OR Apache-2.0
//! # libxensock
//!
//! xensock sockets for Rust programs: stream connections between
//! co-resident Xen domains over grant-mapped shared-memory rings, in the
//! shape of `std::net`.
//!
//! In a guest, [`XenListener::bind`] and [`XenStream::connect`] pick the
//! backend the guest has (see Backends below):
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use libxensock::{SockAddrXen, XenListener, XenStream};
//!
//! // In domain 1:
//! let listener = XenListener::bind("xen:self:5000")?;
//! for stream in listener.incoming() {
//!     let mut s = stream?;
//!     let mut buf = [0u8; 4096];
//!     let n = s.read(&mut buf)?;
//!     s.write_all(&buf[..n])?;
//! }
//! // In domain 2:
//! let mut s = XenStream::connect(SockAddrXen::new(1, 5000))?;
//! s.write_all(b"hello")?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The same on two domains of a simulated host, in one process (it runs
//! anywhere, as this example does under `cargo test`): one
//! [`Transport`] per domain, whose `bind` and `connect` are those of
//! `XenListener` and `XenStream`.
//!
//! ```
//! use std::io::{Read, Write};
//! use std::thread;
//! use libxensock::{SockAddrXen, Transport};
//! use xensock_sim::{DomainConfig, SimHost};
//!
//! let host = SimHost::start().map_err(std::io::Error::other)?;
//! let one = host.create_domain(DomainConfig::new("one")).map_err(std::io::Error::other)?;
//! let two = host.create_domain(DomainConfig::new("two")).map_err(std::io::Error::other)?;
//! let (t1, t2) = (Transport::sim(host.dir(), one.domid)?, Transport::sim(host.dir(), two.domid)?);
//!
//! let listener = t1.bind("xen:self:5000")?;
//! let server = thread::spawn(move || -> std::io::Result<()> {
//!     let (mut s, peer) = listener.accept()?;
//!     assert_eq!(peer.domid, u32::from(two.domid));
//!     let mut buf = [0u8; 5];
//!     s.read_exact(&mut buf)?;
//!     s.write_all(&buf)
//! });
//! let mut s = t2.connect(SockAddrXen::new(one.domid.into(), 5000))?;
//! s.write_all(b"hello")?;
//! let mut back = [0u8; 5];
//! s.read_exact(&mut back)?;
//! assert_eq!(&back, b"hello");
//! server.join().unwrap()?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! ## Backends
//!
//! Where the AF_XEN kernel family is loaded (`af_xen.ko`, its number in
//! `/sys/module/af_xen/parameters/family`), [`XenStream::connect`] and
//! [`XenListener::bind`] make ordinary AF_XEN sockets of it (through
//! `socket2`; every method is the socket call a C program would make).
//! Elsewhere they use the **user-space transport** ([`Transport`]): one
//! link per peer domain, set up once through XenStore, with
//! connect/accept/close as control frames on the link's rings and one pair
//! of data rings per connection, all from `xensock-proto`. It runs over
//! the real `/dev/xen` devices or over the simulated host (`xensock-sim`);
//! [`backend()`] says which and why. The layout and handshakes are in
//! `docs/protocol.md`, section 6.
//!
//! Errors are `io::Error`s carrying the errno a socket user expects:
//! `ECONNREFUSED` (nobody listens, backlog full), `EADDRINUSE`,
//! `ETIMEDOUT`, `ECONNRESET` / `EPIPE` (peer reset, died or closed),
//! `EHOSTUNREACH` (no link to that domain could be set up), `EINVAL`
//! (an address no domain can have). An address string that does not parse
//! fails with `ErrorKind::InvalidInput` saying what is wrong.
//!
//! Readiness: every stream and listener has a pollable descriptor
//! ([`std::os::fd::AsRawFd`]): the socket itself for the kernel family, an
//! eventfd that is readable when the socket has something to report for
//! the user-space transport; both work with poll/epoll/mio and with
//! `tokio-xensock`.
#![deny(unsafe_code)]

mod addr;
mod backend;
// The migration switch (docs/migration.md): the transport hands a
// connection to it at its first move.
mod carrier;
mod claim;
mod clock;
mod conn;
mod control;
pub mod daemon;
mod error;
pub mod hooks;
mod kernel;
mod listener;
mod options;
mod relay;
mod rings;
mod seqpacket;
mod stream;
#[allow(unsafe_code)] // the unsafe floor: every unsafe block, each with its SAFETY comment
mod sys;
mod transport;

pub use addr::{decode_sockaddr, encode_sockaddr, SOCKADDR_XEN_LEN};
pub use addr::{
    AddrParseError, SockAddrXen, ToXenAddr, DOMID_ANY, DOMID_FIRST_RESERVED, DOMID_SELF, PORT_ANY,
};
pub use backend::{backend, backend_with_sysfs, BackendKind, BackendReport, KERNEL_FAMILY_PARAM};
pub use conn::ConnPhase;
pub use error::Error;
pub use listener::{Incoming, XenListener};
pub use options::SocketOptions;
pub use seqpacket::{XenSeqPacket, XenSeqPacketListener};
pub use stream::XenStream;
pub use transport::{
    decode_field, Carrier, Config, ConnStatus, LegCounters, LinkStatus, Status, Transport,
    ENV_PEER_LOST_MS, EPHEMERAL_PORT_FIRST,
};
pub use xensock_xenif::DomId;

/// The carrier switch's benchmark (`benches/carrier.rs`): not a stable
/// interface.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::carrier::bench::main as carrier_bench;
}
