//! KV-cache quantization, simulated: every K and V head vector is stored and read back through a
//! cache type the way an engine would, so `tq eval` can measure what a KV type costs in
//! perplexity / KL divergence without an engine.
//!
//! - Stock block types (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) and f16/bf16/f32 go through the
//!   registry's quantize/dequantize along each head (blocks never straddle heads). With
//!   `rotate` (upstream llama.cpp's default since April 2026, `LLAMA_ATTN_ROT_DISABLE` off), a
//!   quantized K is stored rotated by the orthonormal Walsh–Hadamard matrix of the largest power
//!   of two ≥ 64 dividing the head (queries get the same rotation, so q·k is unchanged but for the
//!   rounding), and a quantized V by 64-wide blocks, the attention output being rotated back.
//! - turbo2/3/4 (the fork's KV types, FORMATS.md §3) use their own two-sided randomized Hadamard
//!   rotation per 128-value group; a head that is not a multiple of 128 is zero-padded to the
//!   next multiple, as the fork builds its cache (a 64-wide head is one group with 64 zeros).
//!   The 64-value group layout (first 64 signs, 1/8) is an explicit option
//!   ([`TurboGroups::Native64`]), never the default. The engine keeps the cache in the rotated
//!   domain and rotates queries/outputs instead; the round trip here is done in the original
//!   domain (padded, then sliced back), which is the same arithmetic up to float rounding.
//! - What an engine does by default — padding, tables, rotation of stock types, the
//!   auto-asymmetric and layer-adaptive rules — is its target profile's [`KvRules`].

use crate::error::{Error, Result};
use crate::math::hadamard::{fwht, inv_sqrt_len, rht2_forward};
pub use crate::types::profile::{KvRules, Profile, TurboGroups};
pub use crate::types::turbo::{turbo_codebook, Turbo4Table};
use crate::types::{turbo, TensorType};

/// Cache types of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayer {
    pub k: TensorType,
    pub v: TensorType,
}

impl KvLayer {
    pub const F16: KvLayer = KvLayer {
        k: TensorType::F16,
        v: TensorType::F16,
    };
}

/// The simulated cache of a whole model: types per layer and the options shared by all layers.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    /// Types of every layer (empty: f16 everywhere).
    pub layers: Vec<KvLayer>,
    /// Upstream's Hadamard rotation of quantized stock types.
    pub rotate: bool,
    pub turbo4: Turbo4Table,
    pub groups: TurboGroups,
}

impl Default for KvCache {
    /// The f16 cache, with the default profile's options for any type set later.
    fn default() -> Self {
        let r = Profile::default().kv;
        KvCache {
            layers: Vec::new(),
            rotate: r.rotate_stock,
            turbo4: r.table,
            groups: r.groups,
        }
    }
}

/// Types an engine accepts for the K/V cache (llama.cpp's `-ctk/-ctv` list plus the fork's turbo).
pub const KV_TYPES: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "turbo2", "turbo3",
    "turbo4",
];

/// Parse a cache type name (as `-ctk` takes it): a registry type that is on [`KV_TYPES`].
pub fn parse_kv_type(name: &str) -> Result<TensorType> {
    if !KV_TYPES.contains(&name) {
        return Err(Error::Usage(format!(
            "KV cache type '{}' is not supported (one of: {})",
            crate::error::one_line(name),
            KV_TYPES.join(", ")
        )));
    }
    TensorType::parse(name)
}

/// A per-layer rule from `--kv-layers RANGES=TYPE` (K and V) or `RANGES=KTYPE/VTYPE`
/// (`-` keeps a side unchanged), e.g. `0-1,28-29=q8_0` or `0,29=-/q8_0`.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRule {
    pub ranges: Vec<(usize, usize)>,
    pub k: Option<TensorType>,
    pub v: Option<TensorType>,
}

