//! The calibration driver shared by `tq calib` and `tq convert --calib TEXT`: windows of tokens →
//! Hessians, batched (every block sees the original model's activations) or sequential (GPTQ
//! order, [`super::sequential`]), with checkpoints and `--resume`.

use super::sequential::SeqQuant;
use super::Hessians;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::quant::{Diagonal, Hessian, HessianWriter, Store, WriteMode};
use std::collections::BTreeMap;
use std::path::Path;

pub struct Options<'a> {
    /// Window length (every window starts at position 0).
    pub ctx: usize,
    /// Windows per `XᵀX` chunk (both modes: the f32 tile products, so the Hessians, depend on it).
    pub batch: usize,
    /// Output file, written block by block (None: in memory only, no checkpoints).
    pub output: Option<&'a Path>,
    /// How the output stores each matrix.
    pub store: Store,
    pub resume: bool,
    /// Sequential mode: what the converted model will be.
    pub sequential: Option<&'a SeqQuant>,
    /// Make a checkpoint after a block when at least this many seconds passed since the last
    /// one (0: after every block).
    pub checkpoint_secs: f64,
    /// Extra `__metadata__` keys (e.g. where the tokens came from).
    pub extra_meta: BTreeMap<String, String>,
    pub quiet: bool,
}

/// What a calibration produced: the Hessians (in memory mode; empty when they went to the
/// output file block by block) and every group's diagonal.
pub struct Calibrated {
    pub hessians: Hessians,
    pub diagonals: Vec<Diagonal>,
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

/// Calibrate the model at `path` (opened as `f`) on `windows` (`n × ctx` tokens, BOS in place),
/// block by block over all windows: each block's Hessians are complete when the block ends, and
/// with an output they are appended to the file then and dropped, so memory holds one block's
/// Hessians whatever the depth; `--resume` continues after the last checkpointed block.
pub fn calibrate(path: &Path, f: &GgufFile, windows: &[u32], o: &Options) -> Result<Calibrated> {
    super::stream::check_windows(windows, o.ctx, o.batch)?;
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
    let layers = super::stream::layout(f, windows.len() as u64)?;
    let n_layer = layers.len();
    let mut meta = o.extra_meta.clone();
    meta.extend([
        ("tq.fingerprint".to_string(), fingerprint.clone()),
        ("tq.batch".to_string(), o.batch.to_string()),
        ("tq.ctx".to_string(), o.ctx.to_string()),
        ("tq.windows_total".to_string(), n_win.to_string()),
        ("tq.windows_done".to_string(), n_win.to_string()),
        ("tq.layers_done".to_string(), n_layer.to_string()),
        ("tq.complete".to_string(), "true".to_string()),
        ("tq.model".to_string(), file_name(path)),
        (
            "tq.sequential".to_string(),
            o.sequential.is_some().to_string(),
        ),
    ]);
    if let Some(q) = o.sequential {
        meta.extend(q.metadata());
    }
    let say = |s: String| {
        if !o.quiet {
            eprintln!("{s}");
        }
    };
    let mut writer = match o.output {
        Some(p) => {
            let index: Vec<&Hessian> = layers.iter().flatten().collect();
            Some(HessianWriter::create(
                p,
                &index,
                &meta,
                o.store,
                WriteMode::Resumable {
                    resume: o.resume,
                    quiet: o.quiet,
                },
            )?)
        }
        None => None,
    };
    // Blocks whose groups are all in the file (a resumed run): a prefix, since checkpoints
    // fall between blocks.
    let done = match &writer {
        Some(w) => {
            let mut groups = 0;
            let mut done = 0;
            for l in &layers {
                if groups + l.len() > w.written() {
                    break;
                }
                groups += l.len();
                done += 1;
            }
            done
        }
        None => 0,
    };
    if done > 0 {
        say(format!(
            "tq calib: resuming after {done} of {n_layer} blocks{}",
            if o.sequential.is_some() {
                format!(" (replaying the quantization of blocks 0..{done})")
            } else {
                String::new()
            }
        ));
    }
    // Sequential replay reads finished blocks back from the partial file.
    let reader = writer.as_ref().map(|w| w.reader());
    let mut last_checkpoint = std::time::Instant::now();
    // After block `l` (0-based): append its groups to the file, drop them, checkpoint.
    let mut on_block = |l: usize, hs: &mut Hessians| -> Result<()> {
        let Some(w) = writer.as_mut() else {
            return Ok(());
        };
        if l < done {
            return Ok(());
        }
        for g in &layers[l] {
            let key = g.tensors.join(",");
            let h = match hs.groups.remove(&key) {
                Some(h) => h,
                // An expert no token was routed to: an empty Hessian (conversion rounds it to
                // nearest).
                None if key.contains('#') => Hessian {
                    tensors: g.tensors.clone(),
                    n: g.n,
                    h: vec![0.0; g.n * g.n],
                    tokens: 0,
                },
                None => {
                    return Err(Error::Unsupported(format!(
                        "{}: the calibration pass produced no Hessian for {key} (the runtime does not read it)",
                        path.display()
                    )))
                }
            };
            w.write(&h)?;
        }
        if l + 1 == n_layer || last_checkpoint.elapsed().as_secs_f64() >= o.checkpoint_secs {
            w.checkpoint()?;
            last_checkpoint = std::time::Instant::now();
        }
        Ok(())
    };

    let run = super::stream::Run {
        model: path,
        file: f,
        windows,
        ctx: o.ctx,
        batch: o.batch,
        quiet: o.quiet,
    };
    let hessians = match o.sequential {
        None => {
            // Batched: every block sees the original model's activations.
            let skip: std::collections::HashSet<&str> = layers[..done]
                .iter()
                .flatten()
                .flat_map(|g| g.tensors.iter().map(|t| crate::quant::tensor_of(t)))
                .collect();
            super::stream::run_blocks(&run, &|t| !skip.contains(t), &mut on_block)?
        }
        Some(q) => {
            // Sequential: blocks < done replay their quantization from the file's Hessians.
            super::stream::run_blocks_sequential(
                &run,
                q,
                reader.as_ref().map(|r| (done, r)),
                &mut on_block,
            )?
        }
    };
    let diagonals = match writer {
        Some(w) => {
            let d = w.diagonals().to_vec();
            w.finish()?;
            d
        }
        None => hessians.diagonals(),
    };
    Ok(Calibrated {
        hessians,
        diagonals,
    })
}
