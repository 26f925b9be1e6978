//! [`convert`]: one resolved [`Job`] through the whole pipeline — source → plan → (mix) →
//! calibrate → quantize → write → (verify) — returning what happened for the caller to print.

use super::job::{CalibInput, Job};
use super::mix;
use super::{Done, Outcome};
use crate::calib::sequential::SeqQuant;
use crate::convert::{self, Calib};
use crate::error::{Error, Result};
use crate::plan::{self, Plan};
use std::path::Path;

/// Run `job`. Warnings (engine problems, fallbacks) and progress go to stderr unless `--quiet`.
pub fn convert(job: &Job) -> Result<Outcome> {
    let a = &job.flags;
    let src = crate::source::open(&a.input, &job.profile)?;
    let request = job.request_for(src.as_ref())?;
    plan::check_overrides(src.tensors(), &request)?;
    let mut plan = plan::plan(src.tensors(), &request, &job.profile)?;
    if let Some(p) = job.preset {
        plan.file_type = Some(p.file_type);
    }
    plan.ldlq = job.flags.ldlq;
    refuse_foreign_calibration(job, &plan)?;
    // What would make engines refuse the output: warnings, or (--strict) an error now.
    // Printed under --quiet too: a warning, not a notice.
    let issues = plan::check_engine(src.as_ref(), a.strict)?;
    super::report::engine_issues(&src.name(), &issues);
    let mut mix = None;
    let mut pre = None;
    let mut kept = None;
    if let Some(b) = job.budget {
        let (rep, h, k) = mix::run(job, b, src.as_ref(), &mut plan)?;
        pre = h;
        mix = Some(rep);
        kept = k;
    }
    let seq_now = SeqQuant::from_plan(&plan, job.request.weights.name(), job.request.recipe.name);
    // Dropped at the end whatever happens: the mix's temporary folder.
    let _cleanup = Cleanup(mix.as_ref().and_then(|m| m.ref_logits.clone()));
    let mut loaded = load_calibration(job, &mut plan, &seq_now, pre)?;
    if let Some(p) = &job.flags.imatrix {
        let im = crate::calib::imatrix::load(p)?;
        plan::assign_importance(&mut plan, &im.entries);
    }
    let prov = super::job::provenance(
        job,
        mix.as_ref().map(|m| m.provenance()).unwrap_or_default(),
    );
    // general.file_type describes the tensors written, with or without provenance.
    let md = convert::output_metadata(
        src.metadata(),
        &plan,
        prov.as_ref(),
        !job.request.keep_types,
    );
    let version = src.gguf_version();
    let size =
        crate::gguf::writer::file_size(version, &md, &convert::tensor_specs(&plan, &job.profile))?;
    if let Some(m) = &mix {
        // The mix measured this size; a difference is a bug, caught before writing.
        if size > m.target {
            return Err(Error::internal(format!(
                "tq convert: the mix came to {size} bytes, over the target {}",
                m.target
            )));
        }
        if !a.quiet && !a.json {
            for l in m.lines() {
                eprintln!("{l}");
            }
        }
    }
    let out = match (&job.output, a.dry_run) {
        (Some(o), false) => o.clone(),
        _ => {
            return Ok(Outcome {
                plan,
                size,
                mix,
                done: Done::DryRun,
            })
        }
    };
    if !a.quiet {
        super::report::fallbacks(&plan);
    }
    if let Some(shard) = job.shard {
        let hessians = match &loaded {
            Loaded::File(file) => Some(file),
            Loaded::None => None,
            // Refused before calibrating (Job::resolve); kept an error, not a panic.
            _ => {
                return Err(Error::Usage(
                    "tq convert --shard: --calib must be a Hessian file".into(),
                ))
            }
        };
        let fj = crate::shard::fragment::Job {
            src: src.as_ref(),
            plan: &plan,
            metadata: &md,
            version,
            profile: &job.profile,
            input: &a.input,
            hash_input: prov.is_some(),
            hessians,
            shard,
            out: &out,
        };
        let t0 = std::time::Instant::now();
        let w = crate::shard::fragment::write(&fj, &|_| {})?;
        let line = super::report::shard(&fj, &w, t0.elapsed().as_secs_f64());
        return Ok(Outcome {
            plan,
            size,
            mix,
            done: Done::Shard(line),
        });
    }
    // `--verify` measures against reference logits of the input on `--kld-text` (the mix's when it
    // made them). Made before anything is written, so a text too short or unreadable stops the run
    // with nothing written; removed when this returns, whatever happens.
    let verify_ref = match (&job.kld_text, a.verify) {
        (Some(text), true) => Some(match mix.as_ref().and_then(|m| m.ref_logits.clone()) {
            Some(r) => (r, Cleanup(None), 0.0),
            None => {
                let t = std::time::Instant::now();
                let r =
                    std::env::temp_dir().join(format!("tq-verify-{}.logits", std::process::id()));
                let rm = Cleanup(Some(r.clone()));
                mix::reference_logits(&a.input, text, job.flags.kld_windows, &r, a.quiet)?;
                (r, rm, t.elapsed().as_secs_f64())
            }
        }),
        _ => None,
    };
    let mut pb = super::progress::bytes(a.quiet, size);
    let t0 = std::time::Instant::now();
    let cp = convert::Checkpoints {
        resume: a.resume,
        key: job.checkpoint_key(),
        quiet: a.quiet,
    };
    // The mix's kept encodings (`--mix-cache`): a tensor found there is written as it is.
    let from_kept = |i: usize| kept.as_ref().and_then(|s| s.get(&plan, i));
    let target = convert::Target {
        src: src.as_ref(),
        plan: &plan,
        metadata: &md,
        version,
        profile: &job.profile,
        out: &out,
        hash_input: prov.as_ref().map(|_| a.input.as_path()),
        cp: &cp,
        prepared: kept.as_ref().map(|_| &from_kept as &convert::Prepared),
    };
    let progress = |d| pb.set_position(d);
    let calib = match &mut loaded {
        Loaded::None => Calib::None,
        Loaded::Hessians(h) => Calib::Hessians(std::mem::take(h)),
        Loaded::File(f) => Calib::File(f),
        Loaded::Stream {
            file,
            windows,
            sequential,
        } => {
            let o = job.text_options().expect("text calibration");
            Calib::Stream(convert::StreamCalib {
                model: &a.input,
                file,
                windows,
                ctx: o.ctx,
                batch: o.batch,
                quiet: a.quiet,
                sequential: sequential.then_some(&seq_now),
            })
        }
    };
    let stats = convert::execute(&target, calib, &progress)?;
    pb.finish_and_clear();
    if let (Some(s), false) = (&kept, a.quiet) {
        eprintln!(
            "tq: --mix-cache: {} of {} tensors written from the measured plans' encodings",
            s.hits(),
            stats.tensors_converted
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    let verified = match &verify_ref {
        Some((r, _, ref_secs)) => {
            let t = std::time::Instant::now();
            let k = mix::kld_of(&out, r, job.flags.kld_windows, "verify", a.quiet)?;
            Some((k, ref_secs + t.elapsed().as_secs_f64()))
        }
        None => None,
    };
    drop(verify_ref);
    Ok(Outcome {
        plan,
        size,
        mix,
        done: Done::Written {
            stats,
            secs,
            verified,
        },
    })
}

/// Removes a temporary file when dropped, and its folder when that is one of ours (`tq-mix-PID`,
/// the mix's) and empties.
struct Cleanup(Option<std::path::PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(r) = &self.0 else { return };
        if let Err(e) = std::fs::remove_file(r) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!(
                    "tq: warning: {}: could not remove this temporary file ({e}); delete it",
                    r.display()
                );
            }
        }
        if let Some(d) = r.parent().filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tq-mix-"))
        }) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The calibration data a conversion writes with.
