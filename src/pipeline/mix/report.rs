//! What a mix chose and measured: the report's lines, JSON and provenance keys.

use super::calibrate::KldCalibration;
use crate::types::TensorType;
use std::path::PathBuf;

/// One measured single-tensor KLD of the fit.
#[derive(Clone)]
pub struct Probe {
    pub tensor: String,
    pub ty: TensorType,
    pub err: f64,
    pub kld: f64,
}

/// One whole plan the mix measured (best of few).
#[derive(Clone)]
pub struct Tried {
    /// `knapsack`, `knapsack, one alpha` or `preset NAME`.
    pub name: String,
    /// The file's bytes.
    pub file: u64,
    /// The fit's summed prediction (None when a type is not one of the mix's candidates).
    pub predicted: Option<f64>,
    /// That sum calibrated on the other measured plans (out of sample: its own left out).
    pub calibrated: Option<f64>,
    /// Measured on the `--kld-text` windows.
    pub kld: f64,
    /// Read from `--mix-cache` rather than measured in this run.
    pub cached: bool,
}

/// One size `--target-kld` measured.
#[derive(Clone)]
pub struct Step {
    pub target: u64,
    pub file: u64,
    /// The best measured plan at that size.
    pub plan: String,
    /// Its calibrated prediction.
    pub predicted: Option<f64>,
    pub measured: f64,
}

#[derive(Default)]
pub struct MixReport {
    pub target: u64,
    pub min_file: u64,
    pub file: u64,
    pub weighting: &'static str,
    pub types: Vec<TensorType>,
    pub err: f64,
    /// Standard error of `err` from the row sample.
    pub err_se: f64,
    /// Of `err`, the activation-rounding term's part (when it was measured).
    pub act_err: Option<f64>,
    pub alpha: Option<f64>,
    /// Per-role slopes (`attn_v.weight` → α), from that role's probes; other roles use `alpha`.
    pub role_alpha: std::collections::BTreeMap<String, f64>,
    /// R² of the per-role predictions over the probes (in-sample).
    pub r2_roles: Option<f64>,
    /// Summed prediction of the chosen mix: `α × error` plus the measured KLDs of direct items.
    pub predicted: Option<f64>,
    /// The calibration of that sum on measured whole plans (the chosen plan's own measurement
    /// left out); None before any plan is measured.
    pub calibration: Option<KldCalibration>,
    /// `--target-kld X` and the sizes it measured.
    pub target_kld: Option<f64>,
    pub steps: Vec<Step>,
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
    pub exact_rows: usize,
    pub sens_s: f64,
    pub fit_s: f64,
    pub dp_s: f64,
    /// Seconds measuring whole plans (best of few).
    pub best_s: f64,
    /// The whole plans measured on the `--kld-text` windows (none without it).
    pub tried: Vec<Tried>,
    /// Which of `tried` the mix wrote (the best measured that fits).
    pub chosen: Option<usize>,
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

    /// The predicted KLD: the summed prediction calibrated when a calibration is known.
    pub fn predicted_kld(&self) -> Option<f64> {
        self.predicted_calibrated().or(self.predicted)
    }

