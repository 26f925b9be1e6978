//! Cross-block TQ quantizers: `LANES` blocks at once in structure-of-arrays form (element `j`
//! of block `l` is lane `l` of vector `j`). Every lane runs exactly the f32 operations of the
//! scalar reference (`super::reference`) for its block, in the same order, with the same
//! operands, so the output is bit-equal (held by the `lanes_*` tests below):
//! - the index is a branchless binary search over the sorted thresholds done lane-wise
//!   (threshold and centroid lookups by in-register permutes on AVX2, a compare/select chain in
//!   the portable backend; `!(v < T[k])` is monotone in k, and NaN maps to the top index as in
//!   `tq_index`);
//! - the multiplier search keeps the first strict minimum by a lane-wise `err < best_err` select;
//! - refinement runs per half until every lane of the group is at a fixed point (its indices
//!   repeat those of the previous round, so every later round reproduces the same d), at most
//!   `REFINE_ROUNDS` rounds: lanes that converged earlier just repeat their fixed point.
//!
//! Two backends implement the lane operations: `avx2` intrinsics (x86-64, chosen at run time;
//! no FMA, which would fuse and change the rounding) and `portable` `[f32; LANES]` loops that
//! the compiler vectorizes for the baseline target.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;

use super::{INV_SQRT32, MULTS, QK, REFINE_ROUNDS, SIGNS, TQ3_BYTES, TQ4_BYTES};
use crate::types::float::f32_to_f16_bits;
use portable::Portable;

/// Blocks per cross-block group.
const LANES: usize = 8;

/// Lane-wise f32 operations; each is one IEEE f32 operation per lane (or an exact select).
trait Lanes: Copy {
    type Idx: Copy;
    unsafe fn splat(v: f32) -> Self;
    unsafe fn load(p: &[f32; LANES]) -> Self;
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn div(self, o: Self) -> Self;
    unsafe fn sqrt(self) -> Self;
    /// `if self > 1e-10 { 1.0 / self } else { 0.0 }` (the reference's `inv_of`).
    unsafe fn inv_guarded(self) -> Self;
    /// `if a < b { x } else { y }`.
    unsafe fn select_lt(a: Self, b: Self, x: Self, y: Self) -> Self;
    /// `if a > b { x } else { y }`.
    unsafe fn select_gt(a: Self, b: Self, x: Self, y: Self) -> Self;
    /// Centroid and index of `v` under ([`C4`], [`T4`]): `tq_index(v, &T4)` per lane.
    unsafe fn lookup4(self) -> (Self, Self::Idx);
    /// Centroid and index of `v` under ([`C3`], [`T3`]).
    unsafe fn lookup3(self) -> (Self, Self::Idx);
    /// `lookup4(v).0`, possibly cheaper.
    unsafe fn centroid4(self) -> Self {
        self.lookup4().0
    }
    /// `lookup3(v).0`, possibly cheaper.
    unsafe fn centroid3(self) -> Self {
        self.lookup3().0
    }
    /// Load `LANES` consecutive blocks transposed: vector `j` holds element `j` of each block.
    unsafe fn load_transposed(x: &[f32; LANES * QK]) -> [Self; QK] {
        let mut t = [[0f32; LANES]; QK];
        for (l, blk) in x.chunks_exact(QK).enumerate() {
            for (j, &v) in blk.iter().enumerate() {
                t[j][l] = v;
            }
        }
        let mut out = [Self::splat(0.0); QK];
        for (o, r) in out.iter_mut().zip(&t) {
            *o = Self::load(r);
        }
        out
    }
    /// Whether `a[k] == b[k]` in every lane for every k (operands are never NaN).
    unsafe fn all_eq(a: &[Self], b: &[Self]) -> bool;
    unsafe fn store_idx(i: Self::Idx, out: &mut [i32; LANES]);
    unsafe fn store(self, out: &mut [f32; LANES]);
}

/// Result of a group: f32 half scales and indices, lane-major within each row.
struct GroupQ {
    d: [[f32; LANES]; 2],
    idx: [[i32; LANES]; QK],
}

#[inline(always)]
unsafe fn lookup<S: Lanes, const FOUR: bool>(v: S) -> (S, S::Idx) {
    if FOUR {
        v.lookup4()
    } else {
        v.lookup3()
    }
}

