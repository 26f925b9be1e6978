//! The mix's KLD fit: single tensors quantized as convert would, each in an otherwise unchanged
//! copy of the input, evaluated against the input's logits; `KLD ≈ α × error` per role.

use super::probe::{Probes, Sample, Substitute};
use super::report::{MixReport, Probe};
use super::substitute::{group_of, reference_logits, substitutes};
use super::MixOpts;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::plan::mix::{self, Calibration};
use crate::plan::Plan;
use crate::quant::sensitivity::Estimate;
use crate::source::TensorSource;
use crate::types::profile::Profile;
use crate::types::TensorType;
use std::path::Path;

/// The KLD fit: `probes` tensors spread over the model, each quantized alone (the convert path)
/// into an otherwise unchanged copy of the input, evaluated against the input on `kld_windows`
/// windows of `text`; `KLD ≈ α × error` by least squares through the origin.
#[allow(clippy::too_many_arguments)]
pub(super) fn fit(
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
    lazy: Option<&super::direct::Lazy>,
) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tq-mix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    // An error leaves no folder behind; a finished fit keeps it (its reference logits serve
    // --verify, and convert removes it).
    let mut guard = RemoveDirOnDrop(Some(dir.clone()));
    let ref_path = dir.join("ref.logits");
    reference_logits(input, text, o.kld_windows, &ref_path, o.quiet)?;
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
        v.sort_by_key(|&(it, m)| crate::arch::layer_of(&plan.entries[items[it].0[m]].name));
    }
    let k = o.probes.min(flat.len());
    let per_role = k.div_ceil(roles.len().max(1));
    // The probes' tensors and types first, then measured in the order of their first block
    // (see probe.rs): (probe, entries, type).
    let mut jobs: Vec<(Job, Vec<usize>, TensorType)> = vec![];
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
        let opt = if (j + q).is_multiple_of(2) {
            order[order.len() / 4]
        } else {
            order[(order.len() / 4).saturating_sub(1)]
        };
        let i = idx[m];
        rep.probes.push(Probe {
            tensor: plan.entries[i].name.clone(),
            ty: tys[opt],
            err: est[opt].err,
            kld: 0.0,
        });
        jobs.push((Job::Probe(j), vec![i], tys[opt]));
    }
    // Tensors without calibration data: every candidate measured (the source type costs 0);
    // token_embd's nearest the target only, the rest where the knapsack looks (embd.rs;
    // unmeasured: NaN).
    for (it, (idx, tys)) in items.iter().enumerate() {
        if !uncal[it] {
            continue;
        }
        let lazy = lazy.filter(|l| l.it == it);
        let mut d = vec![0.0; tys.len()];
        for (c, &t) in tys.iter().enumerate() {
            let i = idx[0];
            if !(t == plan.entries[i].src && idx.len() == 1) {
                match lazy {
                    Some(l) if !l.first().contains(&c) => d[c] = f64::NAN,
                    _ => jobs.push((Job::Direct(it, c), idx.clone(), t)),
                }
            }
        }
        direct[it] = Some(d);
    }
    let file = GgufFile::open(input)?;
    let mut probes = Probes::new(&file, &ref_path, o.kld_windows)?;
    let file = &file;
    let starts: Vec<usize> = jobs
        .iter()
        .map(|(_, idx, _)| {
            let names: Vec<&str> = idx.iter().map(|&i| plan.entries[i].name.as_str()).collect();
            probes.start_of(&names)
        })
        .collect();
    // A probe of one tensor over PROBE_ELEMENTS elements is measured on a sample of its rows
    // (`probe::row_probe`): its KLD scaled by the tensor's estimated error over the sample's.
    // A streamed calibration: the probes of tensors in blocks are encoded in one calibration
    // pass, each when its block ends (a probe holds one tensor's bytes until it runs).
    let mut pre: std::collections::HashMap<usize, Encoded> = Default::default();
    let mut enc = ProbeEncoder::default();
    if let (Calibration::Stream(_), Some(s)) = (calib, o.stream) {
        let n_layer = s.n_layer();
        let blocks: Vec<Option<usize>> = jobs
            .iter()
            .map(|(_, idx, _)| super::stream::block_of(plan, idx, n_layer))
            .collect::<Result<_>>()?;
        let in_blocks = blocks.iter().filter(|b| b.is_some()).count() as u64;
        if in_blocks > 0 {
            let mut pb =
                crate::pipeline::progress::steps(o.quiet, in_blocks, "KLD probes' encodings");
            let mut done = 0u64;
            s.pass("the KLD probes' encodings", &mut |l, hs| {
                // Probes by Hessian group and, in it, factor (each built once); a group's
                // matrix dropped once its probes are encoded (a 70B block's: 8.2 GB).
                let mut mine: Vec<(Option<String>, Option<String>, usize)> = (0..jobs.len())
                    .filter(|&r| blocks[r] == Some(l))
                    .map(|r| {
                        let name = &plan.entries[jobs[r].1[0]].name;
                        let key = crate::quant::sensitivity::ldlq_factor_key(jobs[r].2, &plan.ldlq);
                        (group_of(&Calibration::Memory(hs), name), key, r)
                    })
                    .collect();
                mine.sort();
                for (at, (g, _, r)) in mine.iter().enumerate() {
                    let (job, idx, ty) = &jobs[*r];
                    let c = Calibration::Memory(hs);
                    let e = enc.encode(file, src, plan, profile, *job, idx, *ty, &c)?;
                    pre.insert(*r, e);
                    if super::stream::drop_finished(hs, g, mine.get(at + 1).map(|n| &n.0)) {
                        enc.clear();
                    }
                    done += 1;
                    pb.set_position(done);
                }
                enc.clear();
                Ok(())
            })?;
            pb.finish_and_clear();
        }
    }
    let mut run: Vec<usize> = (0..jobs.len()).collect();
    run.sort_by_key(|&r| starts[r]);
    let mut pb = crate::pipeline::progress::steps(o.quiet, jobs.len() as u64, "KLD probes");
    let mut heads = super::head::Heads::new(&ref_path, super::head::head_elements());
    for (done, &r) in run.iter().enumerate() {
        let (job, idx, ty) = &jobs[r];
        let (kld, sample_err) = match (pre.remove(&r), job, &idx[..]) {
            (None, Job::Direct(..), &[i]) => {
                let k = super::direct::direct_kld(
                    &mut probes,
                    &mut heads,
                    file,
                    src,
                    plan,
                    profile,
                    calib,
                    i,
                    *ty,
                );
                (k?, None)
            }
            (pre, ..) => {
                let encoded = match pre {
                    Some(s) => s,
                    None => enc.encode(file, src, plan, profile, *job, idx, *ty, calib)?,
                };
                let (subs, sample_err) = match encoded {
                    Encoded::Whole(v) => (v, None),
                    Encoded::Rows(p) => (vec![p.substitute(file)?], Some(p.err)),
                };
                (probes.kld(subs)?, sample_err)
            }
        };
        match *job {
            Job::Probe(j) => {
                let p = &mut rep.probes[j];
                p.kld = match sample_err {
                    // The whole tensor's KLD at the sample's KLD per unit of error.
                    Some(e) if e > 0.0 => kld * p.err / e,
                    _ => kld,
                };
            }
            Job::Direct(it, c) => {
                if let Some(d) = direct[it].as_mut() {
                    d[c] = kld;
                }
            }
        }
        pb.set_position(done as u64 + 1);
    }
    pb.finish_and_clear();
    for (it, (idx, tys)) in items.iter().enumerate() {
        if let Some(d) = &direct[it] {
            for (&t, &k) in tys.iter().zip(d).filter(|(_, k)| !k.is_nan()) {
                rep.direct.push((plan.entries[idx[0]].name.clone(), t, k));
            }
        }
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

/// What a probe measures: probe `j` of the fit, or candidate `c` of an uncalibrated item `it`.
#[derive(Clone, Copy)]
enum Job {
    Probe(usize),
    Direct(usize, usize),
}

/// A probe's replacements: a whole encoding, or a sample of rows.
enum Encoded {
    Whole(Vec<Substitute>),
    Rows(super::probe::RowProbe),
}

/// Encodes the probes: a large tensor on a sample of its rows ([`super::probe::row_probe`]),
/// with the LDLQ factors of the current Hessian group kept for the group's next probes (q/k/v
/// share one, gate/up another; a tensor probed at two types reuses its family's); everything
/// else whole, as convert writes it ([`substitutes`]). The measured plans use its row samples
/// too ([`ProbeEncoder::sample`]).
#[derive(Default)]
pub(super) struct ProbeEncoder {
    group: Option<String>,
    /// From a Hessian file: the current group's matrix.
    loaded: Option<crate::quant::Hessian>,
    /// Wider than 16,384 columns, one factor at a time (`sensitivity::encode`).
    factors: crate::quant::sensitivity::Factors,
}

impl ProbeEncoder {
    /// Forget the group (its Hessian is about to be dropped).
    pub(super) fn clear(&mut self) {
        *self = ProbeEncoder::default();
    }

    #[allow(clippy::too_many_arguments)]
    fn encode(
        &mut self,
        file: &GgufFile,
        src: &dyn TensorSource,
        plan: &Plan,
        profile: &Profile,
        job: Job,
        idx: &[usize],
        ty: TensorType,
        calib: &Calibration,
    ) -> Result<Encoded> {
        if let (Job::Probe(_), [i]) = (job, idx) {
            let cap = super::probe::probe_elements();
            let p = self.sample(file, src, plan, *i, ty, calib, cap, Sample::Plain)?;
            if let Some(p) = p {
                return Ok(Encoded::Rows(p));
            }
        }
        Ok(Encoded::Whole(substitutes(
            src, plan, profile, idx, ty, calib,
        )?))
    }

    /// Entry `i` of `plan` at `ty` on a sample of its rows ([`super::probe::row_probe`]) when it
    /// has more than `cap` elements and a Hessian under `calib`; None otherwise (encode it whole).
    /// Calls for one Hessian group in a row share its factors.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sample(
        &mut self,
        file: &GgufFile,
        src: &dyn TensorSource,
        plan: &Plan,
        i: usize,
        ty: TensorType,
        calib: &Calibration,
        cap: u64,
        sample: Sample,
    ) -> Result<Option<super::probe::RowProbe>> {
        let e = &plan.entries[i];
        if !matches!(e.dims.len(), 2 | 3) || e.dims.iter().product::<u64>() <= cap {
            return Ok(None);
        }
        if let [_, _, n_exp] = e.dims[..] {
            // An expert stack: every expert's Hessian. From a file, the sampled experts' are
            // loaded (one group each) and the others' token counts come from the index.
            self.clear();
            let mut loaded = vec![];
            let mut hs: Vec<Option<&crate::quant::Hessian>> = vec![];
            if let Calibration::File(f) = calib {
                let per = e.dims[1];
                let sampled: std::collections::BTreeSet<u64> =
                    super::probe::sample_picks(&e.dims, cap)
                        .iter()
                        .map(|r| r / per)
                        .collect();
                for x in 0..n_exp as usize {
                    loaded.push(match f.index.for_expert(&e.name, x) {
                        Some(g) if sampled.contains(&(x as u64)) => {
                            Some(f.load_group(&g.tensors.join(","))?)
                        }
                        Some(g) => Some(g.clone()),
                        None => None,
                    });
                }
                hs = loaded.iter().map(Option::as_ref).collect();
            } else if let Calibration::Memory(m) = calib {
                hs = (0..n_exp as usize)
                    .map(|x| m.for_expert(&e.name, x))
                    .collect();
            }
            let mut none = crate::quant::sensitivity::Factors::new();
            let (ldlq, f) = (plan.ldlq, &mut none);
            return super::probe::row_probe(file, src, e, i, ty, &hs, ldlq, f, cap, sample);
        }
        let key = group_of(calib, &e.name);
        if key != self.group {
            self.factors.clear();
            self.loaded = None;
            if let (Some(k), Calibration::File(f)) = (&key, calib) {
                self.loaded = Some(f.load_group(k)?);
            }
            self.group = key;
        }
        let h = match calib {
            Calibration::Memory(hs) => hs.for_tensor(&e.name),
            Calibration::File(_) => self.loaded.as_ref(),
            _ => None,
        };
        let (ldlq, factors) = (plan.ldlq, &mut self.factors);
        super::probe::row_probe(file, src, e, i, ty, &[h], ldlq, factors, cap, sample)
    }
}

