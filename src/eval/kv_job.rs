//! `tq kv` as one call: the flags as plain values ([`KvCmdFlags`]), the outputs checked
//! ([`check`]), the recommendation or measurement (and `--write`) in the caller's thread pool
//! ([`run`]), and what it prints ([`render`]: text or JSON).

use super::kv::{
    measure, preset_json, select_candidates, write_with_preset, MeasureOptions, Measured,
};
use super::kv_presets::{recommend, Preset};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::{Config, Model, Numerics};
use crate::tokenizer::input::Input;
use crate::types::profile::Profile;
use std::fmt::Write as _;
use std::path::PathBuf;

/// The flags of `tq kv` as plain values (the CLI fills this in; nothing is checked yet).
/// `--threads` is the caller's: [`run`] works in the pool it is called from.
#[derive(Clone, Debug, Default)]
pub struct KvCmdFlags {
    pub model: PathBuf,
    pub measure: bool,
    pub text: Option<PathBuf>,
    pub tokens: Option<PathBuf>,
    pub chunks: usize,
    pub ctx: usize,
    pub max_kld: f64,
    pub only: Vec<String>,
    pub write: Option<PathBuf>,
    pub json: bool,
    pub target: Option<String>,
    pub type_map: Option<PathBuf>,
}

/// What is checked before the thread pool starts: `--write` is no input.
pub fn check(a: &KvCmdFlags) -> Result<()> {
    crate::io::check_outputs(
        &[("--write", a.write.as_deref())],
        &[Some(&a.model), a.text.as_deref(), a.tokens.as_deref()],
    )
}

/// The preset chosen for a model, why, and what was compared.
#[derive(Debug)]
pub struct KvReport {
    profile: Profile,
    cfg: Config,
    cands: Vec<Preset>,
    chosen: Preset,
    why: Vec<String>,
    measured: Vec<Measured>,
}

/// Recommend a preset from the model's shape, or with `--measure` simulate every candidate on
/// the text and choose; with `--write`, write the copy of the model that records it.
pub fn run(a: &KvCmdFlags) -> Result<KvReport> {
    if !(a.max_kld.is_finite() && a.max_kld >= 0.0) {
        return Err(Error::Usage(format!(
            "--max-kld {}: expected a mean KLD >= 0 (nats), e.g. 0.01",
            a.max_kld
        )));
    }
    let profile = Profile::select(a.target.as_deref(), a.type_map.as_deref())?;
    let file = GgufFile::open(&a.model)?;
    let mut model = Model::new(&file, Numerics::Ggml)?;
    let cfg = model.cfg.clone();
    let cands = select_candidates(&cfg, &profile, &a.only)?;
    let rec = recommend(&cfg, &profile);

    let (mut chosen, mut why, mut measured) = (rec.preset.clone(), rec.reasons.clone(), vec![]);
    if a.measure {
        let input = match (&a.text, &a.tokens) {
            (Some(t), _) => Input::Text(t),
            (None, Some(t)) => Input::TokenFile(t),
            (None, None) => {
                return Err(Error::Usage(
                    "tq kv --measure: give --text FILE (or --tokens FILE)".into(),
                ))
            }
        };
        let o = MeasureOptions {
            input,
            chunks: a.chunks,
            ctx: a.ctx,
            max_kld: a.max_kld,
            quiet: a.json,
        };
        let m = measure(&mut model, &file, &cands, &o)?;
        (chosen, why, measured) = (m.chosen, m.reasons, m.measured);
    }

    if let Some(out) = &a.write {
        write_with_preset(&file, out, &chosen, &cfg)?;
    }
    Ok(KvReport {
        profile,
        cfg,
        cands,
        chosen,
        why,
        measured,
    })
}

/// What `tq kv` prints on stdout: the JSON report, or the text one.
pub fn render(a: &KvCmdFlags, r: &KvReport) -> Result<String> {
    let KvReport {
        profile,
        cfg,
        cands,
        chosen,
        why,
        measured,
    } = r;
    let gqa = cfg.n_head / cfg.n_head_kv.max(1);
    if a.json {
        let j = serde_json::json!({
            "model": a.model.display().to_string(),
            "target": profile.name,
            "target_kv_facts": profile.kv.provenance,
            "head_dim": cfg.head_dim,
            "n_head": cfg.n_head,
            "n_head_kv": cfg.n_head_kv,
            "gqa": gqa,
            "n_layer": cfg.n_layer,
            "recommended": preset_json(chosen, cfg),
            "reasons": why,
            "candidates": cands.iter().map(|p| preset_json(p, cfg)).collect::<Vec<_>>(),
            "measured": if a.measure { Some(&measured) } else { None },
            "max_kld": a.max_kld,
        });
        return Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&j)
                .map_err(|e| Error::internal(format!("JSON encoding failed: {e}")))?
        ));
    }
    let mut s = String::new();
    text(&mut s, a, r, gqa).expect("writing to a String cannot fail");
    Ok(s)
}

fn text(s: &mut String, a: &KvCmdFlags, r: &KvReport, gqa: usize) -> std::fmt::Result {
    let KvReport {
        profile,
        cfg,
        cands,
        chosen,
        why,
        measured,
    } = r;
    writeln!(
        s,
        "{}: head_dim {}, {} heads / {} KV heads (GQA {}), {} layers",
        a.model.display(),
        cfg.head_dim,
        cfg.n_head,
        cfg.n_head_kv,
        gqa,
        cfg.n_layer
    )?;
    writeln!(s, "target: {} ({})", profile.name, profile.kv.provenance)?;
    writeln!(s)?;
    writeln!(
        s,
        "recommended: {} ({:.3} bits per real value)",
        chosen.name,
        chosen.bits(cfg)
    )?;
    let env = chosen.env();
    writeln!(
        s,
        "  llama.cpp:  {}{}",
        if env.is_empty() {
            String::new()
        } else {
            env.join(" ") + " "
        },
        chosen.llama_flags()
    )?;
    writeln!(s, "  tq eval:    {}", chosen.tq_flags())?;
    for r in why {
        writeln!(s, "  - {r}")?;
    }
    writeln!(s)?;
    if a.measure {
        writeln!(
            s,
            "{:<16} {:>8} {:>10} {:>12} {:>8}",
            "preset", "bits", "PPL", "mean KLD", "top-1 %"
        )?;
        for m in measured {
            writeln!(
                s,
                "{:<16} {:>8.3} {:>10.4} {:>12.6} {:>8.2}{}",
                m.name,
                m.bits,
                m.ppl,
                m.kld,
                100.0 * m.same_top1,
                if m.name == chosen.name {
                    "  <- chosen"
                } else {
                    ""
                }
            )?;
        }
    } else {
        writeln!(s, "candidates (measure them with --measure --text FILE):")?;
        for p in cands {
            let env = p.env();
            let flags = if env.is_empty() {
                p.llama_flags()
            } else {
                format!("{} {}", env.join(" "), p.llama_flags())
            };
            writeln!(
                s,
                "  {:<16} {:>6.3} bits  {:<32} {}",
                p.name,
                p.bits(cfg),
                flags,
                p.note
            )?;
        }
    }
    if let Some(out) = &a.write {
        writeln!(s)?;
        writeln!(s, "wrote {} with tq.kv.* = {}", out.display(), chosen.name)?;
    }
    Ok(())
}
