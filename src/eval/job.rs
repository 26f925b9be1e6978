//! `tq eval` as one call: the flags as plain values ([`EvalFlags`], with the simulated KV
//! cache's [`KvCacheFlags`]), checked once before any model is opened ([`EvalJob::resolve`]), run
//! in the caller's thread pool ([`run`]: the banner and the progress bar go to stderr), and the
//! reports the CLI prints ([`EvalReport::text`], [`EvalReport::json`]).
//!
//! `--backend` is read here for `tq validate` too ([`parse_backend`]).

use super::kv::kv_json;
use super::logits_file::Format;
use super::{evaluate_passes, pass_windows, session, EvalResult};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::gpu::BackendKind;
use crate::model::{KvSpec, Model, Numerics};
use crate::tokenizer::input::Input;
use std::path::PathBuf;

/// The flags of `tq eval` as plain values (the CLI fills this in; nothing is checked yet).
/// `--threads` is the caller's: [`run`] works in the pool it is called from.
#[derive(Clone, Debug, Default)]
pub struct EvalFlags {
    pub model: PathBuf,
    pub text: Option<PathBuf>,
    pub tokens: Option<PathBuf>,
    pub ctx: usize,
    pub chunks: Option<usize>,
    pub reference: Option<PathBuf>,
    pub ref_logits: Option<PathBuf>,
    pub save_logits: Option<PathBuf>,
    pub logits_format: String,
    pub json: bool,
    pub batch: Option<usize>,
    /// Windows per block-major pass (`--pass-windows`; `None`: as many as 1 GiB of hidden
    /// states holds).
    pub pass_windows: Option<usize>,
    pub numerics: String,
    pub backend: String,
    pub kv: KvCacheFlags,
    pub quiet: bool,
}

/// The simulated KV cache's flags as plain values; the resolved form is [`KvSpec`]. The
/// engine's behaviour comes from `--target` and each part can be overridden.
#[derive(Clone, Debug, Default)]
pub struct KvCacheFlags {
    pub cache_type_k: String,
    pub cache_type_v: String,
    pub kv_layers: Vec<String>,
    pub kv_target: Option<String>,
    pub kv_type_map: Option<PathBuf>,
    pub kv_auto_asym: Option<String>,
    pub kv_rotation: Option<String>,
    pub no_kv_rotation: bool,
    pub turbo_layer_adaptive: Option<u8>,
    pub turbo_groups: Option<String>,
    pub turbo_codebook: Option<String>,
}

fn on_off(flag: &str, v: &str) -> Result<bool> {
    match v {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        o => Err(Error::Usage(format!(
            "--{flag} {}: expected on or off",
            crate::error::one_line(o)
        ))),
    }
}

impl KvCacheFlags {
    /// The target profile named by --target / --type-map (default fork).
    pub(crate) fn profile(&self) -> Result<crate::types::profile::Profile> {
        crate::types::profile::Profile::select(
            self.kv_target.as_deref(),
            self.kv_type_map.as_deref(),
        )
    }

    /// The spec: the target's KV behaviour, then each flag that overrides a part of it.
    pub(crate) fn spec(&self) -> Result<KvSpec> {
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
            if !crate::model::kv::LAYER_ADAPTIVE_MODES.contains(&m) {
                return Err(Error::Usage(format!(
                    "--turbo-layer-adaptive {m}: the fork has modes 0, 1, 2, 5, 6 and 7"
                )));
            }
            s.layer_adaptive = Some(m);
        }
        if let Some(g) = &self.turbo_groups {
            s.groups = crate::model::kv::TurboGroups::parse(g)?;
        }
        if let Some(t) = &self.turbo_codebook {
            s.turbo4 = crate::model::Turbo4Table::parse(t)?;
        }
        Ok(s)
    }
}

/// `--backend`: `None` for the CPU runtime, else the GPU backend (or the CPU emulation of the
/// kernels) that runs the weights with mat-mul kernels.
pub(crate) fn parse_backend(s: &str) -> Result<Option<BackendKind>> {
    match s {
        "cpu" => Ok(None),
        "auto" => Ok(auto_backend()),
        "wgpu" => Ok(Some(BackendKind::Wgpu)),
        "cuda" => Ok(Some(BackendKind::Cuda)),
        "metal" => Ok(Some(BackendKind::Metal)),
        "cpu-emulation" => Ok(Some(BackendKind::Cpu)),
        o => Err(Error::Usage(format!(
            "--backend {}: expected cpu, auto, wgpu, cuda, metal or cpu-emulation",
            crate::error::one_line(o)
        ))),
    }
}

/// `--backend auto`: the first GPU backend that is built in and opens (CUDA, Metal, wgpu), else
/// the CPU runtime. The report's `backend` says which was used.
fn auto_backend() -> Option<BackendKind> {
    [BackendKind::Cuda, BackendKind::Metal, BackendKind::Wgpu]
        .into_iter()
        .find(|&k| crate::gpu::open_linear(k).is_ok())
}

