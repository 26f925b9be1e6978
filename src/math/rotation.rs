//! Orthonormal full-row rotations for any row length, and how incoherent they make a row.
//!
//! A power-of-two length gets the randomized Hadamard transform `(1/√n)·H_n·diag(s)`. Other
//! lengths (576 = 9·64, 1536 = 3·512, 172 = 43·4, ...) have four options ([`Method`]):
//!
//! - [`Method::Hadamard`] (the default where it exists): a true Hadamard matrix of order
//!   `n = h·2^k`, `H_h ⊗ H_{2^k}`, with `H_h` from Paley's constructions (type I: order p+1 for a
//!   prime p ≡ 3 mod 4, e.g. 12, 20, 24, 44; type II: order 2(p+1) for a prime p ≡ 1 mod 4, e.g.
//!   12, 28, 36, 60). Every entry is ±1/√n, the most incoherent an orthonormal matrix can be.
//!   Applied as row FWHTs of length 2^k plus a dense h×h ±1 mix: O(n log n + n·h).
//!   576 = 36·16 (p = 17), 1536 = 12·128 (p = 11), 768 = 12·64, 2304 = 36·64, 5120 = 20·256.
//! - [`Method::Dct`] (the fallback where no Hadamard order is constructible, e.g. 172 = 43·4):
//!   `C_q ⊗ H_{2^k}/√2^k` with `C_q` the orthonormal DCT-II of the odd part q (entries ≤ √(2/q)).
//! - [`Method::Block`]: block-diagonal Hadamard over blocks of the largest power of two dividing n
//!   (what the TQ 32-blocks do); mixes only within a block.
//! - [`Method::ZeroPad`]: pad to the next power of two m and rotate there; output has m values
//!   (the turbo KV convention for heads that are not a multiple of 128).
//!
//! All methods first multiply by a seeded sign vector ([`crate::math::pcg64::row_signs`]).
//! Incoherence measured on SmolLM2-135M rows is in `docs/codebook.md` (test
//! `rotation::smollm2_incoherence`).

use super::hadamard::{fwht, fwht_f64};
use super::pcg64::row_signs;

/// Which construction to use for a row length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Hadamard of order h·2^k (Sylvester × Paley); falls back to `Dct` when none exists.
    Auto,
    /// Hadamard of order h·2^k; an error when no Paley order fits.
    Hadamard,
    /// Orthonormal DCT-II on the odd part ⊗ Hadamard on the power-of-two part.
    Dct,
    /// Block-diagonal Hadamard, blocks of the largest power of two dividing n.
    Block,
    /// Zero-pad to the next power of two.
    ZeroPad,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Auto => "auto",
            Method::Hadamard => "hadamard",
            Method::Dct => "dct",
            Method::Block => "block",
            Method::ZeroPad => "zeropad",
        }
    }
}

fn is_prime(p: usize) -> bool {
    if p < 2 {
        return false;
    }
    let mut i = 2;
    while i * i <= p {
        if p.is_multiple_of(i) {
            return false;
        }
        i += 1;
    }
    true
}

/// Quadratic character χ(a) mod prime p (χ(0) = 0).
fn chi(a: usize, p: usize) -> i32 {
    let a = a % p;
    if a == 0 {
        return 0;
    }
    // Euler's criterion a^((p-1)/2) mod p.
    let (mut r, mut b, mut e) = (1u64, a as u64, (p as u64 - 1) / 2);
    while e > 0 {
        if e & 1 == 1 {
            r = r * b % p as u64;
        }
        b = b * b % p as u64;
        e >>= 1;
    }
    if r == 1 {
        1
    } else {
        -1
    }
}

