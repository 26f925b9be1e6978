//! GPTQ's sweep, shared by every LDLQ path: for each column in order, round, then feed the
//! scaled error into the next `band` columns through the factor `U` ([`sweep`], lazy batches
//! and GEMMs; [`sweep_scalar`], the reference it is held to).

use super::Factor;
use faer::{Mat, Par};

/// Columns per lazy batch (GPTQ's "lazy batch updates"): inside a batch the error feedback is
/// applied column by column; the batch's errors reach the columns after it in one GEMM.
const LAZY: usize = 128;

/// GPTQ's sweep over a group of rows sharing one factor (`x`: rows × n, row-major): for each
/// column `j`, `round(r, j, x_r)` is row `r`'s quantized value at `j` (it may look at `x_r[j..]`
/// to fix a block scale), and `e = (x_r[j] − q) / U_jj` is fed into the next `band` columns as
/// `x_r[k] −= e · U_jk`.
///
/// The feedback is the scalar sweep's, reordered: within a batch of [`LAZY`] columns it is applied
/// column by column; into the columns after the batch it is `X −= E · U[batch, after]`, one GEMM
/// (faer, single-threaded per group, so deterministic). Full-band LDLQ costs rows·n² multiply-adds
/// (1.2·10¹² for one 7B block): as one-row column loops that was bound by memory and scalar
/// throughput; as GEMMs it runs near the machine's f64 peak. The sums are the same up to f64
/// rounding order; [`sweep_scalar`] is the reference it is held to.
pub(crate) fn sweep(
    x: &mut [f64],
    n: usize,
    f: &Factor,
    band: usize,
    mut round: impl FnMut(usize, usize, &[f64]) -> f64,
) -> Vec<f64> {
    use faer::{linalg::matmul::matmul, Accum};
    let rows = x.len() / n;
    let band = if band == 0 { n } else { band };
    let mut loss = vec![0f64; rows];
    let mut e = Mat::<f64>::zeros(rows, LAZY);
    let uf = f.u_ref();
    // Row j of U from `j` to the batch's end, as f64 (widened when the factor keeps f32).
    let mut ubuf = vec![0f64; LAZY];
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + LAZY).min(n);
        let t = super::prof::start();
        for j in j0..j1 {
            let urow: &[f64] = match uf {
                super::factor::URef::F64(u) => &u[j * n + j..j * n + j1],
                super::factor::URef::F32(u) => {
                    for (d, &v) in ubuf.iter_mut().zip(&u[j * n + j..j * n + j1]) {
                        *d = v as f64;
                    }
                    &ubuf[..j1 - j]
                }
            };
            for r in 0..rows {
                let xr = &x[r * n..(r + 1) * n];
                let q = round(r, j, xr);
                let er = (xr[j] - q) / urow[0];
                e[(r, j - j0)] = er;
                loss[r] += er * er;
            }
            let end = (j + 1 + band).min(j1);
            let u = &urow[1..end - j];
            for r in 0..rows {
                let er = e[(r, j - j0)];
                for (xk, &uk) in x[r * n + j + 1..r * n + end].iter_mut().zip(u) {
                    *xk -= er * uk;
                }
            }
        }
        super::prof::add(super::prof::Phase::SweepBatch, t);
        let t = super::prof::start();
        // Columns after the batch that the band reaches: k in [j1, (j1 − 1) + band].
        let k_end = (j1 - 1 + band + 1).min(n);
        if k_end > j1 {
            let (b, w) = (j1 - j0, k_end - j1);
            // U's panel, with entries beyond each row's band zeroed, and the rows' columns it
            // reaches, copied to contiguous matrices (a strided view of `x` crashed faer's AVX-512
            // kernels in a test; the copies cost O(rows·n) per batch against O(rows·n·128) flops).
            let panel = Mat::<f64>::from_fn(b, w, |a, c| {
                let (j, k) = (j0 + a, j1 + c);
                if k <= j + band {
                    uf.get(j * n + k)
                } else {
                    0.0
                }
            });
            let mut xs = Mat::<f64>::from_fn(rows, w, |r, c| x[r * n + j1 + c]);
            matmul(
                xs.as_mut(),
                Accum::Add,
                e.as_ref().subcols(0, b),
                panel.as_ref(),
                -1.0,
                Par::Seq,
            );
            for r in 0..rows {
                for (c, v) in x[r * n + j1..r * n + k_end].iter_mut().enumerate() {
                    *v = xs[(r, c)];
                }
            }
        }
        super::prof::add(super::prof::Phase::SweepGemm, t);
        j0 = j1;
    }
    loss
}