#[cfg(test)]
mod tests {
    use super::super::substitute::*;
    use super::*;
    use crate::calib::input::calibrate_text;
    use crate::plan::{self, Request};

    /// The copy-based probe this replaced: the input converted whole into a file with only
    /// `idx` quantized to `ty`, evaluated from that file.
    fn write_group(
        src: &dyn TensorSource,
        plan: &Plan,
        profile: &Profile,
        idx: &[usize],
        ty: TensorType,
        calib: &Calibration,
        out: &Path,
    ) -> Result<()> {
        let p = probe_plan(src, plan, profile, idx, ty, calib)?;
        write_plan(src, &p, profile, calib, out)
    }

    /// The whole-model setup of these tests: the tiny 3-block model, its text, in-memory
    /// Hessians, the opened source and a q4_K plan.
    #[allow(clippy::type_complexity)]
    fn tiny_q4k(
        dir: &Path,
    ) -> (
        std::path::PathBuf,
        std::path::PathBuf,
        crate::quant::Hessians,
        Box<dyn TensorSource>,
        Plan,
        Profile,
    ) {
        let (model, text, o) = crate::calib::input::tiny_model_and_text(dir);
        let profile = Profile::default();
        let hs = calibrate_text(&model, &profile, &text, &o).unwrap();
        let src = crate::source::open(&model, &profile).unwrap();
        let req = Request::new(TensorType::Q4K, &plan::recipe::RECIPES[0]);
        let plan = plan::plan(src.tensors(), &req, &profile).unwrap();
        (model, text, hs, src, plan, profile)
    }