impl LayerRule {
    pub fn parse(s: &str) -> Result<LayerRule> {
        let bad = |why: &str| {
            Error::Usage(format!(
                "--kv-layers '{}': {why} (expected e.g. 0-1,28-29=q8_0 or 0,29=-/q8_0)",
                crate::error::one_line(s)
            ))
        };
        let (r, t) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
        let mut ranges = Vec::new();
        for part in r.split(',') {
            let part = part.trim();
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let a: usize = a.trim().parse().map_err(|_| bad("bad layer number"))?;
            let b: usize = b.trim().parse().map_err(|_| bad("bad layer number"))?;
            if b < a {
                return Err(bad("range ends before it starts"));
            }
            ranges.push((a, b));
        }
        let side = |x: &str| -> Result<Option<TensorType>> {
            match x.trim() {
                "-" => Ok(None),
                n => parse_kv_type(n).map(Some),
            }
        };
        let (k, v) = match t.split_once('/') {
            Some((k, v)) => (side(k)?, side(v)?),
            None => {
                let x = side(t)?;
                (x, x)
            }
        };
        Ok(LayerRule { ranges, k, v })
    }

    fn covers(&self, l: usize) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= l && l <= b)
    }
}

/// What the user asked for, before it is laid over a model: the cache types and the engine
/// behaviour (from the target profile, each part overridable).
#[derive(Clone, Debug, PartialEq)]
pub struct KvSpec {
    pub k: TensorType,
    pub v: TensorType,
    pub rules: Vec<LayerRule>,
    /// The target profile's name (reports and messages).
    pub profile: String,
    /// The engine has turbo cache types.
    pub turbo: bool,
    /// The fork's auto-asymmetric rule: turbo K == V and n_head / n_head_kv >= 6 → K q8_0.
    pub auto_asym: bool,
    /// Hadamard rotation of quantized stock types (upstream's default).
    pub rotate: bool,
    pub turbo4: Turbo4Table,
    pub groups: TurboGroups,
    /// The fork's `TURBO_LAYER_ADAPTIVE` mode (0 off, 1, 2, 5, 6, 7); `None`: the engine's own
    /// rule ([`KvRules::turbo2_boundary`]: mode 7 for `-ctv turbo2` on >= 8 layers).
    pub layer_adaptive: Option<u8>,
    pub turbo2_boundary: bool,
}

impl Default for KvSpec {
    /// The f16 cache under the default target profile.
    fn default() -> Self {
        KvSpec::for_profile(&Profile::default())
    }
}

/// The fork's `TURBO_LAYER_ADAPTIVE` modes (src/llama-kv-cache.cpp at 69d8e4be4).
pub const LAYER_ADAPTIVE_MODES: &[u8] = &[0, 1, 2, 5, 6, 7];

impl KvSpec {
    /// The f16 cache with `profile`'s KV behaviour.
    pub fn for_profile(profile: &Profile) -> KvSpec {
        let r = profile.kv;
        KvSpec {
            k: TensorType::F16,
            v: TensorType::F16,
            rules: Vec::new(),
            profile: profile.name.clone(),
            turbo: r.turbo,
            auto_asym: r.auto_asym,
            rotate: r.rotate_stock,
            turbo4: r.table,
            groups: r.groups,
            layer_adaptive: None,
            turbo2_boundary: r.turbo2_boundary,
        }
    }

    /// The spec from its command-line form (`tq eval`'s flags) under a target profile:
    /// `-ctk`/`-ctv` type names and `--kv-layers` rules; the profile's behaviour stays as it is
    /// unless the caller overrides a field.
    pub fn from_names(k: &str, v: &str, rules: &[String], profile: &Profile) -> Result<KvSpec> {
        Ok(KvSpec {
            k: parse_kv_type(k)?,
            v: parse_kv_type(v)?,
            rules: rules
                .iter()
                .map(|r| LayerRule::parse(r))
                .collect::<Result<_>>()?,
            ..KvSpec::for_profile(profile)
        })
    }

    /// The layer-adaptive mode in effect for `n_layer` layers.
    pub fn adaptive_mode(&self, n_layer: usize) -> u8 {
        self.layer_adaptive.unwrap_or(
            if self.turbo2_boundary && self.v == TensorType::Turbo2 && n_layer >= 8 {
                7
            } else {
                0
            },
        )
    }

