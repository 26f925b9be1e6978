//! Noise-aware verdicts. An estimate `v ± e` (e its standard error) against a limit: the check
//! fails only when the whole interval `v ± Z·e` lies beyond the limit, passes when the whole
//! interval lies within it, and is undecided when the interval straddles it — more windows
//! narrow the interval (`--chunks auto` adds them until it no longer straddles).

use serde::{Deserialize, Serialize};

/// Half-width of the verdict interval in standard errors (~95% two-sided for a normal estimate).
pub const Z: f64 = 2.0;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Undecided,
    Skipped,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Undecided => "undecided",
            Status::Skipped => "skipped",
        }
    }

    /// The process exit code of a report with this verdict.
    pub fn exit_code(self) -> i32 {
        match self {
            Status::Pass | Status::Skipped => 0,
            Status::Fail => 3,
            Status::Undecided => 4,
        }
    }
}

/// Which side of the limit is good.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// Good when the value is at most the limit (KLD, PPL ratio).
    Max,
    /// Good when the value is at least the limit (same-top-1, agreement).
    Min,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Limit {
    pub bound: Bound,
    pub value: f64,
}

/// The verdict on `value ± err` (standard error) against `limit`. A non-finite estimate fails.
pub fn verdict(value: f64, err: f64, limit: Limit) -> Status {
    if !value.is_finite() || !err.is_finite() {
        return Status::Fail;
    }
    let (lo, hi) = (value - Z * err, value + Z * err);
    match limit.bound {
        Bound::Max if hi <= limit.value => Status::Pass,
        Bound::Max if lo > limit.value => Status::Fail,
        Bound::Min if lo >= limit.value => Status::Pass,
        Bound::Min if hi < limit.value => Status::Fail,
        _ => Status::Undecided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Limit = Limit {
        bound: Bound::Max,
        value: 0.01,
    };
    const MIN: Limit = Limit {
        bound: Bound::Min,
        value: 90.0,
    };

    #[test]
    fn max_bound_decides_only_outside_the_interval() {
        assert_eq!(verdict(0.005, 0.001, MAX), Status::Pass); // 0.003..0.007
        assert_eq!(verdict(0.009, 0.001, MAX), Status::Undecided); // 0.007..0.011
        assert_eq!(verdict(0.011, 0.001, MAX), Status::Undecided); // 0.009..0.013
        assert_eq!(verdict(0.013, 0.001, MAX), Status::Fail); // 0.011..0.015
        assert_eq!(verdict(0.008, 0.001, MAX), Status::Pass); // touching the limit passes
        assert_eq!(verdict(0.0101, 0.0, MAX), Status::Fail); // no noise: a plain comparison
    }

    #[test]
    fn min_bound_mirrors_max() {
        assert_eq!(verdict(95.0, 1.0, MIN), Status::Pass);
        assert_eq!(verdict(91.0, 1.0, MIN), Status::Undecided);
        assert_eq!(verdict(89.0, 1.0, MIN), Status::Undecided);
        assert_eq!(verdict(87.0, 1.0, MIN), Status::Fail);
    }

    #[test]
    fn non_finite_estimates_fail() {
        assert_eq!(verdict(f64::NAN, 0.0, MAX), Status::Fail);
        assert_eq!(verdict(0.0, f64::INFINITY, MIN), Status::Fail);
    }
}