    /// A probe on a sample of rows holds, in the sampled rows, the values of the whole tensor's
    /// encoding as convert writes it (LDLQ encodes rows independently), in the input's float
    /// type, and the input's own bytes in every other row; its error is the sampled rows' summed
    /// weighted error of that encoding (the scalar reference's); at or under the cap, no sample.
    /// Amplified (a measured plan's sample), the sampled rows hold `w + s·(q − w)` of the same
    /// encoding's `q`, whose weighted error is `s²` times the sample's, and `s²` times the
    /// sample's error estimates the whole tensor's error (within 2× on these tensors).
    #[test]
    fn row_probes_hold_the_whole_encodings_rows() {
        use crate::quant::sensitivity::{row_errors, sample_rows, Factors, Weighting};
        let dir = tempfile::tempdir().unwrap();
        let (model, _, hs, src, plan, profile) = tiny_q4k(dir.path());
        let calib = Calibration::Memory(&hs);
        let file = GgufFile::open(&model).unwrap();
        let mut factors = Factors::new();
        let mut sampled = 0;
        for name in ["blk.1.ffn_down.weight", "blk.0.attn_q.weight"] {
            let i = plan.entries.iter().position(|e| e.name == name).unwrap();
            let e = &plan.entries[i];
            let (n, n_rows) = (e.dims[0] as usize, e.dims[1]);
            let h = hs.for_tensor(name);
            let t = file.tensor(name).unwrap();
            let orig = file.tensor_data(t);
            let rb = orig.len() / n_rows as usize;
            let mut x = vec![0f32; n * n_rows as usize];
            src.read_rows_f32(i, 0, &mut x).unwrap();
            let w = Weighting::Hessian {
                h: h.unwrap(),
                ldlq: plan.ldlq,
            };
            for ty in [TensorType::Q4K, TensorType::Q3K, TensorType::IQ4XS] {
                let whole = substitutes(src.as_ref(), &plan, &profile, &[i], ty, &calib).unwrap();
                let mut q = vec![0f32; x.len()];
                crate::quant::decode_rows(ty, &whole[0].3, &mut q, n, name).unwrap();
                let whole_err: f64 = row_errors(&x, &q, n, &w).iter().sum();
                let cap = (n as u64 * n_rows) / 4;
                let rows = cap.div_ceil(n as u64) as usize;
                assert!(rows > 1 && (rows as u64) < n_rows, "{rows}");
                let picks = sample_rows(n_rows, rows);
                let s = (n_rows as f64 / rows as f64).sqrt() as f32;
                let mut plain_err = 0.0;
                for mode in [Sample::Plain, Sample::Amplified] {
                    let rp = super::super::probe::row_probe(
                        &file,
                        src.as_ref(),
                        e,
                        i,
                        ty,
                        &[h],
                        plan.ldlq,
                        &mut factors,
                        cap,
                        mode,
                    )
                    .unwrap()
                    .expect("a sample over the cap");
                    let sub = rp.substitute(&file).unwrap();
                    assert_eq!((sub.1, sub.2), (t.ty, t.type_id));
                    let got = &sub.3;
                    let (mut err, mut held_err) = (0.0, 0.0);
                    for r in 0..n_rows as usize {
                        let at = r * rb..(r + 1) * rb;
                        if picks.contains(&(r as u64)) {
                            let xr = &x[r * n..(r + 1) * n];
                            let mut row = q[r * n..(r + 1) * n].to_vec();
                            err += row_errors(xr, &row, n, &w)[0];
                            if mode == Sample::Amplified {
                                for (y, x) in row.iter_mut().zip(xr) {
                                    *y = *x + s * (*y - *x);
                                }
                            }
                            let back = crate::quant::encode_rows(
                                t.ty,
                                name,
                                &row,
                                n,
                                &crate::quant::Encoder::Nearest,
                            )
                            .unwrap();
                            assert!(
                                got[at] == back[..],
                                "{name} {ty} {mode:?}: row {r} is not the whole encoding's"
                            );
                            let mut held = vec![0f32; n];
                            crate::quant::decode_rows(t.ty, &back, &mut held, n, name).unwrap();
                            held_err += row_errors(xr, &held, n, &w)[0];
                        } else {
                            assert!(got[at.clone()] == orig[at], "{name} {ty}: row {r} changed");
                        }
                    }
                    assert!(
                        (rp.err - err).abs() <= 1e-9 * err,
                        "{}: {} vs {err}",
                        name,
                        rp.err
                    );
                    assert!(err > 0.0);
                    let gain = match mode {
                        Sample::Plain => 1.0,
                        Sample::Amplified => (s * s) as f64,
                    };
                    assert!(
                        (held_err / (gain * err) - 1.0).abs() < 0.02,
                        "{name} {ty} {mode:?}: the rows' error {held_err} vs {gain} × {err}"
                    );
                    if mode == Sample::Amplified {
                        assert_eq!(err, plain_err, "{name} {ty}: the same sample");
                        let est = gain * err;
                        assert!(
                            est < 2.0 * whole_err && whole_err < 2.0 * est,
                            "{name} {ty}: s² × the sample's error {est} vs the whole {whole_err}"
                        );
                    }
                    plain_err = err;
                    sampled += 1;
                }
                // At or under the cap: the whole tensor (no sample).
                let whole_cap = n as u64 * n_rows;
                assert!(super::super::probe::row_probe(
                    &file,
                    src.as_ref(),
                    e,
                    i,
                    ty,
                    &[h],
                    plan.ldlq,
                    &mut factors,
                    whole_cap,
                    Sample::Amplified,
                )
                .unwrap()
                .is_none());
            }
            factors.clear();
        }
        assert_eq!(sampled, 12);
    }

