//! CPU runtime for llama-family decoders (llama/SmolLM, qwen2 with q/k/v biases, qwen3 with
//! q/k norms), layer-streaming: a batch of token windows flows through block 0, then block 1, …,
//! with only one block's weights dequantized (to f32) at a time. See `docs/eval.md`.

pub(crate) mod attention;
pub(crate) mod block;
pub(crate) mod config;
pub mod decode;
pub(crate) mod kernels;
pub mod kv;
pub mod layer;
pub(crate) mod matmul;
pub(crate) mod moe;
pub(crate) mod q8dot;
pub(crate) mod rope;
pub(crate) mod runtime;
pub(crate) mod tqdot;

pub use block::Batches;
pub use config::{Arch, Config};
pub use kernels::Placement;
pub use kv::{KvCache, KvLayer, KvSpec, Turbo4Table};
pub use runtime::{BackendInfo, Model, Numerics, Observer};
