//! `tq validate` as one call: the flags as plain values ([`ValidateFlags`]), resolved once
//! ([`ValidateJob::resolve`]: `--chunks`, `--kernels`, `--backend`, the target, thresholds,
//! policy, baseline and the artifact list), run over every artifact in the caller's thread pool
//! ([`run`], which writes `--junit`), and the report the CLI prints with the exit code
//! ([`Outcome::render`], [`Outcome::exit_code`]).

use super::policy::Policy;
use super::{self as v, Chunks, GenSpec, RefSource, Report, Status, Thresholds};
use crate::error::{Error, Result};
use crate::eval::job::parse_backend;
use crate::gpu::BackendKind;
use crate::tokenizer::input::Input;
use crate::types::profile::Profile;
use std::path::{Path, PathBuf};

/// The flags of `tq validate` as plain values (the CLI fills this in; nothing is checked yet).
/// `--threads` is the caller's: [`run`] works in the pool it is called from.
#[derive(Clone, Debug, Default)]
pub struct ValidateFlags {
    pub artifact: PathBuf,
    pub reference: Option<PathBuf>,
    pub ref_logits: Option<PathBuf>,
    pub text: Option<PathBuf>,
    pub tokens: Option<PathBuf>,
    pub ctx: usize,
    pub chunks: String,
    pub max_chunks: usize,
    pub max_kld: Option<f64>,
    pub max_p99_kld: Option<f64>,
    pub max_ppl_ratio: Option<f64>,
    pub min_top1: Option<f64>,
    pub min_gen_agreement: Option<f64>,
    pub policy: Option<PathBuf>,
    pub baseline: Option<PathBuf>,
    pub max_regression: Option<f64>,
    pub gen_prompts: usize,
    pub gen_tokens: usize,
    pub prompt_tokens: usize,
    pub prompts: Option<PathBuf>,
    pub kernels: String,
    pub full: bool,
    pub backend: String,
    pub target: Option<String>,
    pub type_map: Option<PathBuf>,
    pub json: bool,
    pub junit: Option<PathBuf>,
    pub batch: Option<usize>,
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
                    crate::error::one_line(o)
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
                crate::error::one_line(n)
            ))),
        },
    }
}

/// The artifacts: the file, or every *.gguf of the directory in name order (the reference excluded).
fn artifacts(a: &ValidateFlags) -> Result<Vec<PathBuf>> {
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

/// A `tq validate` run, resolved from its flags: everything that needs no model is checked and
/// read (the policy, the baseline), and the artifacts are listed.
#[derive(Debug)]
pub struct ValidateJob {
    pub flags: ValidateFlags,
    chunks: Chunks,
    kernels: Vec<BackendKind>,
    profile: Profile,
    /// The thresholds given as flags (a policy's rule is overlaid with them per artifact).
    thresholds: Thresholds,
    policy: Option<Policy>,
    baseline: Option<Report>,
    list: Vec<PathBuf>,
}

impl ValidateJob {
    pub fn resolve(a: ValidateFlags) -> Result<ValidateJob> {
        let chunks = parse_chunks(&a.chunks, a.max_chunks)?;
        let kernels = parse_kernels(&a.kernels)?;
        // Checked here, once; each artifact's validation reads the flag again (`validate_one`).
        parse_backend(&a.backend)?;
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
        crate::io::check_outputs(
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
        Ok(ValidateJob {
            flags: a,
            chunks,
            kernels,
            profile,
            thresholds: flags,
            policy,
            baseline,
            list,
        })
    }
}

/// The reports of every artifact, and the worst verdict.
#[derive(Debug)]
pub struct Outcome {
    reports: Vec<Report>,
    verdict: Status,
}

/// Validate every artifact of the job (each with its policy rule's thresholds, the flags
/// winning), then write `--junit`.
pub fn run(job: &ValidateJob) -> Result<Outcome> {
    let (a, policy, flags) = (&job.flags, &job.policy, job.thresholds);
    let mut reports = vec![];
    for art in &job.list {
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
                        crate::error::one_line(&name)
                    ))
                })?;
                rule.thresholds.overlay(&flags)
            }
        };
        reports.push(validate_one(
            a,
            art,
            &job.profile,
            job.chunks,
            &job.kernels,
            thresholds,
            job.baseline.as_ref(),
        )?);
    }
    if let Some(j) = &a.junit {
        crate::io::write_file(j, v::report::junit(&reports).as_bytes())?;
    }
    let verdict = v::worst(reports.iter().map(|r| r.verdict));
    Ok(Outcome { reports, verdict })
}

impl Outcome {
    /// What `tq validate` prints on stdout: the JSON report (one artifact's, or every artifact's
    /// under the worst verdict), or each artifact's text report (and a summary line for several).
    pub fn render(&self, json: bool) -> Result<String> {
        let (reports, verdict) = (&self.reports, self.verdict);
        let mut s = String::new();
        if json {
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
            .map_err(|e| Error::internal(format!("JSON encoding failed: {e}")))?;
            s += &format!("{j}\n");
        } else {
            for r in reports {
                s += &v::report::render(r);
            }
            if reports.len() > 1 {
                s += &format!(
                    "{} artifacts: {} (exit {})\n",
                    reports.len(),
                    verdict.name(),
                    verdict.exit_code()
                );
            }
        }
        Ok(s)
    }

    /// The process's exit code: the worst verdict's (0 when every check was skipped).
    pub fn exit_code(&self) -> i32 {
        match self.verdict {
            Status::Skipped => 0,
            s => s.exit_code(),
        }
    }
}

fn validate_one(
    a: &ValidateFlags,
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
    let mut pb = crate::io::progress::steps(a.quiet || a.json, 1, "validate blocks");
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
        backend: parse_backend(&a.backend)?,
        batch: a.batch,
        progress: &prog,
    };
    let r = v::validate(&o);
    pb.finish_and_clear();
    r
}
