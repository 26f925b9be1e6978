//! `tq convert INPUT -o OUT.gguf [--weights TYPE] [--recipe R] ...`
use std::path::PathBuf;
use tq::calib::input::{calibrate_text, is_hessian_file, text_windows, TextOptions};
use tq::calib::sequential::SeqQuant;
use tq::convert::{self, Provenance};
use tq::error::{Error, Result};
use tq::plan::{self, recipe, Action, Plan, Request};
use tq::types::profile::Profile;
use tq::types::TensorType;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Input model (GGUF).
    pub input: PathBuf,
    /// Output GGUF (written atomically: temp file + fsync + rename).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Default type of 2-D weights (tq4_1s, tq3_1s, q8_0, q4_0, q4_1, f16, bf16, f32, ...).
    /// Without --weights, --recipe or overrides every tensor keeps its type (a pure copy); with
    /// any of them but no --weights, the default is tq4_1s.
    #[arg(long)]
    pub weights: Option<String>,
    /// pure | config-i | hybrid | premium (see `docs/user-guide.md`).
    #[arg(long)]
    pub recipe: Option<String>,
    /// REGEX=TYPE for tensors whose name matches (repeatable; first match wins). Without
    /// --weights, every other 2-D weight is quantized to tq4_1s (give --weights to choose).
    #[arg(long = "tensor-type", value_name = "REGEX=TYPE")]
    pub tensor_type: Vec<String>,
    /// File with one REGEX=TYPE per line (after the --tensor-type flags).
    #[arg(long)]
    pub tensor_type_file: Option<PathBuf>,
    /// Type of output.weight.
    #[arg(long)]
    pub output_tensor_type: Option<String>,
    /// Type of token_embd.weight.
    #[arg(long)]
    pub token_embedding_type: Option<String>,
    /// Any fallback (row length, engine constraint), and any problem that makes engines refuse
    /// the file (tensor name over 63 bytes, missing or zero hyper-parameter, missing tensor,
    /// wrong shape; warnings otherwise), is an error, before anything is written.
    #[arg(long)]
    pub strict: bool,
    /// Print the plan and totals; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// JSON output (plan with --dry-run, summary otherwise).
    #[arg(long)]
    pub json: bool,
    /// Target engine profile: fork (default), fork-pre-2026-04-15, upstream.
    #[arg(long)]
    pub target: Option<String>,
    /// JSON type map for other forks (instead of --target).
    #[arg(long, conflicts_with = "target")]
    pub type_map: Option<PathBuf>,
    /// Worker threads (default: all cores). Output bytes do not depend on it.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Calibration Hessians from `tq calib` (safetensors), or a UTF-8 text file to calibrate on
    /// first, in this command: TQ tensors with a Hessian are quantized with banded LDLQ (same
    /// bytes per weight; the engine's decoder is unchanged).
    #[arg(long)]
    pub calib: Option<PathBuf>,
    /// With --calib TEXT: calibration tokens (as `tq calib --tokens`).
    #[arg(long, requires = "calib", default_value_t = 8192)]
    pub calib_tokens: usize,
    /// With --calib TEXT: window length (as `tq calib --ctx`).
    #[arg(long, requires = "calib", default_value_t = 512)]
    pub calib_ctx: usize,
    /// With --calib TEXT: windows per forward pass (as `tq calib --batch`).
    #[arg(long, requires = "calib", default_value_t = 4)]
    pub calib_batch: usize,
    /// With --calib TEXT: sequential (GPTQ-order) calibration of exactly this conversion's plan
    /// (as `tq calib --sequential`).
    #[arg(long, requires = "calib")]
    pub calib_sequential: bool,
    /// With --calib H.safetensors: use an interrupted `tq calib` checkpoint (fewer windows or
    /// blocks than it was started with) as it is, instead of refusing it.
    #[arg(long, requires = "calib")]
    pub allow_partial_calib: bool,
    /// llama.cpp imatrix (GGUF from `llama-imatrix` / `tq calib --imatrix-out`, or legacy .dat):
    /// stock tensors without LDLQ get block parameters fitted under its per-column importance
    /// (diagonal-only weighting; round-to-nearest values).
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// LDLQ error-feedback band in columns (0 = full).
    #[arg(long, default_value_t = 0)]
    pub ldlq_band: usize,
    /// LDLQ damping λ: H += λ·mean(diag(H))·I (raised ×10 on Cholesky failure).
    #[arg(long, default_value_t = 0.01)]
    pub damp: f64,
    /// Stock types: after the LDLQ sweep, refit each row's block parameters to its codes under
    /// the Hessian and sweep again, this many times (0: off; each pass costs about one more
    /// sweep, and a third n×n f64 matrix is alive while factoring).
    #[arg(long, default_value_t = tq::quant::ldlq::Refit::DEFAULT.passes, value_name = "N")]
    pub ldlq_refit: usize,
    /// Continue an interrupted conversion (killed, out of time, Ctrl-C) from its last checkpoint:
    /// the same command plus --resume. The output is byte-identical to an uninterrupted run; a
    /// checkpoint of a different command is refused.
    #[arg(long)]
    pub resume: bool,
    /// No progress bar and no notices (errors are still printed).
    #[arg(short, long)]
    pub quiet: bool,
    /// Convert only shard I of N (0-based) of the tensors, balanced by work, into a
    /// fragment at -o; `tq assemble` joins a complete set into the GGUF this command writes
    /// without --shard (see docs/scale.md). With --calib, only a Hessian file.
    #[arg(long, value_name = "I/N", conflicts_with = "dry_run")]
    pub shard: Option<String>,
    /// Choose a type per tensor for a file of at most X bits per parameter (the whole file:
    /// metadata and unquantized tensors count), minimizing the predicted KLD (see
    /// docs/user-guide.md, "A mix for a target size").
    #[arg(long, value_name = "X")]
    pub target_bpw: Option<f64>,
    /// As --target-bpw, for a file of at most SIZE (bytes, or 100MB, 95MiB, 1.5GB).
    #[arg(long, value_name = "SIZE")]
    pub target_size: Option<String>,
    /// Candidate types of the mix, comma-separated (default: what --target loads: stock types,
    /// plus tq3_1s/tq4_1s for the fork).
    #[arg(long, value_name = "LIST")]
    pub types: Option<String>,
    /// Rows sampled per tensor for the mix's error estimate.
    #[arg(long, default_value_t = 64)]
    pub mix_rows: usize,
    /// Text for the mix's KLD fit and for --verify (default: --calib when it is a text file).
    #[arg(long, value_name = "FILE")]
    pub kld_text: Option<PathBuf>,
    /// Windows of 512 tokens of --kld-text for the fit and --verify (at least 2).
    #[arg(long, default_value_t = 2)]
    pub kld_windows: usize,
    /// Single-tensor KLDs measured for the mix's fit (round-robin over the roles: 14 = two
    /// per role of a llama block).
    #[arg(long, default_value_t = 14)]
    pub kld_probes: usize,
    /// After writing, measure the output's KLD against the input on --kld-text.
    #[arg(long)]
    pub verify: bool,
    /// Do not add tq.* provenance keys (for byte-exact copies). general.file_type is still set
    /// from the plan when types change (it describes the tensors written).
    #[arg(long)]
    pub no_provenance: bool,
}

