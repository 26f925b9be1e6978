//! Data-free calibration windows (`tq calib --self-generate N`): sample N windows of `ctx` tokens
//! from the model itself.
//!
//! Every window starts with BOS; the other `ctx − 1` tokens are sampled at temperature 1 from the
//! `top_k` most likely tokens (nothing is banned: an EOS is followed by whatever the model
//! predicts next). All N windows advance together, one position per step, through the KV-cached
//! [`Decoder`], so the cost is `ctx − 1` batched steps, each one pass over the weights (kept
//! dequantized within `--gen-cache-mib`).
//!
//! Randomness: SplitMix64 (Steele, Lea & Flood 2014). A generator seeded with `--seed` hands out
//! one seed per window, in window order; window w's generator draws one uniform per token,
//! `u = (next_u64 >> 11) / 2^53`. The top-k tokens are ordered by logit (descending, ties by id)
//! and `u · Σ p` is located in their cumulative `p = exp(logit − max)` (f64). Windows never share
//! a generator, so the tokens depend only on the model, N, ctx, the seed and k — not on the
//! thread count.

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::decode::Decoder;
use crate::model::runtime::{Model, Numerics};
use rayon::prelude::*;
use std::path::Path;

pub use crate::math::splitmix::SplitMix64;

/// Sample one id from `logits` (all finite) at temperature 1 among the `k` largest.
pub fn sample_top_k(logits: &[f32], k: usize, rng: &mut SplitMix64) -> u32 {
    let n = logits.len();
    let k = k.clamp(1, n);
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut idx: Vec<u32> = (0..n as u32).collect();
    if k < n {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    let top = logits[idx[0] as usize] as f64;
    let p: Vec<f64> = idx
        .iter()
        .map(|&i| (logits[i as usize] as f64 - top).exp())
        .collect();
    let u = rng.next_f64() * p.iter().sum::<f64>();
    let mut acc = 0f64;
    for (j, pj) in p.iter().enumerate() {
        acc += pj;
        if u < acc {
            return idx[j];
        }
    }
    idx[k - 1]
}

pub struct GenOptions {
    pub windows: usize,
    pub ctx: usize,
    pub bos: u32,
    pub seed: u64,
    pub top_k: usize,
    /// Dequantized weights kept between steps (bytes).
    pub cache_bytes: usize,
    pub quiet: bool,
}

/// What a generation cost.
pub struct GenStats {
    pub secs: f64,
    /// Tokens sampled (`windows × (ctx − 1)`).
    pub sampled: usize,
    pub cached_blocks: usize,
    pub output_cached: bool,
}

/// Sample `o.windows` windows of `o.ctx` tokens (window-major, BOS first in each).
pub fn generate(model: &Model, o: &GenOptions) -> Result<(Vec<u32>, GenStats)> {
    let t0 = std::time::Instant::now();
    if o.windows == 0 || o.ctx < 2 {
        return Err(Error::Usage(
            "--self-generate needs N >= 1 windows of --ctx >= 2".into(),
        ));
    }
    let nv = model.cfg.n_vocab;
    if o.bos as usize >= nv {
        return Err(Error::bad_input(
            &model.file.path,
            format!("BOS id {} is outside the vocabulary of {nv}", o.bos),
        ));
    }
    let dec = Decoder::new(model, o.ctx, o.cache_bytes)?;
    let (cached_blocks, output_cached) = dec.cached();
    let mut seeds = SplitMix64::new(o.seed);
    let mut rngs: Vec<SplitMix64> = (0..o.windows)
        .map(|_| SplitMix64::new(seeds.next_u64()))
        .collect();
    let mut st = dec.state(o.windows);
    let ctx = o.ctx;
    let mut out = vec![0u32; o.windows * ctx];
    for w in 0..o.windows {
        out[w * ctx] = o.bos;
    }
    let mut next_report = 0.1;
    for p in 0..ctx - 1 {
        let cur: Vec<u32> = (0..o.windows).map(|w| out[w * ctx + p]).collect();
        let logits = dec.step(&mut st, &cur)?;
        if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
            return Err(Error::Unsupported(format!(
                "{}: non-finite logit while sampling window {} at position {p}",
                model.file.path.display(),
                i / nv
            )));
        }
        let next: Vec<u32> = logits
            .par_chunks(nv)
            .zip(rngs.par_iter_mut())
            .map(|(l, r)| sample_top_k(l, o.top_k, r))
            .collect();
        for (w, t) in next.into_iter().enumerate() {
            out[w * ctx + p + 1] = t;
        }
        let done = (p + 1) as f64 / (ctx - 1) as f64;
        if !o.quiet && done >= next_report && p + 2 < ctx {
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "tq calib: self-generate {:.0}%: {} tokens in {secs:.1} s ({:.1} tokens/s)",
                done * 100.0,
                (p + 1) * o.windows,
                ((p + 1) * o.windows) as f64 / secs
            );
            next_report += 0.1;
        }
    }
    Ok((
        out,
        GenStats {
            secs: t0.elapsed().as_secs_f64(),
            sampled: o.windows * (ctx - 1),
            cached_blocks,
            output_cached,
        },
    ))
}

