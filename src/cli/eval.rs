//! `tq eval MODEL --text FILE`: perplexity the way `llama-perplexity` computes it, and with
//! `--ref REF.gguf` or `--ref-logits FILE` the KL divergence from a reference model.
use std::path::PathBuf;
use tq::error::Result;
use tq::eval::job::{self, EvalFlags, EvalJob, KvCacheFlags};

#[derive(clap::Args)]
pub struct EvalArgs {
    /// Model to evaluate (GGUF; llama, qwen2 or qwen3 architecture).
    pub model: PathBuf,
    /// Text to evaluate, tokenized with the model's tokenizer like `llama-perplexity -f`.
    #[arg(long, short = 'f', conflicts_with = "tokens")]
    pub text: Option<PathBuf>,
    /// Pre-tokenized input instead of --text: whitespace-separated token ids, the whole stream
    /// as the tokenizer would produce it (including a leading BOS if the vocabulary adds one).
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Window length in tokens; the second half of each window is scored.
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx: usize,
    /// Evaluate only the first N windows.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Reference model for KL divergence (run side by side on the same windows).
    #[arg(long = "ref", value_name = "REF.gguf")]
    pub reference: Option<PathBuf>,
    /// Saved reference distributions for KL divergence (from --save-logits, or llama.cpp's
    /// --kl-divergence-base file). The windows come from the file; --text is not needed.
    #[arg(long, conflicts_with = "reference")]
    pub ref_logits: Option<PathBuf>,
    /// Save this model's distributions as a reference for later --ref-logits runs.
    #[arg(long)]
    pub save_logits: Option<PathBuf>,
    /// Format for --save-logits: tq (compact) or llama (readable by llama-perplexity --kl-divergence).
    #[arg(long, default_value = "tq")]
    pub logits_format: String,
    /// Machine-readable JSON report on stdout.
    #[arg(long)]
    pub json: bool,
    /// Worker threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Windows run through the model together (default: about 2048 tokens' worth).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Windows per pass (rounded up to whole batches): a pass advances its windows block by
    /// block, reading each block's weights once, and holds their hidden states (windows × ctx ×
    /// hidden × 4 bytes). Default: as many as 1 GiB of hidden states holds. Equal to --batch:
    /// every block is read once per batch.
    #[arg(long)]
    pub pass_windows: Option<usize>,
    /// ggml (round activations like llama.cpp's CPU backend; default), f32 (exact activations),
    /// cuda (= cuda-native: TQ4_1S/TQ3_1S weights through the fork's CUDA mat-vec arithmetic
    /// with GGML_TQ_NATIVE=1, int8 centroids x q8_1 activations) or cuda-q8_0 (the fork's CUDA
    /// default: TQ4_1S converted to q8_0 at load). Other weight types keep ggml numerics.
    #[arg(long, default_value = "ggml")]
    pub numerics: String,
    /// Where the linear weights run: cpu (the CPU runtime; default); auto (the first GPU backend
    /// built in and present: cuda, metal, wgpu; else cpu); or wgpu, cuda, metal: every
    /// weight whose type has a bundled mat-mul kernel (tq4_1s, tq3_1s) through that GPU backend,
    /// the rest on the CPU; the CPU run is made beside it and the KL divergence between the two
    /// is reported and held to a bound (docs/eval.md). cpu-emulation: the kernels' arithmetic on
    /// the CPU (slow; checks the plumbing without a GPU).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    #[command(flatten)]
    pub kv: KvCacheArgs,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// The simulated KV cache's flags (`tq eval`, `tq validate`); the library's form is
/// [`tq::model::KvSpec`]. The engine's behaviour comes from `--target` and each part can be
/// overridden.
#[derive(clap::Args, Clone, Debug)]
pub struct KvCacheArgs {
    /// KV-cache type for K, simulated like llama.cpp's -ctk (f16 default; f32, bf16, q8_0, q4_0,
    /// q4_1, q5_0, q5_1, iq4_nl, turbo2, turbo3, turbo4). A --ref model keeps f16.
    #[arg(long, visible_aliases = ["ctk", "kv-k"], default_value = "f16")]
    pub cache_type_k: String,
    /// KV-cache type for V, simulated like -ctv (see --cache-type-k).
    #[arg(long, visible_aliases = ["ctv", "kv-v"], default_value = "f16")]
    pub cache_type_v: String,
    /// Per-layer KV types, repeatable, later rules win: RANGES=TYPE sets K and V,
    /// RANGES=KTYPE/VTYPE each ('-' keeps one), e.g. 0-1,28-29=q8_0 or 0,29=-/q8_0.
    #[arg(long, value_name = "RULE")]
    pub kv_layers: Vec<String>,
    /// The engine whose cache is simulated: fork (default: the TurboQuant fork since June 2026),
    /// fork-69d8e4be4 (May 2026), upstream (llama.cpp: rotated stock caches, no turbo types).
    /// It decides turbo padding and tables, rotation and the fork's turbo rules.
    #[arg(long = "target", value_name = "PROFILE")]
    pub kv_target: Option<String>,
    /// JSON type map of another engine (its "kv" entry names the built-in profile whose KV
    /// behaviour it has).
    #[arg(long = "type-map", conflicts_with = "kv_target")]
    pub kv_type_map: Option<PathBuf>,
    /// The fork's auto-asymmetric rule (turbo K == V with n_head/n_head_kv >= 6 -> K q8_0): on
    /// or off; default: the target's (on for the fork, TURBO_AUTO_ASYMMETRIC=0 is off).
    #[arg(long, value_name = "on|off", num_args = 0..=1, default_missing_value = "on")]
    pub kv_auto_asym: Option<String>,
    /// Hadamard rotation of quantized stock KV types: on or off; default: the target's (upstream
    /// rotates since April 2026, the fork does not).
    #[arg(long, value_name = "on|off")]
    pub kv_rotation: Option<String>,
    /// Same as --kv-rotation off (upstream's LLAMA_ATTN_ROT_DISABLE=1).
    #[arg(long, conflicts_with = "kv_rotation")]
    pub no_kv_rotation: bool,
    /// The fork's TURBO_LAYER_ADAPTIVE mode: 0 (uniform), 1, 2, 5, 6 or 7; default: the
    /// fork's own rule (mode 7 for -ctv turbo2 on >= 8 layers).
    #[arg(long, value_name = "MODE")]
    pub turbo_layer_adaptive: Option<u8>,
    /// turbo group layout: pad128 (every head zero-padded to a multiple of 128, as the fork
    /// builds it; default) or 64 (64-wide heads as 64-value groups, what `tq codebook
    /// --head-dim 64` tables are for; no engine's default).
    #[arg(long, value_name = "LAYOUT")]
    pub turbo_groups: Option<String>,
    /// turbo codebooks: june (the fork's tables since June 2026, 66-byte turbo4), may (the
    /// May-2026 tables, 68-byte turbo4, byte-exact with the conformance vectors) or head-dim
    /// (Lloyd-Max for the group's own dimension); default: the target's.
    #[arg(long, visible_alias = "turbo4-table")]
    pub turbo_codebook: Option<String>,
}

pub fn run(a: EvalArgs) -> Result<()> {
    let threads = a.threads;
    let job = EvalJob::resolve(flags(a))?;
    super::with_thread_pool(threads, |threads| {
        let r = job::run(&job, threads)?;
        if job.flags.json {
            println!("{}", r.json()?);
        } else {
            print!("{}", r.text());
        }
        Ok(())
    })
}

/// The flags as the library's plain values.
fn flags(a: EvalArgs) -> EvalFlags {
    EvalFlags {
        model: a.model,
        text: a.text,
        tokens: a.tokens,
        ctx: a.ctx,
        chunks: a.chunks,
        reference: a.reference,
        ref_logits: a.ref_logits,
        save_logits: a.save_logits,
        logits_format: a.logits_format,
        json: a.json,
        batch: a.batch,
        pass_windows: a.pass_windows,
        numerics: a.numerics,
        backend: a.backend,
        kv: KvCacheFlags {
            cache_type_k: a.kv.cache_type_k,
            cache_type_v: a.kv.cache_type_v,
            kv_layers: a.kv.kv_layers,
            kv_target: a.kv.kv_target,
            kv_type_map: a.kv.kv_type_map,
            kv_auto_asym: a.kv.kv_auto_asym,
            kv_rotation: a.kv.kv_rotation,
            no_kv_rotation: a.kv.no_kv_rotation,
            turbo_layer_adaptive: a.kv.turbo_layer_adaptive,
            turbo_groups: a.kv.turbo_groups,
            turbo_codebook: a.kv.turbo_codebook,
        },
        quiet: a.quiet,
    }
}
