//! The seed design's incoherent 2-bit weights (`../shared/docs/FORMATS.md` §6), bit-exact with
//! its own packer (`../shared/conformance/seed2bit.json`).
//!
//! The design is JavaScript: its arithmetic is f64 (JS numbers) except where it stores into a
//! `Float32Array` (the scales, the LDLQ errors, the reconstruction). The vectors pin which:
//! - the rotation `R = FWHT ∘ diag(signsFor(K))`, then `× 1/√K`, is f64 over f32 (or, for
//!   `requant2bit`, f64 `q8·s`) inputs;
//! - the block scale `0.5·sqrt(Σa²/32)` is f64, *stored* as f32, and the codes divide by the
//!   stored f32 scale (dividing by the f64 one misses two cases of the vectors);
//! - `requant2bit` keeps `q8·s` in f64 (rounding it to f32 first misses four cases);
//! - rounding is JS `Math.round` (half towards +∞).
//!
//! Codes are packed 16 per u32 word, the code of element `n·K + k` at bits `2·((n·K + k) mod 16)`.
//! This module is the reference the `tq2_r` GGUF type and `tq conformance` are held to.

use crate::error::{Error, Result};

/// Values per scale.
pub const QK2: usize = 32;
/// Codes per packed word.
pub const CODES_PER_WORD: usize = 16;

/// The design's sign vector for a row of `k`: 32-bit xorshift (13, 17, 5) seeded with
/// `0x9e3779b9 ^ k`, stepped before every element; bit 0 set = +1.
pub fn signs_for(k: usize) -> Vec<f64> {
    let mut x = 0x9e37_79b9u32 ^ (k as u32);
    (0..k)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if x & 1 == 1 {
                1.0
            } else {
                -1.0
            }
        })
        .collect()
}

/// Unnormalized Walsh–Hadamard butterfly in f64, `len = 1, 2, 4, …` (the design's order).
fn fwht_f64(a: &mut [f64]) {
    let n = a.len();
    let mut len = 1;
    while len < n {
        for i in (0..n).step_by(2 * len) {
            for j in i..i + len {
                let (x, y) = (a[j], a[j + len]);
                a[j] = x + y;
                a[j + len] = x - y;
            }
        }
        len *= 2;
    }
}

/// `a ← R·a` with `R = (1/√K)·H·diag(signs)`; `a.len()` a power of two, `signs` its
/// [`signs_for`].
pub fn rotate_f64(a: &mut [f64], signs: &[f64]) {
    for (v, s) in a.iter_mut().zip(signs) {
        *v *= s;
    }
    fwht_f64(a);
    let inv = 1.0 / (a.len() as f64).sqrt();
    for v in a.iter_mut() {
        *v *= inv;
    }
}

/// `a ← Rᵀ·a = diag(signs)·(1/√K)·H·a` (R is orthogonal, H symmetric).
pub fn unrotate_f64(a: &mut [f64], signs: &[f64]) {
    fwht_f64(a);
    let inv = 1.0 / (a.len() as f64).sqrt();
    for (v, s) in a.iter_mut().zip(signs) {
        *v = *v * inv * s;
    }
}

/// JavaScript's `Math.round`: nearest integer, halves towards +∞.
pub fn js_round(x: f64) -> f64 {
    let f = x.floor();
    if x - f >= 0.5 {
        f + 1.0
    } else {
        f
    }
}

/// `Math.max(0, Math.min(3, q))` then the `| 0` of the packer: NaN (0/0 from a zero f32 scale)
/// becomes code 0, as JS's ToInt32 makes it.
fn clamp_code(q: f64) -> u32 {
    if q.is_nan() {
        0
    } else {
        q.clamp(0.0, 3.0) as u32
    }
}

/// The design's block scale: `0.5·sqrt(Σa²/32)` in f64, `1e-12` for an all-zero block, stored as
/// f32.
pub fn block_scale(block: &[f64]) -> f32 {
    let ss: f64 = block.iter().fold(0.0, |acc, v| acc + v * v);
    let s = if ss > 0.0 {
        0.5 * (ss / QK2 as f64).sqrt()
    } else {
        1e-12
    };
    s as f32
}

/// Code of one rotated value `a` with the stored scale `s`: `round((a/s + 3)/2)` clamped to 0..3.
pub fn code_of(a: f64, s: f32) -> u32 {
    clamp_code(js_round((a / s as f64 + 3.0) / 2.0))
}

