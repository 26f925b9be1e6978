//! Block layouts of the stock ggml types `tq` carries (reads, copies, writes, sizes) but has no
//! kernels for: ggml's intermediate dot-product types Q8_1 and Q8_K, which never hold weights. Each size is ggml's `block_*` struct (`ggml-common.h`), tied to its field
//! arithmetic by a compile-time assert as ggml's own `static_assert`s do; gguf-py's table is
//! checked against the registry in `tests/quants_oracle.rs`.

use super::kquants::QK_K;

const F16: usize = size_of::<u16>();

/// `block_q8_1`: `d, s: f16`, `qs: [i8; 32]`.
pub(crate) const QK8_1: usize = 32;
pub(crate) const Q8_1_BYTES: usize = 36;
const _: () = assert!(Q8_1_BYTES == 2 * F16 + QK8_1);

/// `block_q8_K`: `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`.
pub(crate) const Q8_K_BYTES: usize = 292;
const _: () = assert!(Q8_K_BYTES == size_of::<f32>() + QK_K + QK_K / 16 * size_of::<i16>());
