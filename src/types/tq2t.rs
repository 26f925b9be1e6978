//! `tq2_t`: trellis-coded 2-bit weights (issue 19) on the whole-row rotation of `tq2_r`.
//!
//! Block (17 bytes per 64 values, 2.125 bpw): `e` (one byte, the scale, see [`scale_of`]) then
//! `qs[16]`, 2-bit code `b_j` of the block at bits `2·(j mod 4)` of byte `j / 4`. The 64 values
//! are consecutive elements of the rotated row `R·w` (`R` exactly as tq2_r's, [`tq2r::rotation`]).
//!
//! Decoding is a **tail-biting bitshift trellis** with an `L = 12`-bit state: value `j` reads the
//! state `s_j = Σ_{t<6} b_{(j−t) mod 64} << 2t` (its own code in the low bits, the five before it
//! above, wrapping inside the block) and is `d · c(s_j)`, where `c` is a computed pseudo-Gaussian
//! codebook ([`codeword`]: one multiply-add on the state, the sum of the four bytes of the result —
//! QTIP's "1MAD" construction — centred and scaled to unit variance). Every value depends on its
//! block only, so a decoder needs no table and can start anywhere.
//!
//! Encoding is Viterbi search over the 4096 states per value ([`viterbi_ref`] is the plain
//! definition, [`viterbi`] the restructured one that runs ~4× fewer compares and vectorizes; a test
//! holds them bit-identical). Block-LDLQ's passes run it on 16-bit path costs instead
//! ([`Scratch::fixed_point`], `fixed`: the same total error to 10⁻⁴, ≈ 1.5× the speed).
//! Tail-biting is handled QTIP's way: one free-start pass over the block rotated by half its
//! length fixes the five codes that wrap around, a second pass constrained to start and end on
//! them gives the codes. Then the scale is refit by least squares on the chosen
//! codewords and the search rerun with it; the better of the two is kept.
//!
//! This file is the format: its layout, the codebook, the round-to-nearest encoder of a block and
//! a row, and the decoders. The Hessian-aware search of block-LDLQ (per-survivor Viterbi, beam
//! search, coordinate descent of the codes on a block's quadratic form) is an algorithm over the
//! format and lives with LDLQ in `quant::ldlq::trellis` / `quant::ldlq::psp`.

use super::tq2r;

mod fixed;
mod step;
mod viterbi;
use crate::error::Result;
pub use step::Ends;
pub use viterbi::{viterbi, viterbi_ref, Scratch};

/// Values per block (one tail-biting trellis, one scale).
pub const QK: usize = 64;
/// Bytes per block: scale byte + 64 two-bit codes.
pub const TQ2T_BYTES: usize = 1 + QK / 4;
const _: () = assert!(TQ2T_BYTES == 17);
/// Trellis state bits of the format.
pub const L: u32 = 12;

/// The 1MAD multiplier and increment (QTIP, "1MAD" codebook).
pub(crate) const MAD_A: u32 = 34_038_481;
pub(crate) const MAD_B: u32 = 76_625_530;
/// Four uniform bytes sum to mean 510 and variance 4·(256²−1)/12 = 21845.
pub(crate) const MAD_MEAN: i32 = 510;
/// The GPU kernels write it as its f32 bits (a test holds them to it).
pub(crate) const MAD_INV_STD: f32 = 1.0 / 147.800_54;

/// Codeword of state `s`: `(Σ bytes of (A·s + B mod 2³²) − 510) / 147.8`, ≈ N(0, 1) over the states.
#[inline]
pub fn codeword(s: u32) -> f32 {
    let x = MAD_A.wrapping_mul(s).wrapping_add(MAD_B);
    let sum = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24);
    (sum as i32 - MAD_MEAN) as f32 * MAD_INV_STD
}

/// The codebook of an `l`-bit trellis.
pub fn codebook(l: u32) -> Vec<f32> {
    (0..1u32 << l).map(codeword).collect()
}

/// The format's codebook ([`codebook`] of [`L`]), built once.
pub(crate) fn format_codebook() -> &'static [f32] {
    static CB: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    CB.get_or_init(|| codebook(L))
}