    /// The token_embd tests' set-up: `model` opened, its reference logits on 2 windows of
    /// `text` (in `dir`), and token_embd's entry in `plan`.
    fn embd_setup(
        model: &Path,
        text: &Path,
        plan: &Plan,
        dir: &Path,
    ) -> (GgufFile, std::path::PathBuf, usize) {
        let ref_path = dir.join("ref.logits");
        reference_logits(model, text, 2, &ref_path, true).unwrap();
        let i = plan
            .entries
            .iter()
            .position(|e| e.name == "token_embd.weight")
            .unwrap();
        (GgufFile::open(model).unwrap(), ref_path, i)
    }

    /// A token_embd candidate encoded in the windows' rows only holds, in those rows, the whole
    /// encoding's bytes for every candidate type (each row is quantized on its own), and its
    /// pass measures the whole encoding's KLD bit for bit; the rows are fewer than the table's.
    #[test]
    fn token_embd_candidates_encode_the_rows_the_windows_read() {
        let dir = tempfile::tempdir().unwrap();
        let (model, text, hs, src, plan, profile) = tiny_q4k(dir.path());
        let calib = Calibration::Memory(&hs);
        let (file, ref_path, i) = embd_setup(&model, &text, &plan, dir.path());
        let mut probes = Probes::new(&file, &ref_path, 2).unwrap();
        let e = &plan.entries[i];
        let rows = probes.rows_read(&e.name).expect("an untied embedding");
        assert!(
            !rows.is_empty() && (rows.len() as u64) < e.dims[1],
            "{}",
            rows.len()
        );
        assert!(probes.rows_read("output.weight").is_none());
        let types = mix::candidates_for(e, &mix::default_candidates(&profile));
        assert!(types.len() >= 10, "{types:?}");
        for (k, &ty) in types.iter().enumerate() {
            if ty == e.src {
                continue;
            }
            let whole = substitutes(src.as_ref(), &plan, &profile, &[i], ty, &calib).unwrap();
            let cut = substitute_rows(src.as_ref(), &plan, &profile, i, ty, &calib, &rows).unwrap();
            assert_eq!(
                (&cut.0, cut.1, cut.2),
                (&whole[0].0, whole[0].1, whole[0].2)
            );
            assert_eq!(cut.3.len(), whole[0].3.len(), "{ty}");
            let rb = ty.bytes_for(e.dims[0]).unwrap() as usize;
            for &r in &rows {
                let at = r as usize * rb..(r as usize + 1) * rb;
                assert!(cut.3[at.clone()] == whole[0].3[at], "{ty}: row {r} differs");
            }
            // The passes on a few types (each is a whole pass of the tiny model).
            if k % 4 == 0 {
                let a = probes.kld(whole).unwrap();
                let b = probes.kld(vec![cut]).unwrap();
                assert!(a > 0.0);
                assert_eq!(a.to_bits(), b.to_bits(), "{ty}: {a} vs {b}");
            }
        }
    }