/// `--text` or `--tokens`, if either was given.
fn input(a: &EvalFlags) -> Option<Input<'_>> {
    match (&a.tokens, &a.text) {
        (Some(p), _) => Some(Input::TokenFile(p)),
        (None, Some(p)) => Some(Input::Text(p)),
        (None, None) => None,
    }
}

/// A `tq eval` run, resolved from its flags: what needs no model is checked.
#[derive(Debug)]
pub struct EvalJob {
    pub flags: EvalFlags,
    numerics: Numerics,
    backend: Option<BackendKind>,
    format: Format,
    /// TQ weights through the int8 path ([`crate::model::Model::use_tq_int8`]).
    tq_int8: bool,
    /// q8_0 weights through the int8 path ([`crate::model::Model::use_q8_int8`]).
    q8_int8: bool,
}

/// The environment variable choosing how `tq eval` multiplies TQ4_1S / TQ3_1S weights under
/// ggml numerics: `int8` (integer dot products on the rotated, int8-quantized activation) or
/// `f32` (decoded weights, exact activations).
pub const TQ_DOT_ENV: &str = "TQ_TQ_DOT";

/// The default of [`TQ_DOT_ENV`]: int8 where its VNNI kernel runs (a build with the `avx512`
/// feature on a CPU with AVX-512 VNNI: faster than llama.cpp's Q4_0 on the same windows, KLD
/// within noise of the f32 path), else f32 (the AVX2 kernel is slower than the f32 GEMM);
/// docs/bench/eval.md.
fn tq_dot_from_env() -> Result<bool> {
    dot_from_env(TQ_DOT_ENV, crate::model::tqdot::int8_is_faster())
}

/// The environment variable choosing how `tq eval` multiplies q8_0 weights under ggml numerics:
/// `int8` (ggml's arithmetic: integer dot products of the weight's quants with the Q8_0-rounded
/// activation's) or `f32` (dequantized weights × the rounded activations in f32).
pub const Q8_DOT_ENV: &str = "TQ_Q8_DOT";

/// `int8` or `f32` from `var`, `default` when it is unset.
fn dot_from_env(var: &str, default: bool) -> Result<bool> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(default),
        Ok(v) if v == "int8" => Ok(true),
        Ok(v) if v == "f32" => Ok(false),
        Ok(v) => Err(Error::Usage(format!(
            "{var}={}: expected int8 or f32",
            crate::error::one_line(&v)
        ))),
        Err(_) => Err(Error::Usage(format!(
            "{var}: not valid Unicode; expected int8 or f32"
        ))),
    }
}

impl EvalJob {
    /// Parse `--numerics`, `--backend` (`auto` probes the GPU backends here) and
    /// `--logits-format`, and refuse a `--save-logits` that is one of the inputs.
    pub fn resolve(a: EvalFlags) -> Result<EvalJob> {
        let numerics = Numerics::parse(&a.numerics).ok_or_else(|| {
            Error::Usage(format!(
                "--numerics {}: expected ggml, f32, cuda (cuda-native) or cuda-q8_0",
                crate::error::one_line(&a.numerics)
            ))
        })?;
        let backend = parse_backend(&a.backend)?;
        if a.pass_windows == Some(0) || a.batch == Some(0) {
            return Err(Error::Usage(
                "--batch and --pass-windows count windows: give at least 1".into(),
            ));
        }
        let format = match a.logits_format.as_str() {
            "tq" => Format::Tq,
            "llama" => Format::Llama,
            o => {
                return Err(Error::Usage(format!(
                    "--logits-format {o}: expected tq or llama"
                )))
            }
        };
        crate::io::check_outputs(
            &[("--save-logits", a.save_logits.as_deref())],
            &[
                Some(&a.model),
                a.reference.as_deref(),
                a.ref_logits.as_deref(),
                a.text.as_deref(),
                a.tokens.as_deref(),
            ],
        )?;
        let tq_int8 = tq_dot_from_env()?;
        let q8_int8 = dot_from_env(Q8_DOT_ENV, crate::model::q8dot::int8_is_faster())?;
        Ok(EvalJob {
            flags: a,
            numerics,
            backend,
            format,
            tq_int8,
            q8_int8,
        })
    }
}

/// What one `tq eval` found, and what its reports print.
#[derive(Debug)]
pub struct EvalReport {
    result: EvalResult,
    model: PathBuf,
    reference: Option<PathBuf>,
    numerics: Numerics,
    cuda_tensors: usize,
    numerics_note: Option<String>,
    backend: Option<BackendKind>,
    /// The KV part of the JSON report ([`kv_json`]).
    kv: serde_json::Value,
    /// The text report's `KV cache:` line.
    kv_line: String,
    threads: usize,
    batch: usize,
    /// Windows per block-major pass.
    pass_windows: usize,
}

