// SPDX-License-Identifier: MIT OR Apache-2.0
//! The carrier switch against plain loopback TCP, in one run (the
//! harness is `libxensock::internals::carrier_bench`):
//! `cargo bench -p libxensock --features internals --bench carrier [-- MiB switches]`.

fn main() {
    libxensock::internals::carrier_bench(std::env::args().skip(1).collect());
}