#[inline(always)]
unsafe fn centroid<S: Lanes, const FOUR: bool>(v: S) -> S {
    if FOUR {
        v.centroid4()
    } else {
        v.centroid3()
    }
}

/// Quantize one group of `LANES` blocks, given transposed (`x[j]` holds element j of each block).
#[inline(always)]
unsafe fn quantize_group<S: Lanes, const FOUR: bool>(x: &[S; QK]) -> GroupQ {
    let mut b = [S::splat(0.0); QK];
    for j in 0..QK {
        b[j] = x[j].mul(S::splat(SIGNS[j]));
    }
    let mut step = 1;
    while step < QK {
        let mut i = 0;
        while i < QK {
            for j in i..i + step {
                let (a, c) = (b[j], b[j + step]);
                b[j] = a.add(c);
                b[j + step] = a.sub(c);
            }
            i += 2 * step;
        }
        step *= 2;
    }
    let isq = S::splat(INV_SQRT32);
    for v in b.iter_mut() {
        *v = v.mul(isq);
    }

    let mut rms = [S::splat(0.0); 2];
    for h in 0..2 {
        let mut s = S::splat(0.0);
        for v in &b[h * 16..h * 16 + 16] {
            s = s.add(v.mul(*v));
        }
        rms[h] = s.div(S::splat(16.0)).sqrt();
    }

    // Multiplier search: first strict minimum of the error over all 32 values. Three
    // multipliers per pass over the values (independent error chains); each error still sums
    // its 32 terms in index order.
    let mut ds = [[S::splat(0.0); 9]; 2];
    let mut invs = [[S::splat(0.0); 9]; 2];
    for (k, &m) in MULTS.iter().enumerate() {
        for h in 0..2 {
            ds[h][k] = rms[h].mul(S::splat(m));
            invs[h][k] = ds[h][k].inv_guarded();
        }
    }
    let mut err = [S::splat(0.0); 9];
    for h in 0..2 {
        for t in 0..3 {
            let (d3, inv3) = (&ds[h][3 * t..3 * t + 3], &invs[h][3 * t..3 * t + 3]);
            let mut e3 = [err[3 * t], err[3 * t + 1], err[3 * t + 2]];
            for &v in &b[h * 16..h * 16 + 16] {
                for u in 0..3 {
                    let c = centroid::<S, FOUR>(v.mul(inv3[u]));
                    let diff = v.sub(c.mul(d3[u]));
                    e3[u] = e3[u].add(diff.mul(diff));
                }
            }
            err[3 * t..3 * t + 3].copy_from_slice(&e3);
        }
    }
    let mut best = rms;
    let mut best_err = S::splat(1e30);
    for k in 0..9 {
        best[0] = S::select_lt(err[k], best_err, ds[0][k], best[0]);
        best[1] = S::select_lt(err[k], best_err, ds[1][k], best[1]);
        best_err = S::select_lt(err[k], best_err, err[k], best_err);
    }

    // Refinement per half (the halves are independent), stopping when every lane has reached
    // a fixed point; then the last indices are the final ones.
    let mut out = GroupQ {
        d: [[0.0; LANES]; 2],
        idx: [[0; LANES]; QK],
    };
    for h in 0..2 {
        let hb = &b[h * 16..h * 16 + 16];
        let mut d = best[h];
        let mut prev = [S::splat(0.0); 16];
        let mut cur = [S::splat(0.0); 16];
        let mut cur_i = [[0i32; LANES]; 16];
        let mut fixed = false;
        for round in 0..REFINE_ROUNDS {
            let inv = d.inv_guarded();
            for k in 0..16 {
                let (c, i) = lookup::<S, FOUR>(hb[k].mul(inv));
                cur[k] = c;
                S::store_idx(i, &mut cur_i[k]);
            }
            // Indices equal to the previous round's give the same sums, so the next d equals
            // this one and every later round repeats this one: d is final, and so are `cur`.
            if round > 0 && S::all_eq(&cur, &prev) {
                fixed = true;
                break;
            }
            let mut sxc = S::splat(0.0);
            let mut scc = S::splat(0.0);
            for k in 0..16 {
                sxc = sxc.add(hb[k].mul(cur[k]));
                scc = scc.add(cur[k].mul(cur[k]));
            }
            d = S::select_gt(scc, S::splat(1e-10), sxc.div(scc), d);
            prev = cur;
        }
        d.store(&mut out.d[h]);
        if fixed {
            out.idx[h * 16..h * 16 + 16].copy_from_slice(&cur_i);
        } else {
            let inv = d.inv_guarded();
            for (k, &v) in hb.iter().enumerate() {
                S::store_idx(lookup::<S, FOUR>(v.mul(inv)).1, &mut out.idx[h * 16 + k]);
            }
        }
    }
    out
}