/// The scalar sweep [`sweep`] reorders (one column at a time, every row): the reference.
pub(crate) fn sweep_scalar(
    x: &mut [f64],
    n: usize,
    f: &Factor,
    band: usize,
    mut round: impl FnMut(usize, usize, &[f64]) -> f64,
) -> Vec<f64> {
    let rows = x.len() / n;
    let band = if band == 0 { n } else { band };
    let mut loss = vec![0f64; rows];
    let u = f.u_ref();
    for j in 0..n {
        for r in 0..rows {
            let xr = &mut x[r * n..(r + 1) * n];
            let q = round(r, j, xr);
            let err = (xr[j] - q) / u.get(j * n + j);
            loss[r] += err * err;
            for k in j + 1..(j + 1 + band).min(n) {
                xr[k] -= err * u.get(j * n + k);
            }
        }
    }
    loss
}

/// The element type of [`sweep_cm`]: f32 (the default for the TQ formats) or f64.
pub(crate) trait Elem:
    faer::traits::ComplexField
    + faer::traits::Conjugate<Canonical = Self>
    + Copy
    + Send
    + Sync
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::SubAssign
{
    const ZERO: Self;
    const MINUS_ONE: Self;
    fn of(v: f64) -> Self;
    fn f64(self) -> f64;
    /// `x` as f32 when `Self` is f32 (the TQ rounding's vector kernels take f32 only).
    fn as_f32(x: &[Self]) -> Option<&[f32]>;
    fn as_f32_mut(x: &mut [Self]) -> Option<&mut [f32]>;
}

impl Elem for f32 {
    const ZERO: Self = 0.0;
    const MINUS_ONE: Self = -1.0;
    fn of(v: f64) -> Self {
        v as f32
    }
    fn f64(self) -> f64 {
        self as f64
    }
    fn as_f32(x: &[Self]) -> Option<&[f32]> {
        Some(x)
    }
    fn as_f32_mut(x: &mut [Self]) -> Option<&mut [f32]> {
        Some(x)
    }
}

impl Elem for f64 {
    const ZERO: Self = 0.0;
    const MINUS_ONE: Self = -1.0;
    fn of(v: f64) -> Self {
        v
    }
    fn f64(self) -> f64 {
        self
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

/// GPTQ's sweep over a group of rows with `x` stored **column-major** (`x[k·rows + r]` is row
/// `r`'s value at column `k`) in precision `T`, with `u` the factor in `T` (n×n row-major).
///
/// `round(j, x, q)` writes every row's quantized value at column `j` into `q` (length `rows`); it
/// may read any of `x` (the TQ formats fix a half-block's scale from columns `j..j+16`). Then
/// `e_r = (x_r[j] − q_r) / U_jj` is fed into the next `band` columns: inside a batch of [`LAZY`]
/// columns column by column (an axpy over the group's rows, contiguous in this layout), past the
/// batch as one GEMM `X[:, after] −= E · U[batch, after]` straight on `x` and a view of `u` (no
/// copies at full band). Returns each row's `Σ e²` (in f64).
///
/// Against [`sweep`]: the column-major layout makes the in-batch feedback and the GEMM's
/// destination contiguous, and the f32 instantiation halves the memory traffic and doubles the
/// SIMD width. [`sweep_cm_scalar`] is the reference it is held to.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sweep_cm<T: Elem>(
    x: &mut [T],
    rows: usize,
    n: usize,
    u: &[T],
    band: usize,
    simd: bool,
    mut round: impl FnMut(usize, &[T], &mut [T]),
) -> Vec<f64> {
    use faer::{linalg::matmul::matmul, Accum, MatMut, MatRef};
    debug_assert_eq!(x.len(), rows * n);
    let band = if band == 0 { n } else { band };
    let simd = simd && super::tq_round::avx2();
    let mut loss = vec![0f64; rows];
    let mut e = vec![T::ZERO; rows * LAZY];
    let mut q = vec![T::ZERO; rows];
    let mut panel = Vec::new();
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + LAZY).min(n);
        let t = super::prof::start();
        let mut b = Batch {
            x: &mut *x,
            rows,
            n,
            u,
            band,
            e: &mut e,
            q: &mut q,
            loss: &mut loss,
        };
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is true only where the CPU has AVX2 (`tq_round::avx2`).
            unsafe { in_batch_avx2(&mut b, j0, j1, &mut round) };
        } else {
            in_batch(&mut b, j0, j1, &mut round);
        }
        #[cfg(not(target_arch = "x86_64"))]
        in_batch(&mut b, j0, j1, &mut round);
        super::prof::add(super::prof::Phase::SweepBatch, t);
        let t = super::prof::start();
        // Columns after the batch that the band reaches: k in [j1, (j1 − 1) + band].
        let k_end = (j1 - 1 + band + 1).min(n);
        if k_end > j1 {
            let (b, w) = (j1 - j0, k_end - j1);
            let dst = MatMut::from_column_major_slice_mut(&mut x[j1 * rows..k_end * rows], rows, w);
            let lhs = MatRef::from_column_major_slice(&e[..b * rows], rows, b);
            // Every (j, k) of the panel is inside the band when the batch's first column reaches
            // its last: then U's rows are used in place; otherwise a copy with the rest zeroed.
            let rhs = if k_end - 1 <= j0 + band {
                let s = &u[j0 * n + j1..(j1 - 1) * n + k_end];
                MatRef::from_row_major_slice_with_stride(s, b, w, n)
            } else {
                panel.clear();
                for j in j0..j1 {
                    let reach = (j + band + 1).clamp(j1, k_end);
                    panel.extend_from_slice(&u[j * n + j1..j * n + reach]);
                    panel.resize((j - j0 + 1) * w, T::ZERO);
                }
                MatRef::from_row_major_slice(&panel, b, w)
            };
            matmul(dst, Accum::Add, lhs, rhs, T::MINUS_ONE, Par::Seq);
        }
        super::prof::add(super::prof::Phase::SweepGemm, t);
        j0 = j1;
    }
    loss
}