/// `tq calib --self-generate N`: what to sample and where to save it.
pub struct SelfGenerate<'a> {
    pub windows: usize,
    pub ctx: usize,
    pub seed: u64,
    pub top_k: usize,
    /// MiB of dequantized weights kept between decoding steps.
    pub cache_mib: usize,
    /// Also write the sampled tokens here (one window per line, readable as a token file).
    pub save_tokens: Option<&'a Path>,
    /// No progress or rate lines.
    pub quiet: bool,
}

/// Sample calibration windows from the model at `path` (opened as `f`, run with f32 numerics),
/// starting each from the vocabulary's BOS; reports the rate on stderr.
pub fn self_generate(path: &Path, f: &GgufFile, o: &SelfGenerate) -> Result<Vec<u32>> {
    let bos = f.get_u64("tokenizer.ggml.bos_token_id").ok_or_else(|| {
        Error::bad_input(
            path,
            "no tokenizer.ggml.bos_token_id: --self-generate starts every window from BOS",
        )
    })?;
    if o.windows == 0 || o.top_k == 0 {
        return Err(Error::Usage(
            "tq calib: --self-generate N and --top-k must be >= 1".into(),
        ));
    }
    let model = Model::new(f, Numerics::F32)?;
    let (toks, st) = generate(
        &model,
        &GenOptions {
            windows: o.windows,
            ctx: o.ctx,
            bos: u32::try_from(bos).unwrap_or(u32::MAX),
            seed: o.seed,
            top_k: o.top_k,
            cache_bytes: o.cache_mib.saturating_mul(1 << 20),
            quiet: o.quiet,
        },
    )?;
    if !o.quiet {
        eprintln!(
        "tq calib: self-generated {} windows x {} tokens ({} sampled) in {:.1} s: {:.1} tokens/s ({} of {} blocks{} kept dequantized)",
        o.windows,
        o.ctx,
        st.sampled,
        st.secs,
        st.sampled as f64 / st.secs.max(1e-9),
        st.cached_blocks,
        model.cfg.n_layer,
        if st.output_cached { " and the output" } else { "" }
    );
    }
    if let Some(p) = o.save_tokens {
        let text: Vec<String> = toks
            .chunks(o.ctx)
            .map(|w| {
                w.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        crate::io::write_file(p, (text.join("\n") + "\n").as_bytes())?;
    }
    Ok(toks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // First outputs for seed 0 (the published SplitMix64 reference sequence).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn top_k_sampling_follows_the_softmax_of_the_top_k() {
        let logits = [0.0f32, 2.0, (3f32).ln(), -1.0, 1.0, (2f32).ln() + 5.0, 5.0];
        // k = 1: the argmax, always.
        let mut r = SplitMix64::new(3);
        for _ in 0..20 {
            assert_eq!(sample_top_k(&logits, 1, &mut r), 5);
        }
        // k = 3: ids 5, 6, 1 with weights 2e5 : e5 : e2.
        let (n, mut counts) = (200_000, [0usize; 7]);
        for _ in 0..n {
            counts[sample_top_k(&logits, 3, &mut r) as usize] += 1;
        }
        let z = 2.0 * 5f64.exp() + 5f64.exp() + 2f64.exp();
        for (id, want) in [
            (5, 2.0 * 5f64.exp() / z),
            (6, 5f64.exp() / z),
            (1, 2f64.exp() / z),
        ] {
            let got = counts[id] as f64 / n as f64;
            assert!((got - want).abs() < 0.005, "id {id}: {got} vs {want}");
        }
        assert_eq!(counts[0] + counts[2] + counts[3] + counts[4], 0);
        // Same seed, same draws.
        let draw = |seed| {
            let mut r = SplitMix64::new(seed);
            (0..50)
                .map(|_| sample_top_k(&logits, 7, &mut r))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(11), draw(11));
        assert_ne!(draw(11), draw(12));
    }
}
