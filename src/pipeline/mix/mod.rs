//! `tq convert --target-bpw X | --target-size SIZE`: measure each tensor's sensitivity to each
//! candidate type, map it to KLD with a per-model fit against measured single-tensor KLDs, solve
//! the knapsack (`crate::plan::mix`) and set the plan's types; `--verify` measures the written file.
mod act;
mod best;
mod cache;
mod calibrate;
mod direct;
mod fit;
mod head;
mod measured;
mod probe;
mod report;
mod store;
mod stream;
mod substitute;
mod target;

pub use calibrate::KldCalibration;
pub use report::{MixReport, Probe, Step, Tried};
pub(crate) use store::Store;
pub use substitute::{kld_of, reference_logits};

use super::job::{Budget, CalibInput, Job};
use crate::error::{Error, Result};
use crate::plan::mix::{self, Calibration};
use crate::plan::Plan;
use crate::source::TensorSource;
use crate::types::profile::Profile;
use crate::types::TensorType;
use std::collections::BTreeMap;
use std::path::Path;

pub struct MixOpts<'a> {
    pub budget: Budget,
    pub types: Option<&'a str>,
    pub rows: usize,
    /// Of `rows`, those quantized with LDLQ (`--mix-exact-rows`; the rest by the ratio estimate).
    pub exact_rows: usize,
    /// Blocks measured with LDLQ (`--mix-exact-blocks`; 0: all): [`mix::ExactBlocks`].
    pub exact_blocks: usize,
    /// Text for the KLD fit (and `--verify`); None: no KLD prediction.
    pub kld_text: Option<&'a Path>,
    pub kld_windows: usize,
    pub probes: usize,
    pub quiet: bool,
    /// `--mix-cache FILE` and what its measurements depend on besides the candidate types.
    pub(crate) cache: Option<(&'a Path, cache::Key)>,
    /// `--calib TEXT`, streamed (with [`Calibration::Stream`] of its index): every pass that
    /// needs Hessian data calibrates block by block.
    pub(crate) stream: Option<&'a stream::TextStream>,
}