    /// Lay the spec over a model of `n_layer` layers as the engine does: the auto-asymmetric
    /// rule on `-ctk/-ctv`, the layer-adaptive mode, then the per-layer rules in order (later
    /// ones win).
    pub fn resolve(
        &self,
        n_layer: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
    ) -> Result<KvCache> {
        if !self.turbo {
            let all = [Some(self.k), Some(self.v)]
                .into_iter()
                .chain(self.rules.iter().flat_map(|r| [r.k, r.v]));
            if let Some(t) = all.flatten().find(|t| t.is_turbo()) {
                return Err(Error::Usage(format!(
                    "KV cache type {} does not exist in target '{}' (no turbo cache types); use --target fork",
                    t.name(),
                    self.profile
                )));
            }
        }
        let mut base = KvLayer {
            k: self.k,
            v: self.v,
        };
        if self.auto_asym && auto_asym_applies(base, n_head, n_head_kv) {
            base.k = TensorType::Q8_0;
        }
        let mut layers: Vec<KvLayer> = (0..n_layer)
            .map(|l| adaptive_layer(self.adaptive_mode(n_layer), base, l, n_layer))
            .collect();
        for r in &self.rules {
            if let Some(&(_, b)) = r.ranges.iter().find(|&&(_, b)| b >= n_layer) {
                return Err(Error::Usage(format!(
                    "--kv-layers: layer {b} does not exist (the model has {n_layer} layers, 0-{})",
                    n_layer.saturating_sub(1)
                )));
            }
            for (l, lay) in layers.iter_mut().enumerate() {
                if r.covers(l) {
                    if let Some(k) = r.k {
                        lay.k = k;
                    }
                    if let Some(v) = r.v {
                        lay.v = v;
                    }
                }
            }
        }
        let kv = KvCache {
            layers,
            rotate: self.rotate,
            turbo4: self.turbo4,
            groups: self.groups,
        };
        kv.check(head_dim)?;
        Ok(kv)
    }
}

/// Layer `l`'s types under the fork's `TURBO_LAYER_ADAPTIVE` mode (modes 1 and 2 ask whether K
/// is turbo, 5-7 whether V is; all need >= 8 layers).
fn adaptive_layer(mode: u8, base: KvLayer, l: usize, n_layer: usize) -> KvLayer {
    use TensorType::{Turbo2, Turbo4, Q8_0};
    let mut x = base;
    if n_layer < 8 {
        return x;
    }
    let boundary = l < 2 || l >= n_layer - 2;
    match mode {
        1 if base.k.is_turbo() && (l < 4 || l >= n_layer - 4) => x = KvLayer { k: Q8_0, v: Q8_0 },
        2 if base.k.is_turbo() && l >= n_layer - 8 => x = KvLayer { k: Q8_0, v: Q8_0 },
        5 if base.v.is_turbo() => x.v = if boundary { Turbo4 } else { Turbo2 },
        6 if base.v.is_turbo() => x.v = if l >= n_layer - 8 { Turbo4 } else { Turbo2 },
        7 if base.v.is_turbo() => x.v = if boundary { Q8_0 } else { Turbo2 },
        _ => {}
    }
    x
}

/// Whether the fork's auto-asymmetric rule promotes K to q8_0 (FORMATS.md §3).
pub fn auto_asym_applies(l: KvLayer, n_head: usize, n_head_kv: usize) -> bool {
    l.k.is_turbo() && l.k == l.v && n_head_kv > 0 && n_head / n_head_kv >= 6
}

/// Values per turbo group for a head dimension under a group layout (FORMATS.md §3).
pub fn turbo_group(head_dim: usize, groups: TurboGroups) -> usize {
    if head_dim == 64 && groups == TurboGroups::Native64 {
        64
    } else {
        128
    }
}

/// Bits per real value of cache type `t` on heads of `head_dim` (padding and headers counted).
pub fn bits_per_value(
    t: TensorType,
    head_dim: usize,
    table: Turbo4Table,
    groups: TurboGroups,
) -> f64 {
    if t.is_turbo() {
        let g = turbo_group(head_dim, groups);
        let idx_bits = match t {
            TensorType::Turbo2 => 2,
            TensorType::Turbo3 => 3,
            _ => 4,
        };
        // f16 norm (+ the May layout's unused f16 for turbo4) and the packed indices of a group.
        let header = if t == TensorType::Turbo4 && table == Turbo4Table::May {
            4
        } else {
            2
        };
        let group_bytes = header + g * idx_bits / 8;
        let groups = head_dim.div_ceil(g);
        return (groups * group_bytes * 8) as f64 / head_dim as f64;
    }
    let i = t.info();
    (i.block_bytes * 8) as f64 / i.block_size as f64
}

