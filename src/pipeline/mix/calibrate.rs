//! The fit's prediction, calibrated on whole plans. The fit prices each tensor alone (`α ×
//! error` from single-tensor KLDs) and sums; whole plans measure 1.2–1.8× that sum on SmolLM2
//! (on the `--kld-text` windows),
//! more at small KLDs than at large (errors of many tensors compound, and the single-tensor
//! probes sit near the noise floor of 2 windows). Every whole plan the mix measures (best of few)
//! is a point (the summed prediction, the measured KLD); the calibrated prediction is
//! `scale × sum^power`, fitted in log space over those points:
//!
//! - no point: none (the summed prediction is reported as it is, marked uncalibrated);
//! - fewer than 3 points, or sums spanning less than 1.5× (one size's plans): the power is 1 and
//!   the scale the geometric mean of the measured/summed ratios;
//! - otherwise the least-squares line of ln measured on ln sum, its power clamped to
//!   [0.5, 1.5] (the scale then refitted for the clamped power).
//!
//! The points are kept in the mix cache (each plan's summed prediction and measured KLD), so a
//! plan from the cache gets the calibration a cold run that measured the same plans gets.

use std::collections::BTreeMap;

/// `KLD ≈ scale × sum^power` over `plans` measured plans.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KldCalibration {
    pub scale: f64,
    pub power: f64,
    /// The measured plans it was fitted on.
    pub plans: usize,
}

/// Sums spanning less than this ratio fit a scale only.
const MIN_SPAN: f64 = 1.5;
const POWER: (f64, f64) = (0.5, 1.5);

impl KldCalibration {
    /// Fit over `points` (summed prediction, measured KLD); points that are not both positive
    /// and finite are left out. None without a usable point.
    pub fn fit(points: &[(f64, f64)]) -> Option<KldCalibration> {
        let ok: Vec<(f64, f64)> = points
            .iter()
            .filter(|(s, k)| s.is_finite() && k.is_finite() && *s > 0.0 && *k > 0.0)
            .map(|(s, k)| (s.ln(), k.ln()))
            .collect();
        if ok.is_empty() {
            return None;
        }
        let n = ok.len() as f64;
        let mx = ok.iter().map(|p| p.0).sum::<f64>() / n;
        let my = ok.iter().map(|p| p.1).sum::<f64>() / n;
        let lo = ok.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let hi = ok.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let power = if ok.len() < 3 || hi - lo < MIN_SPAN.ln() {
            1.0
        } else {
            let sxy: f64 = ok.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
            let sxx: f64 = ok.iter().map(|p| (p.0 - mx).powi(2)).sum();
            (sxy / sxx).clamp(POWER.0, POWER.1)
        };
        Some(KldCalibration {
            scale: (my - power * mx).exp(),
            power,
            plans: ok.len(),
        })
    }

    /// Fit over the measured plans of `points` (plan key → (summed prediction, measured KLD)),
    /// leaving out `except` (a plan's own measurement, so its prediction is out of sample).
    pub fn fit_except(
        points: &BTreeMap<String, (f64, f64)>,
        except: Option<&str>,
    ) -> Option<KldCalibration> {
        let v: Vec<(f64, f64)> = points
            .iter()
            .filter(|(k, _)| Some(k.as_str()) != except)
            .map(|(_, p)| *p)
            .collect();
        KldCalibration::fit(&v)
    }

    /// The calibrated prediction of a summed prediction.
    pub fn apply(&self, sum: f64) -> f64 {
        if sum <= 0.0 {
            return 0.0;
        }
        self.scale * sum.powf(self.power)
    }

    /// The summed prediction whose calibrated prediction is `kld` (the inverse of [`apply`]).
    pub fn invert(&self, kld: f64) -> f64 {
        (kld / self.scale).powf(1.0 / self.power)
    }

    /// `KLD = 1.78 x sum^0.84 over 7 measured plans`, as the report and provenance say it.
    pub fn describe(&self) -> String {
        format!(
            "KLD = {:.4} x sum^{:.3} over {} measured plans",
            self.scale, self.power, self.plans
        )
    }
}

/// The calibration's points: the measured plans (key → KLD) whose summed prediction is known.
pub(super) fn points(
    known: &BTreeMap<String, f64>,
    sums: &BTreeMap<String, f64>,
) -> BTreeMap<String, (f64, f64)> {
    known
        .iter()
        .filter_map(|(k, m)| sums.get(k).map(|s| (k.clone(), (*s, *m))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_power_law_and_falls_back_to_a_scale() {
        // Exact power law over a wide span: scale and power recovered.
        let pts: Vec<(f64, f64)> = [0.001, 0.003, 0.01, 0.03, 0.1]
            .iter()
            .map(|&s| (s, 2.5 * f64::powf(s, 0.8)))
            .collect();
        let c = KldCalibration::fit(&pts).unwrap();
        assert!(
            (c.power - 0.8).abs() < 1e-9 && (c.scale - 2.5).abs() < 1e-9,
            "{c:?}"
        );
        assert!((c.apply(0.02) - 2.5 * 0.02f64.powf(0.8)).abs() < 1e-12);
        assert!((c.invert(c.apply(0.02)) - 0.02).abs() < 1e-12);
        assert_eq!(c.plans, 5);
        // A narrow span (one size's plans): a scale only, the geometric mean of the ratios.
        let c = KldCalibration::fit(&[(0.010, 0.02), (0.012, 0.03), (0.011, 0.02)]).unwrap();
        assert_eq!(c.power, 1.0);
        let gm = ((0.02f64 / 0.010).ln() + (0.03f64 / 0.012).ln() + (0.02f64 / 0.011).ln()) / 3.0;
        assert!((c.scale - gm.exp()).abs() < 1e-12);
        // Two points: a scale only, even when they span a wide range.
        assert_eq!(
            KldCalibration::fit(&[(0.001, 0.01), (0.1, 0.2)])
                .unwrap()
                .power,
            1.0
        );
        // A steep law is clamped to the power's range.
        let steep: Vec<(f64, f64)> = [0.01, 0.1, 1.0].iter().map(|&s| (s, s * s * s)).collect();
        assert_eq!(KldCalibration::fit(&steep).unwrap().power, 1.5);
        // Unusable points only: none.
        assert!(KldCalibration::fit(&[(0.0, 0.1), (f64::NAN, 0.1), (0.1, -1.0)]).is_none());
        // Leaving a plan out leaves its point out.
        let m: BTreeMap<String, (f64, f64)> =
            [("a".into(), (0.01, 0.02)), ("b".into(), (0.01, 0.04))].into();
        let one = KldCalibration::fit_except(&m, Some("b")).unwrap();
        assert!((one.scale - 2.0).abs() < 1e-12 && one.plans == 1, "{one:?}");
        assert!(KldCalibration::fit_except(&m, None).unwrap().scale > 2.0);
    }
}
