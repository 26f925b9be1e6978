//! Rotary position embeddings as ggml computes them (`ggml_rope_ext` without YaRN): for pair `i`
//! of a head, `theta = pos * base^(-2i/d)` — accumulated by repeated multiplication in f32 like
//! ggml's rope cache — divided by the llama3 frequency factor of that pair when the model has
//! `rope_freqs.weight` (or LongRoPE's factors), and multiplied by the linear scaling
//! `freq_scale`; cos and sin are multiplied by `mscale` (LongRoPE's attention factor). With
//! partial rotary (`n_rot < head_dim`) only the first `n_rot` values of a head rotate, with
//! `base^(-2i/n_rot)`; the rest pass through, as in ggml.

/// A model's RoPE for windows of `n_pos` positions: the global layers', and the sliding-window
/// layers' when they rotate with their own base (Gemma). LongRoPE factors are picked for `n_pos`.
pub(crate) fn model_ropes(cfg: &super::Config, n_pos: usize) -> (Rope, Option<Rope>) {
    let with = |(base, scale): (f32, f32)| {
        Rope::with_mscale(
            cfg.n_rot,
            n_pos,
            base,
            scale,
            cfg.rope_factors(n_pos),
            cfg.rope_neox,
            cfg.rope_attn_factor,
        )
    };
    let global = with((cfg.rope_base, cfg.rope_freq_scale));
    let swa = cfg
        .swa
        .as_ref()
        .map(|s| with((s.rope_base, s.rope_freq_scale)));
    (global, swa)
}

/// Precomputed cos/sin for positions `0..n_pos`, `n_rot / 2` pairs each.
pub struct Rope {
    pub half: usize,
    pub neox: bool,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    #[cfg(test)]
    pub fn new(
        n_rot: usize,
        n_pos: usize,
        base: f32,
        freq_scale: f32,
        freq_factors: Option<&[f32]>,
        neox: bool,
    ) -> Rope {
        Self::with_mscale(n_rot, n_pos, base, freq_scale, freq_factors, neox, 1.0)
    }

    /// [`Rope::new`] with cos and sin multiplied by `mscale`.
    pub fn with_mscale(
        n_rot: usize,
        n_pos: usize,
        base: f32,
        freq_scale: f32,
        freq_factors: Option<&[f32]>,
        neox: bool,
        mscale: f32,
    ) -> Rope {
        let half = n_rot / 2;
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let mut cos = vec![0f32; n_pos * half];
        let mut sin = vec![0f32; n_pos * half];
        for p in 0..n_pos {
            let mut theta = p as f32;
            for i in 0..half {
                let ff = freq_factors.map_or(1.0, |f| f[i]);
                let t = freq_scale * (theta / ff);
                cos[p * half + i] = t.cos() * mscale;
                sin[p * half + i] = t.sin() * mscale;
                theta *= theta_scale;
            }
        }
        Rope {
            half,
            neox,
            cos,
            sin,
        }
    }

    /// Rotate the first `2 * half` values of one head vector in place for position `pos`.
    #[inline]
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let h = self.half;
        let c = &self.cos[pos * h..pos * h + h];
        let s = &self.sin[pos * h..pos * h + h];
        if self.neox {
            let (a, b) = x[..2 * h].split_at_mut(h);
            for i in 0..h {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * c[i] - x1 * s[i];
                b[i] = x0 * s[i] + x1 * c[i];
            }
        } else {
            for i in 0..h {
                let (x0, x1) = (x[2 * i], x[2 * i + 1]);
                x[2 * i] = x0 * c[i] - x1 * s[i];
                x[2 * i + 1] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        for neox in [false, true] {
            let r = Rope::new(8, 16, 10000.0, 1.0, None, neox);
            let v: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
            let mut a = v.clone();
            r.apply(&mut a, 0);
            assert_eq!(a, v);
            let mut b = v.clone();
            r.apply(&mut b, 11);
            let n0: f32 = v.iter().map(|x| x * x).sum();
            let n1: f32 = b.iter().map(|x| x * x).sum();
            assert!((n0 - n1).abs() < 1e-3);
        }
    }

    #[test]
    fn partial_rotary_leaves_the_tail_and_matches_a_full_rotation_of_the_head() {
        // n_rot = 8 of a 12-value head: the first 8 rotate exactly as an 8-value head would.
        for neox in [false, true] {
            let part = Rope::new(8, 8, 500.0, 1.0, None, neox);
            let v: Vec<f32> = (0..12).map(|i| (i as f32 * 0.7).sin()).collect();
            let mut a = v.clone();
            part.apply(&mut a, 5);
            assert_eq!(a[8..], v[8..]);
            let mut b = v[..8].to_vec();
            Rope::new(8, 8, 500.0, 1.0, None, neox).apply(&mut b, 5);
            assert_eq!(a[..8], b[..]);
            assert_ne!(a[..8], v[..8]);
        }
        let m = Rope::with_mscale(8, 4, 500.0, 1.0, None, true, 2.0);
        let mut x = vec![1.0f32; 8];
        m.apply(&mut x, 0);
        assert_eq!(x, vec![2.0f32; 8]);
    }

    #[test]
    fn relative_position_property() {
        // <R(p) q, R(p') k> depends only on p - p'.
        let r = Rope::new(16, 64, 10000.0, 1.0, None, false);
        let q: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f32> = (0..16).map(|i| (i as f32 * 0.91).cos()).collect();
        let dot = |p: usize, pk: usize| {
            let (mut a, mut b) = (q.clone(), k.clone());
            r.apply(&mut a, p);
            r.apply(&mut b, pk);
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((dot(10, 3) - dot(20, 13)).abs() < 1e-3);
    }
}
