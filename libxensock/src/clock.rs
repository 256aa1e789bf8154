// SPDX-License-Identifier: MIT OR Apache-2.0
//! The time proto's machines are given: milliseconds on the monotonic
//! clock since the first call in this process.

use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds since the first call.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}