/// The scale byte's value: 0 is zero, else `(8 + m) · 2^(E − 27)` with `E = e >> 3`, `m = e & 7`
/// (a 5-bit exponent, 3-bit mantissa float: ≤ 6.25% from any scale in [6e-8, 240], exact in f32).
#[inline]
pub fn scale_of(e: u8) -> f32 {
    if e == 0 {
        return 0.0;
    }
    let (ex, m) = ((e >> 3) as i32, (e & 7) as i32);
    (8 + m) as f32 * f32::from_bits(((ex - 27 + 127) as u32) << 23)
}

/// The nearest scale byte to `d` (≥ 0), saturating at the largest.
pub fn nearest_scale(d: f32) -> u8 {
    if !(d > 0.0) {
        return 0;
    }
    // scale_of is increasing in e: binary search the first e with scale_of(e) >= d.
    let (mut lo, mut hi) = (1u16, 255u16);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if scale_of(mid as u8) >= d {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let e = lo as u8;
    if e > 1 && (d - scale_of(e - 1)) <= (scale_of(e) - d) {
        e - 1
    } else {
        e
    }
}

/// Tail-biting search of one block: a free pass on the block rotated by half fixes the `l/2 − 1`
/// codes that wrap, a pass constrained to them gives the codes. Returns the (weighted) squared error.
pub fn encode_tail_biting(
    x: &[f32],
    wt: &[f32],
    dc: &[f32],
    l: u32,
    sc: &mut Scratch,
    codes: &mut [u8],
) -> f32 {
    let n = x.len();
    let h = n / 2;
    let w = (l / 2 - 1) as usize;
    let (y, yw) = (rotated(x, h), rotated(wt, h));
    viterbi(&y, &yw, dc, l, Ends::Free, sc, codes);
    // Original position n − t sits at n − t − h of the rotated sequence.
    let mut top = 0u32;
    for t in 1..=w {
        top |= (codes[n - t - h] as u32) << (2 * (t - 1));
    }
    viterbi(x, wt, dc, l, Ends::Wrap(top), sc, codes)
}

/// `v` rotated left by `h`: the block seen from its middle (the free pass's order).
fn rotated(v: &[f32], h: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(v.len());
    y.extend_from_slice(&v[h..]);
    y.extend_from_slice(&v[..h]);
    y
}

/// Tail-biting search of one block with a cheaper second pass: the free pass of
/// [`encode_tail_biting`] on the block rotated by half, its codes put back in place (any 64 codes
/// are a tail-biting block; these were searched without their real neighbours only across the
/// seam, the middle of the block, where the rotated pass started and ended), then the codes
/// around the seam searched again with the others fixed: the `l/2 − 1` codes on either side of
/// it and `ctx` more, from the codes before them to the codes after them ([`Ends::Pinned`]), a
/// window of `3(l/2 − 1) + 2·ctx` values instead of the block. Returns the block's (weighted)
/// squared error as it decodes.
pub fn encode_tail_biting_seam(
    x: &[f32],
    wt: &[f32],
    dc: &[f32],
    l: u32,
    ctx: usize,
    sc: &mut Scratch,
    codes: &mut [u8],
) -> f32 {
    let n = x.len();
    let (h, w) = (n / 2, (l / 2 - 1) as usize);
    let ctx = ctx.min(h.saturating_sub(2 * w));
    if h < 2 * w {
        return encode_tail_biting(x, wt, dc, l, sc, codes);
    }
    let (y, yw) = (rotated(x, h), rotated(wt, h));
    viterbi(&y, &yw, dc, l, Ends::Free, sc, codes);
    codes.rotate_right(h);
    // Codes a..b searched again; a − w..a and b..b + w pinned (all inside the block).
    let (a, b) = (h - w - ctx, h + w + ctx);
    let start = (1..=w).fold(0u32, |s, t| s | (codes[a - t] as u32) << (2 * (t - 1)));
    let end = (0..w).fold(0u32, |s, t| s | (codes[b + w - 1 - t] as u32) << (2 * t));
    let mut win = vec![0u8; b + w - a];
    let m = b + w - a;
    viterbi(
        &x[a..b + w],
        &wt[a..b + w],
        dc,
        l,
        Ends::Pinned(start, end),
        sc,
        &mut win[..m],
    );
    codes[a..b].copy_from_slice(&win[..b - a]);
    x.iter()
        .zip(wt)
        .zip(block_states(codes, l))
        .map(|((&v, &w), s)| {
            let e = v - dc[s as usize];
            w * (e * e)
        })
        .sum()
}

/// The wrap of a block's codes: its last `l/2 − 1` codes as [`Ends::Wrap`] takes them.
fn wrap_of(codes: &[u8], l: u32) -> u32 {
    let n = codes.len();
    (1..=(l / 2 - 1) as usize).fold(0, |top, t| top | (codes[n - t] as u32) << (2 * (t - 1)))
}

/// State of value `j` of a block of `codes` in an `l`-bit tail-biting trellis.
#[inline]
pub fn state_at(codes: &[u8], j: usize, l: u32) -> u32 {
    let n = codes.len();
    (0..(l / 2) as usize).fold(0u32, |s, t| s | (codes[(j + n - t) % n] as u32) << (2 * t))
}

/// The states of values `0..n` of a block of `codes` ([`state_at`] of each, a test holds them
/// equal): a shift register primed with the codes that wrap, as the fast decoder reads them.
fn block_states(codes: &[u8], l: u32) -> impl Iterator<Item = u32> + '_ {
    let (n, mask) = (codes.len(), (1u32 << l) - 1);
    let mut s = (n + 1 - (l / 2) as usize..n).fold(0u32, |s, j| (s << 2) | codes[j] as u32);
    codes.iter().map(move |&c| {
        s = ((s << 2) | c as u32) & mask;
        s
    })
}

