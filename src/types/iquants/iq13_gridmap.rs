//! The search structure llama.cpp's grid encoders use (`iq3xs_init_impl` for the IQ3 grids,
//! `iq2xs_init_impl` for the IQ2 and IQ1 grids, in `ggml-quants.c`): a map from every point of
//! the coarse integer lattice to its grid row, and, for a point that is not a grid row, its list
//! of "neighbours". One builder for all six grids (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S /
//! IQ1_M).
//!
//! A grid row holds `W` values with level indices `l` in `0..2^bits` (`grids.rs`); the encoders
//! see value `2·l + 1`. A lattice point is keyed by `Σ l_j << (bits·j)`. The neighbours of an
//! off-grid point are every grid row whose squared distance (in the `2·l + 1` coordinates) is one
//! of the `nwant` smallest distinct distances, ordered by (distance, row) — llama.cpp sorts
//! `(d², row)` pairs, a total order, so the list is unique. `nwant` is 2 for IQ2_XXS, IQ2_XS and
//! IQ3_XXS, 1 for IQ2_S, 3 for IQ3_S and IQ1_S / IQ1_M.

/// The grid rows, the lattice → row map and the neighbour lists of one grid.
pub(crate) struct GridMap<const W: usize> {
    /// Row `r` in the encoders' coordinates `2·l + 1`.
    pub rows: Vec<[i8; W]>,
    /// Lattice key → `r ≥ 0` (on the grid), `−(o + 1)` (neighbours at `nbr[o]`), or `i32::MIN`
    /// (a key no encoder asks for, not computed).
    map: Vec<i32>,
    /// Per off-grid key: the count, then that many row indices.
    nbr: Vec<u16>,
    bits: u32,
}

/// What one lattice lookup found.
pub(crate) enum Lookup<'a> {
    /// The point is grid row `r`.
    Row(usize),
    /// The point is off the grid: these rows are its neighbours.
    Near(&'a [u16]),
}

impl<const W: usize> GridMap<W> {
    /// Build from packed rows (`grids.rs`: `bits` per value). `max_level` bounds the levels the
    /// encoder can produce (7 for IQ3, 2 for IQ1): keys with a larger level get no neighbour
    /// list (llama.cpp computes them too; no encoder looks them up).
    pub(crate) fn new(packed: &[u16], bits: u32, max_level: u16, nwant: usize) -> GridMap<W> {
        let mask = (1u16 << bits) - 1;
        let rows: Vec<[i8; W]> = packed
            .iter()
            .map(|&p| std::array::from_fn(|j| 2 * ((p >> (bits * j as u32)) & mask) as i8 + 1))
            .collect();
        let size = 1usize << (bits * W as u32);
        let mut map = vec![i32::MIN; size];
        for (r, &p) in packed.iter().enumerate() {
            map[p as usize] = r as i32;
        }
        let mut nbr = Vec::new();
        let mut d2: Vec<(i32, u16)> = Vec::with_capacity(rows.len());
        for (key, m) in map.iter_mut().enumerate() {
            if *m >= 0 {
                continue;
            }
            let pos: [i32; W] =
                std::array::from_fn(|j| ((key >> (bits as usize * j)) as u16 & mask) as i32);
            if pos.iter().any(|&l| l > max_level as i32) {
                continue;
            }
            d2.clear();
            for (r, row) in rows.iter().enumerate() {
                let d: i32 = (0..W)
                    .map(|j| {
                        let e = row[j] as i32 - (2 * pos[j] + 1);
                        e * e
                    })
                    .sum();
                d2.push((d, r as u16));
            }
            d2.sort_unstable();
            let start = nbr.len();
            nbr.push(0);
            let (mut cur, mut have) = (d2[0].0, 1);
            for &(d, r) in &d2 {
                if d > cur {
                    if have == nwant {
                        break;
                    }
                    cur = d;
                    have += 1;
                }
                nbr.push(r);
            }
            nbr[start] = (nbr.len() - start - 1) as u16;
            *m = -(start as i32 + 1);
        }
        GridMap {
            rows,
            map,
            nbr,
            bits,
        }
    }

