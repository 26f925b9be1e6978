//! Calibration: run the layer-streaming runtime over text windows and accumulate, for each linear
//! layer's input, `H = Σ x xᵀ` (inputs shared by q/k/v, and by gate/up, share one H).
//!
//! Numerics: per batch of windows, `XᵀX` is computed in f32 by faer on fixed 64-column tiles
//! (each tile single-threaded, so the reduction order never depends on the thread count) and added
//! into f64 accumulators. Hessians are persisted as safetensors (F64 `[n, n]` tensors named by the
//! weights they serve, joined by `,`), with a checkpoint after every batch: `--resume` continues
//! from the last checkpoint and gives byte-identical results to an uninterrupted run.
//!
//! [`run`] drives a calibration (batched or sequential); [`sequential`] is the GPTQ-order mode
//! in which block i's Hessians come from the model whose earlier weights are already quantized.
//! [`job`] is `tq calib`: its flags as plain values, checked, and one run; [`blend`] is
//! `tq calib blend` (a file's correlations averaged with a prior's, its diagonal kept).

pub mod blend;
pub mod imatrix;
pub mod input;
pub mod job;
pub mod run;
pub mod selfgen;
pub mod sequential;
pub mod stream;

use crate::model::runtime::Observer;
use crate::quant::Hessians;

impl Observer for Hessians {
    fn linear_input(
        &mut self,
        layer: Option<usize>,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        if self.non_finite.is_some() {
            return;
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            let row = i / cols;
            let win = self.window0 + row.checked_div(self.seq).unwrap_or(0);
            self.non_finite = Some(format!(
                "non-finite activation entering {} (layer {}) in calibration window {win}; the model or text produces NaN/Inf",
                tensors.join(", "),
                layer.map(|l| l.to_string()).unwrap_or("output".into())
            ));
            return;
        }
        // The output projection's input is not needed (token_embd/output are never LDLQ'd here).
        if layer.is_none() {
            return;
        }
        let step = if self.rows_per_accum == 0 {
            rows.max(1)
        } else {
            self.rows_per_accum
        };
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + step).min(rows);
            self.accumulate(tensors, &x[r0 * cols..r1 * cols], r1 - r0, cols);
            r0 = r1;
        }
    }

    /// Per-expert Hessians, named `TENSOR#e` (see [`crate::quant::expert_key`]): each expert's
    /// `H` sums only the tokens routed to it.
    fn expert_input(
        &mut self,
        layer: usize,
        expert: usize,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        let keys = crate::quant::expert_keys(tensors, expert);
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.linear_input(Some(layer), &refs, x, rows, cols);
    }
}
