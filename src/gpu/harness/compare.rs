//! Comparing a kernel's output with the CPU reference: bit-exact for dequantize, a bound relative
//! to `Σ|w·x|` for the dots; [`KernelResult`] is one line of the report.

use crate::types::TensorType;

/// Per-output bound for mat-vec and Q·K: `|y − y_ref| ≤ DOT_REL_BOUND · Σ_j |w_j·x_j|`
/// (2^-16). f32 summation of n terms in any order is within `n·u` (u = 2^-24) of the exact sum
/// relative to `Σ|w·x|`; for the row lengths checked here (≤ 8192) a tree/strided order stays far
/// below 2^-16, and the rotation of the activation adds a few u. Measured values are printed.
pub const DOT_REL_BOUND: f64 = 1.0 / 65536.0;

/// The kind of kernel checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    Dequantize,
    MatVec,
    /// Many activation rows at once (the model runtime's `--backend`).
    MatMul,
    QkDot,
    /// tq2_r's whole-row rotation `R·x` / `Rᵀ·y`.
    Rotate,
    /// tq2_r rows decoded to the original domain (decode + `Rᵀ`).
    RowDecode,
}

impl KernelKind {
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Dequantize => "dequantize",
            KernelKind::MatVec => "matvec",
            KernelKind::MatMul => "matmul",
            KernelKind::QkDot => "qk_dot",
            KernelKind::Rotate => "rotate",
            KernelKind::RowDecode => "row-decode",
        }
    }
}

/// What a kernel is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// Every value bit-identical (NaN where the reference is NaN).
    BitExact,
    /// `|y − y_ref| ≤ bound · Σ|w·x|` per output.
    RelativeToAbsSum(f64),
}

impl std::fmt::Display for Tolerance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tolerance::BitExact => f.write_str("bit-exact"),
            Tolerance::RelativeToAbsSum(b) => write!(f, "|err| <= {b:.3e}*sum|w*x|"),
        }
    }
}

/// The outcome of one kernel on one data set.
#[derive(Clone, Debug)]
pub struct KernelResult {
    pub ty: TensorType,
    pub kind: KernelKind,
    /// Data set: `conformance`, `random-bytes`, or a shape name.
    pub data: String,
    pub values: usize,
    /// Values bit-identical to the reference (NaN ↔ NaN counts).
    pub bit_exact: usize,
    /// Largest |gpu − ref| over values where both are finite.
    pub max_abs: f64,
    /// Largest |gpu − ref| / |ref| over finite non-zero references.
    pub max_rel: f64,
    /// Largest distance in f32 ulps over finite values (dequantize only).
    pub max_ulp: u64,
    /// Largest |gpu − ref| / Σ|w·x| (mat-vec and Q·K only).
    pub max_err_over_abs_sum: f64,
    /// Values where one side is non-finite and the other is not (or NaN vs inf).
    pub class_mismatch: usize,
    pub tolerance: Tolerance,
    pub pass: bool,
    /// First failing value, for the message.
    pub first_failure: Option<String>,
}

/// Distance in ulps between two finite f32 (0 for +0 vs −0 is *not* granted: they differ by 1).
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    fn key(v: f32) -> i64 {
        let b = v.to_bits() as i32 as i64;
        if b < 0 {
            i64::from(i32::MIN) - b - 1
        } else {
            b
        }
    }
    (key(a) - key(b)).unsigned_abs()
}

/// Compare a dequantize output with the CPU reference, bit for bit.
pub fn compare_exact(ty: TensorType, data: &str, got: &[f32], want: &[f32]) -> KernelResult {
    let mut r = KernelResult {
        ty,
        kind: KernelKind::Dequantize,
        data: data.to_string(),
        values: want.len(),
        bit_exact: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulp: 0,
        max_err_over_abs_sum: 0.0,
        class_mismatch: 0,
        tolerance: Tolerance::BitExact,
        pass: got.len() == want.len(),
        first_failure: None,
    };
    if got.len() != want.len() {
        r.first_failure = Some(format!("{} values, expected {}", got.len(), want.len()));
        return r;
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        if same {
            r.bit_exact += 1;
            continue;
        }
        if g.is_finite() && w.is_finite() {
            let d = (g as f64 - w as f64).abs();
            r.max_abs = r.max_abs.max(d);
            if w != 0.0 {
                r.max_rel = r.max_rel.max(d / (w as f64).abs());
            }
            r.max_ulp = r.max_ulp.max(ulp_distance(g, w));
        } else {
            r.class_mismatch += 1;
        }
        if r.first_failure.is_none() {
            r.first_failure = Some(format!(
                "value {i}: got {g:e} ({:08x}), reference {w:e} ({:08x})",
                g.to_bits(),
                w.to_bits()
            ));
        }
        r.pass = false;
    }
    r
}

