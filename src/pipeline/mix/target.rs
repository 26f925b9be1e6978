//! `--target-kld X`: the smallest mix whose calibrated predicted KLD is at most X. The size comes
//! from the knapsack's cost curve (the least summed prediction at each byte budget, searched by
//! bisection) through the calibration of the measured plans (`calibrate.rs`); the mix at that
//! size then measures its best few plans as any mix does, and when the best measured is above X
//! the next size is searched again with those measurements in the calibration (at least
//! [`MIN_STEP`] larger), at most [`MAX_SIZES`] sizes in all.

use super::calibrate::KldCalibration;
use crate::plan::mix;

/// Sizes measured at most before `--target-kld` gives up.
pub(super) const MAX_SIZES: usize = 4;

/// A step up is at least this fraction of the previous target.
pub(super) const MIN_STEP: f64 = 1.0 / 32.0;

/// Grid cells of the bisection's knapsacks (the size then written is solved at the full grid).
const SEARCH_CELLS: u64 = mix::GRID_CELLS / 16;

/// The calibrated prediction of the knapsack's plan for `mixed` bytes of the mixed tensors (None
/// when even the cheapest mix is over them).
fn predicted_at(
    pairs: &[Vec<(u64, f64)>],
    mixed: u64,
    cal: Option<&KldCalibration>,
) -> Option<f64> {
    let s = mix::solve(pairs, mixed, SEARCH_CELLS)?;
    Some(cal.map_or(s.cost, |c| c.apply(s.cost)))
}

/// The smallest whole-file target (`overhead` + the mixed tensors' bytes) whose knapsack plan has
/// a calibrated prediction of at most `x` (the summed prediction itself without a calibration),
/// not below `at_least`. Err: the least prediction reachable (every item at its best option) and
/// that file's bytes, when even it is above `x`.
pub(super) fn size_for(
    pairs: &[Vec<(u64, f64)>],
    overhead: u64,
    cal: Option<&KldCalibration>,
    x: f64,
    at_least: u64,
) -> Result<u64, (f64, u64)> {
    let lo0 = mix::min_bytes(pairs);
    let hi0: u64 = pairs
        .iter()
        .map(|o| o.iter().map(|p| p.0).max().unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    let best = predicted_at(pairs, hi0, cal).unwrap_or(f64::INFINITY);
    if !(best <= x) {
        return Err((best, hi0.saturating_add(overhead)));
    }
    let mut lo = lo0.max(at_least.saturating_sub(overhead));
    if lo >= hi0 {
        return Ok(hi0.saturating_add(overhead));
    }
    if predicted_at(pairs, lo, cal).is_some_and(|p| p <= x) {
        return Ok(lo.saturating_add(overhead));
    }
    // predicted(lo) > x ≥ predicted(hi): bisect to a few bytes per thousand of the range.
    let mut hi = hi0;
    let tol = ((hi0 - lo0) / 4096).max(1);
    while hi - lo > tol {
        let mid = lo + (hi - lo) / 2;
        if predicted_at(pairs, mid, cal).is_some_and(|p| p <= x) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi.saturating_add(overhead))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_size_meeting_the_prediction() {
        // Three items, each: 100 bytes at cost 1.0, 200 at 0.25, 400 at 0.0625.
        let item = vec![(100u64, 1.0), (200, 0.25), (400, 0.0625)];
        let pairs = vec![item.clone(), item.clone(), item];
        // Without a calibration the summed cost itself: 3.0 at 300 bytes, 0.1875 at 1200.
        assert_eq!(size_for(&pairs, 10, None, 3.0, 0), Ok(310));
        let s = size_for(&pairs, 10, None, 1.5, 0).unwrap();
        // 1 + 0.25 + 0.25 = 1.5 needs two items at 200 bytes: 500 mixed bytes.
        assert!((500 + 10..=502 + 10).contains(&s), "{s}");
        let smaller = size_for(&pairs, 10, None, 0.5, 0).unwrap();
        assert!(
            smaller > s,
            "a smaller target needs more bytes: {smaller} vs {s}"
        );
        // A calibration that doubles every prediction needs more bytes for the same target.
        let cal = KldCalibration {
            scale: 2.0,
            power: 1.0,
            plans: 1,
        };
        assert!(size_for(&pairs, 10, Some(&cal), 1.5, 0).unwrap() > s);
        // Unreachable: the least reachable prediction and its file size.
        assert_eq!(size_for(&pairs, 10, None, 0.1, 0), Err((0.1875, 1210)));
        // Never below `at_least`.
        assert_eq!(size_for(&pairs, 10, None, 3.0, 700), Ok(700));
    }
}
