// SPDX-License-Identifier: MIT OR Apache-2.0
//! See `xensock_proto::fuzzing::header_and_directory`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = xensock_proto::fuzzing::header_and_directory(&mut arbitrary::Unstructured::new(data));
});
