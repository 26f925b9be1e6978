//! The one encoder path: how rows of f32 become a type's bytes. `tq convert`, the mix's
//! sensitivity pass and sequential calibration all choose with [`Encoder::choose`] and encode with
//! [`encode_rows`], so the bytes a sensitivity estimate or a simulated block sees are the bytes
//! the converted file holds.

use super::ldlq::Factor;
use crate::error::{Error, Result};
use crate::types::TensorType;
use rayon::prelude::*;

/// LDLQ's settings, one value from the flags to every encoder (convert, the mix's sensitivity,
/// sequential calibration, shards): the plan carries it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LdlqSettings {
    /// Error-feedback band in columns (0 = full); `None` (no `--ldlq-band`): each type's default,
    /// [`default_band`](super::ldlq::default_band).
    pub band: Option<usize>,
    /// Damping λ: `H += λ·mean(diag(H))·I` (raised ×10 on a failed Cholesky); `None` (no
    /// `--damp`): each type's default, [`default_damp`](super::ldlq::default_damp).
    pub damp: Option<f64>,
    /// Stock types: passes refitting the block parameters after the sweep (`--ldlq-refit`).
    pub refit: usize,
    /// Shrinkage s of the Hessian towards its diagonal before damping,
    /// `H ← (1 − s)·H + s·diag(H)` ([`shrink_to_diagonal`](super::ldlq::shrink_to_diagonal));
    /// `None` (no `--shrink`): each type's default, [`default_shrink`](super::ldlq::default_shrink).
    pub shrink: Option<f64>,
}

impl Default for LdlqSettings {
    fn default() -> Self {
        LdlqSettings {
            band: None,
            damp: None,
            refit: super::ldlq::Refit::DEFAULT.passes,
            shrink: None,
        }
    }
}

impl LdlqSettings {
    /// The band `ty` is swept with: `--ldlq-band` when given, else the type's default.
    pub fn band_for(&self, ty: TensorType) -> usize {
        self.band.unwrap_or_else(|| super::ldlq::default_band(ty))
    }

    /// The damping `ty`'s Hessian is factored with: `--damp` when given, else the type's default.
    pub fn damp_for(&self, ty: TensorType) -> f64 {
        self.damp.unwrap_or_else(|| super::ldlq::default_damp(ty))
    }

    /// The shrinkage towards the diagonal `ty`'s Hessian gets: `--shrink` when given, else the
    /// type's default.
    pub fn shrink_for(&self, ty: TensorType) -> f64 {
        self.shrink
            .unwrap_or_else(|| super::ldlq::default_shrink(ty))
    }

    /// The shrinkage as recorded in provenance and checkpoint keys: the number given, or the
    /// per-kind defaults spelled out (`--shrink 0` and no `--shrink` are different files).
    pub fn shrink_label(&self) -> String {
        use super::ldlq::{IQ_SHRINK, SHRINK};
        match self.shrink {
            Some(s) => s.to_string(),
            None => format!("default (stock {SHRINK}, iq2/iq3 {IQ_SHRINK}, others 0)"),
        }
    }

    /// The effective damping as recorded in provenance and checkpoint keys (as [`band_label`]).
    ///
    /// [`band_label`]: LdlqSettings::band_label
    pub fn damp_label(&self) -> String {
        match self.damp {
            Some(d) => d.to_string(),
            None => format!(
                "default (i-quants {}, others {})",
                super::ldlq::IQ_DAMP,
                super::ldlq::DAMP
            ),
        }
    }

    /// The effective damping over `types` (as [`band_label_for`]).
    ///
    /// [`band_label_for`]: LdlqSettings::band_label_for
    pub fn damp_label_for(&self, types: impl IntoIterator<Item = TensorType>) -> String {
        let mut by: std::collections::BTreeMap<String, std::collections::BTreeSet<&str>> =
            Default::default();
        for t in types.into_iter().filter(|t| t.has_ldlq()) {
            by.entry(self.damp_for(t).to_string())
                .or_default()
                .insert(t.name());
        }
        match by.len() {
            0 => self.damp.unwrap_or(super::ldlq::DAMP).to_string(),
            1 => by.into_keys().next().unwrap(),
            _ => by
                .iter()
                .map(|(d, ts)| format!("{d}:{}", ts.iter().copied().collect::<Vec<_>>().join(",")))
                .collect::<Vec<_>>()
                .join(";"),
        }
    }

    /// The effective band as recorded in provenance and checkpoint keys: the number given, or the
    /// per-kind defaults spelled out.
    pub fn band_label(&self) -> String {
        match self.band {
            Some(b) => b.to_string(),
            None => format!(
                "default (iq2/iq3 {}, iq1 {}, others 0 = full)",
                super::ldlq::IQ_BAND,
                super::ldlq::IQ1_BAND
            ),
        }
    }

