//! Causal grouped-query attention over a batch of independent windows. One task per
//! (window, head), run in parallel; inside a task, queries go in blocks so that each block only
//! multiplies against the keys it may see (the causal mask skips the upper triangle's work).
//! Optional: a sliding window (keys more than `window - 1` positions back are masked, as
//! llama.cpp's standard SWA mask) and Gemma 2's soft-capping of the scaled logits.

use super::matmul::{gemm_ab, gemm_abt};
use rayon::prelude::*;

/// Query rows per block.
const QBLOCK: usize = 64;

/// Shapes of the stacked q|k|v activations (`rows × ld`, q at column 0, k at `q_dim`, v at
/// `q_dim + kv_dim`).
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// `cap · tanh(x / cap)` on the scaled logits.
    pub softcap: Option<f32>,
    /// Sliding window: a query at position `i` sees keys `i - window < j ≤ i`.
    pub window: Option<usize>,
}

impl AttnShape {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
    pub fn ld(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
}

/// Attention for `n_win` windows of `seq` rows each. `qkv` is `(n_win * seq) × s.ld()`;
/// the result (`(n_win * seq) × s.q_dim()`, heads side by side) is written to `out`.
pub fn causal_attention(s: &AttnShape, qkv: &[f32], n_win: usize, seq: usize, out: &mut [f32]) {
    let (hd, ld, qd, kvd) = (s.head_dim, s.ld(), s.q_dim(), s.kv_dim());
    let group = s.n_head / s.n_head_kv;
    assert!(qkv.len() >= n_win * seq * ld && out.len() >= n_win * seq * qd);
    let tasks: Vec<(usize, usize)> = (0..n_win)
        .flat_map(|w| (0..s.n_head).map(move |h| (w, h)))
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(w, h)| {
            let base = &qkv[w * seq * ld..(w + 1) * seq * ld];
            let q = &base[h * hd..];
            let kh = h / group;
            let k = &base[qd + kh * hd..];
            let v = &base[qd + kvd + kh * hd..];
            let mut o = vec![0f32; seq * hd];
            let mut sc = vec![0f32; QBLOCK * seq];
            let mut r0 = 0;
            while r0 < seq {
                let r1 = (r0 + QBLOCK).min(seq);
                let m = r1 - r0;
                let nk = r1; // keys 0..r1 can be seen by some row of the block
                gemm_abt(m, nk, hd, &q[r0 * ld..], ld, k, ld, &mut sc, nk);
                for i in 0..m {
                    let row = &mut sc[i * nk..(i + 1) * nk];
                    let lim = r0 + i + 1; // causal: keys 0..=r0+i
                    let lo = s.window.map_or(0, |w| lim.saturating_sub(w));
                    let mut mx = f32::NEG_INFINITY;
                    for x in row[lo..lim].iter_mut() {
                        *x *= s.scale;
                        if let Some(c) = s.softcap {
                            *x = (*x * (1.0 / c)).tanh() * c;
                        }
                        mx = mx.max(*x);
                    }
                    let mut sum = 0f32;
                    for x in row[lo..lim].iter_mut() {
                        *x = (*x - mx).exp();
                        sum += *x;
                    }
                    let inv = 1.0 / sum;
                    for x in row[lo..lim].iter_mut() {
                        *x *= inv;
                    }
                    row[..lo].fill(0.0);
                    row[lim..].fill(0.0);
                }
                gemm_ab(m, hd, nk, &sc, nk, v, ld, &mut o[r0 * hd..], hd);
                r0 = r1;
            }
            o
        })
        .collect();
    // Scatter each task's `seq × hd` block into its head's columns.
    out[..n_win * seq * qd]
        .par_chunks_mut(seq * qd)
        .enumerate()
        .for_each(|(w, ow)| {
            for h in 0..s.n_head {
                let src = &results[w * s.n_head + h];
                for r in 0..seq {
                    ow[r * qd + h * hd..r * qd + (h + 1) * hd]
                        .copy_from_slice(&src[r * hd..(r + 1) * hd]);
                }
            }
        });
}
