//! `tq validate ARTIFACT.gguf|DIR --ref REF.gguf --text F`: the CI gate. The flags are resolved
//! once by the library (`tq::validate::job`), as are the checks, verdicts and reports
//! (`tq::validate`, docs/validate.md).
use std::path::PathBuf;
use tq::error::Result;
use tq::validate::job::{self, ValidateFlags, ValidateJob};

#[derive(clap::Args)]
pub struct ValidateArgs {
    /// The artifact to check (GGUF), or a directory: every *.gguf in it (with --policy).
    pub artifact: PathBuf,
    /// The model the artifact was made from (its blake3 must be the artifact's tq.input.blake3).
    #[arg(long = "ref", value_name = "REF.gguf")]
    pub reference: Option<PathBuf>,
    /// Saved reference distributions (tq eval --save-logits, llama-perplexity's base file).
    #[arg(long, conflicts_with = "reference")]
    pub ref_logits: Option<PathBuf>,
    /// Text to evaluate on (tokenized like llama-perplexity -f).
    #[arg(long, short = 'f', conflicts_with = "tokens")]
    pub text: Option<PathBuf>,
    /// Pre-tokenized input instead of --text.
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Window length in tokens (the second half of each window is scored).
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx: usize,
    /// Windows to evaluate: N, all, or auto (until every quality verdict is decided, at most
    /// --max-chunks).
    #[arg(long, default_value = "auto")]
    pub chunks: String,
    /// The most windows --chunks auto evaluates.
    #[arg(long, default_value_t = 20)]
    pub max_chunks: usize,
    /// Mean KLD limit (nats, as llama-perplexity's "Mean KLD").
    #[arg(long)]
    pub max_kld: Option<f64>,
    /// 99th-percentile KLD limit (nats, llama-perplexity's "99.0%" KLD).
    #[arg(long)]
    pub max_p99_kld: Option<f64>,
    /// PPL(artifact)/PPL(reference) limit (llama-perplexity's "Mean PPL(Q)/PPL(base)").
    #[arg(long)]
    pub max_ppl_ratio: Option<f64>,
    /// Same-top-1 limit in percent (llama-perplexity's "Same top p").
    #[arg(long)]
    pub min_top1: Option<f64>,
    /// Greedy-generation token agreement limit in percent.
    #[arg(long)]
    pub min_gen_agreement: Option<f64>,
    /// Thresholds per artifact-name pattern (JSON; docs/validate.md). Flags given here win.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// A previous --json report: fail checks that got worse than it by more than --max-regression.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Relative regression allowed against --baseline (default 0.10).
    #[arg(long)]
    pub max_regression: Option<f64>,
    /// Greedy-generation prompts (0: no generation check).
    #[arg(long, default_value_t = 3)]
    pub gen_prompts: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 24)]
    pub gen_tokens: usize,
    /// Tokens per prompt taken from the text.
    #[arg(long, default_value_t = 16)]
    pub prompt_tokens: usize,
    /// Prompts, one per line, instead of slices of the text.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// GPU backends whose kernels are checked on the artifact's TQ tensors: auto (every one built
    /// in; absent ones are reported as skipped), none, cpu (the harness's CPU emulation), wgpu,
    /// cuda, metal (comma-separated).
    #[arg(long, default_value = "auto")]
    pub kernels: String,
    /// Check every row of every TQ tensor with the kernels, not a sample of 8 rows per tensor.
    #[arg(long)]
    pub full: bool,
    /// Where the quality windows' linear weights run: cpu (default); auto (the first GPU backend
    /// built in and present: cuda, metal, wgpu; else cpu); or wgpu, cuda, metal: the
    /// weights whose type has a bundled mat-mul kernel through that GPU backend, so the PPL/KLD
    /// reported are what its kernels compute; the CPU run is made beside it and their KL
    /// divergence is the backend/kld_vs_cpu check (docs/validate.md). cpu-emulation: the
    /// kernels' arithmetic on the CPU (slow; no GPU needed).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Target engine profile for type ids: fork (default), fork-pre-2026-04-15, upstream.
    #[arg(long)]
    pub target: Option<String>,
    /// JSON type map for other forks (instead of --target).
    #[arg(long, conflicts_with = "target")]
    pub type_map: Option<PathBuf>,
    /// JSON report on stdout (schema in docs/validate.md).
    #[arg(long)]
    pub json: bool,
    /// Write a JUnit XML report (one testcase per check).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Windows run through the model together.
    #[arg(long)]
    pub batch: Option<usize>,
    /// No progress output.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

pub fn run(a: ValidateArgs) -> Result<i32> {
    let threads = a.threads;
    let job = ValidateJob::resolve(flags(a))?;
    let o = super::with_thread_pool(threads, |_| job::run(&job))?;
    print!("{}", o.render(job.flags.json)?);
    Ok(o.exit_code())
}

/// The flags as the library's plain values.
fn flags(a: ValidateArgs) -> ValidateFlags {
    ValidateFlags {
        artifact: a.artifact,
        reference: a.reference,
        ref_logits: a.ref_logits,
        text: a.text,
        tokens: a.tokens,
        ctx: a.ctx,
        chunks: a.chunks,
        max_chunks: a.max_chunks,
        max_kld: a.max_kld,
        max_p99_kld: a.max_p99_kld,
        max_ppl_ratio: a.max_ppl_ratio,
        min_top1: a.min_top1,
        min_gen_agreement: a.min_gen_agreement,
        policy: a.policy,
        baseline: a.baseline,
        max_regression: a.max_regression,
        gen_prompts: a.gen_prompts,
        gen_tokens: a.gen_tokens,
        prompt_tokens: a.prompt_tokens,
        prompts: a.prompts,
        kernels: a.kernels,
        full: a.full,
        backend: a.backend,
        target: a.target,
        type_map: a.type_map,
        json: a.json,
        junit: a.junit,
        batch: a.batch,
        quiet: a.quiet,
    }
}