/// Quantize whole blocks (`min(src.len() / 32, out.len() / bytes)` of them) group by group;
/// a last partial group is padded with zero blocks whose output is discarded.
#[inline(always)]
unsafe fn quantize_lanes<S: Lanes, const FOUR: bool>(src: &[f32], out: &mut [u8]) {
    let bytes = if FOUR { TQ4_BYTES } else { TQ3_BYTES };
    let nb = (src.len() / QK).min(out.len() / bytes);
    let mut g = 0;
    while g < nb {
        let n = LANES.min(nb - g);
        let x = if n == LANES {
            S::load_transposed(src[g * QK..(g + LANES) * QK].try_into().unwrap())
        } else {
            let mut pad = [0f32; LANES * QK];
            pad[..n * QK].copy_from_slice(&src[g * QK..(g + n) * QK]);
            S::load_transposed(&pad)
        };
        let q = quantize_group::<S, FOUR>(&x);
        // Packed index words, lane-wise: word `w` holds indices 8w..8w+8 at `bits` bits each
        // (TQ4: the 4 LE bytes of qs[4w..4w+4], low nibble first; TQ3: the 24-bit group w).
        let bits = if FOUR { 4 } else { 3 };
        let mut words = [[0u32; LANES]; 4];
        for (w, row) in words.iter_mut().enumerate() {
            for e in 0..8 {
                let ix = &q.idx[8 * w + e];
                for l in 0..LANES {
                    row[l] |= (ix[l] as u32) << (bits * e);
                }
            }
        }
        for l in 0..n {
            let o = &mut out[(g + l) * bytes..(g + l + 1) * bytes];
            o[0..2].copy_from_slice(&f32_to_f16_bits(q.d[0][l]).to_le_bytes());
            o[2..4].copy_from_slice(&f32_to_f16_bits(q.d[1][l]).to_le_bytes());
            let wb = if FOUR { 4 } else { 3 };
            for (w, row) in words.iter().enumerate() {
                o[4 + wb * w..4 + wb * (w + 1)].copy_from_slice(&row[l].to_le_bytes()[..wb]);
            }
        }
        g += LANES;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// TQ4_1S quantizer, portable cross-block backend (bit-equal to [`quantize_tq4_1s_ref`]).
pub fn quantize_tq4_1s_portable(src: &[f32], out: &mut [u8]) {
    // SAFETY: the portable backend uses no target features.
    unsafe { quantize_lanes::<Portable, true>(src, out) }
}

/// TQ3_1S quantizer, portable cross-block backend (bit-equal to [`quantize_tq3_1s_ref`]).
pub fn quantize_tq3_1s_portable(src: &[f32], out: &mut [u8]) {
    // SAFETY: as above.
    unsafe { quantize_lanes::<Portable, false>(src, out) }
}

/// TQ4_1S quantizer, AVX2 cross-block backend; `None` when the CPU lacks AVX2 (or is not x86-64).
pub fn quantize_tq4_1s_avx2(src: &[f32], out: &mut [u8]) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was detected at run time.
        unsafe { avx2::quantize_tq4(src, out) };
        return Some(());
    }
    let _ = (src, out);
    None
}

