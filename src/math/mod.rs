//! Numeric core: Hadamard rotations and their sign generators, Lloyd-Max codebooks.
//!
//! - [`hadamard`]: fast Walsh–Hadamard transform (scalar reference and optimized, bit-identical),
//!   randomized Hadamard `(1/√n)·H·diag(s)` and its inverse.
//! - [`rotation`]: orthonormal full-row rotations for any length (Hadamard of order `h·2^k` from
//!   Paley matrices, block-diagonal Hadamard, DCT fallback, zero padding) and incoherence measures.
//! - [`signs`], [`pcg64`]: the sign vectors the engines compile in, numpy's generator, tq's own.
//! - [`lloyd_max`]: Lloyd-Max codebooks for the rotated-coordinate (beta) density, its Gaussian
//!   limit, N(0,1) and sample data; [`special`]: the special functions they need.
//! - [`splitmix`]: SplitMix64, the small seeded generator for sampling and test inputs.

pub mod hadamard;
pub mod lloyd_max;
pub mod pcg64;
pub mod rotation;
pub mod signs;
pub mod special;
pub(crate) mod splitmix;
