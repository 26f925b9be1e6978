//! CPU models of an engine's arithmetic: what a backend computes, bit for bit, when it is not the
//! CPU reference (the fork's CUDA mat-vec paths for TQ weights), so `tq eval` can measure the
//! numbers a user of that backend gets. Below `model` (which runs through them) and `gpu` (whose
//! harness compares against them).

pub mod cuda_matmul;
pub mod cuda_native;
pub(crate) mod sample;
