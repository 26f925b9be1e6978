//! The precision switches of LDLQ (environment variables read once), in one place so that the
//! factor and the TQ sweep agree on them. Precision per step, measured in docs/bench/speed.md:
//!
//! | step | TQ4_1S / TQ3_1S (default) | other LDLQ types |
//! |---|---|---|
//! | rotation of the Hessian | f64 | f64 |
//! | Cholesky, triangular inverse | **f32** (`TQ_LDLQ_FACTOR_F64=1`: f64) | f64 up to [`F32_FACTOR_ABOVE`] columns, f32 above (`TQ_LDLQ_FACTOR_F32=1`: f32 at every width) |
//! | `U` kept | f32 only | f64; f32 only where the factor is f32 (the sweeps widen it: same values) |
//! | sweep (values, errors, feedback, GEMM) | f32 (`TQ_LDLQ_SWEEP_F64=1`: f64, and the factor f64) | f64 |
//! | half-block scale search, `Σ e²` | f64 | f64 |

use std::sync::OnceLock;

fn flag(name: &str, cell: &'static OnceLock<bool>) -> bool {
    *cell.get_or_init(|| std::env::var_os(name).is_some_and(|v| v != "0"))
}

/// Whether the TQ sweep runs in f64 (`TQ_LDLQ_SWEEP_F64=1`: the precision before, kept for
/// comparison); the default is f32 (KLD on SmolLM2 unchanged within its error). With it the TQ
/// factor is f64 and kept in f64, as before.
pub(super) fn sweep_f64() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    flag("TQ_LDLQ_SWEEP_F64", &ON)
}

/// Whether the TQ formats' factor (Cholesky and triangular inverse) runs in f64
/// (`TQ_LDLQ_FACTOR_F64=1`: the bytes before; `U` is still kept in f32 only); the default is f32.
pub(super) fn tq_factor_f64() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    flag("TQ_LDLQ_FACTOR_F64", &ON)
}

/// Whether the other LDLQ types' factor is computed in f32 (`TQ_LDLQ_FACTOR_F32=1`, an
/// experiment; their default is f64, and their sweeps read `U` in f64).
pub(super) fn factor_f32() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    flag("TQ_LDLQ_FACTOR_F32", &ON)
}

/// Above this many columns (70B-class FFN inputs: 28,672) every factor is computed in f32, for
/// memory: an f64 act-order factor of a 28,672-wide Hessian holds the natural-order Hessian (kept
/// for the refit), the permuted copy and the matrix being factored, ≈ 20 GB; in f32 ≈ 13.2 GB at
/// its peak (the f32 inverse and `U`, which the stock and i-quant sweeps read widened, beside the
/// kept Hessian — or, in the mix, beside the caller's Hessian the refit reads through a view).
/// Quality: the f32 factor measured neutral on SmolLM2 for TQ4_1S and the stock presets
/// (docs/bench/speed.md). No model up to 7B–13B (FFN ≤ 13,824; Llama-3-8B 14,336) is affected.
pub(crate) const F32_FACTOR_ABOVE: usize = 16_384;
