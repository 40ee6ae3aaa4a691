//! Arbitrary ZMQ messages through frame parsing, sequencing with replays,
//! decoding and applying (see `kvpick_core::wire::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvpick_core::wire::fuzzing::run(data));
