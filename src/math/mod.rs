//! Numeric core: Hadamard rotations and their sign generators, Lloyd-Max codebooks.

pub mod hadamard;
pub mod signs;