/// Encoder settings (the format's are [`Settings::FORMAT`]; others are for measurements).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub l: u32,
    /// Initial scale = `alpha · rms` of the block.
    pub alpha: f32,
    /// Refit the scale by least squares and search again.
    pub refit: bool,
    /// Tail-biting (two passes); else a free start and the wrap ignored (measurement only: the
    /// decoder always wraps).
    pub tail_biting: bool,
    /// The refit's search keeps the first search's wrap codes (one pass, the wrapped one)
    /// instead of finding its own with a free pass first (tail-biting only).
    pub refit_keeps_wrap: bool,
    /// 0: tail-biting's second pass over the whole block; `k > 0`: over the seam of the first
    /// pass only, with `k − 1` codes of context ([`encode_tail_biting_seam`]).
    pub seam: usize,
}

impl Settings {
    pub const FORMAT: Settings = Settings {
        l: L,
        alpha: 0.95,
        refit: true,
        tail_biting: true,
        refit_keeps_wrap: false,
        seam: 0,
    };

    /// The round-to-nearest encoder's settings: [`Settings::FORMAT`], or with
    /// `TQ_TQ2T_REFIT_WRAP=1` the refit keeping the first search's wrap (measurements). Read once.
    pub(crate) fn rtn() -> Settings {
        static ST: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        *ST.get_or_init(|| Settings {
            refit_keeps_wrap: std::env::var_os("TQ_TQ2T_REFIT_WRAP").is_some_and(|v| v == "1"),
            ..Settings::FORMAT
        })
    }
}

/// Encode one block of rotated values with a float scale (measurements: any `l`, no scale
/// rounding) or the format's byte scale. Returns (scale byte or 0, decoded values' squared error).
pub fn encode_block(
    x: &[f32],
    cb: &[f32],
    st: Settings,
    byte_scale: bool,
    sc: &mut Scratch,
    codes: &mut [u8],
    out: &mut [f32],
) -> (u8, f32) {
    let ones = vec![1f32; x.len()];
    encode_block_weighted(x, &ones, cb, st, byte_scale, sc, codes, out)
}

