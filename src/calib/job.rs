//! `tq calib` as one call: the flags as plain values ([`CalibFlags`]), the checks that need no
//! model ([`check`]), and the run in the caller's thread pool ([`calibrate`]): the windows (from
//! the text, the token file or the model itself), this shard's part of them (`--shard`), the
//! sequential mode's quantizer, the Hessian file, and `--imatrix-out`. Its messages go to stderr.

use super::input::first_windows;
use super::run::{self, Options};
use super::selfgen::{self_generate, SelfGenerate};
use super::sequential::SeqQuant;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::input::Input;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The flags of `tq calib` as plain values (the CLI fills this in; nothing is checked yet).
/// `--threads` is the caller's: [`calibrate`] works in the pool it is called from.
#[derive(Clone, Debug, Default)]
pub struct CalibFlags {
    pub model: PathBuf,
    pub text: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub self_generate: Option<usize>,
    pub seed: u64,
    pub top_k: usize,
    pub gen_cache_mib: usize,
    pub save_tokens: Option<PathBuf>,
    pub tokens: usize,
    pub ctx: usize,
    pub batch: usize,
    pub output: PathBuf,
    pub store: String,
    pub imatrix_out: Option<PathBuf>,
    pub resume: bool,
    pub sequential: bool,
    pub weights: String,
    pub recipe: String,
    pub ldlq_band: Option<usize>,
    pub damp: Option<f64>,
    pub ldlq_refit: usize,
    pub checkpoint_secs: f64,
    pub shard: Option<String>,
    /// No progress lines and no notices (errors are still printed).
    pub quiet: bool,
}

/// `--shard I/N`: this shard's windows (whole `batch` chunks) of all `windows`, recording in the
/// metadata what `tq calib merge` checks. Arguments: the `I/N` text, the model's path and file,
/// `ctx`, `batch`, the windows and the metadata. The shard room, which sits above this one,
/// implements it: the caller passes `tq::shard::merge::shard_windows`.
pub type ShardWindows = fn(
    &str,
    &Path,
    &GgufFile,
    usize,
    usize,
    Vec<u32>,
    &mut BTreeMap<String, String>,
) -> Result<Vec<u32>>;

/// What is checked before the thread pool starts: the window shape, and that no output is an
/// input or another output.
pub fn check(a: &CalibFlags) -> Result<()> {
    if a.ctx < 2 || a.batch == 0 {
        return Err(Error::Usage(
            "tq calib: --ctx must be >= 2 and --batch >= 1".into(),
        ));
    }
    crate::io::check_outputs(
        &[
            ("-o", Some(&a.output)),
            ("--save-tokens", a.save_tokens.as_deref()),
            ("--imatrix-out", a.imatrix_out.as_deref()),
        ],
        &[Some(&a.model), a.text.as_deref(), a.token_file.as_deref()],
    )
}

/// Run the calibration of `a` (after [`check`]), with `shard_windows` for `--shard`.
pub fn calibrate(a: &CalibFlags, shard_windows: ShardWindows) -> Result<()> {
    crate::quant::LdlqSettings {
        band: a.ldlq_band,
        damp: a.damp,
        refit: a.ldlq_refit,
        shrink: None,
    }
    .check()?;
    if a.self_generate.is_none() && a.tokens < a.ctx {
        return Err(Error::Usage(format!(
            "tq calib: --tokens {} is less than one window: it must be at least --ctx {}",
            a.tokens, a.ctx
        )));
    }
    let f = GgufFile::open(&a.model)?;
    let mut extra_meta = BTreeMap::new();
    let windows = if let Some(n) = a.self_generate {
        let o = SelfGenerate {
            windows: n,
            ctx: a.ctx,
            seed: a.seed,
            top_k: a.top_k,
            cache_mib: a.gen_cache_mib,
            save_tokens: a.save_tokens.as_deref(),
            quiet: a.quiet,
        };
        let windows = self_generate(&a.model, &f, &o)?;
        extra_meta.insert(
            "tq.source".to_string(),
            format!(
                "self-generate {n} windows, seed {}, top-k {}",
                a.seed, a.top_k
            ),
        );
        windows
    } else {
        let input = match (&a.token_file, &a.text) {
            (Some(p), _) => Input::TokenFile(p),
            (None, Some(p)) => Input::Text(p),
            (None, None) => {
                return Err(Error::Usage(
                    "tq calib: give --text FILE (or --token-file FILE)".into(),
                ))
            }
        };
        let (tokens, bos) = input.tokens(&f)?;
        let windows = first_windows(&tokens, bos, a.tokens, a.ctx).ok_or_else(|| {
            Error::Usage(format!(
                "tq calib: the input has {} tokens, fewer than one window of --ctx {}",
                tokens.len(),
                a.ctx
            ))
        })?;
        extra_meta.insert(
            "tq.source".to_string(),
            input
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        windows
    };
    let windows = match &a.shard {
        Some(s) => shard_windows(s, &a.model, &f, a.ctx, a.batch, windows, &mut extra_meta)?,
        None => windows,
    };
    let seq = if a.sequential {
        Some(SeqQuant::for_conversion(
            &f,
            &a.weights,
            &a.recipe,
            crate::quant::LdlqSettings {
                band: a.ldlq_band,
                damp: a.damp,
                refit: a.ldlq_refit,
                shrink: None,
            },
        )?)
    } else {
        None
    };
    let c = run::calibrate(
        &a.model,
        &f,
        &windows,
        &Options {
            ctx: a.ctx,
            batch: a.batch,
            output: Some(&a.output),
            store: crate::quant::Store::parse(&a.store)?,
            resume: a.resume,
            sequential: seq.as_ref(),
            checkpoint_secs: a.checkpoint_secs,
            extra_meta,
            quiet: a.quiet,
        },
    )?;
    if !a.quiet {
        eprintln!(
            "tq calib: wrote {} Hessians to {} ({})",
            c.diagonals.len(),
            a.output.display(),
            a.store
        );
    }
    if let Some(p) = &a.imatrix_out {
        let dataset = a
            .text
            .as_deref()
            .or(a.token_file.as_deref())
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "self-generated".into());
        super::imatrix::write_gguf(&c.diagonals, p, &dataset, a.ctx)?;
        if !a.quiet {
            eprintln!(
                "tq calib: wrote the imatrix (Hessian diagonals) to {}",
                p.display()
            );
        }
    }
    Ok(())
}
