//! `tq calib MODEL --text FILE [--tokens N --ctx C] -o H.safetensors [--resume]`
use crate::calib::Hessians;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::runtime::{Model, Numerics};
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
    /// Windows per forward pass (and per checkpoint).
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
    let fingerprint = format!(
        "{}:{}:{}:{}",
        a.model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        f.file_len(),
        blake3::hash(
            &tokens[..n_win * a.ctx]
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect::<Vec<u8>>()
        )
        .to_hex(),
        a.ctx
    );
    let (mut hs, mut done) = (Hessians::default(), 0usize);
    if a.resume && a.output.exists() {
        let (h, meta) = Hessians::load(&a.output)?;
        if meta.get("tq.fingerprint") != Some(&fingerprint)
            || meta.get("tq.batch") != Some(&a.batch.to_string())
        {
            return Err(Error::Usage(format!(
                "{}: checkpoint is for another model, text, --ctx or --batch; remove it or drop --resume",
                a.output.display()
            )));
        }
        done = meta
            .get("tq.windows_done")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        hs = h;
        eprintln!("tq calib: resuming after {done} of {n_win} windows");
    }
    let model = Model::new(&f, Numerics::F32)?;
    let abort_after: Option<usize> = std::env::var("TQ_CALIB_ABORT_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let t0 = std::time::Instant::now();
    let mut batches = 0usize;
    while done < n_win {
        let end = (done + a.batch).min(n_win);
        let mut toks = tokens[done * a.ctx..end * a.ctx].to_vec();
        if let Some(b) = bos {
            for w in toks.chunks_mut(a.ctx) {
                w[0] = b;
            }
        }
        hs.seq = a.ctx;
        hs.window0 = done;
        model.forward(&toks, a.ctx, a.ctx - 1, Some(&mut hs))?;
        if let Some(e) = hs.non_finite.take() {
            return Err(Error::Unsupported(format!("{}: {e}", a.model.display())));
        }
        done = end;
        let meta = BTreeMap::from([
            ("tq.fingerprint".to_string(), fingerprint.clone()),
            ("tq.batch".to_string(), a.batch.to_string()),
            ("tq.ctx".to_string(), a.ctx.to_string()),
            ("tq.windows_done".to_string(), done.to_string()),
            ("tq.windows_total".to_string(), n_win.to_string()),
            ("tq.complete".to_string(), (done == n_win).to_string()),
            (
                "tq.model".to_string(),
                a.model
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
        ]);
        hs.save(&a.output, &meta)?;
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "tq calib: {done}/{n_win} windows ({} tokens) in {secs:.1} s",
            done * a.ctx
        );
        batches += 1;
        if abort_after == Some(batches) && done < n_win {
            return Err(Error::Usage(
                "tq calib: stopped by TQ_CALIB_ABORT_AFTER (test hook); rerun with --resume".into(),
            ));
        }
    }
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
    let bytes = std::fs::read(p).map_err(|e| Error::io(p, e))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| Error::bad_input(p, format!("not UTF-8 text ({e})")))?;
    let tok = crate::tokenizer::Tokenizer::from_gguf(f)?;
    let bos = tok.bos();
    let add_bos = bos.is_some() && tok.encode("", true).first() == bos.as_ref();
    Ok((tok.encode(&text, true), if add_bos { bos } else { None }))
}