/// [`encode_block`] minimizing `Σ wt_j (x_j − x̂_j)²` (the search and the scale refit both
/// weighted); all-ones weights give `encode_block`'s bytes exactly.
#[allow(clippy::too_many_arguments)]
pub fn encode_block_weighted(
    x: &[f32],
    wt: &[f32],
    cb: &[f32],
    st: Settings,
    byte_scale: bool,
    sc: &mut Scratch,
    codes: &mut [u8],
    out: &mut [f32],
) -> (u8, f32) {
    let n = x.len();
    let rms = (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64).sqrt() as f32;
    let quant = |d: f32| -> (u8, f32) {
        if byte_scale {
            let e = nearest_scale(d);
            (e, scale_of(e))
        } else {
            (0, d)
        }
    };
    // `wrap`: the wrap codes to keep (the refit's search with `refit_keeps_wrap`).
    let run = |d: f32, wrap: Option<u32>, sc: &mut Scratch, codes: &mut [u8]| -> f32 {
        let dc: Vec<f32> = cb.iter().map(|&c| d * c).collect();
        match wrap {
            Some(top) => viterbi(x, wt, &dc, st.l, Ends::Wrap(top), sc, codes),
            None if st.tail_biting && st.seam > 0 => {
                encode_tail_biting_seam(x, wt, &dc, st.l, st.seam - 1, sc, codes)
            }
            None if st.tail_biting => encode_tail_biting(x, wt, &dc, st.l, sc, codes),
            None => viterbi(x, wt, &dc, st.l, Ends::Free, sc, codes),
        }
    };
    let (mut e, mut d) = quant(st.alpha * rms);
    if d == 0.0 {
        codes.fill(0);
        out.fill(0.0);
        return (0, x.iter().zip(wt).map(|(v, w)| w * (v * v)).sum());
    }
    let mut err = run(d, None, sc, codes);
    if st.refit {
        let (mut sxc, mut scc) = (0f64, 0f64);
        for ((&v, &w), s) in x.iter().zip(wt).zip(block_states(codes, st.l)) {
            let c = cb[s as usize] as f64;
            sxc += w as f64 * (v as f64 * c);
            scc += w as f64 * (c * c);
        }
        if scc > 0.0 && sxc > 0.0 {
            let (e2, d2) = quant((sxc / scc) as f32);
            if d2 != d && d2 > 0.0 {
                let mut c2 = vec![0u8; n];
                let wrap = (st.tail_biting && st.refit_keeps_wrap).then(|| wrap_of(codes, st.l));
                let err2 = run(d2, wrap, sc, &mut c2);
                if err2 < err {
                    (e, d, err) = (e2, d2, err2);
                    codes.copy_from_slice(&c2);
                }
            }
        }
    }
    for (o, s) in out.iter_mut().zip(block_states(codes, st.l)) {
        *o = d * cb[s as usize];
    }
    (e, err)
}

/// Pack a block: the scale byte `e`, then the 2-bit codes.
pub(crate) fn pack(e: u8, codes: &[u8], b: &mut [u8]) {
    b[0] = e;
    b[1..].fill(0);
    for (j, &c) in codes.iter().enumerate() {
        b[1 + j / 4] |= c << (2 * (j % 4));
    }
}

/// Encode rotated values (whole blocks): the registry's per-block quantizer.
pub fn quantize_tq2t_rotated(src: &[f32], out: &mut [u8]) {
    let cb = format_codebook();
    let mut sc = Scratch::new(L, QK);
    let (mut codes, mut y) = ([0u8; QK], [0f32; QK]);
    for (x, b) in src.chunks_exact(QK).zip(out.chunks_exact_mut(TQ2T_BYTES)) {
        let (e, _) = encode_block(x, cb, Settings::rtn(), true, &mut sc, &mut codes, &mut y);
        pack(e, &codes, b);
    }
}

/// Quantize one block of rotated values (LDLQ's vector quantizer); `out` gets the decoded values.
pub(crate) fn quantize_block(x: &[f32], sc: &mut Scratch, b: &mut [u8], out: &mut [f32]) {
    let mut codes = [0u8; QK];
    let (e, _) = encode_block(
        x,
        format_codebook(),
        Settings::FORMAT,
        true,
        sc,
        &mut codes,
        out,
    );
    pack(e, &codes, b);
}

fn code(b: &[u8], j: usize) -> u32 {
    ((b[1 + j / 4] >> (2 * (j % 4))) & 3) as u32
}

/// Reference decoder: every value's state read from its block's codes independently (what a GPU
/// thread per value does).
pub fn dequantize_tq2t_rotated_ref(blocks: &[u8], out: &mut [f32]) {
    for (b, y) in blocks
        .chunks_exact(TQ2T_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = scale_of(b[0]);
        for (j, v) in y.iter_mut().enumerate() {
            let s =
                (0..(L / 2) as usize).fold(0u32, |s, t| s | code(b, (j + QK - t) % QK) << (2 * t));
            *v = d * codeword(s);
        }
    }
}

