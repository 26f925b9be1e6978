//! `tq kv`: choosing a KV-cache preset. Without measuring, [`super::kv_presets::recommend`]
//! decides from the model's shape; [`measure`] simulates every candidate on text against the f16
//! cache and chooses the fewest bits per value whose mean KLD is within a bound.
//! [`write_with_preset`] records the choice in a copy of the model, and the JSON helpers give the
//! report's shape for `tq kv --json` and `tq eval --json`.

use std::path::Path;

use super::kv_presets::{candidates, rule_text, Preset};
use super::logits_file::{self, Format};
use super::{evaluate, Reference};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, GgufWriter, TensorSpec, Value};
use crate::model::kv::Profile;
use crate::model::{Config, KvCache, Model};
use crate::tokenizer::input::Input;

/// The KV part of a JSON report: the types per layer, the engine behaviour simulated (target
/// profile, rotation, turbo tables and group layout) and bits per real value (padding counted).
pub fn kv_json(kv: &KvCache, cfg: &Config, profile: &str) -> serde_json::Value {
    let (bk, bv) = kv.bits(cfg.n_layer, cfg.head_dim);
    serde_json::json!({
        "target": profile,
        "types": kv.describe(cfg.n_layer),
        "rotation": kv.rotate,
        "turbo_codebook": kv.turbo4.name(),
        "turbo_groups": kv.groups.name(),
        "bits_per_value_k": bk,
        "bits_per_value_v": bv,
        "bits_per_value": (bk + bv) / 2.0,
    })
}

/// One preset in a JSON report.
pub fn preset_json(p: &Preset, cfg: &Config) -> serde_json::Value {
    serde_json::json!({
        "name": p.name,
        "target": p.spec.profile,
        "ctk": p.spec.k.name(),
        "ctv": p.spec.v.name(),
        "kv_layers": p.spec.rules.iter().map(rule_text).collect::<Vec<_>>(),
        "rotation": p.spec.rotate,
        "bits_per_value": p.bits(cfg),
        "llama_flags": p.llama_flags(),
        "env": p.env(),
        "tq_eval_flags": p.tq_flags(),
        "note": p.note,
    })
}

