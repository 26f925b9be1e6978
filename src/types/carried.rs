//! Block layouts of the stock ggml types `tq` carries (reads, copies, writes, sizes) but has no
//! kernels for. Each size is ggml's `block_*` struct (`ggml-common.h`), tied to its field
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

/// `block_iq2_xxs`: `d: f16`, `qs: [u16; 32]`.
pub(crate) const IQ2_XXS_BYTES: usize = 66;
const _: () = assert!(IQ2_XXS_BYTES == F16 + QK_K / 8 * size_of::<u16>());

/// `block_iq2_xs`: `d: f16`, `qs: [u16; 32]`, `scales[8]`.
pub(crate) const IQ2_XS_BYTES: usize = 74;
const _: () = assert!(IQ2_XS_BYTES == F16 + QK_K / 8 * size_of::<u16>() + QK_K / 32);

/// `block_iq3_xxs`: `d: f16`, `qs[96]` (grid indices, then signs and scales).
pub(crate) const IQ3_XXS_BYTES: usize = 98;
const _: () = assert!(IQ3_XXS_BYTES == F16 + 3 * QK_K / 8);

/// `block_iq1_s`: `d: f16`, `qs[32]`, `qh: [u16; 8]`.
pub(crate) const IQ1_S_BYTES: usize = 50;
const _: () = assert!(IQ1_S_BYTES == F16 + QK_K / 8 + QK_K / 32 * size_of::<u16>());

/// `block_iq3_s`: `d: f16`, `qs[64]`, `qh[8]`, `signs[32]`, `scales[4]`.
pub(crate) const IQ3_S_BYTES: usize = 110;
const _: () = assert!(IQ3_S_BYTES == F16 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64);

/// `block_iq2_s`: `d: f16`, `qs[64]`, `qh[8]`, `scales[8]`.
pub(crate) const IQ2_S_BYTES: usize = 82;
const _: () = assert!(IQ2_S_BYTES == F16 + QK_K / 4 + QK_K / 32 + QK_K / 32);

/// `block_iq1_m`: `qs[32]`, `qh[16]`, `scales[8]` (the f16 scale is spread over the scales).
pub(crate) const IQ1_M_BYTES: usize = 56;
const _: () = assert!(IQ1_M_BYTES == QK_K / 8 + QK_K / 16 + QK_K / 32);

/// `block_tq1_0` (ggml's ternary type, not TurboQuant): `qs[48]` (5 trits per byte), `qh[4]`,
/// `d: f16`.
pub(crate) const TQ1_0_BYTES: usize = 54;
const _: () = assert!(TQ1_0_BYTES == (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + F16);

/// `block_tq2_0`: `qs[64]` (2 bits per value), `d: f16`.
pub(crate) const TQ2_0_BYTES: usize = 66;
const _: () = assert!(TQ2_0_BYTES == QK_K / 4 + F16);

/// `block_mxfp4`: `e: u8` (E8M0 scale), `qs[16]` (E2M1 nibbles).
pub(crate) const QK_MXFP4: usize = 32;
pub(crate) const MXFP4_BYTES: usize = 17;
const _: () = assert!(MXFP4_BYTES == 1 + QK_MXFP4 / 2);

/// `block_nvfp4`: `d[4]` (one UE4M3 scale per 16 values), `qs[32]` (E2M1 nibbles).
pub(crate) const QK_NVFP4: usize = 64;
pub(crate) const NVFP4_BYTES: usize = 36;
const _: () = assert!(NVFP4_BYTES == QK_NVFP4 / 16 + QK_NVFP4 / 2);

/// `block_q1_0`: `d: f16`, `qs[16]` (one sign bit per value).
pub(crate) const QK1_0: usize = 128;
pub(crate) const Q1_0_BYTES: usize = 18;
const _: () = assert!(Q1_0_BYTES == F16 + QK1_0 / 8);

/// `block_q2_0`: `d: f16`, `qs[16]` (2 bits per value).
pub(crate) const QK2_0: usize = 64;
pub(crate) const Q2_0_BYTES: usize = 18;
const _: () = assert!(Q2_0_BYTES == F16 + QK2_0 / 4);