    /// An output-projection candidate on a row sample (head.rs) holds the whole encoding's
    /// values in its exact rows and `w + s·(q − w)` in its tail rows, the input's bytes
    /// elsewhere; its KLD estimates the whole candidate's (within 1.5× on the tiny model's head,
    /// an eighth of its rows sampled) and ranks the candidates as they rank; at the cap, none.
    #[test]
    fn head_candidates_on_a_row_sample_estimate_the_whole_candidates_kld() {
        use super::super::head::Heads;
        use TensorType::*;
        let dir = tempfile::tempdir().unwrap();
        let (model, text, hs, src, plan, profile) = tiny_q4k(dir.path());
        let calib = Calibration::Memory(&hs);
        let (file, ref_path, _) = embd_setup(&model, &text, &plan, dir.path());
        let mut probes = Probes::new(&file, &ref_path, 2).unwrap();
        let i = plan.entries.iter().position(|e| e.name == "output.weight");
        let e = &plan.entries[i.unwrap()];
        let (i, n) = (i.unwrap(), e.dims[0] as usize);
        let all = e.dims[0] * e.dims[1];
        let none = Heads::new(&ref_path, all)
            .sample(&probes, &file, e)
            .unwrap();
        assert!(none.is_none());
        let mut heads = Heads::new(&ref_path, all / 8);
        let h = heads.sample(&probes, &file, e).unwrap().expect("a sample");
        assert_eq!(h.picks.len() as u64, e.dims[1] / 8);
        let emb = &plan.entries[plan
            .entries
            .iter()
            .position(|e| e.name == "token_embd.weight")
            .unwrap()];
        assert!(heads.sample(&probes, &file, emb).unwrap().is_none());
        let mut got = vec![];
        for ty in [Q2K, Q3K, Q4_0, Q4K, Q6K] {
            let whole = substitutes(src.as_ref(), &plan, &profile, &[i], ty, &calib).unwrap();
            let cut = substitute_rows(src.as_ref(), &plan, &profile, i, ty, &calib, &h.picks);
            let p = h.probe(src.as_ref(), &file, e, i, &cut.unwrap()).unwrap();
            let sub = p.substitute(&file).unwrap();
            // Row by row against the whole encoding, decoded.
            let t = file.tensor(&e.name).unwrap();
            let (mut q, mut w) = (vec![0f32; n], vec![0f32; n]);
            let rb = ty.bytes_for(n as u64).unwrap() as usize;
            let fb = t.ty.bytes_for(n as u64).unwrap() as usize;
            for r in 0..e.dims[1] as usize {
                let got = &sub.3[r * fb..(r + 1) * fb];
                let k = h.picks.iter().position(|&x| x == r as u64);
                let Some(k) = k else {
                    assert_eq!(got, &file.tensor_data(t)[r * fb..(r + 1) * fb]);
                    continue;
                };
                let wr = &whole[0].3[r * rb..(r + 1) * rb];
                crate::quant::decode_rows(ty, wr, &mut q, n, "t").unwrap();
                if h.amplified[k] {
                    src.read_rows_f32(i, r as u64, &mut w).unwrap();
                    for (y, x) in q.iter_mut().zip(&w) {
                        *y = *x + h.s * (*y - *x);
                    }
                }
                let near = crate::quant::Encoder::Nearest;
                let want = crate::quant::encode_rows(t.ty, "t", &q, n, &near).unwrap();
                assert_eq!(got, &want[..], "{ty}: row {r}");
            }
            let a = probes.kld(whole).unwrap();
            let b = probes.kld(vec![sub]).unwrap();
            eprintln!("{ty}: whole {a:.4e} sampled {b:.4e} ratio {:.3}", b / a);
            assert!(a > 0.0 && (b / a).max(a / b) < 1.5, "{ty}: {a} vs {b}");
            got.push((a, b));
        }
        // Candidates more than 1.5× apart keep their order.
        for x in &got {
            for y in &got {
                if x.0 > 1.5 * y.0 {
                    assert!(x.1 > y.1, "{got:?}");
                }
            }
        }
    }

