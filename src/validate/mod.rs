//! `tq validate`: the CI gate for a quantized GGUF (see `docs/validate.md`). One call runs the
//! checks — structure (header, types, engine constraints, finite decode, provenance), the bundled
//! GPU kernels on the artifact's own blocks, quality
//! against a reference (PPL ratio, mean / p99 KLD, same-top-1, with noise-aware verdicts),
//! greedy generation, and regression against a baseline report — and returns a [`Report`]
//! whose verdict maps to the exit code (0 pass, 3 fail, 4 undecided). Bad input (a file that does
//! not parse, a stale or foreign reference, a baseline made another way) is an `Error` (exit 2).
//! [`job`] is the command: its flags resolved once, every artifact of a directory validated, and
//! what it prints.

mod generation;
pub mod job;
mod kernels;
pub mod policy;
mod quality;
pub mod report;
mod structure;
mod verdict;

pub use verdict::{verdict, Bound, Limit, Status, Z};

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::tokenizer::input::Input;
use crate::types::profile::Profile;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Version of the JSON report's schema (`docs/validate.md`); a baseline of another version is
/// refused.
pub const REPORT_VERSION: u32 = 1;

/// An estimate and its standard error.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Num {
    pub value: f64,
    pub err: f64,
}

/// One check's outcome.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Check {
    /// structure, kernels, quality, generation or regression.
    pub group: String,
    pub name: String,
    pub status: Status,
    /// What was found, or why the check was skipped (one line).
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Num>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limit>,
}

impl Check {
    fn new(group: &str, name: &str, status: Status, detail: impl Into<String>) -> Check {
        Check {
            group: group.into(),
            name: name.into(),
            status,
            detail: detail.into(),
            value: None,
            limit: None,
        }
    }
}

/// Thresholds, each optional (a check without one reports its number and is skipped).
/// Units as llama-perplexity prints them: KLD in nats, top-1 in percent, PPL ratio PPL(Q)/PPL(ref).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    pub max_kld: Option<f64>,
    pub max_p99_kld: Option<f64>,
    pub max_ppl_ratio: Option<f64>,
    pub min_top1: Option<f64>,
    pub min_gen_agreement: Option<f64>,
    pub max_regression: Option<f64>,
}

impl Thresholds {
    /// `other`'s values where it has them, ours elsewhere.
    pub fn overlay(self, other: &Thresholds) -> Thresholds {
        Thresholds {
            max_kld: other.max_kld.or(self.max_kld),
            max_p99_kld: other.max_p99_kld.or(self.max_p99_kld),
            max_ppl_ratio: other.max_ppl_ratio.or(self.max_ppl_ratio),
            min_top1: other.min_top1.or(self.min_top1),
            min_gen_agreement: other.min_gen_agreement.or(self.min_gen_agreement),
            max_regression: other.max_regression.or(self.max_regression),
        }
    }

    /// Every threshold must be a finite number in its range.
    pub fn check(&self) -> Result<()> {
        let all = [
            ("max_kld", self.max_kld, 0.0, f64::MAX),
            ("max_p99_kld", self.max_p99_kld, 0.0, f64::MAX),
            ("max_ppl_ratio", self.max_ppl_ratio, 0.0, f64::MAX),
            ("min_top1", self.min_top1, 0.0, 100.0),
            ("min_gen_agreement", self.min_gen_agreement, 0.0, 100.0),
            ("max_regression", self.max_regression, 0.0, f64::MAX),
        ];
        for (name, v, lo, hi) in all {
            if let Some(v) = v.filter(|v| !(v.is_finite() && (lo..=hi).contains(v))) {
                return Err(Error::Usage(format!(
                    "threshold {name} (--{}) = {v} is out of range ({lo} to {}{})",
                    name.replace('_', "-"),
                    if hi == f64::MAX {
                        "any".to_string()
                    } else {
                        hi.to_string()
                    },
                    if name.starts_with("min_") {
                        ", percent"
                    } else {
                        ""
                    }
                )));
            }
        }
        Ok(())
    }

    fn quality_given(&self) -> bool {
        self.max_kld.is_some()
            || self.max_p99_kld.is_some()
            || self.max_ppl_ratio.is_some()
            || self.min_top1.is_some()
    }
}

/// What the artifact is compared with.
#[derive(Clone, Copy, Debug)]
pub enum RefSource<'a> {
    None,
    /// The model the artifact was made from (GGUF): run side by side.
    Model(&'a Path),
    /// Saved reference distributions (`tq eval --save-logits`, llama-perplexity's base file).
    Logits(&'a Path),
}

/// How many windows are evaluated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Chunks {
    /// Every window of the text.
    All,
    Fixed(usize),
    /// Until every quality verdict is decided, at most `max` windows.
    Auto {
        max: usize,
    },
}