    /// The effective band over `types` (those with LDLQ): one number when they all share it
    /// (so a Hessian file's `tq.ldlq_band` from before per-type defaults still compares equal),
    /// else `B:type,type;B:type` by band.
    pub fn band_label_for(&self, types: impl IntoIterator<Item = TensorType>) -> String {
        let mut by: std::collections::BTreeMap<usize, std::collections::BTreeSet<&str>> =
            Default::default();
        for t in types.into_iter().filter(|t| t.has_ldlq()) {
            by.entry(self.band_for(t)).or_default().insert(t.name());
        }
        match by.len() {
            0 => self.band.unwrap_or(0).to_string(),
            1 => by.keys().next().unwrap().to_string(),
            _ => by
                .iter()
                .map(|(b, ts)| format!("{b}:{}", ts.iter().copied().collect::<Vec<_>>().join(",")))
                .collect::<Vec<_>>()
                .join(";"),
        }
    }

    /// `--damp`: a finite, non-negative multiple of mean(diag(H)); `--shrink`: in [0, 1].
    pub fn check(&self) -> Result<()> {
        if let Some(d) = self.damp.filter(|d| !(d.is_finite() && *d >= 0.0)) {
            return Err(Error::Usage(format!(
                "--damp {d} must be a finite number >= 0 (a fraction of mean(diag(H)), e.g. 0.01)"
            )));
        }
        match self.shrink {
            Some(s) if !(0.0..=1.0).contains(&s) => Err(Error::Usage(format!(
                "--shrink {s} must be between 0 and 1 (the weight of diag(H) in (1 - s)·H + s·diag(H), e.g. 0.5)"
            ))),
            _ => Ok(()),
        }
    }
}

/// How a tensor's rows are encoded.
#[derive(Clone, Copy)]
pub enum Encoder<'a> {
    /// Round-to-nearest through the registry (row-rotated types rotate here).
    Nearest,
    /// Importance-weighted round-to-nearest of a grid type's block parameters (an imatrix, or a
    /// Hessian diagonal): one weight per column, no error feedback.
    Weighted(&'a [f32]),
    /// Banded LDLQ with the factor of the tensor's Hessian (`band` 0 = full); `hessian`: that
    /// Hessian, for a factor whose refit reads it ([`Encoder::with_hessian`]).
    Ldlq {
        factor: &'a Factor,
        band: usize,
        hessian: Option<&'a [f64]>,
    },
}

impl<'a> Encoder<'a> {
    /// The choice every path makes: LDLQ where the type has it and a factor is given, the
    /// weighted block fit where the type has a grid encoder and an importance is given,
    /// round-to-nearest otherwise.
    pub fn choose(
        ty: TensorType,
        ldlq: Option<(&'a Factor, usize)>,
        importance: Option<&'a [f32]>,
    ) -> Encoder<'a> {
        match (ldlq, importance) {
            (Some((factor, band)), _) if ty.has_ldlq() => Encoder::Ldlq {
                factor,
                band,
                hessian: None,
            },
            (_, Some(imp)) if ty.imatrix_weighted() => Encoder::Weighted(imp),
            _ => Encoder::Nearest,
        }
    }

    /// An LDLQ encoder given the Hessian its factor was made from: what a wide factor from
    /// `ldlq::factor_hessian` reads for its refit instead of a copy of its own
    /// (`ldlq::RefitHessian::Callers`). Other encoders are returned as they are.
    pub fn with_hessian(self, h: &'a [f64]) -> Encoder<'a> {
        match self {
            Encoder::Ldlq { factor, band, .. } => Encoder::Ldlq {
                factor,
                band,
                hessian: Some(h),
            },
            e => e,
        }
    }

    /// What the method is called in `tq.tensor_methods` and plans.
    pub fn name(&self) -> &'static str {
        match self {
            Encoder::Nearest => "rtn",
            Encoder::Weighted(_) => "imatrix",
            Encoder::Ldlq { .. } => "ldlq",
        }
    }
}

/// Encode whole rows (`x` is `rows × row_len`, finite: callers check, naming the tensor) as `dst`
/// with `enc`. Rows in parallel: the bytes do not depend on the thread count.
pub fn encode_rows(
    dst: TensorType,
    name: &str,
    x: &[f32],
    row_len: usize,
    enc: &Encoder,
) -> Result<Vec<u8>> {
    let row_bytes = dst.bytes_for(row_len as u64).ok_or_else(|| {
        Error::Unsupported(format!(
            "{name}: row length {row_len} does not fit type {dst}"
        ))
    })? as usize;
    if row_len == 0 || x.is_empty() {
        return Ok(Vec::new());
    }
    if let Encoder::Ldlq {
        factor,
        band,
        hessian,
    } = enc
    {
        return Ok(super::ldlq::quantize_ldlq_given(
            dst, x, row_len, factor, *band, *hessian,
        ));
    }
    let mut buf = vec![0u8; x.len() / row_len * row_bytes];
    let rows = buf.par_chunks_mut(row_bytes).zip(x.par_chunks(row_len));
    match enc {
        Encoder::Weighted(imp) => match crate::types::weighted_encoder(dst) {
            Some(f) => rows.for_each(|(ob, row)| f(row, imp, ob)),
            None => {
                rows.for_each(|(ob, row)| crate::types::grid::quantize_weighted(dst, row, imp, ob))
            }
        },
        _ => {
            rows.try_for_each(|(ob, row)| crate::types::quantize_rows(dst, row, ob, row_len, name))?
        }
    }
    Ok(buf)
}

