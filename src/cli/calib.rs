//! `tq calib MODEL --text FILE [--tokens N --ctx C] -o H.safetensors [--resume]
//! [--sequential --weights T --recipe R --ldlq-band K --damp D]`
use crate::calib::run::{self, Options};
use crate::calib::sequential::SeqQuant;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::plan::{self, recipe, Request};
use crate::source::SourceTensor;
use crate::types::profile::Profile;
use std::collections::BTreeMap;
use std::path::PathBuf;

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
    /// Calibration tokens to use (rounded down to whole windows).
    #[arg(long, default_value_t = 8192)]
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
    let tensors: Vec<SourceTensor> = f
        .tensors
        .iter()
        .map(|t| SourceTensor {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .collect();
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
    let (tokens, bos) = input_tokens(a, &f)?;
    let n_win = (a.tokens.min(tokens.len())) / a.ctx;
    if n_win == 0 {
        return Err(Error::Usage(format!(
            "tq calib: the input has {} tokens, fewer than one window of --ctx {}",
            tokens.len(),
            a.ctx
        )));
    }
    let windows = run::make_windows(&tokens, n_win, a.ctx, bos);
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
            extra_meta: BTreeMap::new(),
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
