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
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + LAZY).min(n);
        let t = super::prof::start();
        for j in j0..j1 {
            let urow = &f.u[j * n..(j + 1) * n];
            for r in 0..rows {
                let xr = &x[r * n..(r + 1) * n];
                let q = round(r, j, xr);
                let er = (xr[j] - q) / urow[j];
                e[(r, j - j0)] = er;
                loss[r] += er * er;
            }
            let end = (j + 1 + band).min(j1);
            let u = &urow[j + 1..end];
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
                    f.u[j * n + k]
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
    for j in 0..n {
        let urow = &f.u[j * n..(j + 1) * n];
        for r in 0..rows {
            let xr = &mut x[r * n..(r + 1) * n];
            let q = round(r, j, xr);
            let err = (xr[j] - q) / urow[j];
            loss[r] += err * err;
            for k in j + 1..(j + 1 + band).min(n) {
                xr[k] -= err * urow[k];
            }
        }
    }
    loss
}
