//! `tq calib MODEL --text FILE [--tokens N --ctx C] -o H.safetensors [--resume]
//! [--sequential --weights T --recipe R --ldlq-band K --damp D]`
use std::path::PathBuf;
use tq::calib::job::{self, CalibFlags};
use tq::error::Result;

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
    /// With --sequential: the LDLQ band convert will use (0 = full; unset: convert's per-type
    /// default, 64 for IQ1_S / IQ1_M and full for the others).
    #[arg(long, requires = "sequential")]
    pub ldlq_band: Option<usize>,
    /// With --sequential: the LDLQ damping convert will use.
    /// Unset: convert's per-type default.
    #[arg(long, requires = "sequential")]
    pub damp: Option<f64>,
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
    /// No progress lines and no notices (errors are still printed).
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(a: CalibArgs) -> Result<()> {
    let threads = a.threads;
    let flags = flags(a);
    job::check(&flags)?;
    super::with_thread_pool(threads, |_| {
        job::calibrate(&flags, tq::shard::merge::shard_windows)
    })
}

/// The flags as the library's plain values.
fn flags(a: CalibArgs) -> CalibFlags {
    CalibFlags {
        model: a.model,
        text: a.text,
        token_file: a.token_file,
        self_generate: a.self_generate,
        seed: a.seed,
        top_k: a.top_k,
        gen_cache_mib: a.gen_cache_mib,
        save_tokens: a.save_tokens,
        tokens: a.tokens,
        ctx: a.ctx,
        batch: a.batch,
        output: a.output,
        store: a.store,
        imatrix_out: a.imatrix_out,
        resume: a.resume,
        sequential: a.sequential,
        weights: a.weights,
        recipe: a.recipe,
        ldlq_band: a.ldlq_band,
        damp: a.damp,
        ldlq_refit: a.ldlq_refit,
        checkpoint_secs: a.checkpoint_secs,
        shard: a.shard,
        quiet: a.quiet,
    }
}