impl KvCache {
    /// One type for K and V in every layer of an `n_layer` model.
    pub fn uniform(k: TensorType, v: TensorType, n_layer: usize) -> KvCache {
        KvCache {
            layers: vec![KvLayer { k, v }; n_layer],
            ..KvCache::default()
        }
    }

    /// The types of layer `l`.
    pub fn layer(&self, l: usize) -> KvLayer {
        self.layers.get(l).copied().unwrap_or(KvLayer::F16)
    }

    /// Whether every layer is the f16 default.
    pub fn is_default(&self) -> bool {
        self.layers.iter().all(|&l| l == KvLayer::F16)
    }

    /// Check every layer's types against a head dimension.
    pub fn check(&self, head_dim: usize) -> Result<()> {
        for (l, lay) in self.layers.iter().enumerate() {
            for (which, t) in [("K", lay.k), ("V", lay.v)] {
                let info = t.info();
                if info.quantize.is_none() || info.dequantize.is_none() {
                    return Err(Error::Unsupported(format!(
                        "layer {l}: {which} cache type {}: no quantizer in tq",
                        info.name
                    )));
                }
                if !t.is_turbo() && !head_dim.is_multiple_of(info.block_size) {
                    return Err(Error::Unsupported(format!(
                        "layer {l}: {which} cache type {} needs heads that are a multiple of {} (head dim {head_dim}); choose another type",
                        info.name, info.block_size
                    )));
                }
            }
        }
        Ok(())
    }

    /// Mean bits per stored value of K and of V over the layers.
    pub fn bits(&self, n_layer: usize, head_dim: usize) -> (f64, f64) {
        let n = n_layer.max(1) as f64;
        let (mut k, mut v) = (0.0, 0.0);
        for l in 0..n_layer {
            let lay = self.layer(l);
            k += bits_per_value(lay.k, head_dim, self.turbo4, self.groups);
            v += bits_per_value(lay.v, head_dim, self.turbo4, self.groups);
        }
        (k / n, v / n)
    }