    pub fn predicted_calibrated(&self) -> Option<f64> {
        self.predicted
            .zip(self.calibration)
            .map(|(p, c)| c.apply(p))
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
                // The summed prediction: a function of the measurements alone, so a plan from
                // --mix-cache writes the bytes of a cold run (the calibration grows with the cache).
                "tq.mix.predicted_kld".into(),
                self.predicted.map_or("none".into(), |k| format!("{k:.5}")),
            ),
        ]
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "target_bytes": self.target, "min_bytes": self.min_file, "file_bytes": self.file,
            "weighting": self.weighting, "types": self.types.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "error": self.err, "error_se": self.err_se, "activation_rounding_error": self.act_err, "alpha": self.alpha, "r2": self.r2, "role_alpha": self.role_alpha, "r2_roles": self.r2_roles,
            "predicted_kld": self.predicted_kld(), "predicted_kld_uncalibrated": self.predicted, "kld_windows": self.kld_windows,
            "calibration": self.calibration.map(|c| serde_json::json!({"scale": c.scale, "power": c.power, "plans": c.plans})),
            "target_kld": self.target_kld,
            "target_kld_sizes": self.steps.iter().map(|s| serde_json::json!({"target_bytes": s.target, "file_bytes": s.file, "plan": s.plan, "predicted_kld": s.predicted, "measured_kld": s.measured})).collect::<Vec<_>>(),
            "probes": self.probes.iter().map(|p| serde_json::json!({"tensor": p.tensor, "type": p.ty.name(), "error": p.err, "kld": p.kld})).collect::<Vec<_>>(),
            "direct": self.direct.iter().map(|(n, t, k)| serde_json::json!({"tensor": n, "type": t.name(), "kld": k})).collect::<Vec<_>>(),
            "pinned": self.pinned.iter().map(|(n, t)| serde_json::json!({"tensor": n, "type": t.name()})).collect::<Vec<_>>(),
            "grid_bytes": self.grid, "slack_bytes": self.slack, "rows_sampled": self.rows, "rows_exact": self.exact_rows.min(self.rows),
            "sensitivity_seconds": self.sens_s, "fit_seconds": self.fit_s, "dp_seconds": self.dp_s,
            "plans_seconds": self.best_s,
            "plans": self.tried.iter().map(|t| serde_json::json!({"plan": t.name, "file_bytes": t.file, "predicted_kld": t.calibrated.or(t.predicted), "predicted_kld_uncalibrated": t.predicted, "measured_kld": t.kld, "from_cache": t.cached})).collect::<Vec<_>>(),
            "chosen": self.chosen.and_then(|k| self.tried.get(k)).map(|t| t.name.clone()),
            "measured_kld": self.chosen.and_then(|k| self.tried.get(k)).map(|t| t.kld),
        })
    }

    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "mix: {} bytes for a target of {} (cheapest candidate mix {}); grid {} bytes, worst-case slack {} bytes",
            self.file, self.target, self.min_file, self.grid, self.slack
        )];
        v.push(format!(
            "mix: weighting {}; summed error {:.4e} ± {:.1e} (row sample of {} per tensor, {} with LDLQ)",
            self.weighting, self.err, self.err_se, self.rows, self.exact_rows.min(self.rows)
        ));
        if let Some(a) = self.act_err.filter(|_| self.err > 0.0) {
            v.push(format!(
                "mix: of it, activation rounding {a:.4e} ({:.0}%: the 8-bit inputs of the quantized matrix products)",
                100.0 * a / self.err
            ));
        }
        match (self.alpha, self.r2) {
            (Some(a), Some(r)) => {
                v.push(match (self.predicted, self.calibration) {
                    (Some(p), Some(c)) => format!(
                        "mix: predicted KLD {:.5} (the summed prediction {p:.5} calibrated: {}, this plan's own measurement left out)",
                        c.apply(p),
                        c.describe()
                    ),
                    _ => format!(
                        "mix: predicted KLD {} (uncalibrated: the summed single-tensor prediction; no whole plan measured)",
                        self.predicted.map_or("-".into(), |p| format!("{p:.5}"))
                    ),
                });
                v.push(format!(
                    "mix: summed prediction {:.5} (fit ln KLD = ln alpha + ln error, alpha per role ({} roles), R2 of ln KLD {}; one alpha for all: {a:.4e}, R2 {r:.3}; {} single-tensor KLDs on {} windows)",
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
        if !self.tried.is_empty() {
            v.push(format!(
                "mix: best of {} plans, measured on {} windows of --kld-text:",
                self.tried.len(),
                self.kld_windows
            ));
            for (k, t) in self.tried.iter().enumerate() {
                v.push(format!(
                    "mix: {} {}: {} bytes, KLD {:.5} (predicted {}, summed {}){}",
                    if Some(k) == self.chosen { "*" } else { " " },
                    t.name,
                    t.file,
                    t.kld,
                    t.calibrated.map_or("-".into(), |p| format!("{p:.5}")),
                    t.predicted.map_or("-".into(), |p| format!("{p:.5}")),
                    if t.cached { ", from --mix-cache" } else { "" }
                ));
            }
            if let Some(t) = self.chosen.and_then(|k| self.tried.get(k)) {
                v.push(format!(
                    "mix: wrote {} (the best measured that fits)",
                    t.name
                ));
            }
        }
        if let Some(x) = self.target_kld {
            for s in &self.steps {
                v.push(format!(
                    "mix: --target-kld {x}: {} bytes, {}: measured {:.5}, predicted {}",
                    s.file,
                    s.plan,
                    s.measured,
                    s.predicted.map_or("-".into(), |p| format!("{p:.5}"))
                ));
            }
        }
        v.push(format!(
            "mix: sensitivity {:.1} s, KLD fit {:.1} s, DP {:.2} s, measured plans {:.1} s",
            self.sens_s, self.fit_s, self.dp_s, self.best_s
        ));
        v
    }
}