    /// Measurement, not a check (`--ignored`): `TQ_BENCH_MODEL`'s output projection at each of
    /// `TQ_BENCH_TYPES` (comma-separated; default q3_K,q4_K,q6_K,iq4_xs) encoded whole and on
    /// its row sample (head.rs, `TQ_HEAD_ELEMENTS` or the default cap), process CPU seconds and
    /// the KLD on 2 windows of `TQ_BENCH_TEXT` of each (docs/bench/scale.md).
    #[test]
    #[ignore]
    fn bench_head_rows() {
        let (Ok(model), Ok(text)) = (
            std::env::var("TQ_BENCH_MODEL"),
            std::env::var("TQ_BENCH_TEXT"),
        ) else {
            return;
        };
        let types = std::env::var("TQ_BENCH_TYPES").unwrap_or("q3_K,q4_K,q6_K,iq4_xs".into());
        let (model, text) = (Path::new(&model), Path::new(&text));
        let dir = tempfile::tempdir().unwrap();
        let profile = Profile::default();
        let src = crate::source::open(model, &profile).unwrap();
        let req = Request::new(TensorType::Q4K, &plan::recipe::RECIPES[0]);
        let plan = plan::plan(src.tensors(), &req, &profile).unwrap();
        let (file, ref_path, _) = embd_setup(model, text, &plan, dir.path());
        let mut probes = Probes::new(&file, &ref_path, 2).unwrap();
        let i = plan.entries.iter().position(|e| e.name == "output.weight");
        let (i, c) = (i.expect("an output projection"), Calibration::None);
        let e = &plan.entries[i];
        let mut heads =
            super::super::head::Heads::new(&ref_path, super::super::head::head_elements());
        let h = heads.sample(&probes, &file, e).unwrap().expect("a sample");
        let cpu = || crate::io::progress::process_cpu_seconds();
        for ty in types.split(',').map(|t| TensorType::from_name(t).unwrap()) {
            let t0 = cpu();
            let w = substitutes(src.as_ref(), &plan, &profile, &[i], ty, &c).unwrap();
            let t1 = cpu();
            let r = substitute_rows(src.as_ref(), &plan, &profile, i, ty, &c, &h.picks).unwrap();
            let p = h.probe(src.as_ref(), &file, e, i, &r).unwrap();
            let t2 = cpu();
            let a = probes.kld(w).unwrap();
            let b = probes.kld(vec![p.substitute(&file).unwrap()]).unwrap();
            eprintln!(
                "{ty}: whole {:.1} CPU-s KLD {a:.4e}; {} of {} rows {:.2} CPU-s KLD {b:.4e}; ratio {:.3}",
                t1 - t0,
                h.picks.len(),
                e.dims[1],
                t2 - t1,
                b / a
            );
        }
    }

    /// Measurement, not a check (`--ignored`): each default candidate of `TQ_BENCH_MODEL`'s
    /// token_embd encoded whole and in the rows of 2 windows of `TQ_BENCH_TEXT`, thread CPU
    /// seconds of each (docs/bench/scale.md).
    #[test]
    #[ignore]
    fn bench_token_embd_rows() {
        let (Ok(model), Ok(text)) = (
            std::env::var("TQ_BENCH_MODEL"),
            std::env::var("TQ_BENCH_TEXT"),
        ) else {
            return;
        };
        let (model, text) = (
            std::path::PathBuf::from(model),
            std::path::PathBuf::from(text),
        );
        let dir = tempfile::tempdir().unwrap();
        let profile = Profile::default();
        let src = crate::source::open(&model, &profile).unwrap();
        let req = Request::new(TensorType::Q4K, &plan::recipe::RECIPES[0]);
        let plan = plan::plan(src.tensors(), &req, &profile).unwrap();
        let (file, ref_path, i) = embd_setup(&model, &text, &plan, dir.path());
        let probes = Probes::new(&file, &ref_path, 2).unwrap();
        let e = &plan.entries[i];
        let rows = probes.rows_read(&e.name).unwrap();
        let cpu = || crate::io::progress::process_cpu_seconds();
        let (mut tw, mut tr) = (0.0, 0.0);
        for ty in mix::candidates_for(e, &mix::default_candidates(&profile)) {
            if ty == e.src {
                continue;
            }
            let c = Calibration::None;
            let t0 = cpu();
            let w = substitutes(src.as_ref(), &plan, &profile, &[i], ty, &c).unwrap();
            let t1 = cpu();
            let r = substitute_rows(src.as_ref(), &plan, &profile, i, ty, &c, &rows).unwrap();
            let t2 = cpu();
            assert_eq!(w[0].3.len(), r.3.len());
            eprintln!(
                "{ty}: whole {:.2} CPU-s, {} rows {:.3} CPU-s",
                t1 - t0,
                rows.len(),
                t2 - t1
            );
            (tw, tr) = (tw + t1 - t0, tr + t2 - t1);
        }
        eprintln!(
            "all: whole {tw:.1} CPU-s, rows {tr:.2} CPU-s of {} rows of {}",
            rows.len(),
            e.dims[1]
        );
    }

