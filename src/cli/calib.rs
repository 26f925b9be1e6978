//! `tq calib MODEL --text FILE [--tokens N --ctx C] -o H.safetensors [--resume]
//! [--sequential --weights T --recipe R --ldlq-band K --damp D]`
use std::collections::BTreeMap;
use std::path::PathBuf;
use tq::calib::input::first_windows;
use tq::calib::run::{self, Options};
use tq::calib::selfgen::{self_generate, SelfGenerate};
use tq::calib::sequential::SeqQuant;
use tq::error::{Error, Result};
use tq::gguf::GgufFile;
use tq::tokenizer::input::Input;

#[derive(clap::Args)]
pub struct CalibArgs {
    /// Model to calibrate (the unquantized source: F32/F16/BF16 or any type tq dequantizes).
    pub model: PathBuf,
    /// Calibration text (any UTF-8 file; `scripts/fetch-botchan.sh` fetches the documented default).
    #[arg(long, short = 'f', conflicts_with = "token_file")]
    pub text: Option<PathBuf>,
    /// Pre-tokenized input instead of --text: whitespace-separated u32 ids.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Data-free: calibrate on N windows of --ctx tokens sampled from the model itself (from
    /// BOS, temperature 1, top-k; deterministic for a --seed). Replaces --text/--tokens.
    #[arg(long, value_name = "N", conflicts_with_all = ["text", "token_file"])]
    pub self_generate: Option<usize>,
    /// With --self-generate: seed of the sampler (SplitMix64).
    #[arg(long, requires = "self_generate", default_value_t = 0)]
    pub seed: u64,
    /// With --self-generate: sample among the k most likely tokens.
    #[arg(long, requires = "self_generate", default_value_t = 40)]
    pub top_k: usize,
    /// With --self-generate: MiB of dequantized weights kept between decoding steps (the rest is
    /// dequantized again at every step).
    #[arg(long, requires = "self_generate", default_value_t = 4096)]
    pub gen_cache_mib: usize,
    /// With --self-generate: also write the sampled tokens (whitespace-separated ids, readable by
    /// --token-file).
    #[arg(long, requires = "self_generate")]
    pub save_tokens: Option<PathBuf>,
    /// Calibration tokens to use (rounded down to whole windows).
    #[arg(long, default_value_t = 8192, conflicts_with = "self_generate")]
    pub tokens: usize,
    /// Window length.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Windows per XᵀX chunk (the Hessians' f32 tile products depend on it).
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Output Hessian file (safetensors), written block by block as calibration goes.
    #[arg(short, long)]
    pub output: PathBuf,
    /// How the file stores each Hessian: f64 (exact, 8n² bytes), f32 (half), f32-upper (the
    /// upper triangle in f32: a quarter; a Llama-2-7B file is 11 GB instead of 44 GB).
    #[arg(long, default_value = "f64", value_parser = ["f64", "f32", "f32-upper"])]
    pub store: String,
    /// Also write the Hessians' diagonals as a llama.cpp imatrix (GGUF, what `llama-imatrix`
    /// writes), for `llama-quantize --imatrix` or `tq convert --imatrix`.
    #[arg(long, value_name = "FILE")]
    pub imatrix_out: Option<PathBuf>,
    /// Continue an interrupted run from its last checkpoint in --output.
    #[arg(long)]
    pub resume: bool,
    /// Worker threads (results do not depend on it).
    #[arg(long)]
    pub threads: Option<usize>,
    /// GPTQ-style: block i's Hessians come from the model whose blocks < i (and earlier
    /// sub-blocks of i) are already quantized as `tq convert --weights/--recipe --calib` will.
    #[arg(long)]
    pub sequential: bool,
    /// With --sequential: the convert --weights type to simulate.
    #[arg(long, requires = "sequential", default_value = "tq4_1s")]
    pub weights: String,
    /// With --sequential: the convert --recipe to simulate.
    #[arg(long, requires = "sequential", default_value = "pure")]
    pub recipe: String,
    /// With --sequential: the LDLQ band convert will use (0 = full).
    #[arg(long, requires = "sequential", default_value_t = 0)]
    pub ldlq_band: usize,
    /// With --sequential: the LDLQ damping convert will use.
    #[arg(long, requires = "sequential", default_value_t = 0.01)]
    pub damp: f64,
    /// With --sequential: the stock types' refit passes convert will use (--ldlq-refit).
    #[arg(long, requires = "sequential", default_value_t = tq::quant::ldlq::Refit::DEFAULT.passes)]
    pub ldlq_refit: usize,
    /// Make a checkpoint (fsync + a small JSON) after a block only when this many seconds
    /// passed since the last one (0: after every block).
    #[arg(long, default_value_t = 0.0)]
    pub checkpoint_secs: f64,
    /// Calibrate only shard I of N (0-based) of the windows, in whole --batch chunks; `tq calib
    /// merge` sums a complete set (see docs/scale.md). Not with --sequential.
    #[arg(long, value_name = "I/N", conflicts_with = "sequential")]
    pub shard: Option<String>,
}

