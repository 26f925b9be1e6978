//! `tq validate ARTIFACT.gguf|DIR --ref REF.gguf --text F`: the CI gate. Flags are resolved here
//! once; the checks, verdicts and reports are the library's (`tq::validate`, docs/validate.md).
use std::path::{Path, PathBuf};
use tq::error::{Error, Result};
use tq::gpu::BackendKind;
use tq::tokenizer::input::Input;
use tq::types::profile::Profile;
use tq::validate::policy::Policy;
use tq::validate::{self as v, Chunks, GenSpec, RefSource, Report, Status, Thresholds};

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

fn parse_kernels(s: &str) -> Result<Vec<BackendKind>> {
    let mut v = vec![];
    for k in s.split(',') {
        match k.trim() {
            "auto" => v.extend([BackendKind::Cuda, BackendKind::Metal, BackendKind::Wgpu]),
            "none" => {}
            "cpu" => v.push(BackendKind::Cpu),
            "wgpu" => v.push(BackendKind::Wgpu),
            "cuda" => v.push(BackendKind::Cuda),
            "metal" => v.push(BackendKind::Metal),
            o => {
                return Err(Error::Usage(format!(
                    "--kernels {}: expected auto, none, cpu, wgpu, cuda or metal",
                    tq::error::one_line(o)
                )))
            }
        }
    }
    v.dedup();
    Ok(v)
}

fn parse_chunks(s: &str, max: usize) -> Result<Chunks> {
    match s {
        "auto" if max > 0 => Ok(Chunks::Auto { max }),
        "auto" => Err(Error::Usage("--max-chunks must be at least 1".into())),
        "all" => Ok(Chunks::All),
        n => match n.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Chunks::Fixed(n)),
            _ => Err(Error::Usage(format!(
                "--chunks {}: expected a number of windows (1 or more), all or auto",
                tq::error::one_line(n)
            ))),
        },
    }
}

/// The artifacts: the file, or every *.gguf of the directory in name order (the reference excluded).
fn artifacts(a: &ValidateArgs) -> Result<Vec<PathBuf>> {
    if !a.artifact.is_dir() {
        return Ok(vec![a.artifact.clone()]);
    }
    let rd = std::fs::read_dir(&a.artifact).map_err(|e| Error::io(&a.artifact, e))?;
    let same = |p: &Path, q: &Option<PathBuf>| {
        q.as_ref().is_some_and(|q| {
            std::fs::canonicalize(p).ok().is_some()
                && std::fs::canonicalize(p).ok() == std::fs::canonicalize(q).ok()
        })
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "gguf"))
        .filter(|p| !same(p, &a.reference))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no *.gguf artifacts in this directory",
            a.artifact.display()
        )));
    }
    Ok(v)
}

