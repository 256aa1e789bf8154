// SPDX-License-Identifier: MIT OR Apache-2.0
//! Untrusted bytes from the link's control ring or a TCP leg.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| xensock_proto::fuzzing::decode_frame(data));
