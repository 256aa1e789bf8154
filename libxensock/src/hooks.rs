// SPDX-License-Identifier: MIT OR Apache-2.0
//! The migration hooks (`xensock suspend`, `xensock resume`, run from a
//! guest's suspend path) and `xensock status` reach every process's
//! user-space transport through its control socket: [`broadcast`] sends a
//! command to each. Where those sockets live is [`run_dir`]; the guest's
//! one transport over `/dev/xen` is found through its claim
//! ([`ENV_CLAIM_PATH`]) whichever user runs it.

pub use crate::claim::ENV_CLAIM_PATH;
pub use crate::control::{broadcast, run_dir, ENV_RUN_DIR};