pub fn run(a: ValidateArgs) -> Result<i32> {
    let chunks = parse_chunks(&a.chunks, a.max_chunks)?;
    let kernels = parse_kernels(&a.kernels)?;
    // Checked here, once; each artifact's validation reads the flag again (`validate_one`).
    super::eval::parse_backend(&a.backend)?;
    let profile = Profile::select(a.target.as_deref(), a.type_map.as_deref())?;
    let flags = Thresholds {
        max_kld: a.max_kld,
        max_p99_kld: a.max_p99_kld,
        max_ppl_ratio: a.max_ppl_ratio,
        min_top1: a.min_top1,
        min_gen_agreement: a.min_gen_agreement,
        max_regression: a.max_regression,
    };
    flags.check()?;
    let policy = a.policy.as_deref().map(Policy::load).transpose()?;
    let baseline: Option<Report> = match &a.baseline {
        None => None,
        Some(p) => {
            let t = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
            Some(serde_json::from_str(&t).map_err(|e| {
                Error::bad_input(
                    p,
                    format!(
                        "not a tq validate --json report ({e}); make one with tq validate --json"
                    ),
                )
            })?)
        }
    };
    let list = artifacts(&a)?;
    if list.len() > 1 && baseline.is_some() {
        return Err(Error::Usage(
            "--baseline compares one artifact; give a file, not a directory".into(),
        ));
    }
    tq::io::check_outputs(
        &[("--junit", a.junit.as_deref())],
        &[
            Some(&a.artifact),
            a.reference.as_deref(),
            a.ref_logits.as_deref(),
            a.text.as_deref(),
            a.tokens.as_deref(),
            a.policy.as_deref(),
            a.baseline.as_deref(),
        ],
    )?;
    let reports = super::with_thread_pool(a.threads, |_| {
        let mut reports = vec![];
        for art in &list {
            let name = art
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let thresholds = match &policy {
                None => flags,
                Some(p) => {
                    let rule = p.rule_for(&name).ok_or_else(|| {
                        Error::Usage(format!(
                            "{}: no rule of the policy matches '{}'; add a rule (\"match\": \"*\" matches all)",
                            a.policy.as_ref().map_or(String::new(), |p| p.display().to_string()),
                            tq::error::one_line(&name)
                        ))
                    })?;
                    rule.thresholds.overlay(&flags)
                }
            };
            reports.push(validate_one(
                &a,
                art,
                &profile,
                chunks,
                &kernels,
                thresholds,
                baseline.as_ref(),
            )?);
        }
        Ok(reports)
    })?;
    if let Some(j) = &a.junit {
        tq::io::write_file(j, v::report::junit(&reports).as_bytes())?;
    }
    let verdict = v::worst(reports.iter().map(|r| r.verdict));
    if a.json {
        let j = if reports.len() == 1 {
            serde_json::to_value(&reports[0])
        } else {
            serde_json::to_value(serde_json::json!({
                "report_version": v::REPORT_VERSION,
                "verdict": verdict,
                "reports": reports,
            }))
        }
        .and_then(|j| serde_json::to_string_pretty(&j))
        .map_err(|e| Error::internal(format!("JSON encoding of the report failed: {e}")))?;
        println!("{j}");
    } else {
        for r in &reports {
            print!("{}", v::report::render(r));
        }
        if reports.len() > 1 {
            println!(
                "{} artifacts: {} (exit {})",
                reports.len(),
                verdict.name(),
                verdict.exit_code()
            );
        }
    }
    Ok(match verdict {
        Status::Skipped => 0,
        s => s.exit_code(),
    })
}

fn validate_one(
    a: &ValidateArgs,
    art: &Path,
    profile: &Profile,
    chunks: Chunks,
    kernels: &[BackendKind],
    thresholds: Thresholds,
    baseline: Option<&Report>,
) -> Result<Report> {
    if !a.quiet && !a.json {
        eprintln!("tq validate: checking {}", art.display());
    }
    let pb = if a.quiet || a.json {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new(1);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {percent}%",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    };
    let prog = |d: u64, t: u64| {
        pb.set_length(t);
        pb.set_position(d);
    };
    let input = match (&a.tokens, &a.text) {
        (Some(p), _) => Some(Input::TokenFile(p)),
        (None, Some(p)) => Some(Input::Text(p)),
        (None, None) => None,
    };
    let reference = match (&a.reference, &a.ref_logits) {
        (Some(p), _) => RefSource::Model(p),
        (None, Some(p)) => RefSource::Logits(p),
        (None, None) => RefSource::None,
    };
    let o = v::Options {
        artifact: art,
        profile,
        reference,
        input,
        ctx: a.ctx,
        chunks,
        thresholds,
        generation: (a.gen_prompts > 0).then_some(GenSpec {
            prompts: a.gen_prompts,
            prompt_tokens: a.prompt_tokens,
            new_tokens: a.gen_tokens,
            prompts_file: a.prompts.as_deref(),
        }),
        baseline,
        kernels,
        full: a.full,
        backend: super::eval::parse_backend(&a.backend)?,
        batch: a.batch,
        progress: &prog,
    };
    let r = v::validate(&o);
    pb.finish_and_clear();
    r
}
