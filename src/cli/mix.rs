//! `tq convert --target-bpw X | --target-size SIZE`: measure each tensor's sensitivity to each
//! candidate type, map it to KLD with a per-model fit against measured single-tensor KLDs, solve
//! the knapsack (`tq::plan::mix`) and set the plan's types; `--verify` measures the written file.
use std::path::{Path, PathBuf};
use tq::convert;
use tq::error::{Error, Result};
use tq::eval::logits_file::Format;
use tq::eval::{evaluate, session, Reference};
use tq::gguf::GgufFile;
use tq::model::{Model, Numerics};
use tq::plan::mix::{self, Calibration};
use tq::plan::{self, Action, Plan, Request};
use tq::quant::sensitivity::Estimate;
use tq::source::TensorSource;
use tq::tokenizer::input::Input;
use tq::types::profile::Profile;
use tq::types::TensorType;

/// The byte budget asked for.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    Bpw(f64),
    Bytes(u64),
}

/// `100MB` (10⁶), `100MiB` (2²⁰), `1.5GB`, `105466560` (bytes).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        _ => f64::NAN,
    };
    match num.parse::<f64>() {
        Ok(v) if v > 0.0 && mult.is_finite() && (v * mult) < 1e18 => Ok((v * mult).floor() as u64),
        _ => Err(Error::Usage(format!(
            "--target-size '{s}': expected bytes or a size like 100MB, 95MiB, 1.5GB"
        ))),
    }
}

pub struct MixOpts<'a> {
    pub budget: Budget,
    pub types: Option<&'a str>,
    pub rows: usize,
    /// Text for the KLD fit (and `--verify`); None: no KLD prediction.
    pub kld_text: Option<&'a Path>,
    pub kld_windows: usize,
    pub probes: usize,
    pub band: usize,
    pub damp: f64,
    pub quiet: bool,
}

/// One measured single-tensor KLD of the fit.
pub struct Probe {
    pub tensor: String,
    pub ty: TensorType,
    pub err: f64,
    pub kld: f64,
}

pub struct MixReport {
    pub target: u64,
    pub min_file: u64,
    pub file: u64,
    pub weighting: &'static str,
    pub types: Vec<TensorType>,
    pub err: f64,
    /// Standard error of `err` from the row sample.
    pub err_se: f64,
    pub alpha: Option<f64>,
    /// Per-role slopes (`attn_v.weight` → α), from that role's probes; other roles use `alpha`.
    pub role_alpha: std::collections::BTreeMap<String, f64>,
    /// R² of the per-role predictions over the probes (in-sample).
    pub r2_roles: Option<f64>,
    /// Predicted KLD of the chosen mix: `α × error` plus the measured KLDs of direct items.
    pub predicted: Option<f64>,
    /// Tensors without calibration data (token_embd, which SmolLM2-like models also use as
    /// the output head): their candidates' KLDs measured one by one, `(tensor, type, KLD)`.
    pub direct: Vec<(String, TensorType, f64)>,
    /// Tensors without calibration data kept at one type because there was no fit.
    pub pinned: Vec<(String, TensorType)>,
    pub r2: Option<f64>,
    pub probes: Vec<Probe>,
    pub kld_windows: usize,
    pub grid: u64,
    pub slack: u64,
    pub rows: usize,
    pub sens_s: f64,
    pub fit_s: f64,
    pub dp_s: f64,
    /// The reference logits of the fit windows (kept for `--verify`).
    pub ref_logits: Option<PathBuf>,
}

impl MixReport {
    /// Remove the fit's temporary folder (reference logits).
    pub fn cleanup(&self) {
        if let Some(r) = &self.ref_logits {
            let _ = std::fs::remove_file(r);
            if let Some(d) = r.parent() {
                let _ = std::fs::remove_dir(d);
            }
        }
    }

    pub fn predicted_kld(&self) -> Option<f64> {
        self.predicted
    }