/// Compare dot products (one per row) with f64 references and their `Σ|w·x|` scales.
pub fn compare_dots(
    ty: TensorType,
    kind: KernelKind,
    data: &str,
    got: &[f32],
    want: &[f64],
    abs_sum: &[f64],
    bound: f64,
) -> KernelResult {
    let mut r = KernelResult {
        ty,
        kind,
        data: data.to_string(),
        values: want.len(),
        bit_exact: 0,
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulp: 0,
        max_err_over_abs_sum: 0.0,
        class_mismatch: 0,
        tolerance: Tolerance::RelativeToAbsSum(bound),
        pass: got.len() == want.len(),
        first_failure: None,
    };
    if got.len() != want.len() {
        r.first_failure = Some(format!("{} outputs, expected {}", got.len(), want.len()));
        return r;
    }
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(abs_sum).enumerate() {
        if (w as f32).to_bits() == g.to_bits() {
            r.bit_exact += 1;
        }
        let (g64, ok);
        if !g.is_finite() || !w.is_finite() {
            ok = (g.is_nan() && w.is_nan()) || (g as f64) == w;
            if !ok {
                r.class_mismatch += 1;
            }
        } else {
            g64 = g as f64;
            let d = (g64 - w).abs();
            r.max_abs = r.max_abs.max(d);
            if w != 0.0 {
                r.max_rel = r.max_rel.max(d / w.abs());
            }
            let e = if s > 0.0 {
                d / s
            } else if d == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            r.max_err_over_abs_sum = r.max_err_over_abs_sum.max(e);
            ok = e <= bound;
        }
        if !ok {
            r.pass = false;
            if r.first_failure.is_none() {
                r.first_failure = Some(format!(
                    "output {i}: got {g:e}, reference {w:e} (sum|w*x| = {s:e})"
                ));
            }
        }
    }
    r
}

/// Two results of one kernel and tolerance as one (the conformance dots of several row lengths).
pub(crate) fn merge(mut a: KernelResult, b: KernelResult) -> KernelResult {
    a.values += b.values;
    a.bit_exact += b.bit_exact;
    a.max_abs = a.max_abs.max(b.max_abs);
    a.max_rel = a.max_rel.max(b.max_rel);
    a.max_ulp = a.max_ulp.max(b.max_ulp);
    a.max_err_over_abs_sum = a.max_err_over_abs_sum.max(b.max_err_over_abs_sum);
    a.class_mismatch += b.class_mismatch;
    a.pass &= b.pass;
    if a.first_failure.is_none() {
        a.first_failure = b.first_failure;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulp_distance_basics() {
        assert_eq!(ulp_distance(1.0, 1.0), 0);
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulp_distance(0.0, -0.0), 1);
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 3);
    }

    #[test]
    fn compare_exact_nan_and_signed_zero() {
        let r = compare_exact(
            TensorType::TQ4_1S,
            "t",
            &[f32::NAN, -0.0],
            &[f32::NAN, -0.0],
        );
        assert!(r.pass && r.bit_exact == 2);
        let r = compare_exact(TensorType::TQ4_1S, "t", &[0.0], &[-0.0]);
        assert!(!r.pass && r.max_ulp == 1);
        let r = compare_exact(TensorType::TQ4_1S, "t", &[1.0], &[f32::INFINITY]);
        assert!(!r.pass && r.class_mismatch == 1);
    }

    #[test]
    fn compare_dots_bound() {
        let r = compare_dots(
            TensorType::TQ4_1S,
            KernelKind::MatVec,
            "t",
            &[1.0, 2.0],
            &[1.0, 2.0 + 1e-3],
            &[10.0, 10.0],
            DOT_REL_BOUND,
        );
        assert!(!r.pass);
        assert!((r.max_err_over_abs_sum - 1e-4).abs() < 1e-9);
    }
}
