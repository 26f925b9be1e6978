//! Fuzz the Hessian file reader (`tq convert --calib H.safetensors`): open, then read every
//! group; see `entries::hessian_reader`.
//! `tests/fuzz_replay.rs` replays a seeded mutated corpus through the same function.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "entries.rs"]
#[allow(dead_code)] // each target uses one entry
mod entries;

fuzz_target!(|data: &[u8]| entries::hessian_reader(data));
