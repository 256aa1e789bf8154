// SPDX-License-Identifier: MIT OR Apache-2.0
//! Sharing a guest's user-space transport between processes:
//! `xensock daemon`.
//!
//! One process per guest runs the user-space transport (its XenStore link
//! nodes are per domain, [`crate::claim`]). The daemon is that process for
//! everyone else: it runs the transport and serves requests on a Unix
//! `SOCK_SEQPACKET` socket ([`socket_path`], mode 0666). Where the kernel
//! family is not loaded and the daemon answers, [`crate::XenStream`] and
//! [`crate::XenListener`] go through it: each connection is then one end
//! of a Unix stream socket pair in the program, which the daemon relays to
//! and from the xensock connection. The program's descriptor is a plain
//! socket (poll, epoll, fork and exec work as with any), and a program
//! that exits or dies closes only its own connections.
//!
//! The relay costs a copy each way in the daemon, so a program that has
//! the guest to itself is faster with its own transport (the daemon not
//! running), and one that needs speed in many processes with `af_xen.ko`.
//! A peer's reset reaches the program as end of stream (a Unix socket
//! carries no reset); writes after it fail with `EPIPE`.
//!
//! Wire: one seqpacket connection per request; packets are text.
//! - `connect DOMID PORT TIMEOUT_MS` (0: the transport's default) is
//!   answered `ok LDOMID LPORT PDOMID PPORT` with the program's end of the
//!   pair attached (`SCM_RIGHTS`), or `err ERRNO MESSAGE`.
//! - `listen DOMID PORT BACKLOG` (0: the default) is answered
//!   `ok LDOMID LPORT` or `err ...`; then
//!   each accepted connection comes as `conn PDOMID PPORT` with its end
//!   attached. The listener lives as long as the request's connection.

mod client;
mod server;
mod wire;

pub use client::present;
pub(crate) use client::{connect_via, listen_via, RelayListener, RelayStream};
pub use server::serve;
pub use wire::{socket_path, ENV_DAEMON_SOCKET};
