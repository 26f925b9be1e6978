//! Block-streaming calibration: one forward pass over *all* calibration windows, block by block,
//! handing each block's finished Hessians to the caller before the next block starts. The caller
//! (`tq convert --calib TEXT`) quantizes and writes that block's tensors and drops its Hessians,
//! so peak memory is one block's weights in f32, its Hessians and the activations at one block
//! boundary (tokens × hidden × 4 bytes per buffer) — independent of the model's depth.
//!
//! The Hessians are the batched mode's, bit for bit: every block sees the original model's
//! activations, and `XᵀX` is accumulated over chunks of `batch` windows, as
//! [`super::run::calibrate`] does per forward pass (each window's activations do not depend on
//! which other windows share the pass).

use super::Hessians;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::layer::LayerWeights;
use crate::model::runtime::{Model, Numerics, Observer};
use crate::quant::Hessian;
use std::path::Path;

/// The Hessian groups a calibration of `f` will produce, with their dimensions and the token
/// count, but no data (`h` empty): the planner marks LDLQ tensors from it before any block runs.
pub fn expected(f: &GgufFile, tokens: u64) -> Result<Hessians> {
    let n_layer = crate::model::Config::from_gguf(f)?.n_layer;
    let mut hs = Hessians::default();
    for l in 0..n_layer {
        for (names, n) in LayerWeights::linear_groups(f, l)? {
            hs.groups.insert(
                names.join(","),
                Hessian {
                    tensors: names,
                    n,
                    h: Vec::new(),
                    tokens,
                },
            );
        }
    }
    Ok(hs)
}

struct Blocks<'a> {
    hs: Hessians,
    path: &'a Path,
    n_layer: usize,
    n_win: usize,
    t0: std::time::Instant,
    quiet: bool,
    needed: &'a dyn Fn(&str) -> bool,
    on_block: &'a mut dyn FnMut(usize, &mut Hessians) -> Result<()>,
}

impl Observer for Blocks<'_> {
    fn linear_input(
        &mut self,
        layer: Option<usize>,
        tensors: &[&str],
        x: &[f32],
        rows: usize,
        cols: usize,
    ) {
        // A resumed conversion has written these tensors already.
        if layer.is_some() && !tensors.iter().any(|t| (self.needed)(t)) {
            return;
        }
        self.hs.linear_input(layer, tensors, x, rows, cols);
    }

    fn layer_end(&mut self, layer: usize) -> Result<()> {
        if let Some(e) = self.hs.non_finite.take() {
            return Err(Error::Unsupported(format!("{}: {e}", self.path.display())));
        }
        (self.on_block)(layer, &mut self.hs)?;
        if !self.quiet {
            eprintln!(
                "tq calib: block {}/{} ({} windows) in {:.1} s",
                layer + 1,
                self.n_layer,
                self.n_win,
                self.t0.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }
}

/// Calibrate `f` (at `path`) on `windows` (`n × ctx` tokens, BOS in place) block by block:
/// `on_block(l, hs)` is called when block `l`'s Hessians are complete; it may remove groups from
/// `hs` (they are not touched again). Only inputs of linear sets with a tensor `needed` are
/// accumulated (a resumed run skips what it has written).
#[allow(clippy::too_many_arguments)] // the calibration's plain inputs
pub fn run_blocks(
    path: &Path,
    f: &GgufFile,
    windows: &[u32],
    ctx: usize,
    batch: usize,
    quiet: bool,
    needed: &dyn Fn(&str) -> bool,
    on_block: &mut dyn FnMut(usize, &mut Hessians) -> Result<()>,
) -> Result<()> {
    if ctx < 2 || batch == 0 || windows.is_empty() || windows.len() % ctx != 0 {
        return Err(Error::Usage(
            "calibration: --ctx must be >= 2, --batch >= 1, and the input at least one window"
                .into(),
        ));
    }
    let model = Model::new(f, Numerics::F32)?;
    let mut obs = Blocks {
        hs: Hessians {
            seq: ctx,
            rows_per_accum: batch * ctx,
            ..Default::default()
        },
        path,
        n_layer: model.cfg.n_layer,
        n_win: windows.len() / ctx,
        t0: std::time::Instant::now(),
        quiet,
        needed,
        on_block,
    };
    // The logits of the last position only: the output projection is not calibrated.
    model.forward(windows, ctx, ctx - 1, Some(&mut obs))?;
    if let Some(e) = obs.hs.non_finite.take() {
        return Err(Error::Unsupported(format!("{}: {e}", path.display())));
    }
    Ok(())
}
