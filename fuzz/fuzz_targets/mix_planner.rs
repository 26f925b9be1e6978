//! Fuzz the mix's planner (the knapsack behind `--target-size` / `--target-bpw`): items, sizes,
//! costs (NaN and ±inf included), budget and grid from the input; see `entries::mix_planner`.
//! `tests/fuzz_replay.rs` replays a seeded mutated corpus through the same function.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "entries.rs"]
#[allow(dead_code)] // each target uses one entry
mod entries;

fuzz_target!(|data: &[u8]| entries::mix_planner(data));
