// SPDX-License-Identifier: MIT OR Apache-2.0
//! A simulated Xen host for xensock's tests and demos.
//!
//! One host process ([`SimHost`], or `xensock-sim up N`) runs:
//! - a **xenstored** speaking the real XenStore wire protocol on one unix
//!   socket per domain (`<dir>/dom<id>/xenstored.sock`), so every
//!   connection has a domain identity: dom0 is privileged, domUs are not.
//!   Xen's permission model, transactions (`EAGAIN` on conflict), watches
//!   (including `@introduceDomain` / `@releaseDomain`) and xenstored's
//!   quotas apply. Debian's `xenstore-*` tools work against it with
//!   `XENSTORED_PATH` set to a domain's socket.
//! - a **grant table** and **event channels** reached over a control socket
//!   per domain (`<dir>/dom<id>/control.sock`). [`SimXen`] is the client
//!   side and implements [`xensock_xenif::XenBackend`], the trait the
//!   user-space transport also runs on over the real `/dev/xen` devices.
//!   Grants are memfd pages passed with `SCM_RIGHTS`; only the grantee can
//!   map them, read-only grants are mapped from a read-only descriptor;
//!   event channels are eventfds.
//!
//! A domain's processes find the sim through `XENSOCK_SIM=<dir>` and
//! `XENSOCK_SIM_DOMID=<id>` (and `XENSTORED_PATH` for XenStore clients);
//! [`SimDomain::command`] sets all three.
//!
//! See `docs/sim.md` for the model and where it differs from Xen.
#![deny(unsafe_code)]

mod client;
mod ctl;
mod host;
mod listen;
mod store;
#[allow(unsafe_code)] // the unsafe floor: every unsafe block, each with its SAFETY comment
mod sys;
mod xenstored;

pub use client::{SimChannel, SimGrant, SimMapping, SimXen};
pub use host::{
    domain_dir, DomainConfig, MigrateTo, SimConfig, SimDomain, SimError, SimHost, SimStats,
    ENV_SIM_DIR, ENV_SIM_DOMID, ENV_XENSTORED_PATH, FIRST_GRANT_REF, MAX_DOMID, MAX_PAGES_PER_CALL,
};
pub use store::Quotas;
pub use sys::StopSignals;
pub use xenstored::{XenstoredStats, MAX_BACKLOG};