/// The grid value of code `q` (0..3) at scale `s`: `(2q − 3)·s`, exact in f64.
pub fn level(q: u32, s: f32) -> f64 {
    (2.0 * q as f64 - 3.0) * s as f64
}

/// Packed weights: `qw` (16 codes per word over the whole tensor) and one f32 scale per 32 values.
#[derive(Clone, Debug, PartialEq)]
pub struct Packed {
    pub qw: Vec<u32>,
    pub sc: Vec<f32>,
}

fn check_shape(n: usize, k: usize, incoherent: bool, op: &str) -> Result<()> {
    if k == 0 || !k.is_multiple_of(QK2) {
        return Err(Error::Unsupported(format!(
            "{op}: row length {k} is not a positive multiple of {QK2}; the 2-bit format has one scale per {QK2} values"
        )));
    }
    if incoherent && !k.is_power_of_two() {
        return Err(Error::Unsupported(format!(
            "{op}: row length {k} is not a power of two; the design's rotation needs one (pad the rows to {})",
            k.next_power_of_two()
        )));
    }
    n.checked_mul(k)
        .map(|_| ())
        .ok_or_else(|| Error::Unsupported(format!("{op}: {n} x {k} values overflow")))
}

fn put_code(qw: &mut [u32], idx: usize, q: u32) {
    qw[idx / CODES_PER_WORD] |= q << (2 * (idx % CODES_PER_WORD));
}

/// The code of element `idx` of a packed tensor.
pub fn get_code(qw: &[u32], idx: usize) -> u32 {
    (qw[idx / CODES_PER_WORD] >> (2 * (idx % CODES_PER_WORD))) & 3
}

/// Pack rows already in f64 (the design's `pack2bit` after reading its input).
fn pack_f64(rows: &[f64], n: usize, k: usize, incoherent: bool) -> Packed {
    let signs = if incoherent { signs_for(k) } else { Vec::new() };
    let mut qw = vec![0u32; (n * k).div_ceil(CODES_PER_WORD)];
    let mut sc = Vec::with_capacity(n * k / QK2);
    let mut a = vec![0f64; k];
    for r in 0..n {
        a.copy_from_slice(&rows[r * k..(r + 1) * k]);
        if incoherent {
            rotate_f64(&mut a, &signs);
        }
        for (b, block) in a.chunks_exact(QK2).enumerate() {
            let s = block_scale(block);
            sc.push(s);
            for (j, &v) in block.iter().enumerate() {
                put_code(&mut qw, r * k + b * QK2 + j, code_of(v, s));
            }
        }
    }
    Packed { qw, sc }
}

/// The design's `pack2bit`: `w` is `n × k` row-major; with `incoherent` every row is rotated by
/// `R` (k a power of two) before the 4-level grid.
pub fn pack2bit(w: &[f32], n: usize, k: usize, incoherent: bool) -> Result<Packed> {
    check_shape(n, k, incoherent, "pack2bit")?;
    check_len(w.len(), n * k, "pack2bit weights")?;
    let rows: Vec<f64> = w.iter().map(|&v| v as f64).collect();
    Ok(pack_f64(&rows, n, k, incoherent))
}

/// The design's `requant2bit`: a q8_0-style tensor (`q8` int8, one f32 scale per 32) to rotated
/// 2-bit over rows zero-padded to `kp = k.next_power_of_two()`.
pub fn requant2bit(q8: &[i8], s: &[f32], n: usize, k: usize) -> Result<Packed> {
    check_shape(n, k, false, "requant2bit")?;
    check_len(q8.len(), n * k, "requant2bit int8 values")?;
    check_len(s.len(), n * k / QK2, "requant2bit scales")?;
    let kp = k.next_power_of_two();
    let mut rows = vec![0f64; n * kp];
    for r in 0..n {
        for c in 0..k {
            let i = r * k + c;
            rows[r * kp + c] = q8[i] as f64 * s[i / QK2] as f64;
        }
    }
    Ok(pack_f64(&rows, n, kp, true))
}