/// Choose the plan's types for the budget. `size_of(plan)` is the file size the plan gives with
/// its metadata (provenance included): the budget counts the whole file.
#[allow(clippy::too_many_arguments)]
pub fn choose(
    input: &Path,
    src: &dyn TensorSource,
    plan: &mut Plan,
    profile: &Profile,
    o: &MixOpts,
    calib: &Calibration,
    size_of: &dyn Fn(&Plan, &MixReport) -> Result<u64>,
) -> Result<MixReport> {
    let types = match o.types {
        Some(l) => mix::parse_types(l, profile)?,
        None => mix::default_candidates(profile),
    };
    let mut items = mix::items(plan, &types, profile);
    if let Some((idx, _)) = items.iter().find(|(_, t)| t.is_empty()) {
        return Err(Error::Usage(format!(
            "{}: none of the candidate types ({}) can hold its shape {:?}; add one with --types (e.g. f16)",
            plan.entries[idx[0]].name,
            types.iter().map(|t| t.name()).collect::<Vec<_>>().join(","),
            plan.entries[idx[0]].dims
        )));
    }
    let weighting = match calib {
        Calibration::File(_) | Calibration::Memory(_) | Calibration::Stream(_) => {
            "hessian (tr(dW H dW^T), LDLQ as convert)"
        }
        Calibration::Imatrix(_) => "imatrix diagonal (weighted block fit as convert)",
        Calibration::None => "identity: plain squared error (no --calib/--imatrix)",
    };
    // The measurements from --mix-cache when they were made for this model, calibration,
    // candidates and KLD text.
    let key = o.cache.as_ref().map(|(p, k)| {
        let mut k = cache::Key(k.0.clone());
        let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
        k.0.push(("types", names.join(",")));
        (*p, k)
    });
    let cached = match &key {
        Some((p, k)) => match cache::load(p, k)? {
            cache::Loaded::Hit(m) => {
                let fits = m.table.len() == items.len()
                    && m.direct.len() == items.len()
                    && m.table.iter().zip(&items).all(|(per, (idx, tys))| {
                        per.len() == idx.len() && per.iter().all(|c| c.len() == tys.len())
                    });
                if !fits {
                    return Err(Error::bad_input(
                        p,
                        "--mix-cache: its measurements do not match this model's tensors; delete it or give another file",
                    ));
                }
                if !o.quiet {
                    eprintln!(
                        "tq: --mix-cache {}: measurements reused ({} tensors' sensitivity, {} KLD probes); planning only",
                        p.display(),
                        m.table.iter().map(Vec::len).sum::<usize>(),
                        m.probes.len()
                    );
                }
                Some(m)
            }
            cache::Loaded::Miss(why) => {
                if !o.quiet {
                    eprintln!("tq: --mix-cache {}: {why}; measuring", p.display());
                }
                None
            }
        },
        None => None,
    };
    let mut rep = MixReport {
        target: 0,
        min_file: 0,
        file: 0,
        weighting,
        types: types.clone(),
        err: 0.0,
        err_se: 0.0,
        act_err: None,
        alpha: None,
        role_alpha: Default::default(),
        r2_roles: None,
        predicted: None,
        calibration: None,
        target_kld: match o.budget {
            Budget::Kld(x) => Some(x),
            _ => None,
        },
        steps: vec![],
        direct: vec![],
        pinned: vec![],
        r2: None,
        probes: vec![],
        kld_windows: o.kld_windows,
        grid: 0,
        slack: 0,
        rows: o.rows,
        exact_rows: o.exact_rows,
        sens_s: 0.0,
        fit_s: 0.0,
        dp_s: 0.0,
        best_s: 0.0,
        tried: vec![],
        chosen: None,
        ref_logits: None,
    };
    // Items none of whose tensors have calibration data (while others do): their errors are
    // not in the units of the rest, so their KLDs are measured per candidate (with a fit), or
    // they keep q8_0 (without).
    let calibrated = !matches!(calib, Calibration::None);
    let uncal: Vec<bool> = items
        .iter()
        .map(|(idx, _)| {
            calibrated
                && idx
                    .iter()
                    .all(|&i| !mix::has_weights(calib, &plan.entries[i]))
        })
        .collect();
    // An infeasible target fails before anything is measured: every tensor at its smallest
    // candidate is a lower bound of the cheapest mix (exact where members choose freely), with
    // the uncalibrated items at the type they will keep when there is no KLD fit.
    {
        let mut q = plan.clone();
        let picks: Vec<Vec<usize>> = items
            .iter()
            .zip(&uncal)
            .map(|((idx, tys), &unc)| {
                let kept = (unc && o.kld_text.is_none()).then(|| kept_uncalibrated(tys));
                idx.iter()
                    .map(|&i| {
                        let n: u64 = plan.entries[i].dims.iter().product();
                        kept.unwrap_or_else(|| {
                            (0..tys.len())
                                .min_by_key(|&k| tys[k].bytes_for(n).unwrap_or(u64::MAX))
                                .unwrap_or(0)
                        })
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<&[usize]> = picks.iter().map(Vec::as_slice).collect();
        mix::apply(&mut q, &items, &refs, "mix")?;
        rep.min_file = at_own_target(&mut rep, |r| size_of(&q, r))?;
        let target = match o.budget {
            Budget::Bytes(b) => b,
            Budget::Bpw(x) => (x * params_of(plan) as f64 / 8.0).floor() as u64,
            // Any size from the smallest file up.
            Budget::Kld(_) => u64::MAX,
        };
        if target < rep.min_file {
            return Err(Error::Usage(format!(
                "the target of {target} bytes (--target-size / --target-bpw) is below the smallest file the candidate types give ({} bytes = {:.3} bpw); raise the target or add smaller types with --types",
                rep.min_file,
                rep.min_file as f64 * 8.0 / params_of(plan) as f64
            )));
        }
    }
    let t0 = std::time::Instant::now();
    let sample = crate::quant::sensitivity::Sample {
        rows: o.rows,
        exact: o.exact_rows,
    };
    let blocks = mix::ExactBlocks::of_plan(o.exact_blocks, plan);
    if cached.is_none() && !blocks.all() && !o.quiet {
        let l = blocks.list();
        eprintln!(
            "tq: mix: sensitivity with LDLQ in {} of {} blocks ({}); the other blocks' tensors estimated from {}-column diagonal blocks of their Hessians, scaled by the measured blocks' ratios (--mix-exact-blocks)",
            l.len(),
            blocks.n_layer,
            l.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", "),
            blocks.chunk
        );
    }
    if let (None, Some((wide, _)), false) = (&cached, blocks.wide_tensors(plan), o.quiet) {
        eprintln!(
            "tq: mix: {wide} tensors wider than {} columns estimated from diagonal blocks of their Hessians in every block, scaled by the other tensors' ratios (their whole LDLQ factor is the conversion's; it is not built twice)",
            blocks.wide
        );
    }
    let mut table = match &cached {
        Some(m) => m.table.clone(),
        None => {
            let mut pb = super::progress::steps(o.quiet, items.len() as u64, "sensitivity");
            let t = match (calib, o.stream) {
                (Calibration::Stream(_), Some(s)) => {
                    s.sensitivity(src, plan, &items, sample, blocks, &mut |d| {
                        pb.set_position(d as u64)
                    })?
                }
                _ => mix::measure(src, plan, &items, calib, sample, blocks, &|d, _| {
                    pb.set_position(d as u64)
                })?,
            };
            pb.finish_and_clear();
            t
        }
    };
    // The activation-rounding term (act.rs), measured on the KLD text with the table and kept
    // in it (and in the cache): the fit and the knapsack price it with the weight error.
    let act = match (&cached, o.kld_text) {
        (Some(m), _) => m.act.clone(),
        // MoE models only under `TQ_MIX_ACT=all` (act::Mode), each expert stack per expert.
        (None, Some(text)) if act::Mode::from_env().measures(act::has_experts(plan, &items)) => {
            let a = act::table(
                input,
                src,
                plan,
                &items,
                &uncal,
                text,
                o.kld_windows,
                o.rows,
                o.quiet,
            )?;
            for (per, ad) in table.iter_mut().zip(&a) {
                for (m, am) in per.iter_mut().zip(ad) {
                    for (e, x) in m.iter_mut().zip(am) {
                        e.err += x;
                    }
                }
            }
            Some(a)
        }
        _ => None,
    };
    rep.sens_s = t0.elapsed().as_secs_f64();

    let t1 = std::time::Instant::now();
    let mut direct: Vec<Option<Vec<f64>>> = vec![None; items.len()];
    let bpw = match o.budget {
        Budget::Bpw(x) => Some(x),
        Budget::Bytes(b) => Some(b as f64 * 8.0 / params_of(plan) as f64),
        Budget::Kld(_) => None,
    };
    let lazy = direct::Lazy::of(plan, &items, &uncal, bpw, !blocks.all());
    if let Some(m) = &cached {
        rep.probes = m.probes.clone();
        rep.direct = m.direct_report.clone();
        direct = m.direct.clone();
        rep.alpha = m.alpha;
        rep.role_alpha = m.role_alpha.clone();
        rep.r2 = m.r2;
        rep.r2_roles = m.r2_roles;
    } else if let Some(text) = o.kld_text {
        fit::fit(
            input,
            src,
            plan,
            profile,
            &items,
            &table,
            &uncal,
            calib,
            o,
            text,
            &mut rep,
            &mut direct,
            lazy.as_ref(),
        )?;
    }
    if let (Some((p, k)), None) = (&key, &cached) {
        let m = cache::Measured {
            table: table.clone(),
            probes: rep.probes.clone(),
            direct: direct.clone(),
            direct_report: rep.direct.clone(),
            alpha: rep.alpha,
            role_alpha: rep.role_alpha.clone(),
            r2: rep.r2,
            r2_roles: rep.r2_roles,
            plans: Default::default(),
            predicted: Default::default(),
            plan_types: Default::default(),
            act: act.clone(),
        };
        cache::save(p, k, &m)?;
    }
    if rep.alpha.is_none() {
        direct.iter_mut().for_each(|d| *d = None);
        rep.direct.clear();
        for (it, (idx, tys)) in items.iter_mut().enumerate() {
            if !uncal[it] {
                continue;
            }
            let k = kept_uncalibrated(tys);
            let keep = tys[k];
            table[it].iter_mut().for_each(|m| *m = vec![m[k]]);
            *tys = vec![keep];
            rep.pinned.push((plan.entries[idx[0]].name.clone(), keep));
        }
    }
    rep.fit_s = t1.elapsed().as_secs_f64();

    let global = rep.alpha.unwrap_or(1.0);
    let role_alpha = rep.role_alpha.clone();
    let alpha_of = |name: &str| *role_alpha.get(mix::role_of(name)).unwrap_or(&global);
    let mut opts = mix::options(plan, &items, &table, &direct, &alpha_of);
    let mut pairs = mix::costs(&opts);
    let params = params_of(plan);
    // The whole file: fixed tensors, metadata and padding are what the plan's size adds to the
    // mixed tensors' bytes (measured on the cheapest mix, then corrected until it fits).
    let cheapest: Vec<usize> = pairs
        .iter()
        .map(|o| (0..o.len()).min_by_key(|&k| o[k].0).unwrap_or(0))
        .collect();
    // Whole plans measured so far (the cache's, then this run's): their KLDs, and the summed
    // predictions of those the fit prices — the calibration's points.
    let mut known = cached.as_ref().map(|m| m.plans.clone()).unwrap_or_default();
    let mut sums = cached
        .as_ref()
        .map(|m| m.predicted.clone())
        .unwrap_or_default();
    let mut plan_types = cached
        .as_ref()
        .map(|m| m.plan_types.clone())
        .unwrap_or_default();
    let points = |known: &BTreeMap<String, f64>, sums: &BTreeMap<String, f64>| {
        calibrate::points(known, sums)
    };
    rep.calibration = KldCalibration::fit_except(&points(&known, &sums), None);
    // Set a choice on the plan and the report (its provenance strings count in the size).
    // Which items are priced by direct KLDs (their values may grow, not this).
    let measured: Vec<Option<Vec<f64>>> =
        direct.iter().map(|d| d.as_ref().map(|_| vec![])).collect();
    let set = |plan: &mut Plan, rep: &mut MixReport, opts: &[Vec<mix::Opt>], choice: &[usize]| {
        let picks: Vec<&[usize]> = opts
            .iter()
            .zip(choice)
            .map(|(o, &k)| o[k].pick.as_slice())
            .collect();
        mix::apply(plan, &items, &picks, "mix")?;
        // The calibrated tensors' summed error (direct items are in KLD already).
        rep.err = table
            .iter()
            .zip(&picks)
            .zip(&measured)
            .filter(|(_, d)| d.is_none())
            .map(|((per, pick), _)| {
                per.iter()
                    .zip(pick.iter())
                    .map(|(m, &k)| m[k].err)
                    .sum::<f64>()
            })
            .sum();
        rep.act_err = act
            .as_ref()
            .and_then(|a| act::of_plan(plan, &items, &measured, a));
        let cost: f64 = opts.iter().zip(choice).map(|(o, &k)| o[k].cost).sum();
        rep.predicted = rep.alpha.map(|_| cost);
        size_of(plan, rep)
    };
    set(plan, &mut rep, &opts, &cheapest)?;
    rep.min_file = at_own_target(&mut rep, |r| size_of(plan, r))?;
    let too_small = |rep: &MixReport| {
        Error::Usage(format!(
            "the target of {} bytes (--target-size / --target-bpw) is below the smallest file the candidate types give ({} bytes = {:.3} bpw); raise the target or add smaller types with --types",
            rep.target,
            rep.min_file,
            rep.min_file as f64 * 8.0 / params as f64
        ))
    };
    let mixed_min = mix::min_bytes(&pairs);
    // One size for a byte budget; for --target-kld, sizes until the best measured is at most X.
    loop {
        let t2 = std::time::Instant::now();
        let mut pb = super::progress::steps(o.quiet, 1, "knapsack");
        rep.target = match o.budget {
            Budget::Bytes(b) => b,
            Budget::Bpw(x) => (x * params as f64 / 8.0).floor() as u64,
            Budget::Kld(x) => {
                let cal = KldCalibration::fit_except(&points(&known, &sums), None);
                // A step up: at least MIN_STEP above the size measured last.
                let at_least = rep.steps.last().map_or(0, |s| {
                    s.target + ((s.target as f64 * target::MIN_STEP) as u64).max(1)
                });
                let overhead = rep.min_file.saturating_sub(mixed_min);
                let found = target::size_for(&pairs, overhead, cal.as_ref(), x, at_least);
                let last = rep.steps.last().cloned();
                match (found, last) {
                    (Ok(t), None) => t,
                    (Ok(t), Some(s)) if t > s.target => t,
                    (Ok(_), Some(s)) => {
                        rep.cleanup();
                        return Err(Error::Usage(format!(
                            "--target-kld {x}: the largest mix the candidate types give ({} bytes) measured KLD {:.5} on the --kld-text windows, above the target; raise --target-kld or add larger types with --types",
                            s.file, s.measured
                        )));
                    }
                    (Err((best, bytes)), last) => {
                        rep.cleanup();
                        let after = last.map_or(String::new(), |s| {
                            format!(
                                " (measured {:.5} at {} bytes, calibrated on it)",
                                s.measured, s.file
                            )
                        });
                        return Err(Error::Usage(format!(
                            "--target-kld {x}: the least KLD the candidate types reach is predicted {best:.5} (every tensor at its largest candidate, {bytes} bytes){after}; raise --target-kld or add larger types with --types"
                        )));
                    }
                }
            }
        };
        if rep.target < rep.min_file {
            return Err(too_small(&rep));
        }
        let mut budget = rep.target - (rep.min_file - mixed_min);
        // token_embd's candidates near this size's pick (direct.rs).
        if let (Some(l), Some(text), Some(_)) = (&lazy, o.kld_text, rep.alpha) {
            let c = direct::Ctx {
                input,
                src,
                profile,
                calib,
                o,
                text,
            };
            if l.complete(
                &c,
                plan,
                &items,
                &table,
                &mut direct,
                &alpha_of,
                budget,
                &mut rep,
            )? {
                opts = mix::options(plan, &items, &table, &direct, &alpha_of);
                pairs = mix::costs(&opts);
            }
        }
        let mut sol;
        let mut tries = 0;
        loop {
            sol = match mix::solve(&pairs, budget, mix::GRID_CELLS) {
                Some(s) => s,
                None => {
                    // Metadata took the room: the cheapest mix (measured to fit) it is.
                    rep.min_file = set(plan, &mut rep, &opts, &cheapest)?;
                    let b = pairs.iter().zip(&cheapest).map(|(o, &k)| o[k].0).sum();
                    mix::solve(&pairs, b, 1).ok_or_else(|| too_small(&rep))?
                }
            };
            rep.file = set(plan, &mut rep, &opts, &sol.choice)?;
            if rep.file <= rep.target {
                break;
            }
            // Metadata grew with longer type names or numbers: take the excess off and solve
            // again.
            tries += 1;
            if tries > 8 || budget < mixed_min {
                return Err(too_small(&rep));
            }
            budget -= (rep.file - rep.target).min(budget);
        }
        rep.err_se = table
            .iter()
            .zip(&opts)
            .zip(&sol.choice)
            .map(|((per, o), &k)| {
                per.iter()
                    .zip(&o[k].pick)
                    .map(|(m, &t)| m[t].se * m[t].se)
                    .sum::<f64>()
            })
            .sum::<f64>()
            .sqrt();
        rep.grid = sol.grid;
        rep.slack = sol.slack;
        pb.set_position(1);
        pb.finish_and_clear();
        rep.dp_s += t2.elapsed().as_secs_f64();
        let Some(text) = o.kld_text else {
            return Ok(rep);
        };
        let t3 = std::time::Instant::now();
        let r = best::best_of_few(
            &best::BestOf {
                input,
                src,
                profile,
                o,
                calib,
                items: &items,
                table: &table,
                lazy: lazy.as_ref(),
                alpha_of: &alpha_of,
                global,
                calibrated,
                budget,
                text,
                size_of,
                act: act.as_deref(),
            },
            plan,
            &mut rep,
            &mut known,
            &mut sums,
            &mut plan_types,
            &mut direct,
        );
        if let Err(e) = r {
            rep.cleanup();
            return Err(e);
        }
        if let Some((p, k)) = &key {
            // The measured plans join the cache's measurements (a cold run saved them above).
            if let cache::Loaded::Hit(mut m) = cache::load(p, k)? {
                let before = (m.plans.len(), m.predicted.len(), m.plan_types.len());
                m.plans.extend(known.iter().map(|(k, v)| (k.clone(), *v)));
                m.predicted
                    .extend(sums.iter().map(|(k, v)| (k.clone(), *v)));
                m.plan_types
                    .extend(plan_types.iter().map(|(k, v)| (k.clone(), v.clone())));
                // token_embd's candidates measured since (direct.rs).
                let more = rep.alpha.is_some() && m.direct_report.len() != rep.direct.len();
                if more {
                    m.direct = direct.clone();
                    m.direct_report = rep.direct.clone();
                }
                if more || (m.plans.len(), m.predicted.len(), m.plan_types.len()) != before {
                    cache::save(p, k, &m)?;
                }
            }
        }
        rep.best_s += t3.elapsed().as_secs_f64();
        let Budget::Kld(x) = o.budget else {
            return Ok(rep);
        };
        let t = &rep.tried[rep.chosen.unwrap_or(0)];
        let step = report::Step {
            target: rep.target,
            file: rep.file,
            plan: t.name.clone(),
            predicted: rep.predicted_calibrated(),
            measured: t.kld,
        };
        let ok = step.measured <= x;
        if !o.quiet {
            eprintln!(
                "tq: --target-kld {x}: size {} of at most {}: {} bytes ({:.3} bpw), {}, predicted {}, measured {:.5} on {} windows: {}",
                rep.steps.len() + 1,
                target::MAX_SIZES,
                step.file,
                step.file as f64 * 8.0 / params as f64,
                step.plan,
                step.predicted.map_or("-".into(), |p| format!("{p:.5}")),
                step.measured,
                o.kld_windows,
                if ok { "at most the target" } else { "above the target; a larger size" }
            );
        }
        rep.steps.push(step);
        if ok {
            return Ok(rep);
        }
        if rep.steps.len() >= target::MAX_SIZES {
            rep.cleanup();
            let s = rep.steps.last().expect("a step");
            return Err(Error::Usage(format!(
                "--target-kld {x}: after {} sizes the least measured KLD is {:.5} at {} bytes (on the --kld-text windows); raise --target-kld, or give --target-size above {} bytes",
                rep.steps.len(),
                s.measured,
                s.file,
                s.file
            )));
        }
    }
}

/// The candidate an item without calibration data keeps when there is no KLD fit: q8_0, else
/// the last (largest) candidate.
fn kept_uncalibrated(tys: &[TensorType]) -> usize {
    tys.iter()
        .position(|t| *t == TensorType::Q8_0)
        .unwrap_or(tys.len().saturating_sub(1))
}

/// The plan's parameters (every tensor's elements).
fn params_of(plan: &Plan) -> u64 {
    plan.entries
        .iter()
        .map(|e| e.dims.iter().product::<u64>())
        .sum()
}

/// Two plans give every tensor the same type.
fn same_types(a: &Plan, b: &Plan) -> bool {
    a.entries
        .iter()
        .zip(&b.entries)
        .all(|(x, y)| x.dst == y.dst)
}

/// Choose the mix for `job`'s budget: calibration data loaded as convert will use it (a text is
/// calibrated on block by block in each pass that needs Hessians, [`stream`], and the
/// conversion calibrates again as it writes; with [`super::ConvertFlags::mix_in_memory`] it is
/// calibrated on once, in memory, and the Hessians handed on to the conversion), sensitivity,
/// fit, DP. Sets the plan's types and base type. With `--mix-cache`, also returns the store of
/// the encodings the measured plans kept.
pub(crate) fn run(
    job: &Job,
    budget: Budget,
    src: &dyn TensorSource,
    plan: &mut Plan,
) -> Result<(MixReport, Option<crate::quant::Hessians>, Option<Store>)> {
    let a = &job.flags;
    let mut file = None;
    let mut mem = None;
    let mut text = None;
    let mut im = None;
    match &job.calib {
        CalibInput::Hessians { path, .. } => {
            file = Some(crate::quant::HessianFile::open(path)?.0)
        }
        CalibInput::Text { .. } if !a.dry_run && a.mix_in_memory => {
            let o = job.text_options().expect("text calibration");
            let p = job.calib.path().expect("a path");
            mem = Some(crate::calib::input::calibrate_text(
                &a.input,
                &job.profile,
                p,
                &o,
            )?);
        }
        CalibInput::Text { .. } if !a.dry_run => {
            let o = job.text_options().expect("text calibration");
            let p = job.calib.path().expect("a path");
            text = Some(stream::TextStream::new(&a.input, &job.profile, p, &o)?);
        }
        CalibInput::Text { path, .. } => {
            return Err(Error::Usage(format!(
                "tq convert --dry-run with a mix: calibrate first (tq calib {} --text {} -o H.safetensors) and give --calib H.safetensors",
                a.input.display(),
                path.display()
            )))
        }
        CalibInput::None => {}
    }
    if let Some(p) = &job.flags.imatrix {
        im = Some(crate::calib::imatrix::load(p)?.entries);
    }
    let calib = match (&file, &mem, &text, &im) {
        (Some(f), ..) => Calibration::File(f),
        (_, Some(h), ..) => Calibration::Memory(h),
        (_, _, Some(t), _) => Calibration::Stream(&t.index),
        (.., Some(m)) => Calibration::Imatrix(m),
        _ => Calibration::None,
    };
    let cache = match &a.mix_cache {
        Some(p) => Some((p.as_path(), cache::key_of(job)?)),
        None => None,
    };
    let o = MixOpts {
        cache,
        stream: text.as_ref(),
        budget,
        types: a.types.as_deref(),
        rows: a.mix_rows.max(1),
        exact_rows: a.mix_exact_rows.max(1),
        exact_blocks: a.mix_exact_blocks,
        kld_text: job.kld_text.as_deref(),
        kld_windows: a.kld_windows,
        probes: a.kld_probes,
        quiet: a.quiet,
    };
    // The file the plan gives: provenance and the marks convert will add (ldlq / imatrix)
    // change the metadata's length, so they are counted.
    let size_of = |p: &Plan, rep: &MixReport| -> Result<u64> {
        super::job::file_size_of(job, src, p, &calib, im.as_ref(), rep.provenance())
    };
    let rep = choose(&a.input, src, plan, &job.profile, &o, &calib, &size_of)?;
    // The base type (general.file_type) of a mix: its most common type by elements.
    let mut by: std::collections::BTreeMap<TensorType, u64> = Default::default();
    for e in plan.entries.iter().filter(|e| e.dims.len() >= 2) {
        *by.entry(e.dst).or_default() += e.dims.iter().product::<u64>();
    }
    if let Some((t, _)) = by.into_iter().max_by_key(|(_, n)| *n) {
        plan.base_type = t;
        plan.file_type = job.profile.file_type_of(t);
    }
    // The encodings the measured plans kept beside the cache, for the conversion to write as
    // they are (a tensor whose bytes depend on anything else is not found there).
    let kept = match &o.cache {
        Some((p, k)) if !a.dry_run => Some(Store::open(p, k)?),
        _ => None,
    };
    Ok((rep, mem, kept))
}

/// The smallest file's size as a run asking for exactly that size writes it: the report's target
/// is in the header (`tq.mix.target_bytes`), so its digits can move the padding. The size at a
/// target equal to itself: a fixed point, reached in a step or two (the larger if it alternates).
fn at_own_target(rep: &mut MixReport, size: impl Fn(&MixReport) -> Result<u64>) -> Result<u64> {
    let keep = rep.target;
    let mut m = size(rep)?;
    for _ in 0..4 {
        rep.target = m;
        let n = size(rep)?;
        if n == m {
            break;
        }
        m = m.max(n);
    }
    rep.target = keep;
    Ok(m)
}
