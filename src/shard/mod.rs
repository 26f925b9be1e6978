//! Work split across processes or machines (`--shard I/N`): calibration is data-parallel
//! (Hessians add up over windows) and quantization is tensor-parallel (every tensor is encoded on
//! its own). [`Shard`] decides the ranges, deterministically and independently of thread counts;
//! [`fragment`] writes one shard of a conversion and assembles the fragments into the final GGUF
//! (byte-identical to a one-process `tq convert`); [`merge`] sums Hessian shards from `tq calib
//! --shard` in a fixed order. See `docs/scale.md`.

pub mod fragment;
pub mod merge;

use crate::error::{Error, Result};
use std::ops::Range;

/// Shard `index` (0-based, as Slurm array and Kubernetes Indexed Job indices) of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// `"I/N"` with `0 <= I < N`.
    pub fn parse(s: &str) -> Result<Shard> {
        let bad = || {
            Error::Usage(format!(
                "--shard {s}: expected I/N with 0 <= I < N (e.g. 0/4 … 3/4)"
            ))
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// This shard's contiguous range of `weights.len()` items, balanced by weight: item `j`
    /// belongs to the shard whose share of the total contains the start of `j`'s weight, so
    /// boundaries depend only on the weights and `count` (zero-weight items go with the next
    /// item; trailing ones with the last shard).
    pub fn range_by_weight(&self, weights: &[u64]) -> Range<usize> {
        let total: u128 = weights.iter().map(|&w| w as u128).sum();
        let bound = |k: usize| -> usize {
            if k == 0 {
                return 0;
            }
            if k >= self.count {
                return weights.len();
            }
            // The first item whose start (prefix sum) reaches k/N of the total.
            let goal = k as u128 * total;
            let mut prefix = 0u128;
            for (j, &w) in weights.iter().enumerate() {
                if prefix * self.count as u128 >= goal {
                    return j;
                }
                prefix += w as u128;
            }
            weights.len()
        };
        bound(self.index)..bound(self.index + 1)
    }

    /// This shard's windows of `n_win`, in whole batches of `batch` windows, so that every
    /// `XᵀX` chunk holds the same windows as in a one-process run (the f32 tile products are
    /// then the same bits). `None` when there are more shards than batches.
    pub fn window_range(&self, n_win: usize, batch: usize) -> Option<Range<usize>> {
        let batches = n_win.div_ceil(batch.max(1));
        let b0 = self.index * batches / self.count;
        let b1 = (self.index + 1) * batches / self.count;
        (b1 > b0).then(|| b0 * batch..(b1 * batch).min(n_win))
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_only_i_of_n() {
        assert_eq!(Shard::parse("2/5").unwrap(), Shard { index: 2, count: 5 });
        for bad in ["5/5", "1/0", "a/2", "3", "-1/2", "1/2/3"] {
            let e = Shard::parse(bad).unwrap_err().to_string();
            assert!(e.contains("expected I/N"), "{bad}: {e}");
        }
    }

    #[test]
    fn weighted_ranges_tile_the_items_and_balance() {
        let w: Vec<u64> = (0..37u64).map(|i| (i * 7919) % 101 + 1).collect();
        for n in 1..=9 {
            let mut next = 0;
            let total: u64 = w.iter().sum();
            for i in 0..n {
                let r = Shard { index: i, count: n }.range_by_weight(&w);
                assert_eq!(r.start, next, "shards are contiguous");
                next = r.end;
                // No shard holds more than its share plus the largest item.
                let got: u64 = w[r].iter().sum();
                assert!(got <= total / n as u64 + 101 + 1, "n={n} i={i}: {got}");
            }
            assert_eq!(next, w.len(), "every item in exactly one shard");
        }
        // Zero weights (empty tensors) are still assigned.
        let z = [0, 5, 0, 0, 5, 0];
        let a = Shard { index: 0, count: 2 }.range_by_weight(&z);
        let b = Shard { index: 1, count: 2 }.range_by_weight(&z);
        assert_eq!((a.start, a.end, b.start, b.end), (0, 2, 2, 6));
    }

    #[test]
    fn window_ranges_are_whole_batches() {
        // 11 windows in batches of 3: [0,3) [3,6) [6,9) [9,11).
        let r: Vec<_> = (0..2)
            .map(|i| Shard { index: i, count: 2 }.window_range(11, 3).unwrap())
            .collect();
        assert_eq!(r, vec![0..6, 6..11]);
        let r: Vec<_> = (0..3)
            .map(|i| Shard { index: i, count: 3 }.window_range(11, 3).unwrap())
            .collect();
        assert_eq!(r, vec![0..3, 3..6, 6..11]);
        assert!(Shard { index: 0, count: 5 }.window_range(11, 3).is_none());
    }
}