/// Fast decoder: the state shifted in code by code (primed with the wrapped codes), the codebook
/// from the table. Bit-identical to [`dequantize_tq2t_rotated_ref`].
pub fn dequantize_tq2t_rotated(blocks: &[u8], out: &mut [f32]) {
    let cb = format_codebook();
    let mask = (1u32 << L) - 1;
    for (b, y) in blocks
        .chunks_exact(TQ2T_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = scale_of(b[0]);
        let mut s = 0u32;
        for j in QK - (L / 2) as usize + 1..QK {
            s = (s << 2) | code(b, j);
        }
        for (j, v) in y.iter_mut().enumerate() {
            s = ((s << 2) | code(b, j)) & mask;
            *v = d * cb[s as usize];
        }
    }
}

/// Quantize one row (length a multiple of 64): tq2_r's rotation, then the blocks.
pub fn quantize_row(src: &[f32], out: &mut [u8]) -> Result<()> {
    check_len(src.len())?;
    let r = tq2r::rotation(src.len())?;
    quantize_tq2t_rotated(&r.forward(src), out);
    Ok(())
}

/// Dequantize one row: the blocks, then `Rᵀ`.
pub fn dequantize_row(blocks: &[u8], out: &mut [f32]) -> Result<()> {
    check_len(out.len())?;
    let r = tq2r::rotation(out.len())?;
    let mut y = vec![0f32; out.len()];
    dequantize_tq2t_rotated(blocks, &mut y);
    out.copy_from_slice(&r.inverse(&y));
    Ok(())
}

fn check_len(k: usize) -> Result<()> {
    if k == 0 || !k.is_multiple_of(QK) {
        return Err(crate::error::Error::Unsupported(format!(
            "tq2_t: row length {k} is not a positive multiple of {QK}; keep this tensor in another type (e.g. --weights tq2_r or q4_K)"
        )));
    }
    Ok(())
}

/// Reference mat-vec: dequantize every row to the original basis and dot with `x` (f64 sums).
pub fn matvec_ref(blocks: &[u8], x: &[f32], y: &mut [f32]) -> Result<()> {
    tq2r::matvec_ref_by(blocks, x, y, x.len() / QK * TQ2T_BYTES, dequantize_row)
}