/// A Hadamard matrix of order h (row-major ±1) from Paley's constructions, or `None`.
/// Orders 1 and 2 are the Sylvester ones.
pub fn paley_hadamard(h: usize) -> Option<Vec<i8>> {
    if h == 1 {
        return Some(vec![1]);
    }
    if h == 2 {
        return Some(vec![1, 1, 1, -1]);
    }
    if !h.is_multiple_of(4) {
        return None;
    }
    // Paley I: p = h - 1 prime, p ≡ 3 (mod 4). H = I + S, S = [[0, 1ᵀ], [-1, Q]], Q_ij = χ(j - i).
    let p = h - 1;
    if is_prime(p) && p % 4 == 3 {
        let mut m = vec![0i8; h * h];
        for i in 0..h {
            for j in 0..h {
                let s = if i == 0 && j == 0 {
                    0
                } else if i == 0 {
                    1
                } else if j == 0 {
                    -1
                } else {
                    chi(j + p - i, p)
                };
                m[i * h + j] = (s + if i == j { 1 } else { 0 }) as i8;
            }
        }
        return Some(m);
    }
    // Paley II: p = h/2 - 1 prime, p ≡ 1 (mod 4). C = [[0, 1ᵀ], [1, Q]] (symmetric conference
    // matrix); 0 → [[1, -1], [-1, -1]], ±1 → ±[[1, 1], [1, -1]].
    let p = h / 2 - 1;
    if is_prime(p) && p % 4 == 1 {
        let c = h / 2;
        let mut m = vec![0i8; h * h];
        for i in 0..c {
            for j in 0..c {
                let v = if i == 0 && j == 0 {
                    0
                } else if i == 0 || j == 0 {
                    1
                } else {
                    chi(j + p - i, p)
                };
                let blk: [[i32; 2]; 2] = if v == 0 {
                    [[1, -1], [-1, -1]]
                } else {
                    [[v, v], [v, -v]]
                };
                for (di, row) in blk.iter().enumerate() {
                    for (dj, &e) in row.iter().enumerate() {
                        m[(2 * i + di) * h + 2 * j + dj] = e as i8;
                    }
                }
            }
        }
        return Some(m);
    }
    None
}

/// The smallest Paley/Sylvester order h with n = h·2^k, if any.
pub fn hadamard_factor(n: usize) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let k = n.trailing_zeros();
    let odd = n >> k;
    if odd == 1 {
        return Some(1);
    }
    (0..=k)
        .map(|j| odd << j)
        .find(|&h| paley_hadamard(h).is_some())
}

#[derive(Clone, Debug)]
enum Kind {
    /// (H_h ⊗ H_{2^k}) / √n; `hmat` is h×h ±1.
    Hadamard { h: usize, hmat: Vec<f32> },
    /// (C_q ⊗ H_{2^k}/√2^k); `cmat` is q×q orthonormal.
    Dct { q: usize, cmat: Vec<f32> },
    /// Block-diagonal H_b/√b.
    Block { b: usize },
    /// Pad to m = next power of two, H_m/√m.
    Pad { m: usize },
}

/// An orthonormal rotation of rows of length `n` (forward output length `out_len()`).
#[derive(Clone, Debug)]
pub struct Rotation {
    n: usize,
    signs: Vec<f32>,
    kind: Kind,
    method: Method,
}

fn dct_matrix(q: usize) -> Vec<f32> {
    let mut c = vec![0f32; q * q];
    for k in 0..q {
        let w = if k == 0 {
            (1.0 / q as f64).sqrt()
        } else {
            (2.0 / q as f64).sqrt()
        };
        for j in 0..q {
            let ang = std::f64::consts::PI * (2 * j + 1) as f64 * k as f64 / (2 * q) as f64;
            c[k * q + j] = (w * ang.cos()) as f32;
        }
    }
    c
}

/// `out[a] = Σ_a' M[a][a'] · x[a']` over rows of length `w` (x, out: h rows × w).
fn mix_rows(m: &[f32], h: usize, x: &[f32], out: &mut [f32], w: usize, transpose: bool) {
    match w {
        _ if w.is_multiple_of(16) => mix_tiled::<16>(m, h, x, out, w, transpose),
        _ if w.is_multiple_of(8) => mix_tiled::<8>(m, h, x, out, w, transpose),
        _ if w.is_multiple_of(4) => mix_tiled::<4>(m, h, x, out, w, transpose),
        _ => mix_tiled::<1>(m, h, x, out, w, transpose),
    }
}

/// Columns in tiles of `T`, accumulators in registers.
fn mix_tiled<const T: usize>(
    m: &[f32],
    h: usize,
    x: &[f32],
    out: &mut [f32],
    w: usize,
    transpose: bool,
) {
    let (rs, cs) = if transpose { (1, h) } else { (h, 1) };
    for c0 in (0..w).step_by(T) {
        for a in 0..h {
            let mut acc = [0f32; T];
            for a2 in 0..h {
                let k = m[a * rs + a2 * cs];
                let src: &[f32; T] = x[a2 * w + c0..a2 * w + c0 + T].try_into().unwrap();
                for t in 0..T {
                    acc[t] += k * src[t];
                }
            }
            out[a * w + c0..a * w + c0 + T].copy_from_slice(&acc);
        }
    }
}