    /// The key of `W` levels.
    #[inline]
    pub(crate) fn key(&self, l: &[i8]) -> usize {
        l.iter().enumerate().fold(0usize, |k, (j, &v)| {
            k | (v as usize) << (self.bits as usize * j)
        })
    }

    /// Look up the point with levels `l` (each within the encoder's range).
    #[inline]
    pub(crate) fn find(&self, l: &[i8]) -> Lookup<'_> {
        self.find_key(self.key(l))
    }

    /// Look up the point of lattice key `key` (its levels within the encoder's range).
    #[inline]
    pub(crate) fn find_key(&self, key: usize) -> Lookup<'_> {
        let m = self.map[key];
        if m >= 0 {
            Lookup::Row(m as usize)
        } else {
            debug_assert!(m != i32::MIN, "level out of the encoder's range");
            let o = (-(m + 1)) as usize;
            let n = self.nbr[o] as usize;
            Lookup::Near(&self.nbr[o + 1..o + 1 + n])
        }
    }

    /// The grid row of lattice key `key`, if that point is on the grid (any key).
    #[inline]
    pub(crate) fn row_of(&self, key: usize) -> Option<usize> {
        usize::try_from(self.map[key]).ok()
    }

    /// The neighbour (of a lookup's `nbr`) of least `Σ w (s·value(c) − x)²` over its `W`
    /// coordinates `c` (`2·l + 1`; `value` maps one to what the encoder scales: itself for the
    /// IQ2 / IQ3 grids, IQ1's shifted level), first on ties, f32 in ggml's order: ggml's
    /// `iq2_find_best_neighbour`, `iq3_find_best_neighbour` and `iq1_find_best_neighbour2`. Its
    /// levels go into `l`; its row is returned. (ggml asserts that one was found; with finite
    /// inputs some distance is finite, and should none be, the first neighbour is taken.)
    #[inline]
    pub(crate) fn best_neighbour(
        &self,
        nbr: &[u16],
        x: &[f32],
        w: &[f32],
        s: f32,
        value: impl Fn(i8) -> f32,
        l: &mut [i8],
    ) -> usize {
        let mut best = f32::MAX;
        let mut idx = None;
        for &r in nbr {
            let row = &self.rows[r as usize];
            let mut d2 = 0f32;
            for i in 0..W {
                let diff = s * value(row[i]) - x[i];
                d2 += w[i] * diff * diff;
            }
            if d2 < best {
                best = d2;
                idx = Some(r as usize);
            }
        }
        let idx = idx.unwrap_or(nbr[0] as usize);
        l.copy_from_slice(&self.levels(idx));
        idx
    }

    /// Levels `l` of row `r` (`(v − 1) / 2` of its coordinates).
    #[inline]
    pub(crate) fn levels(&self, r: usize) -> [i8; W] {
        self.rows[r].map(|v| (v - 1) / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every off-grid point's neighbours are exactly the rows within its `nwant` smallest
    /// distances (brute force), in (distance, row) order, and on-grid points map to their row.
    #[test]
    fn neighbours_are_the_nearest_shells() {
        let packed: Vec<u16> = (0..64u16).map(|i| (i * 37) % 512).collect();
        let mut uniq = packed.clone();
        uniq.sort();
        uniq.dedup();
        let g = GridMap::<3>::new(&uniq, 3, 7, 2);
        for key in 0..512usize {
            let l: Vec<i8> = (0..3).map(|j| ((key >> (3 * j)) & 7) as i8).collect();
            let d = |r: usize| -> i32 {
                (0..3)
                    .map(|j| (g.rows[r][j] as i32 - (2 * l[j] as i32 + 1)).pow(2))
                    .sum()
            };
            match g.find(&l) {
                Lookup::Row(r) => assert_eq!(d(r), 0),
                Lookup::Near(n) => {
                    let mut ds: Vec<i32> = (0..g.rows.len()).map(d).collect();
                    ds.sort();
                    ds.dedup();
                    let want: Vec<u16> = {
                        let mut v: Vec<(i32, u16)> = (0..g.rows.len())
                            .filter(|&r| d(r) <= ds[1])
                            .map(|r| (d(r), r as u16))
                            .collect();
                        v.sort();
                        v.into_iter().map(|p| p.1).collect()
                    };
                    assert_eq!(n, &want[..], "key {key}");
                }
            }
        }
    }
}