/// The state [`in_batch`] works on: the group (`x`, column-major), the factor, the batch's errors
/// (`e`, column-major, `rows` per column), the rounding's output `q` and each row's `Σ e²`.
struct Batch<'a, T> {
    x: &'a mut [T],
    rows: usize,
    n: usize,
    u: &'a [T],
    band: usize,
    e: &'a mut [T],
    q: &'a mut [T],
    loss: &'a mut [f64],
}

/// [`in_batch`] compiled for AVX2: the same operations (element-wise, no fused multiply-adds, no
/// reordered sums), eight f32 lanes instead of four, so the same bits; `round` is the caller's
/// (the TQ rounding dispatches to its own AVX2 kernels).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn in_batch_avx2<T: Elem>(
    b: &mut Batch<'_, T>,
    j0: usize,
    j1: usize,
    round: &mut impl FnMut(usize, &[T], &mut [T]),
) {
    in_batch(b, j0, j1, round)
}

/// Columns `j0..j1` of one lazy batch: round column `j`, keep its scaled errors, and feed them into
/// the batch's later columns within the band (an axpy over the group's contiguous rows each).
#[inline(always)]
fn in_batch<T: Elem>(
    b: &mut Batch<'_, T>,
    j0: usize,
    j1: usize,
    round: &mut impl FnMut(usize, &[T], &mut [T]),
) {
    let (rows, n) = (b.rows, b.n);
    for j in j0..j1 {
        round(j, b.x, b.q);
        let urow = &b.u[j * n..(j + 1) * n];
        let ec = &mut b.e[(j - j0) * rows..(j - j0 + 1) * rows];
        let xj = &b.x[j * rows..(j + 1) * rows];
        for r in 0..rows {
            let er = (xj[r] - b.q[r]) / urow[j];
            ec[r] = er;
            let v = er.f64();
            b.loss[r] += v * v;
        }
        let end = (j + 1 + b.band).min(j1);
        let ec = &b.e[(j - j0) * rows..(j - j0 + 1) * rows];
        for (k, &uk) in urow.iter().enumerate().take(end).skip(j + 1) {
            for (xk, &er) in b.x[k * rows..(k + 1) * rows].iter_mut().zip(ec) {
                *xk -= er * uk;
            }
        }
    }
}

/// The sweep [`sweep_cm`] reorders, in the same layout and precision: one column at a time, its
/// error fed into all of its band at once. The reference.
pub(crate) fn sweep_cm_scalar<T: Elem>(
    x: &mut [T],
    rows: usize,
    n: usize,
    u: &[T],
    band: usize,
    mut round: impl FnMut(usize, &[T], &mut [T]),
) -> Vec<f64> {
    let band = if band == 0 { n } else { band };
    let mut loss = vec![0f64; rows];
    let mut q = vec![T::ZERO; rows];
    let mut e = vec![T::ZERO; rows];
    for j in 0..n {
        round(j, x, &mut q);
        let urow = &u[j * n..(j + 1) * n];
        for r in 0..rows {
            e[r] = (x[j * rows + r] - q[r]) / urow[j];
            let v = e[r].f64();
            loss[r] += v * v;
        }
        for k in j + 1..(j + 1 + band).min(n) {
            for r in 0..rows {
                x[k * rows + r] -= e[r] * urow[k];
            }
        }
    }
    loss
}