/// The factored form of a [`Method::Hadamard`] or [`Method::Dct`] rotation, as a GPU kernel
/// applies it to a row `x` of `n = h·w` values (`w` a power of two):
/// 1. `v = x ⊙ signs`;
/// 2. an unnormalized FWHT (the [`fwht`] butterfly order) on each of the `h` segments of `w`;
/// 3. Hadamard (`mix_then_scale`): `y[a·w + c] = scale · Σ_a' mat[a·h + a']·v[a'·w + c]`;
///    DCT: `v ← v·scale` first, then the same sum without the scale.
///
/// The sum over `a'` runs in increasing order from 0, as the CPU transform does, so an f32
/// implementation that follows these steps is bit-exact with [`Rotation::forward`] (for the ±1
/// Hadamard factor even with fused multiply-adds; the DCT factor needs them off). The inverse is
/// the same steps with `mat` transposed and the signs applied last instead of first.
#[derive(Clone, Copy, Debug)]
pub struct Factors<'a> {
    pub signs: &'a [f32],
    /// Order of the dense factor (1: none, a plain FWHT).
    pub h: usize,
    /// Length of each FWHT segment, `n / h`.
    pub w: usize,
    /// The dense `h × h` factor, row-major: ±1 (Hadamard) or the orthonormal DCT-II (f32).
    pub mat: &'a [f32],
    /// Hadamard: mix, then × scale; DCT: × scale, then mix.
    pub mix_then_scale: bool,
    /// `1/√n` (Hadamard) or `1/√w` (DCT), rounded to f32 as the CPU transform rounds it.
    pub scale: f32,
}

impl Rotation {
    /// A rotation for length `n` with signs from `row_signs(seed, n)`.
    pub fn new(n: usize, method: Method, seed: u64) -> Result<Rotation, String> {
        if n == 0 {
            return Err("rotation length must be positive".into());
        }
        let k = n.trailing_zeros();
        let odd = n >> k;
        let kind = match method {
            Method::Auto | Method::Hadamard => match hadamard_factor(n) {
                Some(h) => {
                    let hmat = paley_hadamard(h).unwrap().into_iter().map(|v| v as f32).collect();
                    Kind::Hadamard { h, hmat }
                }
                None if method == Method::Auto => Kind::Dct { q: odd, cmat: dct_matrix(odd) },
                None => {
                    return Err(format!(
                        "no Hadamard matrix of order {n} from Paley's constructions (n = h·2^k with h-1 \
                         a prime ≡ 3 mod 4 or h/2-1 a prime ≡ 1 mod 4); use --rotation dct"
                    ))
                }
            },
            Method::Dct => Kind::Dct { q: odd, cmat: dct_matrix(odd) },
            Method::Block => Kind::Block { b: 1 << k },
            Method::ZeroPad => Kind::Pad { m: n.next_power_of_two() },
        };
        let sign_len = match kind {
            Kind::Pad { m } => m,
            _ => n,
        };
        Ok(Rotation {
            n,
            signs: row_signs(seed, sign_len),
            kind,
            method,
        })
    }

    /// A rotation for length `n` with the given ±1 `signs` (of length [`Rotation::out_len`]) in
    /// place of tq's PCG64 stream: for formats that fix their own generator (`tq2_r` uses the seed
    /// design's `signsFor`).
    pub fn with_signs(n: usize, method: Method, signs: Vec<f32>) -> Result<Rotation, String> {
        let mut r = Rotation::new(n, method, 0)?;
        if signs.len() != r.out_len() {
            return Err(format!(
                "{} signs for a rotation of {} values",
                signs.len(),
                r.out_len()
            ));
        }
        r.signs = signs;
        Ok(r)
    }

    /// Input length.
    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Output length of [`Rotation::forward`] (n, or the padded length).
    pub fn out_len(&self) -> usize {
        match self.kind {
            Kind::Pad { m } => m,
            _ => self.n,
        }
    }
    /// The method that was asked for.
    pub fn method(&self) -> Method {
        self.method
    }

