//! Incremental decoding with a KV cache, for sampling from a model (`tq calib --self-generate`).
//!
//! `B` independent sequences advance one position per [`Decoder::step`]; every block's K and V
//! are kept for all positions so far. Weights are dequantized once and kept — blocks in order,
//! then the output projection — while they fit in a memory budget; what does not fit is
//! dequantized again at every step (correct, just slower); a mixture-of-experts block's experts
//! are dequantized at every step, one at a time, as in the forward pass. Exact f32 numerics, the
//! same graph as [`Model::forward`] with [`Numerics::F32`] for every architecture it runs (tested
//! against it, position by position, on each).

use super::block::post_norm;
use super::layer::{glu_rows, rms_norm, rms_norm_rows, LayerWeights};
use super::matmul::matmul_t;
use super::rope::Rope;
use super::runtime::{Model, Numerics};
use crate::error::{Error, Result};
use rayon::prelude::*;

pub struct Decoder<'m, 'a> {
    model: &'m Model<'a>,
    blocks: Vec<Option<LayerWeights>>,
    output: Option<Vec<f32>>,
    rope: Rope,
    /// Sliding-window layers' RoPE (Gemma), when they have their own.
    rope_swa: Option<Rope>,
    max_pos: usize,
}

/// The K/V cache of a batch of sequences: per block, `batch × max_pos × kv_dim` for K and V.
pub struct KvState {
    batch: usize,
    pos: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvState {
    /// Positions decoded so far.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

/// Dot product with 8 independent partial sums (vectorizes; a single running sum does not).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn layer_bytes(lw: &LayerWeights) -> usize {
    4 * (lw.attn_norm.len()
        + lw.ffn_norm.len()
        + lw.qkv.w.len()
        + lw.wo.w.len()
        + lw.gate_up.w.len()
        + lw.down.w.len()
        + lw.q_norm.as_ref().map_or(0, |v| v.len())
        + lw.k_norm.as_ref().map_or(0, |v| v.len())
        + lw.router.as_ref().map_or(0, |r| r.w.len()))
}

impl<'m, 'a> Decoder<'m, 'a> {
    /// A decoder for up to `max_pos` positions, caching dequantized weights up to `cache_bytes`.
    pub fn new(model: &'m Model<'a>, max_pos: usize, cache_bytes: usize) -> Result<Self> {
        if model.numerics != Numerics::F32 || !model.kv.is_default() {
            // Its callers (greedy generation, self-generated calibration) open the model so.
            return Err(Error::internal(
                "the incremental decoder runs exact f32 numerics with an unquantized cache only",
            ));
        }
        let cfg = &model.cfg;
        let mut used = 0usize;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        let mut full = false;
        for l in 0..cfg.n_layer {
            if !full {
                let lw = LayerWeights::load(model.file, cfg, l)?;
                let b = layer_bytes(&lw);
                if used + b <= cache_bytes {
                    used += b;
                    blocks.push(Some(lw));
                    continue;
                }
                full = true;
            }
            blocks.push(None);
        }
        let out_bytes = 4 * cfg.n_vocab * cfg.n_embd;
        let output = if blocks.iter().all(Option::is_some) && used + out_bytes <= cache_bytes {
            let t = model
                .file
                .tensor(model.output_tensor())
                .expect("checked by Config");
            let mut w = vec![0f32; cfg.n_vocab * cfg.n_embd];
            super::layer::dequantize_rows(model.file, t, 0, cfg.n_vocab, &mut w)?;
            Some(w)
        } else {
            None
        };
        // As the forward pass: LongRoPE factors chosen for the longest sequence decoded.
        let (rope, rope_swa) = super::rope::model_ropes(cfg, max_pos);
        Ok(Decoder {
            model,
            blocks,
            output,
            rope,
            rope_swa,
            max_pos,
        })
    }

    /// Blocks whose weights are kept dequantized, and whether the output projection is.
    pub fn cached(&self) -> (usize, bool) {
        (
            self.blocks.iter().filter(|b| b.is_some()).count(),
            self.output.is_some(),
        )
    }

    /// An empty cache for `batch` sequences (`n_layer × 2 × batch × max_pos × kv_dim` f32).
    pub fn state(&self, batch: usize) -> KvState {
        let cfg = &self.model.cfg;
        let n = batch * self.max_pos * cfg.n_head_kv * cfg.head_dim;
        KvState {
            batch,
            pos: 0,
            k: (0..cfg.n_layer).map(|_| vec![0f32; n]).collect(),
            v: (0..cfg.n_layer).map(|_| vec![0f32; n]).collect(),
        }
    }

