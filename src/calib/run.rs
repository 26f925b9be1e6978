//! The calibration driver shared by `tq calib` and `tq convert --calib TEXT`: windows of tokens →
//! Hessians, batched (every block sees the original model's activations) or sequential (GPTQ
//! order, [`super::sequential`]), with checkpoints and `--resume`.

use super::sequential::{SeqQuant, Sequential};
use super::Hessians;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::runtime::{Model, Numerics};
use std::collections::BTreeMap;
use std::path::Path;

pub struct Options<'a> {
    /// Window length (every window starts at position 0).
    pub ctx: usize,
    /// Windows per forward pass and per checkpoint (batched mode); windows per `XᵀX` chunk
    /// (both modes).
    pub batch: usize,
    /// Checkpoint / output file (None: in memory only, no checkpoints).
    pub output: Option<&'a Path>,
    pub resume: bool,
    /// Sequential mode: what the converted model will be.
    pub sequential: Option<&'a SeqQuant>,
    /// Sequential mode: write a checkpoint after a block when at least this many seconds passed
    /// since the last one (0: after every block).
    pub checkpoint_secs: f64,
    /// Extra `__metadata__` keys (e.g. where the tokens came from).
    pub extra_meta: BTreeMap<String, String>,
    pub quiet: bool,
}

