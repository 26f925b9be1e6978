//! `tq kv MODEL`: KV-cache presets. Without `--measure`, a recommendation from the model's shape;
//! with `--measure --text FILE`, every candidate simulated on the text and the one with the fewest
//! bits per value whose mean KLD (vs the f16 cache) is under `--max-kld` chosen.
use std::path::PathBuf;
use tq::error::{Error, Result};
use tq::eval::logits_file::{self, Format};
use tq::eval::{evaluate, Reference, Windows};
use tq::gguf::{GgufFile, GgufWriter, TensorSpec, Value};
use tq::model::kv_presets::{candidates, recommend, Preset};
use tq::model::{Config, Model, Numerics};

#[derive(clap::Args)]
pub struct KvArgs {
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
}

/// One measured candidate.
#[derive(serde::Serialize, Clone, Debug)]
struct Measured {
    name: String,
    bits: f64,
    ppl: f64,
    ppl_err: f64,
    kld: f64,
    kld_err: f64,
    same_top1: f64,
}

fn preset_json(p: &Preset, cfg: &Config) -> serde_json::Value {
    serde_json::json!({
        "name": p.name,
        "ctk": p.spec.k.name(),
        "ctv": p.spec.v.name(),
        "kv_layers": p.spec.rules.iter().map(tq::model::kv_presets::rule_text).collect::<Vec<_>>(),
        "rotation": p.spec.rotate,
        "bits_per_value": p.bits(cfg),
        "llama_flags": p.llama_flags(),
        "env": p.env(),
        "tq_eval_flags": p.tq_flags(),
        "note": p.note,
    })
}

pub fn run(a: KvArgs) -> Result<()> {
    super::with_thread_pool(a.threads, |threads| run_in_pool(&a, threads))
}

fn run_in_pool(a: &KvArgs, threads: usize) -> Result<()> {
    let file = GgufFile::open(&a.model)?;
    let mut model = Model::new(&file, Numerics::Ggml)?;
    model.threads = threads;
    let cfg = model.cfg.clone();
    let mut cands = candidates(&cfg);
    if !a.only.is_empty() {
        for n in &a.only {
            if !cands.iter().any(|p| &p.name == n) {
                return Err(Error::Usage(format!(
                    "--only {}: no such preset for this model (have: {})",
                    tq::error::one_line(n),
                    cands
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        cands.retain(|p| p.name == "f16" || a.only.contains(&p.name));
    }
    let rec = recommend(&cfg);
    let gqa = cfg.n_head / cfg.n_head_kv.max(1);

    let mut measured: Vec<Measured> = Vec::new();
    let mut chosen = rec.preset.clone();
    let mut why = rec.reasons.clone();
    if a.measure {
        let (text, (toks, bos)) = match (&a.text, &a.tokens) {
            (Some(t), _) => (t, super::eval::text_tokens(t, &file)?),
            (None, Some(t)) => (t, super::eval::token_file_tokens(t, &file)?),
            (None, None) => {
                return Err(Error::Usage(
                    "tq kv --measure: give --text FILE (or --tokens FILE)".into(),
                ))
            }
        };
        let win = Windows::new(&toks, a.ctx, Some(a.chunks), bos)?;
        let batch = (2048 / win.n_ctx).clamp(1, win.n_chunk);
        let tmp = tq::io::ScratchFile(std::env::temp_dir().join(format!(
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
        let quiet = a.json;
        let say = |s: String| {
            if !quiet {
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
        model.kv = tq::model::KvCache::default();
        let base = evaluate(
            &model,
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
        for p in cands.iter().filter(|p| p.name != "f16") {
            model.kv = p
                .spec
                .resolve(cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim)?;
            let rd = logits_file::Reader::open(&tmp.0)?;
            let r = evaluate(&model, &win, Reference::File(rd), None, batch, &|_, _| {})?;
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
        measured.insert(
            0,
            Measured {
                name: "f16".into(),
                bits: 16.0,
                ppl: base.ppl.value,
                ppl_err: base.ppl.err,
                kld: 0.0,
                kld_err: 0.0,
                same_top1: 1.0,
            },
        );
        let best = measured
            .iter()
            .filter(|m| m.kld <= a.max_kld)
            .min_by(|x, y| x.bits.total_cmp(&y.bits).then(x.kld.total_cmp(&y.kld)))
            .expect("f16 has KLD 0");
        chosen = cands
            .iter()
            .find(|p| p.name == best.name)
            .expect("measured from the candidates")
            .clone();
        why = vec![format!(
            "fewest bits per value ({:.3}) with mean KLD {:.6} <= --max-kld {} on {} windows of {}",
            best.bits,
            best.kld,
            a.max_kld,
            win.n_chunk,
            text.display()
        )];
    }

    if let Some(out) = &a.write {
        write_with_preset(&file, out, &chosen, &cfg)?;
    }

    if a.json {
        let j = serde_json::json!({
            "model": a.model.display().to_string(),
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
                .map_err(|e| Error::Usage(format!("JSON encoding failed: {e}")))?
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
    println!();
    println!(
        "recommended: {} ({:.3} bits per value)",
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
            println!(
                "  {:<16} {:>6.3} bits  {:<32} {}",
                p.name,
                p.bits(&cfg),
                p.llama_flags(),
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

/// Copy the model with the preset recorded under `tq.kv.*` (engines ignore unknown keys; the
/// fork reads no TurboQuant metadata, so these are for people and tools).
fn write_with_preset(
    file: &GgufFile,
    out: &std::path::Path,
    p: &Preset,
    cfg: &Config,
) -> Result<()> {
    tq::io::check_output("--write", out, &[&file.path])?;
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
                .map(tq::model::kv_presets::rule_text)
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ));
    md.push(("tq.kv.llama_flags".into(), Value::string(&p.llama_flags())));
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