    /// One-line description, e.g. `hadamard 36x16 (Paley II, p=17)`.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Hadamard { h, .. } => {
                let p2 = self.n / h;
                if *h <= 2 {
                    format!("hadamard {} (Sylvester)", self.n)
                } else if is_prime(h - 1) && (h - 1) % 4 == 3 {
                    format!("hadamard {h}x{p2} (Paley I, p={})", h - 1)
                } else {
                    format!("hadamard {h}x{p2} (Paley II, p={})", h / 2 - 1)
                }
            }
            Kind::Dct { q, .. } => format!("dct {q} x hadamard {}", self.n / q),
            Kind::Block { b } => format!("block-diagonal hadamard {}x{b}", self.n / b),
            Kind::Pad { m } => format!("zero-pad {} -> {m}, hadamard {m}", self.n),
        }
    }

    /// `y = R·x`; `x.len() == len()`, returns `out_len()` values.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        assert_eq!(x.len(), self.n, "rotation input length");
        let mut v: Vec<f32> = match self.kind {
            Kind::Pad { m } => {
                let mut v = x.to_vec();
                v.resize(m, 0.0);
                v
            }
            _ => x.to_vec(),
        };
        for (a, s) in v.iter_mut().zip(&self.signs) {
            *a *= s;
        }
        self.core(&mut v, false);
        v
    }

    /// `x = Rᵀ·y` (the exact inverse for square kinds; for zero padding, the first n values).
    pub fn inverse(&self, y: &[f32]) -> Vec<f32> {
        assert_eq!(y.len(), self.out_len(), "rotation output length");
        let mut v = y.to_vec();
        self.core(&mut v, true);
        for (a, s) in v.iter_mut().zip(&self.signs) {
            *a *= s;
        }
        v.truncate(self.n);
        v
    }

    /// The factored form of a Hadamard or DCT rotation ([`Factors`]); `None` for block-diagonal
    /// and zero-padded rotations.
    pub fn factors(&self) -> Option<Factors<'_>> {
        match &self.kind {
            Kind::Hadamard { h, hmat } => Some(Factors {
                signs: &self.signs,
                h: *h,
                w: self.n / h,
                mat: hmat,
                mix_then_scale: true,
                scale: (1.0 / (self.n as f64).sqrt()) as f32,
            }),
            Kind::Dct { q, cmat } => Some(Factors {
                signs: &self.signs,
                h: *q,
                w: self.n / q,
                mat: cmat,
                mix_then_scale: false,
                scale: (1.0 / ((self.n / q) as f64).sqrt()) as f32,
            }),
            Kind::Block { .. } | Kind::Pad { .. } => None,
        }
    }

    /// `R·x` in f64 for a Hadamard or DCT rotation: the same linear map as [`Rotation::forward`]
    /// (the DCT factor's f32 entries, the signs) with every operation in f64 and the exact
    /// scale — the reference that f32 implementations of the transform are held to. `None` for
    /// the kinds without [`Rotation::factors`] or a wrong input length.
    pub fn forward_f64(&self, x: &[f64]) -> Option<Vec<f64>> {
        self.apply_f64(x, false)
    }

    /// `Rᵀ·y` in f64, as [`Rotation::forward_f64`].
    pub fn inverse_f64(&self, y: &[f64]) -> Option<Vec<f64>> {
        self.apply_f64(y, true)
    }

    fn apply_f64(&self, x: &[f64], inverse: bool) -> Option<Vec<f64>> {
        let f = self.factors()?;
        if x.len() != self.n {
            return None;
        }
        let mut v: Vec<f64> = if inverse {
            x.to_vec()
        } else {
            x.iter().zip(f.signs).map(|(a, s)| a * *s as f64).collect()
        };
        for seg in v.chunks_exact_mut(f.w) {
            fwht_f64(seg);
        }
        let scale = if f.mix_then_scale {
            1.0 / (self.n as f64).sqrt()
        } else {
            1.0 / (f.w as f64).sqrt()
        };
        let mut out = vec![0f64; self.n];
        for a in 0..f.h {
            for c in 0..f.w {
                let m = |a2: usize| {
                    if inverse {
                        f.mat[a2 * f.h + a]
                    } else {
                        f.mat[a * f.h + a2]
                    }
                };
                out[a * f.w + c] = scale
                    * (0..f.h)
                        .map(|a2| m(a2) as f64 * v[a2 * f.w + c])
                        .sum::<f64>();
            }
        }
        if inverse {
            out.iter_mut()
                .zip(f.signs)
                .for_each(|(a, s)| *a *= *s as f64);
        }
        Some(out)
    }

    /// `Σ_j |R_ij|·|x_j|` for every output `i` of a Hadamard or DCT rotation, in f64: the scale
    /// that the rounding error of an f32 transform is measured against (the transform's output
    /// `i` is the dot of row `i` of `R` with `x`). `inverse` for `Rᵀ`. `None` as
    /// [`Rotation::forward_f64`].
    pub fn abs_sums(&self, x: &[f64], inverse: bool) -> Option<Vec<f64>> {
        let f = self.factors()?;
        if x.len() != self.n {
            return None;
        }
        // |R| = |M| ⊗ (all-ones w×w) · scale: every output of a segment sees Σ|x| of a segment.
        let seg: Vec<f64> = x
            .chunks_exact(f.w)
            .map(|s| s.iter().map(|v| v.abs()).sum())
            .collect();
        let scale = if f.mix_then_scale {
            1.0 / (self.n as f64).sqrt()
        } else {
            1.0 / (f.w as f64).sqrt()
        };
        let mut out = vec![0f64; self.n];
        for a in 0..f.h {
            let s: f64 = (0..f.h)
                .map(|a2| {
                    let m = if inverse {
                        f.mat[a2 * f.h + a]
                    } else {
                        f.mat[a * f.h + a2]
                    };
                    (m as f64).abs() * seg[a2]
                })
                .sum();
            out[a * f.w..(a + 1) * f.w].fill(scale * s);
        }
        Some(out)
    }

    /// The orthonormal transform without signs; `transpose` for the inverse.
    fn core(&self, v: &mut [f32], transpose: bool) {
        match &self.kind {
            Kind::Hadamard { h, hmat } => {
                let w = v.len() / h;
                for row in v.chunks_exact_mut(w) {
                    fwht(row);
                }
                if *h > 1 {
                    let mut out = vec![0f32; v.len()];
                    mix_rows(hmat, *h, v, &mut out, w, transpose);
                    v.copy_from_slice(&out);
                }
                let k = (1.0 / (v.len() as f64).sqrt()) as f32;
                v.iter_mut().for_each(|a| *a *= k);
            }
            Kind::Dct { q, cmat } => {
                let w = v.len() / q;
                for row in v.chunks_exact_mut(w) {
                    fwht(row);
                }
                let k = (1.0 / (w as f64).sqrt()) as f32;
                v.iter_mut().for_each(|a| *a *= k);
                if *q > 1 {
                    let mut out = vec![0f32; v.len()];
                    mix_rows(cmat, *q, v, &mut out, w, transpose);
                    v.copy_from_slice(&out);
                }
            }
            Kind::Block { b } => {
                let k = (1.0 / (*b as f64).sqrt()) as f32;
                for blk in v.chunks_exact_mut(*b) {
                    fwht(blk);
                    blk.iter_mut().for_each(|a| *a *= k);
                }
            }
            Kind::Pad { .. } => {
                fwht(v);
                let k = (1.0 / (v.len() as f64).sqrt()) as f32;
                v.iter_mut().for_each(|a| *a *= k);
            }
        }
    }
}