/// Fast mat-vec: rotate the activation once (`w·x = (R·w)·(R·x)`), then decode each block's
/// rotated values and dot them with `x'`, never forming the weights in the original basis.
pub fn matvec(blocks: &[u8], x: &[f32], y: &mut [f32]) -> Result<()> {
    let k = x.len();
    check_len(k)?;
    let xr = tq2r::rotation(k)?.forward(x);
    let row_bytes = k / QK * TQ2T_BYTES;
    let mut v = [0f32; QK];
    for (yn, row) in y.iter_mut().zip(blocks.chunks_exact(row_bytes)) {
        let mut acc = 0f32;
        for (b, xs) in row.chunks_exact(TQ2T_BYTES).zip(xr.chunks_exact(QK)) {
            dequantize_tq2t_rotated(b, &mut v);
            acc += v.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
        }
        *yn = acc;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::splitmix::gauss_f32 as gauss;
    use crate::math::splitmix::SplitMix64;

    /// The returned error is the squared error of the decoded path, and the wrapped path is a
    /// valid tail-biting path (its states read back circularly give that error).
    #[test]
    fn tail_biting_path_decodes_to_its_error() {
        let l = 10;
        let cb = codebook(l);
        let x = gauss(64, 11);
        let mut sc = Scratch::new(l, 64);
        let mut codes = vec![0u8; 64];
        let err = encode_tail_biting(&x, &[1.0; 64], &cb, l, &mut sc, &mut codes);
        let direct: f32 = (0..64)
            .map(|j| (x[j] - cb[state_at(&codes, j, l) as usize]).powi(2))
            .sum();
        assert!((err - direct).abs() <= 1e-4 * direct, "{err} vs {direct}");
        // And it is at least as good as any of 200 random paths.
        let mut g = SplitMix64::new(3);
        for _ in 0..200 {
            let c: Vec<u8> = (0..64).map(|_| (g.next_u64() & 3) as u8).collect();
            let e: f32 = (0..64)
                .map(|j| (x[j] - cb[state_at(&c, j, l) as usize]).powi(2))
                .sum();
            assert!(err <= e);
        }
    }

    /// The seam's search ([`encode_tail_biting_seam`]) keeps the free pass's codes outside its
    /// window, returns the error its codes decode to, is never worse than the free pass's codes
    /// (they are one of the paths the window's search compares), and on 40 blocks is within 8%
    /// of the full second pass (unit and non-unit weights, the format's trellis).
    #[test]
    fn seam_search_keeps_the_free_codes_and_never_loses_to_them() {
        let l = L;
        let cb = format_codebook();
        let mut sc = Scratch::new(l, QK);
        let decode_err = |x: &[f32], wt: &[f32], dc: &[f32], c: &[u8]| -> f64 {
            (0..QK)
                .map(|j| {
                    let e = (x[j] - dc[state_at(c, j, l) as usize]) as f64;
                    wt[j] as f64 * e * e
                })
                .sum()
        };
        for weighted in [false, true] {
            let (mut sum_seam, mut sum_full) = (0f64, 0f64);
            for seed in 0..40u64 {
                let x = gauss(QK, 100 + seed);
                let wt: Vec<f32> = if weighted {
                    gauss(QK, 300 + seed)
                        .iter()
                        .map(|g| (0.7 * g).exp())
                        .collect()
                } else {
                    vec![1.0; QK]
                };
                let dc: Vec<f32> = cb.iter().map(|c| 0.95 * c).collect();
                // The free pass's codes, from the plain definition.
                let h = QK / 2;
                let y: Vec<f32> = (0..QK).map(|i| x[(h + i) % QK]).collect();
                let yw: Vec<f32> = (0..QK).map(|i| wt[(h + i) % QK]).collect();
                let mut free = vec![0u8; QK];
                viterbi_ref(&y, &yw, &dc, l, Ends::Free, &mut free);
                free.rotate_right(h);
                let ctx = 8;
                let mut codes = vec![0u8; QK];
                let err = encode_tail_biting_seam(&x, &wt, &dc, l, ctx, &mut sc, &mut codes);
                let w = (l / 2 - 1) as usize;
                let (a, b) = (h - w - ctx, h + w + ctx);
                assert_eq!(codes[..a], free[..a], "seed {seed}");
                assert_eq!(codes[b..], free[b..], "seed {seed}");
                let direct = decode_err(&x, &wt, &dc, &codes);
                assert!(
                    (err as f64 - direct).abs() <= 1e-5 * direct,
                    "{err} vs {direct}"
                );
                let ef = decode_err(&x, &wt, &dc, &free);
                assert!(
                    direct <= ef * (1.0 + 1e-6),
                    "seed {seed}: {direct} vs free {ef}"
                );
                let mut full = vec![0u8; QK];
                encode_tail_biting(&x, &wt, &dc, l, &mut sc, &mut full);
                sum_seam += direct;
                sum_full += decode_err(&x, &wt, &dc, &full);
            }
            // Alone (no later search to repair it) the window's 31 values measured +4.2% unit
            // weights; paths merge slower than the window's 8 codes of context.
            eprintln!("weighted {weighted}: seam {sum_seam} vs full {sum_full}");
            assert!(
                sum_seam <= 1.08 * sum_full,
                "weighted {weighted}: seam {sum_seam} vs full {sum_full}"
            );
        }
    }

    /// The shift register's states are the definition's, for every code pattern tried, at
    /// several state sizes and block lengths.
    #[test]
    fn block_states_equal_state_at() {
        let mut g = SplitMix64::new(17);
        for (l, n) in [(12u32, 64usize), (10, 64), (8, 16), (12, 6)] {
            for _ in 0..20 {
                let c: Vec<u8> = (0..n).map(|_| (g.next_u64() & 3) as u8).collect();
                let a: Vec<u32> = block_states(&c, l).collect();
                let b: Vec<u32> = (0..n).map(|j| state_at(&c, j, l)).collect();
                assert_eq!(a, b, "l {l} n {n}");
            }
        }
    }

    #[test]
    fn codebook_is_unit_gaussian_like() {
        let cb = codebook(L);
        let n = cb.len() as f64;
        let mean = cb.iter().map(|&c| c as f64).sum::<f64>() / n;
        let var = cb.iter().map(|&c| (c as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.08,
            "{mean} {var}"
        );
    }

    #[test]
    fn scale_byte_round_trips() {
        for e in 1..=255u8 {
            assert_eq!(nearest_scale(scale_of(e)), e);
            assert!(scale_of(e) > scale_of(e - 1));
        }
        assert_eq!(nearest_scale(0.0), 0);
        assert_eq!(nearest_scale(1e9), 255);
        for d in [1e-5f32, 0.013, 0.5, 3.0, 100.0] {
            let r = scale_of(nearest_scale(d));
            assert!((r - d).abs() <= 0.0625 * d, "{d} -> {r}");
        }
    }

    #[test]
    fn fast_decoder_equals_reference() {
        let w = gauss(5 * QK, 4);
        let mut b = vec![0u8; 5 * TQ2T_BYTES];
        quantize_tq2t_rotated(&w, &mut b);
        // And some arbitrary bytes too: every code pattern decodes the same both ways.
        let mut g = SplitMix64::new(8);
        b.extend(g.bytes(3 * TQ2T_BYTES));
        let n = b.len() / TQ2T_BYTES * QK;
        let (mut a, mut c) = (vec![0f32; n], vec![0f32; n]);
        dequantize_tq2t_rotated_ref(&b, &mut a);
        dequantize_tq2t_rotated(&b, &mut c);
        assert!(a.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    /// i.i.d. Gaussian blocks: the format's normalized error is well under the scalar 4-level
    /// grid's 0.1175 (the goal is ≤ 0.075; docs/bench/two-bit.md has the measured table).
    #[test]
    fn gaussian_mse_beats_the_scalar_grid() {
        let n = 64 * QK;
        let w = gauss(n, 21);
        let mut b = vec![0u8; n / QK * TQ2T_BYTES];
        quantize_tq2t_rotated(&w, &mut b);
        let mut y = vec![0f32; n];
        dequantize_tq2t_rotated(&b, &mut y);
        let e: f64 = w
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let s: f64 = w.iter().map(|v| (*v as f64).powi(2)).sum();
        let nmse = e / s;
        assert!(nmse < 0.085, "nmse {nmse}");
    }

    #[test]
    fn fast_matvec_equals_reference_and_rows_round_trip() {
        for (rows, k) in [(5, 576), (3, 1536), (2, 256)] {
            let w = gauss(rows * k, 1 + k as u64);
            let x = gauss(k, 99);
            let rb = k / QK * TQ2T_BYTES;
            let mut b = vec![0u8; rows * rb];
            for (r, o) in w.chunks_exact(k).zip(b.chunks_exact_mut(rb)) {
                quantize_row(r, o).unwrap();
            }
            let (mut y0, mut y1) = (vec![0f32; rows], vec![0f32; rows]);
            matvec_ref(&b, &x, &mut y0).unwrap();
            matvec(&b, &x, &mut y1).unwrap();
            let scale = (k as f32).sqrt();
            for (a, c) in y0.iter().zip(&y1) {
                assert!((a - c).abs() <= 2e-5 * scale, "K={k}: {a} vs {c}");
            }
            let mut back = vec![0f32; k];
            dequantize_row(&b[..rb], &mut back).unwrap();
            let e: f32 = back.iter().zip(&w).map(|(a, b)| (a - b).powi(2)).sum();
            let s: f32 = w[..k].iter().map(|v| v * v).sum();
            assert!(e / s < 0.09, "K={k}: {}", e / s);
        }
    }

    #[test]
    fn zero_rows_huge_values_and_bad_lengths() {
        let mut b = vec![0u8; TQ2T_BYTES * 2];
        quantize_row(&[0.0; 128], &mut b).unwrap();
        let mut out = vec![1f32; 128];
        dequantize_row(&b, &mut out).unwrap();
        assert!(out.iter().all(|v| *v == 0.0));
        quantize_row(&[1e30; 128], &mut b).unwrap();
        dequantize_row(&b, &mut out).unwrap();
        assert!(out.iter().all(|v| v.is_finite()));
        let e = quantize_row(&[0.0; 96], &mut b).unwrap_err();
        assert!(e.to_string().contains("multiple of 64"), "{e}");
    }
}