    /// A compact description: `K/V` when uniform, else the distinct per-layer settings.
    pub fn describe(&self, n_layer: usize) -> String {
        let mut runs: Vec<(usize, usize, KvLayer)> = Vec::new();
        for l in 0..n_layer {
            let lay = self.layer(l);
            match runs.last_mut() {
                Some(r) if r.2 == lay => r.1 = l,
                _ => runs.push((l, l, lay)),
            }
        }
        let name = |x: KvLayer| format!("{}/{}", x.k.name(), x.v.name());
        if runs.len() <= 1 {
            return runs
                .first()
                .map_or_else(|| name(KvLayer::F16), |r| name(r.2));
        }
        runs.iter()
            .map(|(a, b, x)| {
                if a == b {
                    format!("{a}={}", name(*x))
                } else {
                    format!("{a}-{b}={}", name(*x))
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl KvLayer {
    /// Rotation size applied to K (and queries), if any.
    pub fn k_rotation(&self, rotate: bool, head_dim: usize) -> Option<usize> {
        if !rotate || !self.k.is_quantized() || self.k.is_turbo() || !head_dim.is_multiple_of(64) {
            return None;
        }
        let mut n = 64;
        while head_dim.is_multiple_of(2 * n) {
            n *= 2;
        }
        Some(n)
    }

    /// Rotation size applied to V (and rotated back on the output), if any.
    pub fn v_rotation(&self, rotate: bool, head_dim: usize) -> Option<usize> {
        if !rotate || !self.v.is_quantized() || self.v.is_turbo() || !head_dim.is_multiple_of(64) {
            return None;
        }
        Some(64)
    }
}

/// Orthonormal Walsh–Hadamard rotation of consecutive `n`-blocks of `x` (its own inverse).
pub fn hadamard_blocks(x: &mut [f32], n: usize) {
    let k = inv_sqrt_len(n);
    for b in x.chunks_exact_mut(n) {
        fwht(b);
        b.iter_mut().for_each(|v| *v *= k);
    }
}

/// Store one `g`-value group (g = 64 or 128) in a turbo block and read it back, in the rotated
/// domain: `f16(norm) · C[idx]` from the fork's encoder (`types::turbo::quantize_group`) with any
/// codebook; with g = 128 and the stock tables this equals the registry's dequantized bytes.
pub fn turbo_group_rotated(x: &[f32], cb: &[f32], out: &mut [f32]) {
    let (norm, idx) = turbo::quantize_group(x, cb);
    let stored = half::f16::from_f32(norm).to_f32();
    for (o, &i) in out.iter_mut().zip(&idx) {
        *o = cb[i as usize] * stored;
    }
}

/// Store one head vector in a cache of type `t` and read it back (turbo: zero-padded to whole
/// groups, the padding's read-back discarded as the engine's sliced output does).
pub fn round_trip(t: TensorType, table: Turbo4Table, groups: TurboGroups, x: &mut [f32]) {
    match t {
        TensorType::F32 => {}
        TensorType::F16 => x
            .iter_mut()
            .for_each(|v| *v = half::f16::from_f32(*v).to_f32()),
        TensorType::BF16 => x
            .iter_mut()
            .for_each(|v| *v = half::bf16::from_f32(*v).to_f32()),
        t if t.is_turbo() => {
            let g = turbo_group(x.len(), groups);
            let cb = turbo_codebook(t, table, g);
            for part in x.chunks_mut(g) {
                let mut buf = [0f32; 128];
                buf[..part.len()].copy_from_slice(part);
                let mut y = [0f32; 128];
                turbo_group_rotated(&buf[..g], cb, &mut y[..g]);
                // The inverse of the turbo rotation swaps the sign vectors.
                rht2_forward(&mut y[..g], &turbo::S2[..g], &turbo::S1[..g]);
                part.copy_from_slice(&y[..part.len()]);
            }
        }
        t => {
            let info = t.info();
            let mut bytes = vec![0u8; x.len() / info.block_size * info.block_bytes];
            (info.quantize.expect("checked"))(x, &mut bytes);
            (info.dequantize.expect("checked"))(&bytes, x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2654435761) >> 8;
                (h as f32 / (1u32 << 24) as f32 - 0.5) * (1.0 + (i % 7) as f32)
            })
            .collect()
    }

    #[test]
    fn hadamard_is_an_involution_and_keeps_norms() {
        let v: Vec<f32> = (0..128).map(|i| ((i * 37) % 17) as f32 - 8.0).collect();
        let mut a = v.clone();
        hadamard_blocks(&mut a, 64);
        let n0: f32 = v.iter().map(|x| x * x).sum();
        let n1: f32 = a.iter().map(|x| x * x).sum();
        assert!((n0 - n1).abs() < 1e-3 * n0);
        hadamard_blocks(&mut a, 64);
        for (x, y) in a.iter().zip(&v) {
            assert!((x - y).abs() < 1e-4);
        }
    }

    #[test]
    fn rotation_sizes_follow_upstream() {
        let l = KvLayer {
            k: TensorType::Q4_0,
            v: TensorType::Q4_0,
        };
        assert_eq!(l.k_rotation(true, 64), Some(64));
        assert_eq!(l.k_rotation(true, 128), Some(128));
        assert_eq!(l.k_rotation(true, 192), Some(64));
        assert_eq!(l.v_rotation(true, 128), Some(64));
        assert_eq!(l.k_rotation(true, 80), None);
        assert_eq!(l.k_rotation(false, 128), None);
        assert_eq!(KvLayer::F16.k_rotation(true, 128), None);
    }

    /// The simulation's turbo group equals the registry's bytes (themselves bit-exact with the
    /// fork's conformance vectors) for 128-groups and the stock tables.
    #[test]
    fn turbo_group_equals_registry_dequantize() {
        for t in [TensorType::Turbo2, TensorType::Turbo3, TensorType::Turbo4] {
            let info = t.info();
            for seed in 0..200 {
                let x = data(128, seed * 7919 + 1);
                let mut bytes = vec![0u8; info.block_bytes];
                (info.quantize.unwrap())(&x, &mut bytes);
                let mut want = [0f32; 128];
                (info.dequantize.unwrap())(&bytes, &mut want);
                let mut got = [0f32; 128];
                turbo_group_rotated(&x, turbo_codebook(t, Turbo4Table::May, 128), &mut got);
                assert_eq!(
                    got.map(f32::to_bits),
                    want.map(f32::to_bits),
                    "{t:?} seed {seed}"
                );
            }
        }
    }

    #[test]
    fn round_trips_are_close_and_lloyd_max_beats_may() {
        let v = data(128, 99);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let rel = |t, table| {
            let mut a = v.clone();
            round_trip(t, table, TurboGroups::Pad128, &mut a);
            a.iter()
                .zip(&v)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f32>()
                .sqrt()
                / norm
        };
        assert!(rel(TensorType::Q8_0, Turbo4Table::May) < 0.01);
        assert!(rel(TensorType::Q4_0, Turbo4Table::May) < 0.2);
        let (t2, t3) = (
            rel(TensorType::Turbo2, Turbo4Table::May),
            rel(TensorType::Turbo3, Turbo4Table::May),
        );
        let (may, lm) = (
            rel(TensorType::Turbo4, Turbo4Table::May),
            rel(TensorType::Turbo4, Turbo4Table::LloydMax),
        );
        assert!(t2 > t3 && t3 > lm, "turbo2 {t2} turbo3 {t3} turbo4 {lm}");
        // The May table is ~2.1x the optimal MSE: ~1.45x the RMS error.
        assert!(may > 1.2 * lm, "may {may} vs lloyd-max {lm}");
        assert!(lm < 0.15);
        // 64-wide heads: padded to one 128-group (the fork), or one 64-group (explicit).
        for groups in [TurboGroups::Pad128, TurboGroups::Native64] {
            let mut h = data(64, 5);
            let h0 = h.clone();
            round_trip(TensorType::Turbo3, Turbo4Table::May, groups, &mut h);
            let e: f32 = h.iter().zip(&h0).map(|(a, b)| (a - b) * (a - b)).sum();
            let n: f32 = h0.iter().map(|a| a * a).sum();
            assert!((e / n).sqrt() < 0.3, "{groups:?}: {}", (e / n).sqrt());
        }
    }

    /// On 64-value groups the fork's d = 128 tables are too narrow: the per-group Lloyd-Max
    /// tables give a lower error on many random vectors (numpy gives MSE 0.0162 vs 0.0089 for
    /// 4 bits), and on 128-value groups they are nearly the fork's.
    #[test]
    fn head_dim_tables_fit_64_value_groups() {
        let mse = |t, table, d: usize| {
            let groups = TurboGroups::Native64;
            let mut tot = 0f64;
            for seed in 0..400u32 {
                let v = data(d, seed * 31 + 7);
                let mut a = v.clone();
                round_trip(t, table, groups, &mut a);
                let e: f32 = a.iter().zip(&v).map(|(x, y)| (x - y) * (x - y)).sum();
                let n: f32 = v.iter().map(|x| x * x).sum();
                tot += (e / n) as f64;
            }
            tot / 400.0
        };
        for t in [TensorType::Turbo3, TensorType::Turbo4] {
            let (fork, own) = (
                mse(t, Turbo4Table::LloydMax, 64),
                mse(t, Turbo4Table::HeadDim, 64),
            );
            assert!(own < 0.85 * fork, "{t:?}: head-dim {own} vs fork {fork}");
            let (fork, own) = (
                mse(t, Turbo4Table::LloydMax, 128),
                mse(t, Turbo4Table::HeadDim, 128),
            );
            assert!(
                (own / fork - 1.0).abs() < 0.03,
                "{t:?} d=128: {own} vs {fork}"
            );
        }
    }

    #[test]
    fn lloyd_max_table_is_close_to_the_june_table() {
        // FORMATS.md §3: the fork's June-2026 table (positive half).
        let june = [
            0.01114, 0.03369, 0.05709, 0.08205, 0.10960, 0.14149, 0.18139, 0.24021,
        ];
        let cb = turbo_codebook(TensorType::Turbo4, Turbo4Table::LloydMax, 128);
        for (c, j) in cb[8..].iter().zip(june) {
            assert!((c - j).abs() < 0.003, "{c} vs {j}");
        }
    }

    #[test]
    fn bits_include_padding_and_headers() {
        use TensorType::*;
        let (lm, may) = (Turbo4Table::LloydMax, Turbo4Table::May);
        let (pad, g64) = (TurboGroups::Pad128, TurboGroups::Native64);
        assert_eq!(bits_per_value(F16, 64, lm, pad), 16.0);
        assert_eq!(bits_per_value(Q8_0, 64, lm, pad), 8.5);
        assert_eq!(bits_per_value(Q4_0, 128, lm, pad), 4.5);
        assert_eq!(bits_per_value(Turbo3, 128, lm, pad), 3.125);
        assert_eq!(bits_per_value(Turbo2, 128, lm, pad), 2.125);
        assert_eq!(bits_per_value(Turbo4, 128, may, pad), 4.25);
        assert_eq!(bits_per_value(Turbo4, 128, lm, pad), 4.125);
        // FORMATS.md §3: on 64-wide heads the fork stores 50 bytes (turbo3) and 68 (turbo4,
        // May) per 64 real values.
        assert_eq!(bits_per_value(Turbo3, 64, lm, pad), 6.25);
        assert_eq!(bits_per_value(Turbo4, 64, may, pad), 8.5);
        assert_eq!(bits_per_value(Turbo4, 64, lm, pad), 8.25);
        assert_eq!(bits_per_value(Turbo2, 64, lm, pad), 4.25);
        assert_eq!(bits_per_value(Turbo3, 64, lm, g64), 3.25);
        // 80 and 192: zero-padded to 128 and 256 in both layouts.
        assert_eq!(bits_per_value(Turbo3, 80, lm, g64), 5.0);
        assert_eq!(bits_per_value(Turbo3, 192, lm, pad), 100.0 * 8.0 / 192.0);
    }

    /// What the fork computes on a padded 64-wide head, in the rotated domain: the query padded
    /// with zeros and rotated (`turbo::rotate_forward`), dotted with the registry's dequantized
    /// block of the zero-padded key (the registry is byte-exact with the fork's conformance
    /// vectors). The simulation's original-domain round trip gives the same scores.
    #[test]
    fn padded_round_trip_gives_the_engines_scores() {
        for t in [TensorType::Turbo2, TensorType::Turbo3, TensorType::Turbo4] {
            let info = t.info();
            for seed in 0..50u32 {
                let (q, k) = (data(64, seed * 2 + 1), data(64, seed * 2 + 7));
                let mut kp = [0f32; 128];
                kp[..64].copy_from_slice(&k);
                let mut bytes = vec![0u8; info.block_bytes];
                (info.quantize.unwrap())(&kp, &mut bytes);
                let mut k_rot = [0f32; 128];
                (info.dequantize.unwrap())(&bytes, &mut k_rot);
                let mut q_rot = [0f32; 128];
                q_rot[..64].copy_from_slice(&q);
                turbo::rotate_forward(&mut q_rot);
                let engine: f64 = q_rot.iter().zip(&k_rot).map(|(a, b)| (a * b) as f64).sum();
                let mut ks = k.clone();
                round_trip(t, Turbo4Table::May, TurboGroups::Pad128, &mut ks);
                let sim: f64 = q.iter().zip(&ks).map(|(a, b)| (a * b) as f64).sum();
                let scale: f64 = q.iter().map(|a| a.abs() as f64).sum::<f64>() * 1e-5;
                assert!(
                    (engine - sim).abs() < scale,
                    "{t:?} seed {seed}: {engine} vs {sim}"
                );
                // The 64-group layout is a different cache.
                let mut k64 = k.clone();
                round_trip(t, Turbo4Table::May, TurboGroups::Native64, &mut k64);
                assert_ne!(k64, ks);
            }
        }
    }

    /// The fork's TURBO_LAYER_ADAPTIVE modes, the automatic mode 7 for turbo2 V and the
    /// profile-dependent defaults.
    #[test]
    fn layer_adaptive_modes_follow_the_fork() {
        use TensorType::*;
        let fork = Profile::built_in("fork-69d8e4be4").unwrap();
        let mut s = KvSpec::from_names("turbo3", "turbo2", &[], &fork).unwrap();
        let kv = s.resolve(10, 9, 3, 64).unwrap();
        let v: Vec<_> = (0..10).map(|l| kv.layer(l).v).collect();
        assert_eq!(
            v,
            [Q8_0, Q8_0, Turbo2, Turbo2, Turbo2, Turbo2, Turbo2, Turbo2, Q8_0, Q8_0]
        );
        assert!((0..10).all(|l| kv.layer(l).k == Turbo3));
        // Fewer than 8 layers, or TURBO_LAYER_ADAPTIVE=0: uniform.
        assert!((0..7).all(|l| s.resolve(7, 9, 3, 64).unwrap().layer(l).v == Turbo2));
        s.layer_adaptive = Some(0);
        assert!((0..10).all(|l| s.resolve(10, 9, 3, 64).unwrap().layer(l).v == Turbo2));
        s.layer_adaptive = Some(1);
        let kv = s.resolve(10, 9, 3, 64).unwrap();
        assert_eq!(kv.layer(3), KvLayer { k: Q8_0, v: Q8_0 });
        assert_eq!(
            kv.layer(4),
            KvLayer {
                k: Turbo3,
                v: Turbo2
            }
        );
        assert_eq!(kv.layer(6), KvLayer { k: Q8_0, v: Q8_0 });
        s.layer_adaptive = Some(5);
        let kv = s.resolve(10, 9, 3, 64).unwrap();
        assert_eq!((kv.layer(1).v, kv.layer(5).v), (Turbo4, Turbo2));
        s.layer_adaptive = Some(6);
        let kv = s.resolve(10, 9, 3, 64).unwrap();
        assert_eq!((kv.layer(1).v, kv.layer(2).v), (Turbo2, Turbo4));
        // Mode 7 does not start by itself for a turbo3 V.
        let s3 = KvSpec::from_names("turbo3", "turbo3", &[], &fork).unwrap();
        assert!((0..10).all(|l| s3.resolve(10, 9, 3, 64).unwrap().layer(l).v == Turbo3));
        // Upstream: no turbo types at all, and stock types rotated.
        let up = Profile::built_in("upstream").unwrap();
        let su = KvSpec::from_names("q8_0", "turbo3", &[], &up).unwrap();
        let e = su.resolve(10, 9, 3, 64).unwrap_err().to_string();
        assert!(e.contains("turbo3") && e.contains("upstream"), "{e}");
        assert!(KvSpec::from_names("q8_0", "q4_0", &[], &up).unwrap().rotate);
        assert!(!s3.rotate && s3.auto_asym && s3.turbo4 == Turbo4Table::May);
        let june = KvSpec::for_profile(&Profile::default());
        assert_eq!(june.turbo4, Turbo4Table::LloydMax);
        assert_eq!(june.groups, TurboGroups::Pad128);
    }

    #[test]
    fn layer_rules_and_auto_asym() {
        let r = LayerRule::parse("0-1,28-29=q8_0").unwrap();
        assert_eq!(r.ranges, vec![(0, 1), (28, 29)]);
        assert_eq!((r.k, r.v), (Some(TensorType::Q8_0), Some(TensorType::Q8_0)));
        let r2 = LayerRule::parse("3=-/turbo4").unwrap();
        assert_eq!((r2.k, r2.v), (None, Some(TensorType::Turbo4)));
        for bad in ["0-1", "a=q8_0", "3-1=q8_0", "0=q3_k", "0=turbo9/-"] {
            assert!(LayerRule::parse(bad).is_err(), "{bad}");
        }
        let spec = KvSpec {
            k: TensorType::Turbo3,
            v: TensorType::Turbo3,
            rules: vec![r, r2],
            auto_asym: true,
            layer_adaptive: Some(0),
            ..KvSpec::default()
        };
        // GQA 9/3 = 3: no promotion.
        let kv = spec.resolve(30, 9, 3, 64).unwrap();
        assert_eq!(kv.layer(5).k, TensorType::Turbo3);
        assert_eq!(kv.layer(0).v, TensorType::Q8_0);
        assert_eq!(kv.layer(3).k, TensorType::Turbo3);
        assert_eq!(kv.layer(3).v, TensorType::Turbo4);
        assert_eq!(kv.layer(29).k, TensorType::Q8_0);
        // GQA 28/4 = 7: K promoted.
        let kv = spec.resolve(30, 28, 4, 128).unwrap();
        assert_eq!(kv.layer(5).k, TensorType::Q8_0);
        assert_eq!(kv.layer(5).v, TensorType::Turbo3);
        assert!(spec.resolve(20, 9, 3, 64).is_err());
        assert_eq!(
            kv.describe(30),
            "0-1=q8_0/q8_0,2=q8_0/turbo3,3=q8_0/turbo4,4-27=q8_0/turbo3,28-29=q8_0/q8_0"
        );
        // A block type that does not fit the head.
        let s = KvSpec {
            k: TensorType::Q4_0,
            ..KvSpec::default()
        };
        assert!(s.resolve(2, 4, 4, 96).is_ok());
        assert!(s.resolve(2, 4, 4, 48).is_err());
    }
}