/// Incoherence of a vector: `√n · max|y_i| / ‖y‖₂` (1 for a flat vector, √n for a spike;
/// ≈ √(2 ln n) for an i.i.d. Gaussian vector). 0 for the zero vector.
pub fn incoherence(y: &[f32]) -> f64 {
    let ss: f64 = y.iter().map(|&v| (v as f64) * (v as f64)).sum();
    if ss == 0.0 {
        return 0.0;
    }
    let mx = y.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
    (y.len() as f64).sqrt() * mx / ss.sqrt()
}

/// Excess kurtosis of the entries of a (zero-mean) vector: `n·Σy⁴ / (Σy²)² - 3` (0 for Gaussian).
pub fn excess_kurtosis(y: &[f32]) -> f64 {
    let s2: f64 = y.iter().map(|&v| (v as f64).powi(2)).sum();
    let s4: f64 = y.iter().map(|&v| (v as f64).powi(4)).sum();
    if s2 == 0.0 {
        return 0.0;
    }
    y.len() as f64 * s4 / (s2 * s2) - 3.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paley_matrices_are_hadamard() {
        for h in [1usize, 2, 4, 8, 12, 20, 24, 28, 36, 44, 60, 76, 108] {
            let m = paley_hadamard(h).unwrap_or_else(|| panic!("order {h}"));
            for i in 0..h {
                for j in 0..h {
                    let dot: i32 = (0..h)
                        .map(|k| m[i * h + k] as i32 * m[j * h + k] as i32)
                        .sum();
                    assert_eq!(
                        dot,
                        if i == j { h as i32 } else { 0 },
                        "order {h} rows {i},{j}"
                    );
                }
            }
        }
        assert!(paley_hadamard(172).is_none());
        assert!(paley_hadamard(6).is_none());
    }

    #[test]
    fn factors_of_common_widths() {
        assert_eq!(hadamard_factor(4096), Some(1));
        assert_eq!(hadamard_factor(576), Some(36));
        assert_eq!(hadamard_factor(1536), Some(12));
        assert_eq!(hadamard_factor(2304), Some(36));
        assert_eq!(hadamard_factor(5120), Some(20));
        assert_eq!(hadamard_factor(172), None);
    }

    #[test]
    fn inverse_is_identity_for_every_method() {
        for n in [64usize, 96, 172, 576, 1536, 333] {
            for m in [Method::Auto, Method::Dct, Method::Block, Method::ZeroPad] {
                let r = Rotation::new(n, m, 3).unwrap();
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 17.0)
                    .collect();
                let y = r.forward(&x);
                let ex: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
                let ey: f64 = y.iter().map(|v| (*v as f64).powi(2)).sum();
                assert!((ex - ey).abs() < 1e-5 * ex, "{n} {m:?} norm");
                let z = r.inverse(&y);
                for (a, b) in x.iter().zip(&z) {
                    assert!((a - b).abs() < 2e-5 * 3.0, "{n} {m:?}");
                }
            }
        }
    }

    /// The factored form applied step by step in f32 is the CPU transform bit for bit, and the
    /// f64 map is the same linear map.
    #[test]
    fn factors_reproduce_forward_and_f64_is_close() {
        for n in [64usize, 96, 576, 1376, 1536] {
            let r = Rotation::new(n, Method::Auto, 5).unwrap();
            let f = r.factors().unwrap();
            assert_eq!(f.h * f.w, n);
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let mut v: Vec<f32> = x.iter().zip(f.signs).map(|(a, s)| a * s).collect();
            for seg in v.chunks_exact_mut(f.w) {
                fwht(seg);
            }
            if !f.mix_then_scale {
                v.iter_mut().for_each(|a| *a *= f.scale);
            }
            let mut y = vec![0f32; n];
            for a in 0..f.h {
                for c in 0..f.w {
                    // h = 1: no mix (a sum from +0 would turn −0 into +0).
                    let mut acc = if f.h == 1 { v[c] } else { 0f32 };
                    for a2 in 0..f.h {
                        if f.h > 1 {
                            acc += f.mat[a * f.h + a2] * v[a2 * f.w + c];
                        }
                    }
                    y[a * f.w + c] = if f.mix_then_scale { acc * f.scale } else { acc };
                }
            }
            let want = r.forward(&x);
            assert!(
                y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{n}: {}",
                r.describe()
            );
            let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let y64 = r.forward_f64(&x64).unwrap();
            let bound = r.abs_sums(&x64, false).unwrap();
            for i in 0..n {
                assert!(
                    (y64[i] - want[i] as f64).abs() <= 1e-5 * bound[i],
                    "{n} [{i}]"
                );
                assert!(y64[i].abs() <= bound[i] * (1.0 + 1e-12));
            }
            let back = r.inverse_f64(&y64).unwrap();
            let ib = r.abs_sums(&y64, true).unwrap();
            for i in 0..n {
                assert!(
                    (back[i] - x64[i]).abs() <= 1e-5 * ib[i],
                    "{n} inverse [{i}]"
                );
            }
        }
        assert!(Rotation::new(96, Method::Block, 1)
            .unwrap()
            .factors()
            .is_none());
    }

    #[test]
    fn hadamard_rotation_flattens_a_spike() {
        let r = Rotation::new(576, Method::Hadamard, 1).unwrap();
        let mut x = vec![0f32; 576];
        x[17] = 1.0;
        let y = r.forward(&x);
        assert!((incoherence(&y) - 1.0).abs() < 1e-5, "every entry is ±1/√n");
    }
}
