//! `tq eval MODEL --text FILE`: perplexity the way `llama-perplexity` computes it, and with
//! `--ref REF.gguf` or `--ref-logits FILE` the KL divergence from a reference model.
use std::path::PathBuf;
use tq::error::{Error, Result};
use tq::eval::kv::kv_json;
use tq::eval::logits_file::Format;
use tq::eval::{evaluate, session, EvalResult};
use tq::gguf::GgufFile;
use tq::gpu::BackendKind;
use tq::model::{KvSpec, Model, Numerics};
use tq::tokenizer::input::Input;

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

fn on_off(flag: &str, v: &str) -> Result<bool> {
    match v {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        o => Err(Error::Usage(format!(
            "--{flag} {}: expected on or off",
            tq::error::one_line(o)
        ))),
    }
}

impl KvCacheArgs {
    /// The target profile named by --target / --type-map (default fork).
    pub fn profile(&self) -> Result<tq::types::profile::Profile> {
        tq::types::profile::Profile::select(self.kv_target.as_deref(), self.kv_type_map.as_deref())
    }

    /// The spec: the target's KV behaviour, then each flag that overrides a part of it.
    pub fn spec(&self) -> Result<KvSpec> {
        let mut s = KvSpec::from_names(
            &self.cache_type_k,
            &self.cache_type_v,
            &self.kv_layers,
            &self.profile()?,
        )?;
        if let Some(v) = &self.kv_auto_asym {
            s.auto_asym = on_off("kv-auto-asym", v)?;
        }
        if let Some(v) = &self.kv_rotation {
            s.rotate = on_off("kv-rotation", v)?;
        }
        if self.no_kv_rotation {
            s.rotate = false;
        }
        if let Some(m) = self.turbo_layer_adaptive {
            if !tq::model::kv::LAYER_ADAPTIVE_MODES.contains(&m) {
                return Err(Error::Usage(format!(
                    "--turbo-layer-adaptive {m}: the fork has modes 0, 1, 2, 5, 6 and 7"
                )));
            }
            s.layer_adaptive = Some(m);
        }
        if let Some(g) = &self.turbo_groups {
            s.groups = tq::model::kv::TurboGroups::parse(g)?;
        }
        if let Some(t) = &self.turbo_codebook {
            s.turbo4 = tq::model::Turbo4Table::parse(t)?;
        }
        Ok(s)
    }
}

/// `--backend`: `None` for the CPU runtime, else the GPU backend (or the CPU emulation of the
/// kernels) that runs the weights with mat-mul kernels.
pub fn parse_backend(s: &str) -> Result<Option<BackendKind>> {
    match s {
        "cpu" => Ok(None),
        "auto" => Ok(auto_backend()),
        "wgpu" => Ok(Some(BackendKind::Wgpu)),
        "cuda" => Ok(Some(BackendKind::Cuda)),
        "metal" => Ok(Some(BackendKind::Metal)),
        "cpu-emulation" => Ok(Some(BackendKind::Cpu)),
        o => Err(Error::Usage(format!(
            "--backend {}: expected cpu, auto, wgpu, cuda, metal or cpu-emulation",
            tq::error::one_line(o)
        ))),
    }
}

/// `--backend auto`: the first GPU backend that is built in and opens (CUDA, Metal, wgpu), else
/// the CPU runtime. The report's `backend` says which was used.
fn auto_backend() -> Option<BackendKind> {
    [BackendKind::Cuda, BackendKind::Metal, BackendKind::Wgpu]
        .into_iter()
        .find(|&k| tq::gpu::open_linear(k).is_ok())
}

/// `--text` or `--tokens`, if either was given.
fn input(a: &EvalArgs) -> Option<Input<'_>> {
    match (&a.tokens, &a.text) {
        (Some(p), _) => Some(Input::TokenFile(p)),
        (None, Some(p)) => Some(Input::Text(p)),
        (None, None) => None,
    }
}