/// Greedy-generation settings (prompts from the text unless a prompts file is given).
#[derive(Clone, Copy, Debug)]
pub struct GenSpec<'a> {
    pub prompts: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub prompts_file: Option<&'a Path>,
}

/// Everything one validation needs, resolved by the caller.
pub struct Options<'a> {
    pub artifact: &'a Path,
    pub profile: &'a Profile,
    pub reference: RefSource<'a>,
    pub input: Option<Input<'a>>,
    pub ctx: usize,
    pub chunks: Chunks,
    pub thresholds: Thresholds,
    pub generation: Option<GenSpec<'a>>,
    pub baseline: Option<&'a Report>,
    /// GPU backends whose kernels are held to the CPU reference on the artifact's tensors.
    pub kernels: &'a [crate::gpu::BackendKind],
    /// Every row of every kernel-type tensor instead of a sample.
    pub full: bool,
    /// Run the quality windows with the weights that have mat-mul kernels on this backend
    /// (`--backend`; `None`: the CPU runtime), the CPU run beside it for the `backend` check.
    pub backend: Option<crate::gpu::BackendKind>,
    pub batch: Option<usize>,
    pub progress: crate::eval::perplexity::Progress<'a>,
}

/// Identity of the reference (what a baseline must share).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RefId {
    /// gguf or logits.
    pub kind: String,
    pub name: String,
    pub blake3: String,
}

/// The quality numbers, each with its standard error (`ppl_ratio` and the KLD ones need a reference).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Quality {
    pub windows: usize,
    pub windows_available: usize,
    pub tokens_scored: usize,
    pub ppl: Num,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppl_ref: Option<Num>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppl_ratio: Option<Num>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kld: Option<Num>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kld_p99: Option<Num>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kld_max: Option<f64>,
    /// Same top-1 token as the reference, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top1: Option<Num>,
    pub seconds: f64,
}

/// One generation prompt's outcome.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PromptGen {
    pub prompt: usize,
    /// Percent of generated positions where artifact and reference chose the same token.
    pub agreement: f64,
    /// First generated position where they differ (None: identical).
    pub first_divergence: Option<usize>,
    /// Degenerate-output flags of the artifact's text (repetition loop, only special tokens).
    pub artifact_flags: Vec<String>,
    pub reference_flags: Vec<String>,
}

/// The whole report (the `--json` schema, `docs/validate.md`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub report_version: u32,
    pub tq_version: String,
    pub artifact: String,
    pub artifact_bytes: u64,
    pub reference: Option<RefId>,
    /// File name of the text/tokens and blake3 of the evaluated token windows.
    pub text: Option<String>,
    pub tokens_blake3: Option<String>,
    pub ctx: usize,
    /// all, fixed or auto.
    pub chunks: String,
    /// Half-width of the verdict interval in standard errors.
    pub z: f64,
    pub thresholds: Thresholds,
    pub quality: Option<Quality>,
    /// With `--backend`: the backend, what ran where, and the comparison with the CPU run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::eval::backend::BackendReport>,
    pub generation: Option<Vec<PromptGen>>,
    pub checks: Vec<Check>,
    pub verdict: Status,
    pub seconds: f64,
}

impl Report {
    /// 0 pass, 3 a check failed, 4 a check undecided (and none failed).
    pub fn exit_code(&self) -> i32 {
        self.verdict.exit_code()
    }
}

/// The overall verdict: fail if any check failed, undecided if any is, pass otherwise (skipped
/// checks do not count).
pub fn overall(checks: &[Check]) -> Status {
    if checks.iter().any(|c| c.status == Status::Fail) {
        Status::Fail
    } else if checks.iter().any(|c| c.status == Status::Undecided) {
        Status::Undecided
    } else {
        Status::Pass
    }
}

/// The worst of several verdicts (a directory of artifacts): fail, then undecided, then pass.
pub fn worst(v: impl IntoIterator<Item = Status>) -> Status {
    let v: Vec<Status> = v.into_iter().collect();
    if v.contains(&Status::Fail) {
        Status::Fail
    } else if v.contains(&Status::Undecided) {
        Status::Undecided
    } else {
        Status::Pass
    }
}