pub fn run(a: ConvertArgs) -> Result<()> {
    super::with_thread_pool(a.threads, |_| convert(&a))
}

fn convert(a: &ConvertArgs) -> Result<()> {
    super::check_damp(a.damp)?;
    let calib_is_text = match &a.calib {
        Some(p) if a.shard.is_some() => !is_hessian_file(p)?,
        _ => false,
    };
    let shard = super::shard::check_convert_shard(a.shard.as_deref(), calib_is_text)?;
    let profile = Profile::select(a.target.as_deref(), a.type_map.as_deref())?;
    let out = match (&a.output, a.dry_run) {
        (Some(o), _) => Some(o.clone()),
        (None, true) => None,
        (None, false) => {
            return Err(Error::Usage(
                "tq convert: give -o OUT.gguf (or --dry-run)".into(),
            ))
        }
    };
    tq::io::check_outputs(
        &[("-o", out.as_deref())],
        &[
            Some(&a.input),
            a.calib.as_deref(),
            a.imatrix.as_deref(),
            a.tensor_type_file.as_deref(),
            a.type_map.as_deref(),
        ],
    )?;
    let budget = mix_budget(a)?;
    let src = tq::source::open(&a.input, &profile)?;
    let req = request(a)?;
    let mut plan = plan::plan(src.tensors(), &req, &profile)?;
    plan.ldlq_refit = a.ldlq_refit;
    // What would make engines refuse the output: warnings, or (--strict) an error now.
    // Printed under --quiet too: a warning, not a notice.
    let issues = plan::check_engine(src.as_ref(), a.strict)?;
    report_engine_issues(&src.name(), &issues);
    let kld_text = a.kld_text.clone().or_else(|| {
        a.calib
            .clone()
            .filter(|p| !is_hessian_file(p).unwrap_or(true))
    });
    if a.verify && (kld_text.is_none() || a.dry_run) {
        return Err(Error::Usage(
            "tq convert --verify: give --kld-text FILE (or --calib TEXT) to measure on, and -o (not --dry-run)".into(),
        ));
    }
    let mut pre_hessians = None;
    let mix = match budget {
        None => None,
        Some(b) => {
            let (rep, h) = run_mix(
                a,
                b,
                src.as_ref(),
                &mut plan,
                &profile,
                &req,
                kld_text.as_deref(),
            )?;
            pre_hessians = h;
            Some(rep)
        }
    };
    let now = SeqQuant::from_plan(
        &plan,
        req.weights.name(),
        req.recipe.name,
        a.ldlq_band,
        a.damp,
    );
    let ldlq = resolve_ldlq(a, &profile, &mut plan, &now, pre_hessians)?;
    if let Some(p) = &a.imatrix {
        let im = tq::calib::imatrix::load(p)?;
        plan::assign_importance(&mut plan, &im.entries);
    }
    let prov = provenance(
        a,
        &req,
        mix.as_ref().map(|m| m.provenance()).unwrap_or_default(),
    );
    let md = convert::output_metadata(
        src.metadata(),
        &plan,
        prov.as_ref(),
        // general.file_type describes the tensors written, with or without provenance.
        !req.keep_types,
    );
    let version = src.gguf_version();
    let size = tq::gguf::writer::file_size(version, &md, &convert::tensor_specs(&plan, &profile))?;
    if let Some(m) = &mix {
        // The mix measured this size; a difference is a bug, caught before writing.
        if size > m.target {
            return Err(Error::Usage(format!(
                "tq convert: the mix came to {size} bytes, over the target {}; this is a bug, please report it",
                m.target
            )));
        }
        if !a.quiet && !a.json {
            for l in m.lines() {
                eprintln!("{l}");
            }
        }
    }
    if a.dry_run {
        if let Some(m) = &mix {
            m.cleanup();
        }
        print_plan(&plan, a, size, &profile, mix.as_ref())?;
        return Ok(());
    }
    if !a.quiet {
        report_fallbacks(&plan);
    }
    let out = out.expect("checked above");
    if let Some(shard) = shard {
        let hessians = match &ldlq {
            Calib::File(file) => Some((file, a.ldlq_band, a.damp)),
            Calib::None => None,
            // Refused before calibrating (check_convert_shard); kept an error, not a panic.
            _ => {
                return Err(Error::Usage(
                    "tq convert --shard: --calib must be a Hessian file".into(),
                ))
            }
        };
        let job = tq::shard::fragment::Job {
            src: src.as_ref(),
            plan: &plan,
            metadata: &md,
            version,
            profile: &profile,
            input: &a.input,
            hash_input: prov.is_some(),
            hessians,
            shard,
            out: &out,
        };
        return super::shard::convert_shard(&job, a.quiet);
    }
    let pb = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        progress_bar(size)
    };
    let t0 = std::time::Instant::now();
    let hash_input = prov.as_ref().map(|_| a.input.as_path());
    let cp = convert::Checkpoints {
        resume: a.resume,
        key: format!(
            "{} | --ldlq-band {} --damp {} --ldlq-refit {} | input {} | calib {} | imatrix {} | tq {}",
            canonical_flags(a, &req),
            a.ldlq_band,
            a.damp,
            a.ldlq_refit,
            file_identity(&a.input),
            a.calib.as_deref().map(file_identity).unwrap_or_default(),
            a.imatrix.as_deref().map(file_identity).unwrap_or_default(),
            env!("CARGO_PKG_VERSION")
        ),
        quiet: a.quiet,
    };
    let target = convert::Target {
        src: src.as_ref(),
        plan: &plan,
        metadata: &md,
        version,
        profile: &profile,
        out: &out,
        hash_input,
        cp: &cp,
    };
    let progress = |d| pb.set_position(d);
    let stats = match ldlq {
        Calib::Stream {
            file,
            windows,
            sequential,
        } => convert::execute_calibrating(
            &target,
            &progress,
            &convert::StreamCalib {
                model: &a.input,
                file: &file,
                windows: &windows,
                ctx: a.calib_ctx,
                batch: a.calib_batch,
                band: a.ldlq_band,
                damp: a.damp,
                quiet: a.quiet,
                sequential: sequential.as_ref(),
            },
        )?,
        Calib::File(file) => {
            convert::execute_from_file(&target, &progress, &file, a.ldlq_band, a.damp)?
        }
        Calib::Hessians(l) => convert::execute(&target, Some(l), &progress)?,
        Calib::None => convert::execute(&target, None, &progress)?,
    };
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let (params, bpw, bpw2d) = totals(&plan);
    let verified = match (&kld_text, a.verify) {
        (Some(text), true) => {
            let t = std::time::Instant::now();
            let r = match mix.as_ref().and_then(|m| m.ref_logits.clone()) {
                Some(r) => r,
                None => {
                    let r = std::env::temp_dir()
                        .join(format!("tq-verify-{}.logits", std::process::id()));
                    super::mix::reference_logits(&a.input, text, a.kld_windows, &r)?;
                    r
                }
            };
            let k = super::mix::kld_of(&out, &r, a.kld_windows)?;
            let _ = std::fs::remove_file(&r);
            Some((k, t.elapsed().as_secs_f64()))
        }
        _ => None,
    };
    if let Some(m) = &mix {
        m.cleanup();
    }
    if a.json {
        let j = serde_json::json!({
            "input": a.input.display().to_string(), "output": out.display().to_string(),
            "bytes": stats.bytes_written, "seconds": secs, "parameters": params,
            "bpw": bpw, "bpw_2d": bpw2d, "converted": stats.tensors_converted, "copied": stats.tensors_copied,
            "fallbacks": plan.entries.iter().filter(|e| e.fallback).count(),
            "mix": mix.as_ref().map(|m| m.json()),
            "verify": verified.map(|(k, s)| serde_json::json!({"kld": k, "windows": a.kld_windows, "seconds": s})),
        });
        println!("{j}");
    } else if !a.quiet {
        eprintln!(
            "wrote {} ({} bytes, {:.3} bpw, {:.3} bpw 2-D weights): {} tensors converted, {} copied, in {:.1} s",
            out.display(),
            stats.bytes_written,
            bpw,
            bpw2d,
            stats.tensors_converted,
            stats.tensors_copied,
            secs
        );
        if let Some((k, s)) = verified {
            let pred = mix
                .as_ref()
                .and_then(|m| m.predicted_kld())
                .map_or(String::new(), |p| format!(" (predicted {p:.5})"));
            eprintln!(
                "verify: mean KLD {k:.5} vs the input on {} windows of {}{pred}, in {s:.1} s",
                a.kld_windows,
                kld_text
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// `--target-bpw` / `--target-size`, checked: one of them, a positive finite value.
fn mix_budget(a: &ConvertArgs) -> Result<Option<super::mix::Budget>> {
    use super::mix::Budget;
    let b = match (a.target_bpw, &a.target_size) {
        (Some(_), Some(_)) => {
            return Err(Error::Usage(
                "tq convert: give --target-bpw or --target-size, not both".into(),
            ))
        }
        (Some(x), None) if x.is_finite() && x > 0.0 && x <= 64.0 => Some(Budget::Bpw(x)),
        (Some(x), None) => {
            return Err(Error::Usage(format!(
                "--target-bpw {x}: expected bits per parameter in (0, 64], e.g. 4.5"
            )))
        }
        (None, Some(s)) => Some(Budget::Bytes(super::mix::parse_size(s)?)),
        (None, None) => None,
    };
    if a.kld_windows < 2 {
        return Err(Error::Usage(format!(
            "--kld-windows {}: at least 2 windows (the evaluator's minimum)",
            a.kld_windows
        )));
    }
    if b.is_none() && a.types.is_some() {
        return Err(Error::Usage(
            "tq convert: --types lists the candidates of a mix; give --target-bpw or --target-size"
                .into(),
        ));
    }
    if b.is_some() && a.shard.is_some() {
        return Err(Error::Usage(
            "tq convert: a mix (--target-bpw/--target-size) cannot be sharded yet; convert without --shard".into(),
        ));
    }
    if b.is_some() && a.calib_sequential {
        return Err(Error::Usage(
            "tq convert: --calib-sequential with a mix is not supported; use tq calib --sequential and --calib H.safetensors".into(),
        ));
    }
    Ok(b)
}

/// Choose the mix: calibration data loaded as convert will use it (a text is calibrated on
/// here, in memory, and the Hessians handed on to the conversion), sensitivity, fit, DP.
fn run_mix(
    a: &ConvertArgs,
    budget: super::mix::Budget,
    src: &dyn tq::source::TensorSource,
    plan: &mut Plan,
    profile: &Profile,
    req: &Request,
    kld_text: Option<&std::path::Path>,
) -> Result<(super::mix::MixReport, Option<tq::quant::Hessians>)> {
    use tq::plan::mix::Calibration;
    let mut file = None;
    let mut mem = None;
    let mut im = None;
    match &a.calib {
        Some(p) if is_hessian_file(p)? => file = Some(tq::quant::HessianFile::open(p)?.0),
        Some(p) if !a.dry_run => {
            let o = TextOptions {
                tokens: a.calib_tokens,
                ctx: a.calib_ctx,
                batch: a.calib_batch,
                quiet: a.quiet,
            };
            mem = Some(calibrate_text(&a.input, profile, p, &o)?);
        }
        Some(p) => {
            return Err(Error::Usage(format!(
                "tq convert --dry-run with a mix: calibrate first (tq calib {} --text {} -o H.safetensors) and give --calib H.safetensors",
                a.input.display(),
                p.display()
            )))
        }
        None => {}
    }
    if let Some(p) = &a.imatrix {
        im = Some(tq::calib::imatrix::load(p)?.entries);
    }
    let calib = match (&file, &mem, &im) {
        (Some(f), _, _) => Calibration::File(f),
        (_, Some(h), _) => Calibration::Memory(h),
        (_, _, Some(m)) => Calibration::Imatrix(m),
        _ => Calibration::None,
    };
    let o = super::mix::MixOpts {
        budget,
        types: a.types.as_deref(),
        rows: a.mix_rows.max(1),
        kld_text,
        kld_windows: a.kld_windows,
        probes: a.kld_probes,
        band: a.ldlq_band,
        damp: a.damp,
        quiet: a.quiet,
    };
    let version = src.gguf_version();
    // The file the plan gives: provenance and the marks convert will add (ldlq / imatrix)
    // change the metadata's length, so they are counted.
    let size_of = |p: &Plan, rep: &super::mix::MixReport| -> Result<u64> {
        let mut p = p.clone();
        match &calib {
            Calibration::File(f) => plan::assign_ldlq(&mut p, &f.index, a.ldlq_band),
            Calibration::Memory(h) => plan::assign_ldlq(&mut p, h, a.ldlq_band),
            Calibration::Imatrix(_) | Calibration::None => {}
        }
        if let Some(m) = &im {
            plan::assign_importance(&mut p, m);
        }
        let prov = provenance(a, req, rep.provenance());
        let md = convert::output_metadata(src.metadata(), &p, prov.as_ref(), true);
        tq::gguf::writer::file_size(version, &md, &convert::tensor_specs(&p, profile))
    };
    let rep = super::mix::choose(&a.input, src, plan, profile, &o, &calib, &size_of)?;
    // The base type (general.file_type) of a mix: its most common type by elements.
    let mut by: std::collections::BTreeMap<TensorType, u64> = Default::default();
    for e in plan.entries.iter().filter(|e| e.dims.len() >= 2) {
        *by.entry(e.dst).or_default() += e.dims.iter().product::<u64>();
    }
    if let Some((t, _)) = by.into_iter().max_by_key(|(_, n)| *n) {
        plan.base_type = t;
        plan.file_type = profile.file_type_of(t);
    }
    Ok((rep, mem))
}

fn provenance(a: &ConvertArgs, req: &Request, extra: Vec<(String, String)>) -> Option<Provenance> {
    if a.no_provenance {
        return None;
    }
    Some(Provenance {
        recipe: if req.keep_types {
            "keep".into()
        } else if a.target_bpw.is_some() || a.target_size.is_some() {
            "mix".into()
        } else {
            req.recipe.name.into()
        },
        flags: canonical_flags(a, req),
        input_name: a
            .input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        // Filled in by execute, which hashes the input while converting; a dry run counts
        // the placeholder too, so its size is the written file's (a mix's budget depends on it).
        input_blake3: convert::HASH_PLACEHOLDER.to_string(),
        extra,
    })
}

/// Where LDLQ's Hessians come from.
enum Calib {
    None,
    /// Hessians a mix calibrated in memory (`--target-bpw` with `--calib TEXT`).
    Hessians(convert::Ldlq),
    /// A Hessian file from `tq calib`, read group by group while writing.
    File(tq::quant::HessianFile),
    /// `--calib TEXT`: calibrated block by block while writing (batched, or sequential with
    /// this conversion's plan).
    Stream {
        file: tq::gguf::GgufFile,
        windows: Vec<u32>,
        sequential: Option<SeqQuant>,
    },
}

/// `--calib`: a Hessian file is loaded (with a warning when sequential Hessians were made for
/// another quantization); a text file is calibrated on while writing, block by block (sequential
/// calibration: first, in memory); not under --dry-run. Either way the plan's TQ tensors are
/// marked for LDLQ before anything is written.
fn resolve_ldlq(
    a: &ConvertArgs,
    profile: &Profile,
    plan: &mut Plan,
    now: &SeqQuant,
    pre: Option<tq::quant::Hessians>,
) -> Result<Calib> {
    if let Some(hessians) = pre {
        // A mix calibrated on the text already: the same Hessians, not a second run.
        plan::assign_ldlq(plan, &hessians, a.ldlq_band);
        return Ok(Calib::Hessians(convert::Ldlq {
            hessians,
            band: a.ldlq_band,
            damp: a.damp,
        }));
    }
    let calib_text = match &a.calib {
        Some(p) => !is_hessian_file(p)?,
        None => false,
    };
    if a.calib_sequential && !calib_text {
        return Err(Error::Usage(
            "tq convert: --calib-sequential calibrates on a text file given to --calib; for a Hessian file, run tq calib --sequential".into(),
        ));
    }
    Ok(match &a.calib {
        Some(p) if calib_text && a.dry_run => {
            if !a.quiet {
                eprintln!(
                    "tq: --dry-run: calibration on {} not run; TQ tensors would be quantized with LDLQ",
                    p.display()
                );
            }
            Calib::None
        }
        Some(p) if calib_text => {
            let o = TextOptions {
                tokens: a.calib_tokens,
                ctx: a.calib_ctx,
                batch: a.calib_batch,
                quiet: a.quiet,
            };
            let (file, windows) = text_windows(&a.input, profile, p, &o)?;
            let expected = tq::calib::stream::expected(&file, windows.len() as u64)?;
            plan::assign_ldlq(plan, &expected, a.ldlq_band);
            Calib::Stream {
                file,
                windows,
                sequential: a.calib_sequential.then(|| now.clone()),
            }
        }
        Some(p) => {
            let (file, meta) = tq::quant::HessianFile::open(p)?;
            if !a.allow_partial_calib {
                refuse_partial(p, &meta)?;
            }
            if let Some(d) = tq::calib::sequential::mismatch(&meta, now) {
                eprintln!(
                    "tq: warning: {}: sequential Hessians were computed for another quantization ({d}); blocks after the first saw activations of a model this conversion does not write (rerun tq calib --sequential with matching flags)",
                    p.display()
                );
            }
            plan::assign_ldlq(plan, &file.index, a.ldlq_band);
            Calib::File(file)
        }
        None => Calib::None,
    })
}

/// A Hessian file `tq calib` was interrupted while writing (`tq.complete = "false"`) is refused,
/// naming how far it got and how to finish it.
fn refuse_partial(
    p: &std::path::Path,
    meta: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    if meta.get("tq.complete").map(String::as_str) != Some("false") {
        return Ok(());
    }
    let get = |k: &str| meta.get(k).map_or("?", String::as_str);
    let held = if get("tq.sequential") == "true" {
        format!("sequential, blocks done: {}", get("tq.layers_done"))
    } else {
        format!(
            "{} of {} windows",
            get("tq.windows_done"),
            get("tq.windows_total")
        )
    };
    Err(Error::bad_input(
        p,
        format!(
            "an interrupted calibration checkpoint ({held}); finish it with `tq calib` and the same flags plus --resume -o {}, or pass --allow-partial-calib to use it as it is",
            p.display()
        ),
    ))
}

fn request(a: &ConvertArgs) -> Result<Request<'static>> {
    let weights = a.weights.as_deref().map(TensorType::parse).transpose()?;
    let recipe = a.recipe.as_deref().map(recipe::parse).transpose()?;
    let mut overrides = a
        .tensor_type
        .iter()
        .map(|s| plan::parse_override(s))
        .collect::<Result<Vec<_>>>()?;
    if let Some(f) = &a.tensor_type_file {
        overrides.extend(plan::read_override_file(f)?);
    }
    let output_type = a
        .output_tensor_type
        .as_deref()
        .map(TensorType::parse)
        .transpose()?;
    let token_embd_type = a
        .token_embedding_type
        .as_deref()
        .map(TensorType::parse)
        .transpose()?;
    let mixing = a.target_bpw.is_some() || a.target_size.is_some();
    let keep_types = !mixing
        && weights.is_none()
        && recipe.is_none()
        && overrides.is_empty()
        && output_type.is_none()
        && token_embd_type.is_none();
    Ok(Request {
        // A mix sets every matrix's type; its starting plan needs a type every profile loads.
        weights: weights.unwrap_or(if mixing {
            TensorType::Q8_0
        } else {
            TensorType::TQ4_1S
        }),
        recipe: recipe.unwrap_or(&recipe::RECIPES[0]),
        overrides,
        output_type,
        token_embd_type,
        keep_types,
        strict: a.strict,
    })
}

/// The flags that decide the output, in a fixed form (no paths, no thread count).
/// A file's size and modification time: what a checkpoint checks its inputs by (hashing a 140 GB
/// model again on every resume would cost minutes).
fn file_identity(p: &std::path::Path) -> String {
    match std::fs::metadata(p) {
        Ok(m) => format!(
            "{} bytes, modified {:?}",
            m.len(),
            m.modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_nanos())
        ),
        Err(_) => String::new(),
    }
}

fn canonical_flags(a: &ConvertArgs, req: &Request) -> String {
    let mut f = vec![
        format!("--weights {}", req.weights),
        format!("--recipe {}", req.recipe.name),
    ];
    for o in &a.tensor_type {
        f.push(format!("--tensor-type {o}"));
    }
    if let Some(t) = &a.tensor_type_file {
        f.push(format!(
            "--tensor-type-file {}",
            t.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
    }
    if let Some(t) = req.output_type {
        f.push(format!("--output-tensor-type {t}"));
    }
    if let Some(t) = req.token_embd_type {
        f.push(format!("--token-embedding-type {t}"));
    }
    if a.strict {
        f.push("--strict".into());
    }
    if let Some(c) = &a.calib {
        let name = c
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        f.push(format!("--calib {name}"));
        if !is_hessian_file(c).unwrap_or(true) {
            f.push(format!(
                "--calib-tokens {} --calib-ctx {} --calib-batch {}",
                a.calib_tokens, a.calib_ctx, a.calib_batch
            ));
            if a.calib_sequential {
                f.push("--calib-sequential".into());
            }
        }
        if a.allow_partial_calib {
            f.push("--allow-partial-calib".into());
        }
        f.push(format!(
            "--ldlq-band {} --damp {} --ldlq-refit {}",
            a.ldlq_band, a.damp, a.ldlq_refit
        ));
    }
    if let Some(x) = a.target_bpw {
        f.push(format!("--target-bpw {x}"));
    }
    if let Some(x) = &a.target_size {
        f.push(format!("--target-size {x}"));
    }
    if a.target_bpw.is_some() || a.target_size.is_some() {
        if let Some(t) = &a.types {
            f.push(format!("--types {t}"));
        }
        f.push(format!("--mix-rows {}", a.mix_rows));
        if let Some(t) = &a.kld_text {
            let name = t
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            f.push(format!("--kld-text {name}"));
        }
        f.push(format!(
            "--kld-windows {} --kld-probes {}",
            a.kld_windows, a.kld_probes
        ));
    }
    if let Some(c) = &a.imatrix {
        let name = c
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        f.push(format!("--imatrix {name}"));
    }
    f.join(" ")
}

fn totals(plan: &Plan) -> (u64, f64, f64) {
    let (mut n, mut b, mut n2, mut b2) = (0u64, 0u64, 0u64, 0u64);
    for e in &plan.entries {
        let k: u64 = e.dims.iter().product();
        n += k;
        b += e.bytes;
        if e.dims.iter().filter(|&&d| d > 1).count() >= 2 {
            n2 += k;
            b2 += e.bytes;
        }
    }
    let per = |b: u64, n: u64| {
        if n == 0 {
            0.0
        } else {
            b as f64 * 8.0 / n as f64
        }
    };
    (n, per(b, n), per(b2, n2))
}

fn report_fallbacks(plan: &Plan) {
    let fallbacks: Vec<_> = plan.entries.iter().filter(|e| e.fallback).collect();
    for e in fallbacks.iter().take(20) {
        eprintln!(
            "tq: {}: {} -> {} ({})",
            e.name,
            e.src,
            e.dst,
            e.reasons.join("; ")
        );
    }
    if fallbacks.len() > 20 {
        eprintln!(
            "tq: ... and {} more fallbacks (see --dry-run)",
            fallbacks.len() - 20
        );
    }
    let mut requant: std::collections::BTreeMap<String, usize> = Default::default();
    for e in plan
        .entries
        .iter()
        .filter(|e| e.action == Action::Requantize)
    {
        *requant
            .entry(format!("{} -> {}", e.src, e.dst))
            .or_default() += 1;
    }
    for (k, n) in requant {
        eprintln!(
            "tq: requantizing {n} tensors {k} (already-quantized input: quality loss compounds)"
        );
    }
}

fn report_engine_issues(input: &str, issues: &[String]) {
    for i in issues.iter().take(20) {
        eprintln!("tq: warning: {input}: {i}");
    }
    if issues.len() > 20 {
        eprintln!(
            "tq: warning: {input}: ... and {} more problems engines refuse",
            issues.len() - 20
        );
    }
    if !issues.is_empty() {
        eprintln!("tq: warning: {input}: converting anyway (--strict refuses such input)");
    }
}

fn progress_bar(total: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb
}

fn print_plan(
    plan: &Plan,
    a: &ConvertArgs,
    size: u64,
    profile: &Profile,
    mix: Option<&super::mix::MixReport>,
) -> Result<()> {
    let (params, bpw, bpw2d) = totals(plan);
    let fallbacks = plan.entries.iter().filter(|e| e.fallback).count();
    if a.json {
        let tensors: Vec<_> = plan
            .entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name, "shape": e.dims, "source_type": e.src.name(), "type": e.dst.name(),
                    "action": e.action, "method": convert::method(e), "bytes": e.bytes, "fallback": e.fallback, "reasons": e.reasons,
                })
            })
            .collect();
        let j = serde_json::json!({
            "input": a.input.display().to_string(), "target": profile.name, "file_type": plan.file_type,
            "base_type": plan.base_type.name(), "file_bytes": size, "parameters": params,
            "bpw": bpw, "bpw_2d": bpw2d, "fallbacks": fallbacks, "tensors": tensors,
            "mix": mix.map(|m| m.json()),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&j).map_err(|e| Error::Usage(e.to_string()))?
        );
        return Ok(());
    }
    let names: Vec<String> = plan
        .entries
        .iter()
        .map(|e| tq::inspect::cell(&e.name))
        .collect();
    let nw = tq::inspect::column_width(&names, 4);
    println!(
        "{:nw$}  {:<16} {:<18} {:<11} {:>11}  reason",
        "tensor", "shape", "type", "action", "bytes"
    );
    for (e, name) in plan.entries.iter().zip(&names) {
        let shape = e
            .dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x");
        let ty = format!("{} -> {}", e.src, e.dst);
        let action = format!("{:?}", e.action).to_lowercase();
        println!(
            "{name:nw$}  {:<16} {:<18} {:<11} {:>11}  {}",
            shape,
            ty,
            action,
            e.bytes,
            e.reasons.join("; ")
        );
    }
    let mut by: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for e in &plan.entries {
        let x = by.entry(e.dst.name()).or_default();
        x.0 += 1;
        x.1 += e.bytes;
    }
    println!();
    for (t, (n, b)) in by {
        println!("  {t:<8} {n:>5} tensors {b:>14} bytes");
    }
    println!(
        "file: {size} bytes ({:.2} MiB), {params} parameters, {bpw:.4} bpw whole file tensors, {bpw2d:.4} bpw 2-D weights; file_type {}; {fallbacks} fallbacks (target '{}')",
        size as f64 / 1048576.0,
        plan.file_type.map(|f| f.to_string()).unwrap_or("-".into()),
        profile.name
    );
    Ok(())
}