    pub fn provenance(&self) -> Vec<(String, String)> {
        let fit = match (self.alpha, self.r2) {
            (Some(a), Some(r)) => format!(
                "kld = {a:.6e} x error; R2 {r:.3} over {} single-tensor KLDs on {} windows",
                self.probes.len(),
                self.kld_windows
            ),
            _ => "none (no --kld-text): the mix minimizes the summed weighted error".into(),
        };
        vec![
            ("tq.mix.target_bytes".into(), self.target.to_string()),
            ("tq.mix.weighting".into(), self.weighting.into()),
            (
                "tq.mix.types".into(),
                self.types
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("tq.mix.error".into(), format!("{:.6e}", self.err)),
            ("tq.mix.fit".into(), fit),
            (
                "tq.mix.predicted_kld".into(),
                self.predicted_kld()
                    .map_or("none".into(), |k| format!("{k:.5}")),
            ),
        ]
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "target_bytes": self.target, "min_bytes": self.min_file, "file_bytes": self.file,
            "weighting": self.weighting, "types": self.types.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "error": self.err, "error_se": self.err_se, "alpha": self.alpha, "r2": self.r2, "role_alpha": self.role_alpha, "r2_roles": self.r2_roles,
            "predicted_kld": self.predicted_kld(), "kld_windows": self.kld_windows,
            "probes": self.probes.iter().map(|p| serde_json::json!({"tensor": p.tensor, "type": p.ty.name(), "error": p.err, "kld": p.kld})).collect::<Vec<_>>(),
            "direct": self.direct.iter().map(|(n, t, k)| serde_json::json!({"tensor": n, "type": t.name(), "kld": k})).collect::<Vec<_>>(),
            "pinned": self.pinned.iter().map(|(n, t)| serde_json::json!({"tensor": n, "type": t.name()})).collect::<Vec<_>>(),
            "grid_bytes": self.grid, "slack_bytes": self.slack, "rows_sampled": self.rows,
            "sensitivity_seconds": self.sens_s, "fit_seconds": self.fit_s, "dp_seconds": self.dp_s,
        })
    }

    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "mix: {} bytes for a target of {} (cheapest candidate mix {}); grid {} bytes, worst-case slack {} bytes",
            self.file, self.target, self.min_file, self.grid, self.slack
        )];
        v.push(format!(
            "mix: weighting {}; summed error {:.4e} ± {:.1e} (row sample of {} per tensor)",
            self.weighting, self.err, self.err_se, self.rows
        ));
        match (self.alpha, self.r2) {
            (Some(a), Some(r)) => {
                v.push(format!(
                    "mix: predicted KLD {:.5} (fit ln KLD = ln alpha + ln error, alpha per role ({} roles), R2 of ln KLD {}; one alpha for all: {a:.4e}, R2 {r:.3}; {} single-tensor KLDs on {} windows)",
                    self.predicted.unwrap_or(a * self.err),
                    self.role_alpha.len(),
                    self.r2_roles.map_or("-".into(), |x| format!("{x:.3}")),
                    self.probes.len(),
                    self.kld_windows
                ));
                for p in &self.probes {
                    v.push(format!(
                        "mix:   probe {} {}: error {:.4e}, KLD {:.5} (fit {:.5})",
                        p.tensor,
                        p.ty,
                        p.err,
                        p.kld,
                        a * p.err
                    ));
                }
            }
            _ => v.push(
                "mix: no KLD prediction (give --kld-text for the fit); the types minimize the summed weighted error"
                    .into(),
            ),
        }
        for (n, t, k) in &self.direct {
            v.push(format!("mix:   measured {n} {t}: KLD {k:.5}"));
        }
        for (n, t) in &self.pinned {
            v.push(format!(
                "mix:   {n} kept {t}: no calibration data for it and no KLD fit (--kld-text) to weigh it"
            ));
        }
        v.push(format!(
            "mix: sensitivity {:.1} s, KLD fit {:.1} s, DP {:.2} s",
            self.sens_s, self.fit_s, self.dp_s
        ));
        v
    }
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
        Calibration::File(_) | Calibration::Memory(_) => "hessian (tr(dW H dW^T), LDLQ as convert)",
        Calibration::Imatrix(_) => "imatrix diagonal (weighted block fit as convert)",
        Calibration::None => "identity: plain squared error (no --calib/--imatrix)",
    };
    let t0 = std::time::Instant::now();
    let pb = bar(o.quiet, items.len() as u64, "sensitivity");
    let mut table = mix::measure(src, plan, &items, calib, o.band, o.damp, o.rows, &|d, _| {
        pb.set_position(d as u64)
    })?;
    pb.finish_and_clear();
    let sens_s = t0.elapsed().as_secs_f64();

    let mut rep = MixReport {
        target: 0,
        min_file: 0,
        file: 0,
        weighting,
        types: types.clone(),
        err: 0.0,
        err_se: 0.0,
        alpha: None,
        role_alpha: Default::default(),
        r2_roles: None,
        predicted: None,
        direct: vec![],
        pinned: vec![],
        r2: None,
        probes: vec![],
        kld_windows: o.kld_windows,
        grid: 0,
        slack: 0,
        rows: o.rows,
        sens_s,
        fit_s: 0.0,
        dp_s: 0.0,
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
    let t1 = std::time::Instant::now();
    let mut direct: Vec<Option<Vec<f64>>> = vec![None; items.len()];
    if let Some(text) = o.kld_text {
        fit(
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
        )?;
    }
    if rep.alpha.is_none() {
        direct.iter_mut().for_each(|d| *d = None);
        rep.direct.clear();
        for (it, (idx, tys)) in items.iter_mut().enumerate() {
            if !uncal[it] {
                continue;
            }
            let keep = if tys.contains(&TensorType::Q8_0) {
                TensorType::Q8_0
            } else {
                *tys.last().expect("non-empty")
            };
            let k = tys.iter().position(|t| *t == keep).unwrap_or(0);
            table[it].iter_mut().for_each(|m| *m = vec![m[k]]);
            *tys = vec![keep];
            rep.pinned.push((plan.entries[idx[0]].name.clone(), keep));
        }
    }
    rep.fit_s = t1.elapsed().as_secs_f64();

    let t2 = std::time::Instant::now();
    let global = rep.alpha.unwrap_or(1.0);
    let role_alpha = rep.role_alpha.clone();
    let alpha_of = |name: &str| *role_alpha.get(mix::role_of(name)).unwrap_or(&global);
    let opts = mix::options(plan, &items, &table, &direct, &alpha_of);
    let pairs = mix::costs(&opts);
    let params: u64 = plan
        .entries
        .iter()
        .map(|e| e.dims.iter().product::<u64>())
        .sum();
    // The whole file: fixed tensors, metadata and padding are what the plan's size adds to the
    // mixed tensors' bytes (measured on the cheapest mix, then corrected until it fits).
    let cheapest: Vec<usize> = pairs
        .iter()
        .map(|o| (0..o.len()).min_by_key(|&k| o[k].0).unwrap_or(0))
        .collect();
    rep.target = match o.budget {
        Budget::Bytes(b) => b,
        Budget::Bpw(x) => (x * params as f64 / 8.0).floor() as u64,
    };
    // Set a choice on the plan and the report (its provenance strings count in the size).
    let set = |plan: &mut Plan, rep: &mut MixReport, choice: &[usize]| -> Result<u64> {
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
            .zip(&direct)
            .filter(|(_, d)| d.is_none())
            .map(|((per, pick), _)| {
                per.iter()
                    .zip(pick.iter())
                    .map(|(m, &k)| m[k].err)
                    .sum::<f64>()
            })
            .sum();
        let cost: f64 = opts.iter().zip(choice).map(|(o, &k)| o[k].cost).sum();
        rep.predicted = rep.alpha.map(|_| cost);
        size_of(plan, rep)
    };
    rep.min_file = set(plan, &mut rep, &cheapest)?;
    let too_small = |rep: &MixReport| {
        Error::Usage(format!(
            "--target: {} bytes is below the smallest file the candidate types give ({} bytes = {:.3} bpw); raise the target or add smaller types with --types",
            rep.target,
            rep.min_file,
            rep.min_file as f64 * 8.0 / params as f64
        ))
    };
    if rep.target < rep.min_file {
        return Err(too_small(&rep));
    }
    let mixed_min = mix::min_bytes(&pairs);
    let mut budget = rep.target - (rep.min_file - mixed_min);
    let mut sol;
    let mut tries = 0;
    loop {
        sol = match mix::solve(&pairs, budget, mix::GRID_CELLS) {
            Some(s) => s,
            None => {
                // Metadata took the room: the cheapest mix (measured to fit) it is.
                rep.min_file = set(plan, &mut rep, &cheapest)?;
                let b = pairs.iter().zip(&cheapest).map(|(o, &k)| o[k].0).sum();
                mix::solve(&pairs, b, 1).ok_or_else(|| too_small(&rep))?
            }
        };
        rep.file = set(plan, &mut rep, &sol.choice)?;
        if rep.file <= rep.target {
            break;
        }
        // Metadata grew with longer type names or numbers: take the excess off and solve again.
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
    rep.dp_s = t2.elapsed().as_secs_f64();
    Ok(rep)
}

/// The KLD fit: `probes` tensors spread over the model, each quantized alone (the convert path)
/// into an otherwise unchanged copy of the input, evaluated against the input on `kld_windows`
/// windows of `text`; `KLD ≈ α × error` by least squares through the origin.
#[allow(clippy::too_many_arguments)]
fn fit(
    input: &Path,
    src: &dyn TensorSource,
    plan: &Plan,
    profile: &Profile,
    items: &[(Vec<usize>, Vec<TensorType>)],
    table: &mix::Table,
    uncal: &[bool],
    calib: &Calibration,
    o: &MixOpts,
    text: &Path,
    rep: &mut MixReport,
    direct: &mut [Option<Vec<f64>>],
) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tq-mix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    // An error leaves no folder behind; a finished fit keeps it (its reference logits serve
    // --verify, and convert removes it).
    let mut guard = RemoveDirOnDrop(Some(dir.clone()));
    let ref_path = dir.join("ref.logits");
    reference_logits(input, text, o.kld_windows, &ref_path)?;
    rep.ref_logits = Some(ref_path.clone());
    // Probes: members spread evenly over the items, alternately at the cheapest candidate and
    // the one in the middle, so the fit spans small and large errors.
    let flat: Vec<(usize, usize)> = items
        .iter()
        .enumerate()
        .filter(|(it, _)| !uncal[*it])
        .flat_map(|(it, (idx, _))| (0..idx.len()).map(move |m| (it, m)))
        .collect();
    // Probes round-robin over the roles (attn_q, attn_v, ffn_down, …), spread over the layers
    // within a role.
    let mut roles: Vec<(&str, Vec<(usize, usize)>)> = vec![];
    for &(it, m) in &flat {
        let r = mix::role_of(&plan.entries[items[it].0[m]].name);
        match roles.iter_mut().find(|(x, _)| *x == r) {
            Some((_, v)) => v.push((it, m)),
            None => roles.push((r, vec![(it, m)])),
        }
    }
    // Members in layer order (the file's order may be 0, 1, 10, 11, …).
    for (_, v) in roles.iter_mut() {
        v.sort_by_key(|&(it, m)| tq::arch::layer_of(&plan.entries[items[it].0[m]].name));
    }
    let k = o.probes.min(flat.len());
    let per_role = k.div_ceil(roles.len().max(1));
    let pb = bar(o.quiet, k as u64, "KLD fit");
    for j in 0..k {
        let (_, members) = &roles[j % roles.len()];
        let q = j / roles.len();
        let (it, m) =
            members[((2 * q + 1) * members.len() / (2 * per_role)).min(members.len() - 1)];
        let (idx, tys) = &items[it];
        let est: &Vec<Estimate> = &table[it][m];
        let mut order: Vec<usize> = (0..tys.len()).collect();
        order.sort_by(|&a, &b| est[b].err.total_cmp(&est[a].err));
        // Near the operating range (4–5 bits), not the extremes: KLD grows faster than
        // linearly at large errors, and q8_0's KLD is lost in the noise of two windows.
        let opt = if (j + q) % 2 == 0 {
            order[order.len() / 4]
        } else {
            order[(order.len() / 4).saturating_sub(1)]
        };
        let i = idx[m];
        let out = dir.join(format!("probe-{j}.gguf"));
        write_group(src, plan, profile, &[i], tys[opt], calib, o, &out)?;
        let kld = kld_of(&out, &ref_path, o.kld_windows)?;
        let _ = std::fs::remove_file(&out);
        rep.probes.push(Probe {
            tensor: plan.entries[i].name.clone(),
            ty: tys[opt],
            err: est[opt].err,
            kld,
        });
        pb.set_position(j as u64 + 1);
    }
    pb.finish_and_clear();
    // Tensors without calibration data: every candidate measured (the source type costs 0).
    for (it, (idx, tys)) in items.iter().enumerate() {
        if !uncal[it] {
            continue;
        }
        let mut d = vec![];
        for &t in tys {
            let i = idx[0];
            let k = if t == plan.entries[i].src && idx.len() == 1 {
                0.0
            } else {
                let out = dir.join("direct.gguf");
                write_group(src, plan, profile, idx, t, calib, o, &out)?;
                let k = kld_of(&out, &ref_path, o.kld_windows)?;
                let _ = std::fs::remove_file(&out);
                k
            };
            rep.direct.push((plan.entries[i].name.clone(), t, k));
            d.push(k);
        }
        direct[it] = Some(d);
    }
    // Fit in log space: ln KLD = ln α + ln error, i.e. α is the geometric mean of the
    // probes' KLD/error ratios (a least-squares slope would be set by the one largest probe).
    // R² of ln KLD, for one α and for one α per role.
    let pts: Vec<(String, f64)> = rep
        .probes
        .iter()
        .filter(|p| p.err > 0.0 && p.kld > 0.0)
        .map(|p| (mix::role_of(&p.tensor).to_string(), (p.kld / p.err).ln()))
        .collect();
    if pts.is_empty() {
        return Ok(());
    }
    let ln_k: Vec<f64> = rep
        .probes
        .iter()
        .filter(|p| p.err > 0.0 && p.kld > 0.0)
        .map(|p| p.kld.ln())
        .collect();
    let ln_e: Vec<f64> = rep
        .probes
        .iter()
        .filter(|p| p.err > 0.0 && p.kld > 0.0)
        .map(|p| p.err.ln())
        .collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let ln_a = mean(&pts.iter().map(|(_, r)| *r).collect::<Vec<_>>());
    let mut by: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for (r, x) in &pts {
        by.entry(r.clone()).or_default().push(*x);
    }
    let role_ln: std::collections::BTreeMap<String, f64> =
        by.iter().map(|(r, v)| (r.clone(), mean(v))).collect();
    let mk = mean(&ln_k);
    let ss_tot: f64 = ln_k.iter().map(|k| (k - mk).powi(2)).sum();
    let r2 = |f: &dyn Fn(usize) -> f64| {
        let ss: f64 = (0..ln_k.len())
            .map(|i| (ln_k[i] - f(i) - ln_e[i]).powi(2))
            .sum();
        (ss_tot > 0.0).then(|| 1.0 - ss / ss_tot)
    };
    rep.alpha = Some(ln_a.exp());
    rep.r2 = r2(&|_| ln_a);
    rep.r2_roles = r2(&|i| role_ln[&pts[i].0]);
    rep.role_alpha = role_ln.into_iter().map(|(r, l)| (r, l.exp())).collect();
    guard.0 = None;
    Ok(())
}

