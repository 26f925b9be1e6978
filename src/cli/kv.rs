//! `tq kv MODEL`: KV-cache presets. Without `--measure`, a recommendation from the model's shape;
//! with `--measure --text FILE`, every candidate simulated on the text and the one with the fewest
//! bits per value whose mean KLD (vs the f16 cache) is under `--max-kld` chosen.
use std::path::PathBuf;
use tq::error::{Error, Result};
use tq::eval::kv::{measure, preset_json, select_candidates, write_with_preset, MeasureOptions};
use tq::eval::kv_presets::recommend;
use tq::gguf::GgufFile;
use tq::model::{Model, Numerics};
use tq::tokenizer::input::Input;

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
    tq::io::check_outputs(
        &[("--write", a.write.as_deref())],
        &[Some(&a.model), a.text.as_deref(), a.tokens.as_deref()],
    )?;
    super::with_thread_pool(a.threads, |_| run_in_pool(&a))
}

// Mostly printing: the text and JSON reports of the recommendation or measurement.
fn run_in_pool(a: &KvCmdArgs) -> Result<()> {
    let profile = tq::types::profile::Profile::select(a.target.as_deref(), a.type_map.as_deref())?;
    let file = GgufFile::open(&a.model)?;
    let mut model = Model::new(&file, Numerics::Ggml)?;
    let cfg = model.cfg.clone();
    let cands = select_candidates(&cfg, &profile, &a.only)?;
    let rec = recommend(&cfg, &profile);
    let gqa = cfg.n_head / cfg.n_head_kv.max(1);

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
            "recommended": preset_json(&chosen, &cfg),
            "reasons": why,
            "candidates": cands.iter().map(|p| preset_json(p, &cfg)).collect::<Vec<_>>(),
            "measured": if a.measure { Some(&measured) } else { None },
            "max_kld": a.max_kld,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&j)
                .map_err(|e| Error::internal(format!("JSON encoding of the report failed: {e}")))?
        );
        return Ok(());
    }
    println!(
        "{}: head_dim {}, {} heads / {} KV heads (GQA {}), {} layers",
        a.model.display(),
        cfg.head_dim,
        cfg.n_head,
        cfg.n_head_kv,
        gqa,
        cfg.n_layer
    );
    println!("target: {} ({})", profile.name, profile.kv.provenance);
    println!();
    println!(
        "recommended: {} ({:.3} bits per real value)",
        chosen.name,
        chosen.bits(&cfg)
    );
    let env = chosen.env();
    println!(
        "  llama.cpp:  {}{}",
        if env.is_empty() {
            String::new()
        } else {
            env.join(" ") + " "
        },
        chosen.llama_flags()
    );
    println!("  tq eval:    {}", chosen.tq_flags());
    for r in &why {
        println!("  - {r}");
    }
    println!();
    if a.measure {
        println!(
            "{:<16} {:>8} {:>10} {:>12} {:>8}",
            "preset", "bits", "PPL", "mean KLD", "top-1 %"
        );
        for m in &measured {
            println!(
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
            );
        }
    } else {
        println!("candidates (measure them with --measure --text FILE):");
        for p in &cands {
            let env = p.env();
            let flags = if env.is_empty() {
                p.llama_flags()
            } else {
                format!("{} {}", env.join(" "), p.llama_flags())
            };
            println!(
                "  {:<16} {:>6.3} bits  {:<32} {}",
                p.name,
                p.bits(&cfg),
                flags,
                p.note
            );
        }
    }
    if let Some(out) = &a.write {
        println!();
        println!("wrote {} with tq.kv.* = {}", out.display(), chosen.name);
    }
    Ok(())
}