pub fn run(a: CalibArgs) -> Result<()> {
    if a.ctx < 2 || a.batch == 0 {
        return Err(Error::Usage(
            "tq calib: --ctx must be >= 2 and --batch >= 1".into(),
        ));
    }
    tq::io::check_outputs(
        &[
            ("-o", Some(&a.output)),
            ("--save-tokens", a.save_tokens.as_deref()),
            ("--imatrix-out", a.imatrix_out.as_deref()),
        ],
        &[Some(&a.model), a.text.as_deref(), a.token_file.as_deref()],
    )?;
    super::with_thread_pool(a.threads, |_| calibrate(&a))
}

fn calibrate(a: &CalibArgs) -> Result<()> {
    tq::quant::LdlqSettings {
        band: a.ldlq_band,
        damp: a.damp,
        refit: a.ldlq_refit,
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
        Some(s) => shard_windows(a, &f, s, windows, &mut extra_meta)?,
        None => windows,
    };
    let seq = if a.sequential {
        Some(SeqQuant::for_conversion(
            &f,
            &a.weights,
            &a.recipe,
            tq::quant::LdlqSettings {
                band: a.ldlq_band,
                damp: a.damp,
                refit: a.ldlq_refit,
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
            store: tq::quant::Store::parse(&a.store)?,
            resume: a.resume,
            sequential: seq.as_ref(),
            checkpoint_secs: a.checkpoint_secs,
            extra_meta,
            quiet: false,
        },
    )?;
    eprintln!(
        "tq calib: wrote {} Hessians to {} ({})",
        c.diagonals.len(),
        a.output.display(),
        a.store
    );
    if let Some(p) = &a.imatrix_out {
        let dataset = a
            .text
            .as_deref()
            .or(a.token_file.as_deref())
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "self-generated".into());
        tq::calib::imatrix::write_gguf(&c.diagonals, p, &dataset, a.ctx)?;
        eprintln!(
            "tq calib: wrote the imatrix (Hessian diagonals) to {}",
            p.display()
        );
    }
    Ok(())
}

/// `--shard I/N`: this shard's windows (whole batches), with the whole run's fingerprint and
/// the window range recorded for `tq calib merge`.
fn shard_windows(
    a: &CalibArgs,
    f: &GgufFile,
    s: &str,
    windows: Vec<u32>,
    meta: &mut BTreeMap<String, String>,
) -> Result<Vec<u32>> {
    let shard = tq::shard::Shard::parse(s)?;
    let n_win = windows.len() / a.ctx;
    let r = shard.window_range(n_win, a.batch).ok_or_else(|| {
        Error::Usage(format!(
            "tq calib --shard {shard}: {n_win} windows make {} batches of --batch {}; use at most that many shards",
            n_win.div_ceil(a.batch),
            a.batch
        ))
    })?;
    let name = a
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let fp = tq::shard::merge::fingerprint(&name, f.file_len(), &windows, a.ctx);
    meta.extend(tq::shard::merge::shard_meta(shard, r.clone(), n_win, &fp));
    Ok(windows[r.start * a.ctx..r.end * a.ctx].to_vec())
}