/// Decode whole rows as an engine reads them (the inverse rotation of row-rotated types
/// included): what a simulated tensor holds after [`encode_rows`].
pub fn decode_rows(
    ty: TensorType,
    bytes: &[u8],
    out: &mut [f32],
    row_len: usize,
    name: &str,
) -> Result<()> {
    if row_len == 0 || out.is_empty() {
        return Ok(());
    }
    let rb = bytes.len() / (out.len() / row_len).max(1);
    out.par_chunks_mut(row_len)
        .zip(bytes.par_chunks(rb.max(1)))
        .try_for_each(|(o, b)| crate::types::dequantize_rows(ty, b, o, row_len, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, k: usize) -> Vec<f32> {
        let mut s = 0x9e37_79b9_u64;
        (0..n * k)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect()
    }

    /// tq2_t's round-to-nearest encoder (rows in parallel, each row's Viterbi searches
    /// independent) gives the same bytes on 1, 2 and 5 threads.
    #[test]
    fn tq2t_rows_same_bytes_for_any_thread_count() {
        let (n, k) = (12, 512);
        let mut g = crate::math::splitmix::SplitMix64::new(32);
        let x: Vec<f32> = (0..n * k).map(|_| g.gauss() as f32).collect();
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| encode_rows(TensorType::TQ2T, "t", &x, k, &Encoder::Nearest).unwrap())
        };
        let one = run(1);
        assert_eq!(one.len(), n * k / 64 * 17);
        assert_eq!(one, run(2));
        assert_eq!(one, run(5));
    }

    #[test]
    fn the_choice_follows_the_type() {
        let imp = vec![1f32; 256];
        let x = rows(256, 512);
        let mut h = vec![0f64; 256 * 256];
        for t in x.chunks(256) {
            for i in 0..256 {
                for j in 0..256 {
                    h[i * 256 + j] += (t[i] * t[j]) as f64;
                }
            }
        }
        let f = crate::quant::ldlq::factor(&h, 256, 0.01, "t").unwrap();
        for ty in [
            TensorType::TQ4_1S,
            TensorType::Q4K,
            TensorType::Q8_0,
            TensorType::IQ2XS,
            TensorType::F16,
        ] {
            let e = Encoder::choose(ty, Some((&f, 0)), Some(&imp));
            let want = if ty.has_ldlq() {
                "ldlq"
            } else if ty.imatrix_weighted() {
                "imatrix"
            } else {
                "rtn"
            };
            assert_eq!(e.name(), want, "{ty}");
            let e = Encoder::choose(ty, None, Some(&imp));
            assert_eq!(
                e.name(),
                if ty.imatrix_weighted() {
                    "imatrix"
                } else {
                    "rtn"
                }
            );
            assert_eq!(Encoder::choose(ty, None, None).name(), "rtn");
        }
    }

    /// Round-to-nearest rows equal the registry's own encoding, row-rotated types included, and
    /// decode back through the registry's row decoder.
    #[test]
    fn nearest_is_the_registry_and_decodes() {
        for ty in [
            TensorType::Q4_0,
            TensorType::TQ4_1S,
            TensorType::TQ2R,
            TensorType::TQ2T,
        ] {
            let (n, k) = (256, 3);
            let x = rows(n, k);
            let b = encode_rows(ty, "t", &x, n, &Encoder::Nearest).unwrap();
            let rb = ty.bytes_for(n as u64).unwrap() as usize;
            let mut want = vec![0u8; rb * k];
            for (o, r) in want.chunks_mut(rb).zip(x.chunks(n)) {
                crate::types::quantize_rows(ty, r, o, n, "t").unwrap();
            }
            assert_eq!(b, want, "{ty}");
            let mut y = vec![0f32; n * k];
            decode_rows(ty, &b, &mut y, n, "t").unwrap();
            let mut z = vec![0f32; n * k];
            crate::types::dequantize_rows(ty, &b, &mut z, n, "t").unwrap();
            assert_eq!(y, z, "{ty}");
        }
    }
}
