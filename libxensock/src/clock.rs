// SPDX-License-Identifier: MIT OR Apache-2.0
//! The time proto's machines are given: milliseconds on the monotonic
//! clock since the first call in this process.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::time::{clock_gettime, ClockId};

/// Milliseconds since the first call.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// How long this guest has been suspended since it booted: the boot-time
/// clock less the monotonic one, which only a suspend (a save, a
/// migration) moves apart. A mapping of a peer's pages made before it
/// last grew does not show them any more (Xen does not carry grant
/// mappings across a save), whatever else this process has noticed yet.
pub(crate) fn slept() -> Duration {
    let at = |id| clock_gettime(id).map(Duration::from).unwrap_or_default();
    at(ClockId::CLOCK_BOOTTIME).saturating_sub(at(ClockId::CLOCK_MONOTONIC))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slept_stands_still_while_the_guest_runs() {
        let first = slept();
        for _ in 0..10_000 {
            let now = slept();
            let apart = now.max(first) - now.min(first);
            assert!(apart < Duration::from_millis(1), "{first:?} then {now:?}");
        }
    }
}
