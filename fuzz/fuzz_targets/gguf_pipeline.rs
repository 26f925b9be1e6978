//! Fuzz what runs *after* a GGUF header parses: `tq inspect`'s report and its text and JSON
//! renderings, the planner over the file's tensors (a few requests: `--weights tq4_1s`, each
//! recipe, `--weights q8_0`, keep types), the output metadata and size `convert` derives from a
//! plan, and, for small files, `convert` itself into a scratch output. Inputs that do not parse
//! are dropped early (the `gguf_reader` target covers those). Any panic is a crash.
//! The body lives in `entries::gguf_pipeline`; `tests/fuzz_replay.rs` replays a seeded mutated
//! corpus of small GGUF models through it on every test run.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "entries.rs"]
#[allow(dead_code)] // each target uses one entry
mod entries;

fuzz_target!(|data: &[u8]| entries::gguf_pipeline(data));