enum Loaded {
    None,
    /// Hessians a mix calibrated in memory (`--target-bpw` with `--calib TEXT`).
    Hessians(crate::quant::Hessians),
    File(crate::quant::HessianFile),
    /// `--calib TEXT`: calibrated block by block while writing.
    Stream {
        file: crate::gguf::GgufFile,
        windows: Vec<u32>,
        sequential: bool,
    },
}

/// `--calib`: a Hessian file is opened (with a warning when sequential Hessians were made for
/// another quantization); a text file is calibrated on while writing, block by block; not under
/// --dry-run. Either way the plan's tensors are marked for LDLQ before anything is written.
fn load_calibration(
    job: &Job,
    plan: &mut Plan,
    now: &SeqQuant,
    pre: Option<crate::quant::Hessians>,
) -> Result<Loaded> {
    let a = &job.flags;
    if let Some(hessians) = pre {
        // A mix calibrated on the text already: the same Hessians, not a second run.
        plan::assign_ldlq(plan, &hessians, &job.flags.ldlq);
        return Ok(Loaded::Hessians(hessians));
    }
    Ok(match &job.calib {
        CalibInput::Text { path, .. } if a.dry_run => {
            if !a.quiet {
                eprintln!(
                    "tq: --dry-run: calibration on {} not run; TQ tensors would be quantized with LDLQ",
                    path.display()
                );
            }
            Loaded::None
        }
        CalibInput::Text {
            path, sequential, ..
        } => {
            let o = job.text_options().expect("text calibration");
            let (file, windows) =
                crate::calib::input::text_windows(&a.input, &job.profile, path, &o)?;
            let expected = crate::calib::stream::expected(&file, windows.len() as u64)?;
            plan::assign_ldlq(plan, &expected, &job.flags.ldlq);
            Loaded::Stream {
                file,
                windows,
                sequential: *sequential,
            }
        }
        CalibInput::Hessians {
            path,
            allow_partial,
        } => {
            let (file, meta) = crate::quant::HessianFile::open(path)?;
            if !allow_partial {
                refuse_partial(path, &meta)?;
            }
            if let Some(d) = crate::calib::sequential::mismatch(&meta, now) {
                eprintln!(
                    "tq: warning: {}: sequential Hessians were computed for another quantization ({d}); blocks after the first saw activations of a model this conversion does not write (rerun tq calib --sequential with matching flags)",
                    path.display()
                );
            }
            plan::assign_ldlq(plan, &file.index, &job.flags.ldlq);
            Loaded::File(file)
        }
        CalibInput::None => Loaded::None,
    })
}