pub fn run(a: EvalArgs) -> Result<()> {
    let numerics = Numerics::parse(&a.numerics).ok_or_else(|| {
        Error::Usage(format!(
            "--numerics {}: expected ggml, f32, cuda (cuda-native) or cuda-q8_0",
            tq::error::one_line(&a.numerics)
        ))
    })?;
    let backend = parse_backend(&a.backend)?;
    let format = match a.logits_format.as_str() {
        "tq" => Format::Tq,
        "llama" => Format::Llama,
        o => {
            return Err(Error::Usage(format!(
                "--logits-format {o}: expected tq or llama"
            )))
        }
    };
    tq::io::check_outputs(
        &[("--save-logits", a.save_logits.as_deref())],
        &[
            Some(&a.model),
            a.reference.as_deref(),
            a.ref_logits.as_deref(),
            a.text.as_deref(),
            a.tokens.as_deref(),
        ],
    )?;
    super::with_thread_pool(a.threads, |threads| {
        run_in_pool(&a, numerics, backend, format, threads)
    })
}

// Mostly printing: the banner, the progress bar, and the text and JSON reports.
fn run_in_pool(
    a: &EvalArgs,
    numerics: Numerics,
    backend: Option<BackendKind>,
    format: Format,
    threads: usize,
) -> Result<()> {
    let file = GgufFile::open(&a.model)?;
    let mut model = Model::new(&file, numerics)?;
    if let Some(b) = backend {
        model.use_backend(b)?;
    }
    let kv_spec = a.kv.spec()?;
    model.kv = kv_spec.resolve(
        model.cfg.n_layer,
        model.cfg.n_head,
        model.cfg.n_head_kv,
        model.cfg.head_dim,
    )?;
    let (kv_bits_k, kv_bits_v) = model.kv.bits(model.cfg.n_layer, model.cfg.head_dim);
    let cuda_tensors = model.cuda_tensors();
    let numerics_note = numerics_note(numerics, cuda_tensors.len());

    let ref_file;
    let mut ref_model = None;
    if let Some(r) = &a.reference {
        ref_file = GgufFile::open(r)?;
        ref_model = Some(Model::new(&ref_file, numerics)?);
    }
    let (win, reference) = session::windows_and_reference(
        &file,
        input(a),
        a.ctx,
        a.chunks,
        a.ref_logits.as_deref(),
        ref_model.as_ref(),
    )?;
    let nv = model.cfg.n_vocab;
    let batch = a.batch.unwrap_or_else(|| {
        session::default_batch(&win, nv, ref_model.is_some() || backend.is_some())
    });
    let mut writer = match &a.save_logits {
        Some(p) => Some(session::logits_writer(
            p,
            format,
            &a.model,
            numerics.name(),
            &win,
            nv,
        )?),
        None => None,
    };

    if !a.quiet && !a.json {
        eprintln!(
            "tq eval: {} ({}, {} blocks), {} windows x {} tokens, scoring {} per window, batch {} windows, {} threads, {} numerics, backend {}, KV {} ({:.3}/{:.3} bits per real value, target {})",
            a.model.display(),
            model.cfg.arch.name(),
            model.cfg.n_layer,
            win.n_chunk,
            win.n_ctx,
            win.scored_per_window(),
            batch,
            threads,
            numerics.name(),
            backend.map_or("cpu", |b| b.name()),
            model.kv.describe(model.cfg.n_layer),
            kv_bits_k,
            kv_bits_v,
            kv_spec.profile
        );
    }
    let pb = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new(1);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {percent}% ETA {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    };
    let prog = |d: u64, t: u64| {
        pb.set_length(t);
        pb.set_position(d);
    };
    let res = evaluate(&model, &win, reference, writer.as_mut(), batch, &prog)?;
    pb.finish_and_clear();
    if let Some(w) = writer {
        w.finish()?;
    }

    if a.json {
        let j = serde_json::json!({
            "model": a.model.display().to_string(),
            "reference": a.reference.as_ref().or(a.ref_logits.as_ref()).map(|p| p.display().to_string()),
            "numerics": numerics.name(),
            "numerics_path": {
                "name": numerics.name(),
                "description": numerics.describe(),
                "cuda_tensors": cuda_tensors.len(),
                "note": numerics_note,
            },
            "backend": backend.map_or("cpu", |b| b.name()),
            "kv": kv_json(&model.kv, &model.cfg, &kv_spec.profile),
            "threads": threads,
            "batch": batch,
            "result": res,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&j)
                .map_err(|e| Error::internal(format!("JSON encoding of the report failed: {e}")))?
        );
    } else {
        print!("{}", render(&res));
        if let Some(b) = &res.backend {
            print!("{}", b.render());
        }
        println!("Numerics: {} ({})", numerics.name(), numerics.describe());
        if let Some(n) = &numerics_note {
            println!("  {n}");
        }
        println!(
            "KV cache: {} ({:.3} bits per real value K, {:.3} V{})",
            model.kv.describe(model.cfg.n_layer),
            kv_bits_k,
            kv_bits_v,
            if model.kv.is_default() {
                String::new()
            } else {
                format!(
                    ", simulated as target '{}' builds it: turbo groups {}, {} turbo tables, stock types {}",
                    kv_spec.profile,
                    model.kv.groups.name(),
                    model.kv.turbo4.name(),
                    if model.kv.rotate { "rotated" } else { "not rotated" }
                )
            }
        );
    }
    Ok(())
}