/// Run the job with `threads` workers (the size of the pool it is called from, for the report):
/// open the model (and the reference), cut the windows, evaluate with the banner and a progress
/// bar on stderr (unless `--quiet`; no banner with `--json`), and write `--save-logits`.
pub fn run(job: &EvalJob, threads: usize) -> Result<EvalReport> {
    let (a, numerics, backend, format) = (&job.flags, job.numerics, job.backend, job.format);
    let file = GgufFile::open(&a.model)?;
    let mut model = Model::new(&file, numerics)?;
    // With a GPU backend the CPU twin it is checked against stays the f32 reference.
    model.use_tq_int8(job.tq_int8 && backend.is_none());
    model.use_q8_int8(job.q8_int8 && backend.is_none());
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
        let mut m = Model::new(&ref_file, numerics)?;
        m.use_tq_int8(job.tq_int8 && backend.is_none());
        m.use_q8_int8(job.q8_int8 && backend.is_none());
        ref_model = Some(m);
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
    let twin = model
        .backend()
        .is_some_and(|b| b.placements.iter().any(|p| p.on_backend));
    let models = 1 + usize::from(ref_model.is_some()) + usize::from(twin);
    let pass = a
        .pass_windows
        .map_or_else(
            || pass_windows(&win, &model, batch, models),
            |p| p.div_ceil(batch) * batch,
        )
        .min(win.n_chunk.div_ceil(batch) * batch);
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
            "tq eval: {} ({}, {} blocks), {} windows x {} tokens, scoring {} per window, batch {} windows, {} per pass, {} threads, {} numerics, backend {}, KV {} ({:.3}/{:.3} bits per real value, target {})",
            a.model.display(),
            model.cfg.arch.name(),
            model.cfg.n_layer,
            win.n_chunk,
            win.n_ctx,
            win.scored_per_window(),
            batch,
            pass.min(win.n_chunk),
            threads,
            numerics.name(),
            backend.map_or("cpu", |b| b.name()),
            model.kv.describe(model.cfg.n_layer),
            kv_bits_k,
            kv_bits_v,
            kv_spec.profile
        );
    }
    // A bar on a terminal, else a line with the ETA every TQ_PROGRESS_SECS; one unit is one
    // block (or the output head) of one batch.
    let mut pb = crate::io::progress::steps(a.quiet, 1, "eval blocks");
    let prog = |d: u64, t: u64| {
        pb.set_length(t);
        pb.set_position(d);
    };
    let res = evaluate_passes(
        &model,
        &win,
        reference,
        writer.as_mut(),
        batch,
        Some(pass),
        &prog,
    )?;
    pb.finish_and_clear();
    if let Some(w) = writer {
        w.finish()?;
    }

    Ok(EvalReport {
        result: res,
        model: a.model.clone(),
        reference: a.reference.as_ref().or(a.ref_logits.as_ref()).cloned(),
        numerics,
        cuda_tensors: cuda_tensors.len(),
        numerics_note,
        backend,
        kv: kv_json(&model.kv, &model.cfg, &kv_spec.profile),
        kv_line: format!(
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
        ),
        threads,
        batch,
        pass_windows: pass.min(win.n_chunk),
    })
}

impl EvalReport {
    /// The `--json` report (one JSON document, no final newline).
    pub fn json(&self) -> Result<String> {
        let (numerics, backend) = (self.numerics, self.backend);
        let j = serde_json::json!({
            "model": self.model.display().to_string(),
            "reference": self.reference.as_ref().map(|p| p.display().to_string()),
            "numerics": numerics.name(),
            "numerics_path": {
                "name": numerics.name(),
                "description": numerics.describe(),
                "cuda_tensors": self.cuda_tensors,
                "note": self.numerics_note,
            },
            "backend": backend.map_or("cpu", |b| b.name()),
            "kv": self.kv,
            "threads": self.threads,
            "batch": self.batch,
            "pass_windows": self.pass_windows,
            "result": self.result,
        });
        serde_json::to_string_pretty(&j)
            .map_err(|e| Error::internal(format!("JSON encoding failed: {e}")))
    }

    /// The text report: PPL (and KLD), the backend comparison, the numerics and the KV cache.
    pub fn text(&self) -> String {
        let (res, numerics) = (&self.result, self.numerics);
        let mut s = render(res);
        if let Some(b) = &res.backend {
            s += &b.render();
        }
        s += &format!("Numerics: {} ({})\n", numerics.name(), numerics.describe());
        if let Some(n) = &self.numerics_note {
            s += &format!("  {n}\n");
        }
        s += &self.kv_line;
        s.push('\n');
        s
    }
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

/// The text report of an [`EvalResult`]: PPL, and the KLD statistics with a reference.
fn render(r: &EvalResult) -> String {
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