/// The design's codebook-aware LDLQ (no rotation): columns from last to first,
/// `corr = W[i,k] + Σ_{j=k+1}^{min(K,k+1+band)−1} E[i,j]·L[j,k]` (f64), code
/// `round(corr/s/2 + 1.5)`, error `E[i,k] = W[i,k] − (2q−3)·s` kept in f32. `l` is unit
/// lower-triangular `k × k` row-major; `None` is plain rounding; `band = 0` means all later
/// columns. Returns the packed codes (the scales are the given `sc`).
pub fn ldlq_round2bit(
    w: &[f32],
    l: Option<&[f32]>,
    sc: &[f32],
    n: usize,
    k: usize,
    band: usize,
) -> Result<Vec<u32>> {
    check_shape(n, k, false, "ldlqRound2bit")?;
    check_len(w.len(), n * k, "ldlqRound2bit weights")?;
    check_len(sc.len(), n * k / QK2, "ldlqRound2bit scales")?;
    if let Some(l) = l {
        check_len(l.len(), k * k, "ldlqRound2bit L")?;
    }
    let mut qw = vec![0u32; (n * k).div_ceil(CODES_PER_WORD)];
    let mut e = vec![0f32; k];
    for i in 0..n {
        e.fill(0.0);
        for c in (0..k).rev() {
            let wv = w[i * k + c] as f64;
            let mut corr = wv;
            if let Some(l) = l {
                let hi = if band == 0 { k } else { k.min(c + 1 + band) };
                for j in c + 1..hi {
                    corr += e[j] as f64 * l[j * k + c] as f64;
                }
            }
            let s = sc[(i * k + c) / QK2];
            let q = clamp_code(js_round(corr / s as f64 / 2.0 + 1.5));
            put_code(&mut qw, i * k + c, q);
            e[c] = (wv - level(q, s)) as f32;
        }
    }
    Ok(qw)
}

/// The design's reconstruction: `(2q − 3)·s` per value and, with `incoherent`, `Rᵀ` per row (f64,
/// rounded to f32 once). In the rotated domain without `incoherent`.
pub fn reconstruct(p: &Packed, n: usize, k: usize, incoherent: bool) -> Result<Vec<f32>> {
    check_shape(n, k, incoherent, "reconstruct")?;
    check_len(p.qw.len(), (n * k).div_ceil(CODES_PER_WORD), "packed words")?;
    check_len(p.sc.len(), n * k / QK2, "scales")?;
    let signs = if incoherent { signs_for(k) } else { Vec::new() };
    let mut out = Vec::with_capacity(n * k);
    let mut a = vec![0f64; k];
    for r in 0..n {
        for (c, v) in a.iter_mut().enumerate() {
            let idx = r * k + c;
            *v = level(get_code(&p.qw, idx), p.sc[idx / QK2]);
        }
        if incoherent {
            unrotate_f64(&mut a, &signs);
        }
        out.extend(a.iter().map(|&v| v as f32));
    }
    Ok(out)
}

fn check_len(got: usize, want: usize, what: &str) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "{what}: {got} values where the shape needs {want}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn js_round_halves_go_up() {
        assert_eq!(js_round(0.5), 1.0);
        assert_eq!(js_round(-0.5), 0.0);
        assert_eq!(js_round(1.5), 2.0);
        assert_eq!(js_round(-1.5), -1.0);
        assert_eq!(js_round(0.49999999999999994), 0.0);
    }

    #[test]
    fn rotation_is_orthogonal_and_self_inverse() {
        let signs = signs_for(64);
        let x: Vec<f64> = (0..64)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) * 0.25)
            .collect();
        let mut y = x.clone();
        rotate_f64(&mut y, &signs);
        let nx: f64 = x.iter().map(|v| v * v).sum();
        let ny: f64 = y.iter().map(|v| v * v).sum();
        assert!((nx - ny).abs() < 1e-12 * nx);
        unrotate_f64(&mut y, &signs);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    fn shapes_are_errors_not_panics() {
        assert!(pack2bit(&[0.0; 48], 1, 48, false).is_err());
        assert!(pack2bit(&[0.0; 96], 1, 96, true).is_err());
        assert!(pack2bit(&[0.0; 64], 1, 32, false).is_err());
        assert!(requant2bit(&[0; 32], &[], 1, 32).is_err());
        assert!(ldlq_round2bit(&[0.0; 32], Some(&[0.0; 4]), &[1.0], 1, 32, 0).is_err());
    }

    #[test]
    fn zero_block_takes_code_two_and_tiny_scale() {
        let p = pack2bit(&[0.0; 32], 1, 32, true).unwrap();
        assert_eq!(p.sc, [1e-12f32]);
        assert!((0..32).all(|i| get_code(&p.qw, i) == 2));
    }
}
