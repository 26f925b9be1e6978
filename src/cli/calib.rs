//! `tq calib MODEL --text FILE [--tokens N --ctx C] -o H.safetensors [--resume]
//! [--sequential --weights T --recipe R --ldlq-band K --damp D]`
use std::collections::BTreeMap;
use std::path::PathBuf;
use tq::calib::run::{self, Options};
use tq::calib::sequential::SeqQuant;
use tq::error::{Error, Result};
use tq::gguf::GgufFile;
use tq::plan::{self, recipe, Request};
use tq::source::SourceTensor;
use tq::types::profile::Profile;

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
    /// Windows per forward pass and per checkpoint (with --sequential: per XᵀX chunk only).
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Output Hessian file (safetensors, F64).
    #[arg(short, long)]
    pub output: PathBuf,
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
    /// With --sequential: write a checkpoint after a block only when this many seconds passed
    /// since the last one (0: after every block; each checkpoint rewrites the whole file).
    #[arg(long, requires = "sequential", default_value_t = 60.0)]
    pub checkpoint_secs: f64,
}

pub fn run(a: CalibArgs) -> Result<()> {
    if a.ctx < 2 || a.batch == 0 {
        return Err(Error::Usage(
            "tq calib: --ctx must be >= 2 and --batch >= 1".into(),
        ));
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Usage(e.to_string()))?;
    pool.install(|| calibrate(&a))
}

/// The convert plan for `f` under `--weights`/`--recipe` (default target profile), reduced to
/// what sequential calibration simulates.
pub fn seq_quant(f: &GgufFile, a: &CalibArgs) -> Result<SeqQuant> {
    let weights = plan::parse_type(&a.weights)?;
    let r = recipe::recipe(&a.recipe).ok_or_else(|| {
        Error::Usage(format!(
            "unknown recipe '{}'; recipes: {}",
            a.recipe,
            recipe::names().join(", ")
        ))
    })?;
    let req = Request {
        weights,
        recipe: r,
        overrides: vec![],
        output_type: None,
        token_embd_type: None,
        keep_types: false,
        strict: false,
    };
    let tensors: Vec<SourceTensor> = f.tensors.iter().map(SourceTensor::of_gguf).collect();
    let p = plan::plan(&tensors, &req, &Profile::default())?;
    Ok(SeqQuant::from_plan(
        &p,
        weights.name(),
        r.name,
        a.ldlq_band,
        a.damp,
    ))
}

fn calibrate(a: &CalibArgs) -> Result<()> {
    let f = GgufFile::open(&a.model)?;
    let mut extra_meta = BTreeMap::new();
    let windows = if let Some(n) = a.self_generate {
        let windows = self_generate(a, &f, n)?;
        extra_meta.insert(
            "tq.source".to_string(),
            format!(
                "self-generate {n} windows, seed {}, top-k {}",
                a.seed, a.top_k
            ),
        );
        windows
    } else {
        let (tokens, bos) = input_tokens(a, &f)?;
        let n_win = (a.tokens.min(tokens.len())) / a.ctx;
        if n_win == 0 {
            return Err(Error::Usage(format!(
                "tq calib: the input has {} tokens, fewer than one window of --ctx {}",
                tokens.len(),
                a.ctx
            )));
        }
        let src = a.text.as_ref().or(a.token_file.as_ref()).expect("checked");
        extra_meta.insert(
            "tq.source".to_string(),
            src.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        run::make_windows(&tokens, n_win, a.ctx, bos)
    };
    let seq = if a.sequential {
        Some(seq_quant(&f, a)?)
    } else {
        None
    };
    let (hs, _) = run::calibrate(
        &a.model,
        &f,
        &windows,
        &Options {
            ctx: a.ctx,
            batch: a.batch,
            output: Some(&a.output),
            resume: a.resume,
            sequential: seq.as_ref(),
            checkpoint_secs: a.checkpoint_secs,
            extra_meta,
            quiet: false,
        },
    )?;
    eprintln!(
        "tq calib: wrote {} Hessians to {}",
        hs.groups.len(),
        a.output.display()
    );
    Ok(())
}

/// `--self-generate N`: sample the windows from the model (see `calib::selfgen`).
fn self_generate(a: &CalibArgs, f: &GgufFile, n: usize) -> Result<Vec<u32>> {
    use tq::calib::selfgen::{generate, GenOptions};
    use tq::model::runtime::{Model, Numerics};
    let bos = f.get_u64("tokenizer.ggml.bos_token_id").ok_or_else(|| {
        Error::bad_input(
            &a.model,
            "no tokenizer.ggml.bos_token_id: --self-generate starts every window from BOS",
        )
    })?;
    if n == 0 || a.top_k == 0 {
        return Err(Error::Usage(
            "tq calib: --self-generate N and --top-k must be >= 1".into(),
        ));
    }
    let model = Model::new(f, Numerics::F32)?;
    let (toks, st) = generate(
        &model,
        &GenOptions {
            windows: n,
            ctx: a.ctx,
            bos: u32::try_from(bos).unwrap_or(u32::MAX),
            seed: a.seed,
            top_k: a.top_k,
            cache_bytes: a.gen_cache_mib.saturating_mul(1 << 20),
            quiet: false,
        },
    )?;
    eprintln!(
        "tq calib: self-generated {n} windows x {} tokens ({} sampled) in {:.1} s: {:.1} tokens/s ({} of {} blocks{} kept dequantized)",
        a.ctx,
        st.sampled,
        st.secs,
        st.sampled as f64 / st.secs.max(1e-9),
        st.cached_blocks,
        model.cfg.n_layer,
        if st.output_cached { " and the output" } else { "" }
    );
    if let Some(p) = &a.save_tokens {
        let text: Vec<String> = toks
            .chunks(a.ctx)
            .map(|w| {
                w.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        std::fs::write(p, text.join("\n") + "\n").map_err(|e| Error::io(p, e))?;
    }
    Ok(toks)
}

fn input_tokens(a: &CalibArgs, f: &GgufFile) -> Result<(Vec<u32>, Option<u32>)> {
    let bos_id = f.get_u64("tokenizer.ggml.bos_token_id").map(|v| v as u32);
    if let Some(p) = &a.token_file {
        let t = super::eval::read_token_file(p)?;
        let bos = if super::eval::add_bos_from_metadata(f) {
            bos_id
        } else {
            None
        };
        return Ok((t, bos));
    }
    let p = a
        .text
        .as_ref()
        .ok_or_else(|| Error::Usage("tq calib: give --text FILE (or --token-file FILE)".into()))?;
    run::text_tokens(f, p)
}