/// The first `n_win` windows of `ctx` tokens, with `bos` written at the start of each.
pub fn make_windows(tokens: &[u32], n_win: usize, ctx: usize, bos: Option<u32>) -> Vec<u32> {
    let mut toks = tokens[..n_win * ctx].to_vec();
    if let Some(b) = bos {
        for w in toks.chunks_mut(ctx) {
            w[0] = b;
        }
    }
    toks
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Calibrate the model at `path` (opened as `f`) on `windows` (`n × ctx` tokens, BOS in place).
/// Returns the Hessians and the metadata written with them.
// One function on purpose: batches, checkpoints and resume share state (the Hessians, the
// window cursor, the checkpoint clock) that splitting would have to thread through every piece.
pub fn calibrate(
    path: &Path,
    f: &GgufFile,
    windows: &[u32],
    o: &Options,
) -> Result<(Hessians, BTreeMap<String, String>)> {
    if o.ctx < 2 || o.batch == 0 || windows.is_empty() || windows.len() % o.ctx != 0 {
        return Err(Error::Usage(
            "calibration: --ctx must be >= 2, --batch >= 1, and the input at least one window"
                .into(),
        ));
    }
    let n_win = windows.len() / o.ctx;
    let tokens_hash = blake3::hash(
        &windows
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .to_hex();
    let mut fingerprint = format!(
        "{}:{}:{}:{}",
        file_name(path),
        f.file_len(),
        tokens_hash,
        o.ctx
    );
    if let Some(q) = o.sequential {
        let types = blake3::hash(q.metadata()["tq.tensor_types"].as_bytes()).to_hex();
        fingerprint.push_str(&format!(":sequential {}:{types}", q.describe()));
    }
    let mut base_meta = o.extra_meta.clone();
    base_meta.extend([
        ("tq.fingerprint".to_string(), fingerprint.clone()),
        ("tq.batch".to_string(), o.batch.to_string()),
        ("tq.ctx".to_string(), o.ctx.to_string()),
        ("tq.windows_total".to_string(), n_win.to_string()),
        ("tq.model".to_string(), file_name(path)),
        (
            "tq.sequential".to_string(),
            o.sequential.is_some().to_string(),
        ),
    ]);
    if let Some(q) = o.sequential {
        base_meta.extend(q.metadata());
    }
    let checkpoint = match (o.resume, o.output) {
        (true, Some(p)) if p.exists() => {
            let (h, meta) = Hessians::load(p)?;
            if meta.get("tq.fingerprint") != Some(&fingerprint)
                || meta.get("tq.batch") != Some(&o.batch.to_string())
            {
                return Err(Error::Usage(format!(
                    "{}: checkpoint is for another model, text, --ctx, --batch or quantization (--sequential, --weights, --recipe, --ldlq-band, --damp); remove it or drop --resume",
                    p.display()
                )));
            }
            Some((h, meta))
        }
        _ => None,
    };
    let model = Model::new(f, Numerics::F32)?;
    let abort_after: Option<usize> = std::env::var("TQ_CALIB_ABORT_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let t0 = std::time::Instant::now();
    let say = |s: String| {
        if !o.quiet {
            eprintln!("{s}");
        }
    };

    let Some(q) = o.sequential else {
        // Batched: every block sees the original model's activations.
        let (mut hs, mut done) = (Hessians::default(), 0usize);
        if let Some((h, meta)) = checkpoint {
            done = meta
                .get("tq.windows_done")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            hs = h;
            say(format!(
                "tq calib: resuming after {done} of {n_win} windows"
            ));
        }
        let mut meta = base_meta.clone();
        let mut batches = 0usize;
        while done < n_win {
            let end = (done + o.batch).min(n_win);
            hs.seq = o.ctx;
            hs.window0 = done;
            model.forward(
                &windows[done * o.ctx..end * o.ctx],
                o.ctx,
                o.ctx - 1,
                Some(&mut hs),
            )?;
            if let Some(e) = hs.non_finite.take() {
                return Err(Error::Unsupported(format!("{}: {e}", path.display())));
            }
            done = end;
            meta.insert("tq.windows_done".into(), done.to_string());
            meta.insert("tq.complete".into(), (done == n_win).to_string());
            if let Some(p) = o.output {
                hs.save(p, &meta)?;
            }
            say(format!(
                "tq calib: {done}/{n_win} windows ({} tokens) in {:.1} s",
                done * o.ctx,
                t0.elapsed().as_secs_f64()
            ));
            batches += 1;
            if abort_after == Some(batches) && done < n_win {
                return Err(Error::Usage(
                    "tq calib: stopped by TQ_CALIB_ABORT_AFTER (test hook); rerun with --resume"
                        .into(),
                ));
            }
        }
        return Ok((hs, meta));
    };

    // Sequential: one forward pass over all windows, block by block.
    let n_layer = model.cfg.n_layer;
    let (mut hs, mut done) = (Hessians::default(), 0usize);
    if let Some((h, meta)) = checkpoint {
        done = meta
            .get("tq.layers_done")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        hs = h;
        if done >= n_layer {
            say(format!("tq calib: {} is already complete", path.display()));
            return Ok((hs, meta));
        }
        say(format!(
            "tq calib: resuming after {done} of {n_layer} blocks (replaying the quantization of blocks 0..{done})"
        ));
    }
    hs.seq = o.ctx;
    hs.window0 = 0;
    hs.rows_per_accum = o.batch * o.ctx;
    let meta_at = |layers: usize| {
        let mut m = base_meta.clone();
        m.insert("tq.layers_done".into(), layers.to_string());
        m.insert("tq.windows_done".into(), n_win.to_string());
        m.insert("tq.complete".into(), (layers == n_layer).to_string());
        m
    };
    let mut last_save = std::time::Instant::now();
    let mut on_layer = |hs: &Hessians, layers: usize| -> Result<()> {
        let abort = abort_after == Some(layers) && layers < n_layer;
        say(format!(
            "tq calib: block {layers}/{n_layer} ({} windows, {} tokens) in {:.1} s",
            n_win,
            windows.len(),
            t0.elapsed().as_secs_f64()
        ));
        if let Some(p) = o.output {
            if layers < n_layer && (abort || last_save.elapsed().as_secs_f64() >= o.checkpoint_secs)
            {
                hs.save(p, &meta_at(layers))?;
                last_save = std::time::Instant::now();
            }
        }
        if abort {
            return Err(Error::Usage(
                "tq calib: stopped by TQ_CALIB_ABORT_AFTER (test hook); rerun with --resume".into(),
            ));
        }
        Ok(())
    };
    let mut obs = Sequential::new(hs, q, done, path.display().to_string(), &mut on_layer);
    model.forward(windows, o.ctx, o.ctx - 1, Some(&mut obs))?;
    let [n_ldlq, n_rtn, n_kept] = obs.counts;
    let quant_secs = obs.quant_secs;
    let mut hs = obs.hs;
    if let Some(e) = hs.non_finite.take() {
        return Err(Error::Unsupported(format!("{}: {e}", path.display())));
    }
    let meta = meta_at(n_layer);
    if let Some(p) = o.output {
        hs.save(p, &meta)?;
    }
    say(format!(
        "tq calib: sequential: {n_ldlq} tensors quantized with LDLQ, {n_rtn} round-to-nearest, {n_kept} kept as stored ({quant_secs:.1} s quantizing); {:.1} s in all",
        t0.elapsed().as_secs_f64()
    ));
    Ok((hs, meta))
}
