//! `tq kv MODEL`: KV-cache presets. Without `--measure`, a recommendation from the model's shape;
//! with `--measure --text FILE`, every candidate simulated on the text and the one with the fewest
//! bits per value whose mean KLD (vs the f16 cache) is under `--max-kld` chosen.
use std::path::PathBuf;
use tq::error::Result;
use tq::eval::kv_job::{self, KvCmdFlags};

#[derive(clap::Args)]
pub struct KvCmdArgs {
    /// Model (GGUF).
    pub model: PathBuf,
    /// Evaluate the candidates on --text with the simulator and pick from measurements.
    #[arg(long)]
    pub measure: bool,
    /// Text for --measure.
    #[arg(long, short = 'f', conflicts_with = "tokens")]
    pub text: Option<PathBuf>,
    /// Pre-tokenized input for --measure instead of --text (whitespace-separated ids).
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Windows of --text to evaluate per candidate.
    #[arg(long, default_value_t = 8)]
    pub chunks: usize,
    /// Window length in tokens.
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx: usize,
    /// Largest mean KLD vs the f16 cache a preset may have to be chosen.
    #[arg(long, default_value_t = 0.01)]
    pub max_kld: f64,
    /// Also consider these presets only (names as listed; default: all that fit the model).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Write a copy of MODEL with the chosen preset under tq.kv.* (tensors copied byte for byte).
    #[arg(long, value_name = "OUT.gguf")]
    pub write: Option<PathBuf>,
    /// JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Worker threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// The engine the presets are for: fork (default), fork-69d8e4be4 or upstream. It decides
    /// which types exist, turbo padding and tables, rotation and the fork's turbo rules.
    #[arg(long)]
    pub target: Option<String>,
    /// JSON type map of another engine (its "kv" entry names the built-in profile whose KV
    /// behaviour it has).
    #[arg(long, conflicts_with = "target")]
    pub type_map: Option<PathBuf>,
}

pub fn run(a: KvCmdArgs) -> Result<()> {
    let threads = a.threads;
    let flags = KvCmdFlags {
        model: a.model,
        measure: a.measure,
        text: a.text,
        tokens: a.tokens,
        chunks: a.chunks,
        ctx: a.ctx,
        max_kld: a.max_kld,
        only: a.only,
        write: a.write,
        json: a.json,
        target: a.target,
        type_map: a.type_map,
    };
    kv_job::check(&flags)?;
    super::with_thread_pool(threads, |_| {
        let r = kv_job::run(&flags)?;
        print!("{}", kv_job::render(&flags, &r)?);
        Ok(())
    })
}