/// Removes its folder when dropped, unless emptied first.
struct RemoveDirOnDrop(Option<std::path::PathBuf>);

impl Drop for RemoveDirOnDrop {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The input model's logits on the first `windows` windows of `text` (ctx 512).
pub fn reference_logits(input: &Path, text: &Path, windows: usize, out: &Path) -> Result<()> {
    let file = GgufFile::open(input).map_err(|e| {
        Error::Usage(format!(
            "--kld-text / --verify evaluate the input model, which must be a GGUF file ({e})"
        ))
    })?;
    let model = Model::new(&file, Numerics::Ggml)?;
    let (win, _) = session::windows_and_reference(
        &file,
        Some(Input::Text(text)),
        512,
        Some(windows),
        None,
        None,
    )?;
    let nv = model.cfg.n_vocab;
    let mut w = session::logits_writer(out, Format::Tq, input, "ggml", &win, nv)?;
    let batch = session::default_batch(&win, nv, false);
    evaluate(
        &model,
        &win,
        Reference::None,
        Some(&mut w),
        batch,
        &|_, _| {},
    )?;
    w.finish()
}

/// Mean KLD of `model` against the saved reference logits.
pub fn kld_of(model: &Path, ref_logits: &Path, windows: usize) -> Result<f64> {
    let file = GgufFile::open(model)?;
    let m = Model::new(&file, Numerics::Ggml)?;
    let (win, r) =
        session::windows_and_reference(&file, None, 512, Some(windows), Some(ref_logits), None)?;
    let batch = session::default_batch(&win, m.cfg.n_vocab, false);
    let res = evaluate(&m, &win, r, None, batch, &|_, _| {})?;
    res.kld
        .map(|k| k.kld.value)
        .ok_or_else(|| Error::Usage("no KLD was computed against the reference".into()))
}

/// A copy of the input with only the entries `idx` quantized to `ty`, the way convert would.
#[allow(clippy::too_many_arguments)]
fn write_group(
    src: &dyn TensorSource,
    plan: &Plan,
    profile: &Profile,
    idx: &[usize],
    ty: TensorType,
    calib: &Calibration,
    o: &MixOpts,
    out: &Path,
) -> Result<()> {
    let keep = Request {
        weights: TensorType::Q8_0,
        recipe: &plan::recipe::RECIPES[0],
        overrides: vec![],
        output_type: None,
        token_embd_type: None,
        keep_types: true,
        strict: false,
    };
    let mut p = plan::plan(src.tensors(), &keep, profile)?;
    p.ldlq_refit = plan.ldlq_refit;
    for &i in idx {
        let e = &mut p.entries[i];
        debug_assert_eq!(e.name, plan.entries[i].name);
        e.dst = ty;
        e.action = if e.src.is_float() {
            Action::Quantize
        } else {
            Action::Requantize
        };
        e.bytes = ty
            .bytes_for(e.dims.iter().product())
            .ok_or_else(|| Error::Unsupported(format!("{}: does not fit {ty}", e.name)))?;
    }
    let names: Vec<String> = idx.iter().map(|&i| p.entries[i].name.clone()).collect();
    match calib {
        Calibration::File(f) => plan::assign_ldlq(&mut p, &f.index, o.band),
        Calibration::Memory(h) => plan::assign_ldlq(&mut p, h, o.band),
        Calibration::Imatrix(m) => plan::assign_importance(&mut p, m),
        Calibration::None => {}
    }
    let md = convert::output_metadata(src.metadata(), &p, None, false);
    let cp = convert::Checkpoints {
        resume: false,
        key: String::new(),
        quiet: true,
    };
    let target = convert::Target {
        src,
        plan: &p,
        metadata: &md,
        version: src.gguf_version(),
        profile,
        out,
        hash_input: None,
        cp: &cp,
    };
    let none = |_| {};
    match calib {
        Calibration::File(f) => convert::execute_from_file(&target, &none, f, o.band, o.damp)?,
        Calibration::Memory(hs) => {
            // Only this tensor's Hessian group goes along (a copy of all would be the model's).
            let mut one = tq::quant::Hessians::default();
            for name in &names {
                if let Some(g) = hs.for_tensor(name) {
                    one.groups.insert(g.tensors.join(","), g.clone());
                }
            }
            let l = convert::Ldlq {
                hessians: one,
                band: o.band,
                damp: o.damp,
            };
            convert::execute(&target, Some(l), &none)?
        }
        _ => convert::execute(&target, None, &none)?,
    };
    Ok(())
}

fn bar(quiet: bool, len: u64, what: &str) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{pos}}/{{len}} eta {{eta}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb
}
