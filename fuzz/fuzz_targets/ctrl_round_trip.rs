// SPDX-License-Identifier: MIT OR Apache-2.0
//! See `xensock_proto::fuzzing::message_round_trip`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = xensock_proto::fuzzing::message_round_trip(&mut arbitrary::Unstructured::new(data));
});