/// `--calib H.safetensors` and `--imatrix` made for another model (a tensor the input does not
/// have, or other row lengths) are refused before any work (headers only for the Hessians).
fn refuse_foreign_calibration(job: &Job, plan: &Plan) -> Result<()> {
    if let CalibInput::Hessians { path, .. } = &job.calib {
        let (file, _) = crate::quant::HessianFile::open(path)?;
        plan::check_calibration_file(
            plan,
            path,
            "Hessian",
            "make one for this model with tq calib",
            file.index
                .groups
                .values()
                .flat_map(|g| g.tensors.iter().map(move |t| (t.as_str(), g.n))),
        )?;
    }
    if let Some(p) = &job.flags.imatrix {
        let im = crate::calib::imatrix::load(p)?;
        plan::check_calibration_file(
            plan,
            p,
            "imatrix entry",
            "make one for this model (llama-imatrix, or tq calib --imatrix-out)",
            im.entries.iter().map(|(k, v)| (k.as_str(), v.len())),
        )?;
    }
    Ok(())
}

/// A Hessian file `tq calib` was interrupted while writing (`tq.complete = "false"`) is refused,
/// naming how far it got and how to finish it.
fn refuse_partial(p: &Path, meta: &std::collections::BTreeMap<String, String>) -> Result<()> {
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