/// TQ3_1S quantizer, AVX2 cross-block backend; `None` without AVX2.
pub fn quantize_tq3_1s_avx2(src: &[f32], out: &mut [u8]) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was detected at run time.
        unsafe { avx2::quantize_tq3(src, out) };
        return Some(());
    }
    let _ = (src, out);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tq::testutil::{mixed_block, next_down, next_up, Rng};
    use crate::types::tq::{
        quantize_tq3_1s, quantize_tq3_1s_ref, quantize_tq4_1s, quantize_tq4_1s_ref, tq_index, C3,
        C4, T3, T4,
    };

    type QFn = fn(&[f32], &mut [u8]);

    /// The quantizers checked against the references: (name, tq4, tq3).
    fn fast_paths() -> Vec<(&'static str, QFn, QFn)> {
        fn a4(s: &[f32], o: &mut [u8]) {
            quantize_tq4_1s_avx2(s, o).unwrap()
        }
        fn a3(s: &[f32], o: &mut [u8]) {
            quantize_tq3_1s_avx2(s, o).unwrap()
        }
        let mut v: Vec<(&'static str, QFn, QFn)> = vec![
            ("registry", quantize_tq4_1s, quantize_tq3_1s),
            (
                "portable",
                quantize_tq4_1s_portable,
                quantize_tq3_1s_portable,
            ),
        ];
        if quantize_tq4_1s_avx2(&[], &mut []).is_some() {
            v.push(("avx2", a4, a3));
        } else {
            eprintln!("no AVX2 on this CPU: the AVX2 kernel is not tested");
        }
        v
    }

    fn assert_same_blocks(name: &str, got: &[u8], want: &[u8], bytes: usize, src: &[f32]) {
        assert_eq!(got.len(), want.len());
        for k in 0..want.len() / bytes {
            let s = k * bytes..(k + 1) * bytes;
            assert_eq!(
                got[s.clone()],
                want[s],
                "{name}: block {k}, input {:?}",
                &src[k * QK..(k + 1) * QK]
            );
        }
    }

    /// Every fast quantizer equals the reference on 200 000 mixed blocks per type (25 000 groups
    /// of 8 with unrelated blocks side by side, so lanes converge at different rounds).
    #[test]
    fn lanes_match_ref_mixed_blocks() {
        let mut r = Rng(21);
        let nb = 200_000;
        let mut src = Vec::with_capacity(nb * QK);
        for _ in 0..nb {
            src.extend_from_slice(&mixed_block(&mut r));
        }
        let mut want4 = vec![0u8; nb * TQ4_BYTES];
        quantize_tq4_1s_ref(&src, &mut want4);
        let mut want3 = vec![0u8; nb * TQ3_BYTES];
        quantize_tq3_1s_ref(&src, &mut want3);
        for (name, f4, f3) in fast_paths() {
            let mut got = vec![0u8; nb * TQ4_BYTES];
            f4(&src, &mut got);
            assert_same_blocks(name, &got, &want4, TQ4_BYTES, &src);
            let mut got = vec![0u8; nb * TQ3_BYTES];
            f3(&src, &mut got);
            assert_same_blocks(name, &got, &want3, TQ3_BYTES, &src);
        }
    }

    /// Blocks with non-finite values (inf, -inf, NaN, f32::MAX): bytes equal the reference's,
    /// up to the sign and payload of NaN scales.
    #[test]
    fn lanes_match_ref_non_finite() {
        let mut r = Rng(22);
        let specials = [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN,
        ];
        let nb = 4000;
        let mut src = Vec::with_capacity(nb * QK);
        for _ in 0..nb {
            let mut x = mixed_block(&mut r);
            for _ in 0..(1 + r.next() % 3) {
                x[(r.next() % 32) as usize] = specials[(r.next() % 5) as usize];
            }
            src.extend_from_slice(&x);
        }
        let mut want4 = vec![0u8; nb * TQ4_BYTES];
        quantize_tq4_1s_ref(&src, &mut want4);
        let mut want3 = vec![0u8; nb * TQ3_BYTES];
        quantize_tq3_1s_ref(&src, &mut want3);
        // A NaN scale's sign and payload are not defined by the reference (LLVM may rewrite
        // `x * -1.0` as a negation in one path and not in another; x86 makes the default NaN
        // negative): canonicalize NaN f16 scales, compare everything else exactly.
        let canon = |v: &mut [u8], bytes: usize| {
            let mut nan = 0;
            for b in v.chunks_exact_mut(bytes) {
                for h in 0..2 {
                    let s = u16::from_le_bytes([b[2 * h], b[2 * h + 1]]);
                    if s & 0x7c00 == 0x7c00 && s & 0x03ff != 0 {
                        b[2 * h..2 * h + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
                        nan += 1;
                    }
                }
            }
            nan
        };
        assert!(canon(&mut want4, TQ4_BYTES) > 100);
        assert!(canon(&mut want3, TQ3_BYTES) > 100);
        for (name, f4, f3) in fast_paths() {
            let mut got = vec![0u8; nb * TQ4_BYTES];
            f4(&src, &mut got);
            canon(&mut got, TQ4_BYTES);
            assert_same_blocks(name, &got, &want4, TQ4_BYTES, &src);
            let mut got = vec![0u8; nb * TQ3_BYTES];
            f3(&src, &mut got);
            canon(&mut got, TQ3_BYTES);
            assert_same_blocks(name, &got, &want3, TQ3_BYTES, &src);
        }
    }

    /// Rows of 1..=25 blocks (partial last groups), and outputs shorter than the input: the
    /// block count is `min(src / 32, out / bytes)` and nothing past it is written.
    #[test]
    fn lanes_tails_and_short_outputs() {
        let mut r = Rng(23);
        for nb in 1..=25usize {
            let src: Vec<f32> = (0..nb).flat_map(|_| mixed_block(&mut r)).collect();
            for (bytes, reff) in [
                (TQ4_BYTES, quantize_tq4_1s_ref as QFn),
                (TQ3_BYTES, quantize_tq3_1s_ref),
            ] {
                let mut want = vec![0u8; nb * bytes];
                reff(&src, &mut want);
                for (name, f4, f3) in fast_paths() {
                    let f = if bytes == TQ4_BYTES { f4 } else { f3 };
                    // Exact size, with 7 extra input values (not a whole block).
                    let mut src7 = src.clone();
                    src7.extend([1.0; 7]);
                    let mut got = vec![0xAAu8; nb * bytes];
                    f(&src7, &mut got);
                    assert_eq!(got, want, "{name}: {nb} blocks");
                    // Output room for fewer blocks (plus a partial block of slack).
                    let keep = nb / 2;
                    let mut got = vec![0xAAu8; keep * bytes + bytes - 1];
                    f(&src, &mut got);
                    assert_eq!(
                        got[..keep * bytes],
                        want[..keep * bytes],
                        "{name}: {nb}/{keep}"
                    );
                    assert!(got[keep * bytes..].iter().all(|&b| b == 0xAA), "{name}");
                    // Output room for more blocks than the input has.
                    let mut got = vec![0xAAu8; (nb + 3) * bytes];
                    f(&src, &mut got);
                    assert_eq!(got[..nb * bytes], want[..], "{name}: {nb} + 3");
                    assert!(got[nb * bytes..].iter().all(|&b| b == 0xAA), "{name}");
                }
            }
        }
    }

    /// The lane-wise index search equals `tq_index` around every threshold and on specials.
    #[test]
    fn lane_lookup_equals_linear_scan() {
        let mut vals = vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(1),
        ];
        for &t in T4.iter().chain(T3.iter()) {
            vals.extend([t, next_up(t), next_down(t), -t]);
        }
        let mut r = Rng(24);
        vals.extend((0..4000).map(|_| (r.gauss() * 1.5) as f32));
        while vals.len() % LANES != 0 {
            vals.push(0.5);
        }
        for ch in vals.chunks_exact(LANES) {
            let v: [f32; LANES] = ch.try_into().unwrap();
            let check = |c4: [f32; LANES], i4: [i32; LANES], c3: [f32; LANES], i3: [i32; LANES]| {
                for l in 0..LANES {
                    let (k4, k3) = (tq_index(v[l], &T4), tq_index(v[l], &T3));
                    assert_eq!(i4[l] as usize, k4, "v = {:e}", v[l]);
                    assert_eq!(c4[l], C4[k4], "v = {:e}", v[l]);
                    assert_eq!(i3[l] as usize, k3, "v = {:e}", v[l]);
                    assert_eq!(c3[l], C3[k3], "v = {:e}", v[l]);
                }
            };
            unsafe {
                let p = Portable(v);
                let ((c4, i4), (c3, i3)) = (p.lookup4(), p.lookup3());
                check(c4.0, i4, c3.0, i3);
            }
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                #[target_feature(enable = "avx2")]
                unsafe fn run(
                    v: &[f32; LANES],
                ) -> ([f32; LANES], [i32; LANES], [f32; LANES], [i32; LANES]) {
                    let a = avx2::Avx2::load(v);
                    let ((c4, i4), (c3, i3)) = (a.lookup4(), a.lookup3());
                    let mut o = ([0f32; LANES], [0i32; LANES], [0f32; LANES], [0i32; LANES]);
                    c4.store(&mut o.0);
                    avx2::Avx2::store_idx(i4, &mut o.1);
                    c3.store(&mut o.2);
                    avx2::Avx2::store_idx(i3, &mut o.3);
                    o
                }
                let (c4, i4, c3, i3) = unsafe { run(&v) };
                check(c4, i4, c3, i3);
            }
        }
    }
}