/// The candidates for `cfg`, restricted to `only` (plus the f16 reference) when it is not empty;
/// a name that is not a candidate is a usage error listing those that are.
pub fn select_candidates(cfg: &Config, profile: &Profile, only: &[String]) -> Result<Vec<Preset>> {
    let mut cands = candidates(cfg, profile);
    if only.is_empty() {
        return Ok(cands);
    }
    if let Some(n) = only.iter().find(|n| !cands.iter().any(|p| &p.name == *n)) {
        return Err(Error::Usage(format!(
            "--only {}: no such preset for this model (have: {})",
            crate::error::one_line(n),
            cands
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    cands.retain(|p| p.name == "f16" || only.contains(&p.name));
    Ok(cands)
}

/// One measured candidate.
#[derive(serde::Serialize, Clone, Debug)]
pub struct Measured {
    pub name: String,
    pub bits: f64,
    pub ppl: f64,
    pub ppl_err: f64,
    pub kld: f64,
    pub kld_err: f64,
    pub same_top1: f64,
}

/// What to measure the candidates on.
pub struct MeasureOptions<'a> {
    pub input: Input<'a>,
    /// Windows of the input per candidate, and their length in tokens.
    pub chunks: usize,
    pub ctx: usize,
    /// Largest mean KLD vs the f16 cache a preset may have to be chosen.
    pub max_kld: f64,
    /// No progress lines on stderr.
    pub quiet: bool,
}

/// The measured choice: the preset, why, and every candidate's numbers (f16 first).
pub struct Measurement {
    pub chosen: Preset,
    pub reasons: Vec<String>,
    pub measured: Vec<Measured>,
}

/// Simulate every candidate on the input (`model.kv` is changed) and choose the one with the
/// fewest bits per value (ties: lower KLD) whose mean KLD vs the f16 cache is within
/// `o.max_kld`. The f16 run's distributions go to a scratch file that the others read back.
pub fn measure(
    model: &mut Model,
    file: &GgufFile,
    cands: &[Preset],
    o: &MeasureOptions,
) -> Result<Measurement> {
    let cfg = model.cfg.clone();
    let text = o.input.path();
    let win = super::session::input_windows(file, &o.input, o.ctx, Some(o.chunks))?;
    let batch = (2048 / win.n_ctx).clamp(1, win.n_chunk);
    let tmp = crate::io::ScratchFile(std::env::temp_dir().join(format!(
        "tq-kv-ref-{}-{}.logits",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )));
    let h = logits_file::Header {
        format: Format::Tq,
        n_ctx: win.n_ctx,
        n_vocab: cfg.n_vocab,
        n_chunk: win.n_chunk,
        first: win.first(),
        info: "{}".into(),
        tokens: win.tokens.clone(),
    };
    let say = |s: String| {
        if !o.quiet {
            eprintln!("{s}");
        }
    };
    say(format!(
        "tq kv: {} windows x {} tokens of {}; reference: f16 cache",
        win.n_chunk,
        win.n_ctx,
        text.display()
    ));
    let mut w = logits_file::Writer::create(&tmp.0, Format::Tq, &h)?;
    model.kv = KvCache::default();
    let base = evaluate(
        model,
        &win,
        Reference::None,
        Some(&mut w),
        batch,
        &|_, _| {},
    )?;
    w.finish()?;
    say(format!(
        "  {:<16} {:>6.3} bits  PPL {:.4}  ({:.1} s)",
        "f16", 16.0, base.ppl.value, base.seconds
    ));
    let mut measured = vec![Measured {
        name: "f16".into(),
        bits: 16.0,
        ppl: base.ppl.value,
        ppl_err: base.ppl.err,
        kld: 0.0,
        kld_err: 0.0,
        same_top1: 1.0,
    }];
    for p in cands.iter().filter(|p| p.name != "f16") {
        model.kv = p
            .spec
            .resolve(cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim)?;
        let rd = logits_file::Reader::open(&tmp.0)?;
        let r = evaluate(model, &win, Reference::File(rd), None, batch, &|_, _| {})?;
        let k = r.kld.as_ref().expect("reference given");
        let m = Measured {
            name: p.name.clone(),
            bits: p.bits(&cfg),
            ppl: r.ppl.value,
            ppl_err: r.ppl.err,
            kld: k.kld.value,
            kld_err: k.kld.err,
            same_top1: k.same_top.value,
        };
        say(format!(
            "  {:<16} {:>6.3} bits  PPL {:.4}  KLD {:.6}  top-1 {:.2}%  ({:.1} s)",
            m.name,
            m.bits,
            m.ppl,
            m.kld,
            100.0 * m.same_top1,
            r.seconds
        ));
        measured.push(m);
    }
    let best = measured
        .iter()
        .filter(|m| m.kld <= o.max_kld)
        .min_by(|x, y| x.bits.total_cmp(&y.bits).then(x.kld.total_cmp(&y.kld)))
        .expect("f16 has KLD 0");
    let chosen = cands
        .iter()
        .find(|p| p.name == best.name)
        .expect("measured from the candidates")
        .clone();
    let reasons = vec![format!(
        "fewest bits per value ({:.3}) with mean KLD {:.6} <= --max-kld {} on {} windows of {}",
        best.bits,
        best.kld,
        o.max_kld,
        win.n_chunk,
        text.display()
    )];
    Ok(Measurement {
        chosen,
        reasons,
        measured,
    })
}

/// Copy the model with the preset recorded under `tq.kv.*` (engines ignore unknown keys; the
/// fork reads no TurboQuant metadata, so these are for people and tools). Tensors are copied
/// byte for byte; `out` may not be the input.
pub fn write_with_preset(file: &GgufFile, out: &Path, p: &Preset, cfg: &Config) -> Result<()> {
    crate::io::check_output("--write", out, &[Some(&file.path)])?;
    let mut md: Vec<(String, Value)> = file
        .metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("tq.kv."))
        .cloned()
        .collect();
    md.push(("tq.kv.preset".into(), Value::string(&p.name)));
    md.push(("tq.kv.ctk".into(), Value::string(p.spec.k.name())));
    md.push(("tq.kv.ctv".into(), Value::string(p.spec.v.name())));
    md.push((
        "tq.kv.layers".into(),
        Value::string(
            &p.spec
                .rules
                .iter()
                .map(rule_text)
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ));
    md.push(("tq.kv.target".into(), Value::string(&p.spec.profile)));
    md.push(("tq.kv.llama_flags".into(), Value::string(&p.llama_flags())));
    md.push(("tq.kv.env".into(), Value::string(&p.env().join(" "))));
    md.push((
        "tq.kv.bits_per_value".into(),
        Value::F32(p.bits(cfg) as f32),
    ));
    let specs: Vec<TensorSpec> = file.tensors.iter().map(|t| t.spec()).collect();
    let mut w = GgufWriter::create(out, file.version, &md, &specs)?;
    for t in &file.tensors {
        w.write_data(file.tensor_data(t))?;
        file.release(t);
    }
    w.finish()
}