/// What the CUDA numerics did to this model (None for ggml / f32).
fn numerics_note(numerics: Numerics, cuda_tensors: usize) -> Option<String> {
    numerics.cuda_path()?;
    Some(if cuda_tensors == 0 {
        "no tq4_1s/tq3_1s weight in this model: the CUDA model changed nothing (same as ggml)"
            .to_string()
    } else {
        format!(
            "{cuda_tensors} tq4_1s/tq3_1s weights through the CUDA model (modelled per token as \
             the fork's mat-vec kernels compute it; see docs/eval.md)"
        )
    })
}

/// The text report.
pub fn render(r: &EvalResult) -> String {
    let mut s = String::new();
    s += &format!(
        "windows {} x {} tokens, {} tokens scored, {:.1} s, {:.1} tokens/s\n",
        r.n_chunk, r.n_ctx, r.tokens_scored, r.seconds, r.tokens_per_second
    );
    s += &format!("PPL = {:.4} +/- {:.5}\n", r.ppl.value, r.ppl.err);
    if let Some(k) = &r.kld {
        s += &format!(
            "PPL(ref)               : {:.6} +/- {:.6}\n",
            k.ppl_base.value, k.ppl_base.err
        );
        s += &format!(
            "ln(PPL/PPL(ref))       : {:.6} +/- {:.6}\n",
            k.ln_ppl_ratio.value, k.ln_ppl_ratio.err
        );
        s += &format!(
            "Cor(ln PPL, ln PPL ref): {:.2}%\n",
            100.0 * k.ln_ppl_correlation
        );
        s += &format!(
            "Mean KLD               : {:.6} +/- {:.6}\n",
            k.kld.value, k.kld.err
        );
        s += &format!(
            "KLD median / 99% / 99.9% / max: {:.6} / {:.6} / {:.6} / {:.6}\n",
            k.kld_median, k.kld_p99, k.kld_p999, k.kld_max
        );
        s += &format!(
            "RMS dp                 : {:.3} +/- {:.3} %\n",
            100.0 * k.p_diff_rms.value,
            100.0 * k.p_diff_rms.err
        );
        s += &format!(
            "Same top-1             : {:.3} +/- {:.3} %\n",
            100.0 * k.same_top.value,
            100.0 * k.same_top.err
        );
    }
    s
}
