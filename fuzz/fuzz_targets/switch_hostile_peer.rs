// SPDX-License-Identifier: MIT OR Apache-2.0
//! See `xensock_proto::fuzzing::switch_with_hostile_peer`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = xensock_proto::fuzzing::switch_with_hostile_peer(&mut arbitrary::Unstructured::new(data));
});
