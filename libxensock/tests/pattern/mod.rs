// SPDX-License-Identifier: MIT OR Apache-2.0
//! The test streams' byte pattern and checksum, one copy for the sim
//! helpers (`common`) and the backend-neutral cases (`cases`).

#![allow(dead_code)]

/// A deterministic byte pattern (xorshift) and an FNV-1a checksum.
pub struct Pattern(u64);
impl Pattern {
    pub fn new(seed: u64) -> Pattern {
        Pattern(seed | 1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            *b = self.0 as u8;
        }
    }
}

pub fn fnv(h: &mut u64, data: &[u8]) {
    for &b in data {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100000001b3);
    }
}
pub const FNV_INIT: u64 = 0xcbf29ce484222325;