    /// The probes in memory, resumed at their first block, give the KLDs of the copies they
    /// replaced (same tensors, types, LDLQ bytes and windows), for tensors in every block, the
    /// token embeddings (a whole pass) and the output projection (the head only), measured in
    /// an order that makes the kept hidden states go back to the embeddings.
    #[test]
    fn probes_in_memory_equal_the_copies() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let (model, text, hs, src, mut plan, profile) = tiny_q4k(dir.path());
        let calib = Calibration::Memory(&hs);
        plan.ldlq.band = Some(64);
        let ref_path = p("ref.logits");
        reference_logits(&model, &text, 2, &ref_path, true).unwrap();
        let at = |n: &str| plan.entries.iter().position(|e| e.name == n).unwrap();
        use TensorType::*;
        let cases: Vec<(Vec<usize>, TensorType)> = vec![
            (vec![at("blk.2.ffn_down.weight")], Q3K),
            (vec![at("blk.0.attn_q.weight")], Q4K),
            (vec![at("output.weight")], Q4_0),
            (vec![at("blk.1.attn_v.weight")], Q2K),
            (
                vec![at("blk.1.ffn_gate.weight"), at("blk.2.ffn_up.weight")],
                IQ4XS,
            ),
            (vec![at("token_embd.weight")], Q4K),
            (vec![at("blk.2.attn_output.weight")], Q5K),
        ];
        let file = GgufFile::open(&model).unwrap();
        let mut probes = Probes::new(&file, &ref_path, 2).unwrap();
        for (k, (idx, ty)) in cases.iter().enumerate() {
            let out = p(&format!("probe-{k}.gguf"));
            write_group(src.as_ref(), &plan, &profile, idx, *ty, &calib, &out).unwrap();
            let old = kld_of(&out, &ref_path, 2, "", true).unwrap();
            let subs = substitutes(src.as_ref(), &plan, &profile, idx, *ty, &calib).unwrap();
            // The substituted bytes are the copy's.
            let copy = GgufFile::open(&out).unwrap();
            for (name, t, _, bytes) in &subs {
                let ct = copy.tensor(name).unwrap();
                assert_eq!(ct.ty, *t);
                assert!(copy.tensor_data(ct) == &bytes[..], "{name}: bytes differ");
            }
            let new = probes.kld(subs).unwrap();
            eprintln!("probe {k} ({ty}): copy {old:.9}, in memory {new:.9}");
            assert!(old > 0.0, "{k}: the probe changes the model");
            assert!(
                (new - old).abs() <= 1e-9 * old.max(1e-6),
                "{k}: copy {old} vs in memory {new}"
            );
        }
        // Resumed probes ran fewer blocks than whole passes would.
        assert!(probes.blocks_run < 3 * cases.len(), "{}", probes.blocks_run);
    }

    /// An expert stack's row probe holds, in each sampled row, the whole stack's encoding as
    /// convert writes it — LDLQ under the expert's Hessian, round-to-nearest for an expert with
    /// too few tokens or none — and the input's bytes elsewhere; its error is the experts'
    /// rows' weighted error, each expert weighted by its share of the routed tokens (an expert
    /// no token reached adds none); amplified, the rows hold `w + s·(q − w)`.
    #[test]
    fn an_expert_stacks_row_probe_holds_the_whole_encodings_rows() {
        use crate::quant::hessian::{expert_key, MIN_EXPERT_TOKENS};
        use crate::quant::sensitivity::{row_errors, Factors, Weighting};
        use crate::quant::{Hessian, Hessians};
        let (n, per, n_exp) = (256usize, 32usize, 4usize);
        let name = "blk.0.ffn_gate_exps.weight";
        let dims = vec![n as u64, per as u64, n_exp as u64];
        let w = crate::gguf_gen::gaussian(7, n * per * n_exp, 0.02);
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let g = crate::gguf_gen::build_with_data(
            3,
            None,
            vec![],
            vec![(name.into(), dims.clone(), 0, bytes.clone())],
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.gguf");
        std::fs::write(&path, &g.bytes).unwrap();
        let profile = crate::types::profile::Profile::default();
        let file = GgufFile::open(&path).unwrap();
        let src = crate::source::open(&path, &profile).unwrap();
        // Expert 0 and 3: LDLQ; expert 1: under MIN_EXPERT_TOKENS; expert 2: never routed.
        let tokens = [Some(100u64), Some(10), None, Some(200)];
        assert!(tokens[1].unwrap() < MIN_EXPERT_TOKENS && tokens[0].unwrap() >= MIN_EXPERT_TOKENS);
        let mut hs = Hessians::default();
        for (x, t) in tokens.iter().enumerate() {
            let Some(t) = *t else { continue };
            let xs = crate::gguf_gen::gaussian(100 + x as u64, t as usize * n, 1.0);
            let mut h = vec![0f64; n * n];
            for v in xs.chunks(n) {
                for a in 0..n {
                    for b in 0..n {
                        h[a * n + b] += v[a] as f64 * v[b] as f64;
                    }
                }
            }
            let key = expert_key(name, x);
            hs.groups.insert(
                key.clone(),
                Hessian {
                    tensors: vec![key],
                    n,
                    h,
                    tokens: t,
                },
            );
        }
        let ty = TensorType::Q4K;
        let plan = crate::plan::Plan {
            entries: vec![crate::plan::PlanEntry {
                name: name.into(),
                dims: dims.clone(),
                src: TensorType::F32,
                dst: ty,
                action: crate::plan::Action::Quantize,
                bytes: ty.bytes_for((n * per * n_exp) as u64).unwrap(),
                reasons: vec![],
                fallback: false,
                ldlq: true,
                importance: None,
            }],
            file_type: None,
            base_type: ty,
            ldlq: Default::default(),
        };
        let calib = Calibration::Memory(&hs);
        let whole = encode_entry(src.as_ref(), &plan, 0, &calib).unwrap();
        let mut q = vec![0f32; w.len()];
        crate::quant::decode_rows(ty, &whole, &mut q, n, name).unwrap();
        let mut rtn = vec![0f32; w.len()];
        let plain = crate::quant::encode_rows(ty, name, &w, n, &crate::quant::Encoder::Nearest);
        crate::quant::decode_rows(ty, &plain.unwrap(), &mut rtn, n, name).unwrap();
        assert!(
            q[..per * n] != rtn[..per * n],
            "expert 0 is LDLQ'd, not rounded"
        );
        let slots: Vec<Option<&Hessian>> = (0..n_exp).map(|x| hs.for_expert(name, x)).collect();
        let cap = (64 * n) as u64;
        let picks = super::super::probe::expert_picks(per as u64, n_exp, 64);
        let total: u64 = tokens.iter().flatten().sum();
        let s = ((per * n_exp) as f64 / picks.len() as f64).sqrt() as f32;
        let probe = |cap: u64, mode: Sample| {
            let (e, mut f) = (&plan.entries[0], Factors::new());
            super::super::probe::row_probe(
                &file,
                src.as_ref(),
                e,
                0,
                ty,
                &slots,
                plan.ldlq,
                &mut f,
                cap,
                mode,
            )
        };
        for mode in [Sample::Plain, Sample::Amplified] {
            let rp = probe(cap, mode)
                .unwrap()
                .expect("a stack over the cap is sampled");
            assert_eq!(rp.picks, picks);
            let sub = rp.substitute(&file).unwrap();
            let got: Vec<f32> = sub
                .3
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let mut err = 0.0;
            for r in 0..per * n_exp {
                let at = r * n..(r + 1) * n;
                if !picks.contains(&(r as u64)) {
                    assert!(got[at.clone()] == w[at], "row {r} changed");
                    continue;
                }
                let want: Vec<f32> = match mode {
                    Sample::Plain => q[at.clone()].to_vec(),
                    Sample::Amplified => w[at.clone()]
                        .iter()
                        .zip(&q[at.clone()])
                        .map(|(x, y)| *x + s * (*y - *x))
                        .collect(),
                };
                assert!(got[at.clone()] == want[..], "{mode:?}: row {r}");
                if let Some(h) = slots[r / per] {
                    let wt = Weighting::HessianRtn(h);
                    let e = row_errors(&w[at.clone()], &q[at], n, &wt)[0];
                    err += h.tokens as f64 / total as f64 * e;
                }
            }
            assert!(err > 0.0);
            assert!((rp.err - err).abs() <= 1e-9 * err, "{} vs {err}", rp.err);
        }
        // From a Hessian file (the sampled experts' groups loaded, the others' tokens from its
        // index): the same rows and error as from memory, at a cap that samples experts 1 and 3 only.
        let hp = dir.path().join("h.safetensors");
        hs.save(&hp, &Default::default(), crate::quant::Store::F64)
            .unwrap();
        let (hf, _) = crate::quant::HessianFile::open(&hp).unwrap();
        let mut enc = ProbeEncoder::default();
        let half = (32 * n) as u64;
        for (c, mode) in [
            (&calib, Sample::Amplified),
            (&Calibration::File(&hf), Sample::Amplified),
        ] {
            let a = enc
                .sample(&file, src.as_ref(), &plan, 0, ty, c, half, mode)
                .unwrap()
                .unwrap();
            let b = probe(half, mode).unwrap().unwrap();
            assert_eq!(
                b.picks
                    .iter()
                    .map(|r| r / per as u64)
                    .collect::<std::collections::BTreeSet<_>>(),
                [1, 3].into()
            );
            assert_eq!((a.picks, a.rows, a.err), (b.picks, b.rows, b.err));
        }
        // At the cap: the whole stack.
        let none = probe((n * per * n_exp) as u64, Sample::Plain);
        assert!(none.unwrap().is_none());
    }

    /// Measurement (`--ignored`, needs `TQ_BENCH_MODEL` and `TQ_BENCH_HESSIANS`, a `tq calib`
    /// file with per-expert Hessians; `TQ_BENCH_TENSOR` picks the stack, default block 0's
    /// `ffn_gate_exps`): the process CPU of one expert stack's probe encoded whole, as before,
    /// and on its row sample, at three candidate types (docs/bench/scale.md).
    #[test]
    #[ignore]
    fn bench_expert_stack_probe() {
        let (Ok(model), Ok(hfile)) = (
            std::env::var("TQ_BENCH_MODEL"),
            std::env::var("TQ_BENCH_HESSIANS"),
        ) else {
            return;
        };
        let name = std::env::var("TQ_BENCH_TENSOR")
            .unwrap_or_else(|_| "blk.0.ffn_gate_exps.weight".into());
        let model = std::path::PathBuf::from(model);
        let profile = crate::types::profile::Profile::default();
        let src = crate::source::open(&model, &profile).unwrap();
        let file = GgufFile::open(&model).unwrap();
        let req = crate::plan::Request::new(TensorType::Q4K, &crate::plan::recipe::RECIPES[0]);
        let mut plan = crate::plan::plan(src.tensors(), &req, &profile).unwrap();
        let (hf, _) = crate::quant::HessianFile::open(std::path::Path::new(&hfile)).unwrap();
        let calib = Calibration::File(&hf);
        let i = plan.entries.iter().position(|e| e.name == name).unwrap();
        let cpu = crate::io::progress::process_cpu_seconds;
        let cap = super::super::probe::probe_elements();
        for ty in [TensorType::Q4K, TensorType::IQ4XS, TensorType::Q6K] {
            let e = &mut plan.entries[i];
            e.dst = ty;
            e.action = crate::plan::Action::Quantize;
            e.bytes = ty.bytes_for(e.dims.iter().product()).unwrap();
            mark(&mut plan, &calib);
            assert!(
                plan.entries[i].ldlq,
                "{name}: no expert Hessians in {hfile}"
            );
            let t0 = cpu();
            let whole = encode_entry(src.as_ref(), &plan, i, &calib).unwrap();
            let t1 = cpu();
            let mut enc = ProbeEncoder::default();
            let rp = enc
                .sample(
                    &file,
                    src.as_ref(),
                    &plan,
                    i,
                    ty,
                    &calib,
                    cap,
                    Sample::Plain,
                )
                .unwrap()
                .expect("a stack over the cap");
            let t2 = cpu();
            let experts: std::collections::BTreeSet<u64> = rp
                .picks
                .iter()
                .map(|r| r / plan.entries[i].dims[1])
                .collect();
            eprintln!(
                "{name} {ty}: whole {:.1} CPU-s ({} bytes), {} rows of {} experts {:.1} CPU-s",
                t1 - t0,
                whole.len(),
                rp.picks.len(),
                experts.len(),
                t2 - t1
            );
        }
    }
}