    /// Feed one token per sequence at position `st.pos()`; returns the logits of that position
    /// for every sequence (`batch × n_vocab`).
    pub fn step(&self, st: &mut KvState, tokens: &[u32]) -> Result<Vec<f32>> {
        let m = self.model;
        let cfg = &m.cfg;
        let b = st.batch;
        assert_eq!(tokens.len(), b, "one token per sequence");
        if st.pos >= self.max_pos {
            return Err(Error::internal(format!(
                "decoder: all {} positions are used",
                self.max_pos
            )));
        }
        let pos = st.pos;
        let (e, hd, nh) = (cfg.n_embd, cfg.head_dim, cfg.n_head);
        let (qd, kvd) = (nh * hd, cfg.n_head_kv * hd);
        let ld = qd + 2 * kvd;
        let group = nh / cfg.n_head_kv;
        let (mp, threads) = (self.max_pos, m.threads());
        let nff = cfg.n_ff.max(cfg.moe.as_ref().map_or(0, |x| x.n_ff_exp));
        let mut x = m.embed(tokens)?;
        let mut h = vec![0f32; b * e];
        let mut qkv = vec![0f32; b * ld];
        let mut att = vec![0f32; b * qd];
        let mut gu = vec![0f32; b * 2 * nff];
        let mut act = vec![0f32; b * nff];
        let mut tmp = vec![0f32; b * e];
        for l in 0..cfg.n_layer {
            let loaded;
            let lw = match &self.blocks[l] {
                Some(w) => w,
                None => {
                    loaded = LayerWeights::load(m.file, cfg, l)?;
                    &loaded
                }
            };
            let window = cfg.window_of(l);
            let rope = match (&self.rope_swa, window) {
                (Some(r), Some(_)) => r,
                _ => &self.rope,
            };
            rms_norm_rows(&x, &lw.attn_norm, cfg.rms_eps, e, &mut h);
            lw.qkv.forward(&h, b, &mut qkv, false, threads);
            let (kc, vc) = (&mut st.k[l], &mut st.v[l]);
            for r in 0..b {
                let (q, kvr) = qkv[r * ld..(r + 1) * ld].split_at_mut(qd);
                for qh in q.chunks_mut(hd) {
                    if let Some(nw) = &lw.q_norm {
                        let c = qh.to_vec();
                        rms_norm(&c, nw, cfg.rms_eps, qh);
                    }
                    rope.apply(qh, pos);
                    if let Some(sc) = cfg.q_scale {
                        qh.iter_mut().for_each(|v| *v *= sc);
                    }
                }
                let (k, v) = kvr.split_at_mut(kvd);
                for kh in k.chunks_mut(hd) {
                    if let Some(nw) = &lw.k_norm {
                        let c = kh.to_vec();
                        rms_norm(&c, nw, cfg.rms_eps, kh);
                    }
                    rope.apply(kh, pos);
                }
                let at = (r * mp + pos) * kvd;
                kc[at..at + kvd].copy_from_slice(k);
                vc[at..at + kvd].copy_from_slice(v);
            }
            let (kc, vc) = (&st.k[l], &st.v[l]);
            att.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
                let (r, head) = (i / nh, i % nh);
                let kh = head / group;
                let q = &qkv[r * ld + head * hd..r * ld + (head + 1) * hd];
                let key = |t: usize| (r * mp + t) * kvd + kh * hd;
                // Sliding window: keys pos - window < t <= pos.
                let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let mut sc: Vec<f32> = (lo..=pos)
                    .map(|t| {
                        let x = dot(q, &kc[key(t)..key(t) + hd]) * cfg.kq_scale;
                        match cfg.attn_softcap {
                            Some(c) => (x * (1.0 / c)).tanh() * c,
                            None => x,
                        }
                    })
                    .collect();
                let mx = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for s in sc.iter_mut() {
                    *s = (*s - mx).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                o.fill(0.0);
                for (i, s) in sc.iter().enumerate() {
                    let (t, p) = (lo + i, s * inv);
                    for (oi, vi) in o.iter_mut().zip(&vc[key(t)..key(t) + hd]) {
                        *oi += p * vi;
                    }
                }
            });
            lw.wo.forward(&att, b, &mut tmp, false, threads);
            post_norm(&lw.attn_post_norm, &mut tmp, cfg.rms_eps, e);
            x.iter_mut().zip(&tmp).for_each(|(a, t)| *a += t);
            rms_norm_rows(&x, &lw.ffn_norm, cfg.rms_eps, e, &mut h);
            if let (Some(router), Some(moe)) = (&lw.router, &cfg.moe) {
                m.moe_ffn(l, moe, router, None, &h, b, &mut tmp, None)?;
            } else {
                let nff = lw.gate_up.n_total / 2;
                lw.gate_up.forward(&h, b, &mut gu, false, threads);
                glu_rows(&gu, &mut act[..b * nff], nff, cfg.gelu, false);
                lw.down
                    .forward(&act[..b * nff], b, &mut tmp, false, threads);
                post_norm(&lw.ffn_post_norm, &mut tmp, cfg.rms_eps, e);
            }
            x.iter_mut().zip(&tmp).for_each(|(a, t)| *a += t);
        }
        st.pos += 1;
        let mut hn = vec![0f32; b * e];
        rms_norm_rows(&x, m.output_norm(), cfg.rms_eps, e, &mut hn);
        match &self.output {
            Some(w) => {
                let nv = cfg.n_vocab;
                let mut logits = vec![0f32; b * nv];
                matmul_t(&hn, b, e, w, nv, &mut logits, nv, threads);
                m.softcap_logits(&mut logits);
                Ok(logits)
            }
            None => m.project(&hn, b, threads),
        }
    }
}