/// Validate one artifact.
pub fn validate(o: &Options) -> Result<Report> {
    let t0 = std::time::Instant::now();
    o.thresholds.check()?;
    if matches!(o.reference, RefSource::None)
        && (o.thresholds.quality_given() || o.thresholds.min_gen_agreement.is_some())
    {
        return Err(Error::Usage(
            "quality thresholds need a reference: give --ref REF.gguf or --ref-logits FILE".into(),
        ));
    }
    let file = GgufFile::open_with(o.artifact, o.profile)?;
    let mut checks = structure::checks(&file, o.artifact, o.profile)?;

    let ref_file = match o.reference {
        RefSource::Model(p) => Some(GgufFile::open(p)?),
        _ => None,
    };
    let reference = match o.reference {
        RefSource::None => None,
        RefSource::Model(p) | RefSource::Logits(p) => Some(RefId {
            kind: if ref_file.is_some() { "gguf" } else { "logits" }.into(),
            name: file_name(p),
            blake3: crate::io::hash_file(p)?,
        }),
    };
    checks.push(structure::reference_hash(
        &file,
        o.artifact,
        ref_file.as_ref(),
        reference.as_ref(),
    )?);
    if let Some(rf) = &ref_file {
        same_architecture(&file, rf)?;
    }

    let mut quality = None;
    let mut backend = None;
    let mut tokens_blake3 = None;
    // A file that fails structure is not run: its numbers would mean nothing (and a NaN weight
    // stops the runtime).
    let broken = overall(&checks) == Status::Fail;
    if broken {
        checks.push(Check::new(
            "quality",
            "quality",
            Status::Skipped,
            "structure failed: not evaluated",
        ));
    } else if o.input.is_some() || matches!(o.reference, RefSource::Logits(_)) {
        let q = quality::run(o, &file, ref_file.as_ref())?;
        tokens_blake3 = Some(q.tokens_blake3.clone());
        checks.extend(q.checks);
        quality = Some(q.quality);
        backend = q.backend;
    } else {
        checks.push(Check::new(
            "quality",
            "quality",
            Status::Skipped,
            "no --text/--tokens given: nothing to evaluate",
        ));
    }

    if let Some(b) = o.backend.filter(|_| quality.is_none()) {
        checks.push(Check::new(
            "backend",
            "kld_vs_cpu",
            Status::Skipped,
            format!(
                "--backend {}: the quality windows were not evaluated",
                b.name()
            ),
        ));
    }
    if !broken {
        checks.extend(kernels::checks(&file, o.kernels, o.full)?);
    }

    let mut generation = None;
    match (&o.generation, &ref_file, o.input) {
        (Some(_), _, _) if broken => {}
        (Some(g), Some(rf), input) if input.is_some() || g.prompts_file.is_some() => {
            let (gens, c) = generation::run(&file, rf, input, g, &o.thresholds)?;
            generation = Some(gens);
            checks.extend(c);
        }
        (Some(_), _, _) => checks.push(Check::new(
            "generation",
            "agreement",
            Status::Skipped,
            "greedy generation needs --ref REF.gguf and --text/--tokens or --prompts FILE",
        )),
        (None, _, _) => {}
    }

    let mut report = Report {
        report_version: REPORT_VERSION,
        tq_version: env!("CARGO_PKG_VERSION").into(),
        artifact: o.artifact.display().to_string(),
        artifact_bytes: file.file_len(),
        reference,
        text: o.input.map(|i| file_name(i.path())),
        tokens_blake3,
        ctx: o.ctx,
        chunks: match o.chunks {
            Chunks::All => "all",
            Chunks::Fixed(_) => "fixed",
            Chunks::Auto { .. } => "auto",
        }
        .into(),
        z: Z,
        thresholds: o.thresholds,
        quality,
        backend,
        generation,
        checks,
        verdict: Status::Pass,
        seconds: 0.0,
    };
    if let Some(b) = o.baseline {
        let r = policy::regression(&report, b, o.thresholds.max_regression)?;
        report.checks.extend(r);
    }
    report.verdict = overall(&report.checks);
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// A reference of another architecture (or shape) is a usage error, not a quality failure.
fn same_architecture(a: &GgufFile, r: &GgufFile) -> Result<()> {
    let (aa, ra) = (a.architecture(), r.architecture());
    if aa != ra {
        return Err(Error::Usage(format!(
            "{}: the reference is a {} model, the artifact {} is {}: give the model the artifact was made from",
            r.path.display(),
            ra.unwrap_or("(no architecture)"),
            a.path.display(),
            aa.unwrap_or("(no architecture)")
        )));
    }
    let keys = ["block_count", "embedding_length", "vocab_size"];
    for k in keys {
        let key = format!("{}.{k}", aa.unwrap_or(""));
        if a.get_u64(&key) != r.get_u64(&key) {
            return Err(Error::Usage(format!(
                "{}: the reference's {key} is {:?}, the artifact's {:?}: give the model the artifact was made from",
                r.path.display(),
                r.get_u64(&key),
                a.get_u64(&key)
            )));
        }
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}
