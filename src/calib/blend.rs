//! `tq calib blend`: a Hessian file whose diagonal is the calibration's own and whose
//! correlations are a weighted average of the calibration's and a prior's (another Hessian file
//! of the same model, e.g. `tq calib --self-generate`: data-free).
//!
//! Per group, with `d = diag(H)`, `p = diag(P)` and weight `a`:
//! `B_ii = H_ii` and `B_ij = (1 − a)·H_ij + a·P_ij·√(d_i d_j)/√(p_i p_j)` for `i ≠ j`, i.e. the
//! correlation matrix `(1 − a)·corr(H) + a·corr(P)` rescaled to `H`'s diagonal (where `p_i` or
//! `d_i` is not positive the entry stays `H_ij`). The diagonal, all that an importance matrix
//! (llama.cpp's imatrix) takes from the calibration, is untouched; only what LDLQ's error feedback
//! exploits, the correlations between inputs, is averaged. Why: the correlations of a few
//! thousand tokens of one text do not carry over to another text (docs/bench/presets.md: on
//! SmolLM2, Botchan's correlations under wikitext's diagonal are worse for held-out wikitext than
//! the diagonal alone, wikitext's own under Botchan's diagonal far better), and an average of two
//! unrelated sources overfits either less. `a = 0` copies `H`.

use crate::error::{Error, Result};
use crate::quant::{Hessian, HessianFile, HessianWriter, WriteMode};
use std::collections::BTreeMap;
use std::path::Path;

/// The blended matrix of one group (module comment): `h` and `p` are `n × n`, row-major.
pub(crate) fn blend_matrix(h: &[f64], p: &[f64], n: usize, a: f64) -> Vec<f64> {
    assert_eq!((h.len(), p.len()), (n * n, n * n));
    let mut out = h.to_vec();
    if a == 0.0 {
        return out;
    }
    let sd: Vec<f64> = (0..n).map(|i| h[i * n + i].max(0.0).sqrt()).collect();
    let sp: Vec<f64> = (0..n).map(|i| p[i * n + i].max(0.0).sqrt()).collect();
    for i in 0..n {
        for j in 0..n {
            let q = sp[i] * sp[j];
            if i == j || q <= 0.0 || sd[i] * sd[j] <= 0.0 {
                continue;
            }
            out[i * n + j] = (1.0 - a) * h[i * n + j] + a * (p[i * n + j] / q) * (sd[i] * sd[j]);
        }
    }
    out
}

/// What [`blend`] wrote.
#[derive(Debug)]
pub struct Blended {
    pub groups: usize,
}

/// The model part (file name and length) of a calibration fingerprint `name:len:tokens:ctx`.
fn model_of(meta: &BTreeMap<String, String>) -> Option<String> {
    let fp = meta.get("tq.fingerprint")?;
    let mut it = fp.split(':');
    Some(format!("{}:{}", it.next()?, it.next()?))
}

/// Blend the Hessian file `h` with the prior `prior` at weight `a` (0..=1) into `out`, written
/// group by group in `h`'s order and store (memory: three matrices). Both must be complete
/// calibrations of the same model with the same groups; `out` keeps `h`'s metadata and token
/// counts, plus `tq.prior` (the prior's source) and `tq.prior_weight`.
pub fn blend(h: &Path, prior: &Path, a: f64, out: &Path) -> Result<Blended> {
    if !(0.0..=1.0).contains(&a) {
        return Err(Error::Usage(format!(
            "tq calib blend: --weight {a} must be between 0 and 1 (the prior's share of the correlations, e.g. 0.5)"
        )));
    }
    let (fh, mh) = HessianFile::open(h)?;
    let (fp, mp) = HessianFile::open(prior)?;
    for (p, m) in [(h, &mh), (prior, &mp)] {
        if m.get("tq.complete").map(String::as_str) == Some("false") {
            return Err(Error::bad_input(
                p,
                "an interrupted calibration; finish it with the same tq calib command plus --resume",
            ));
        }
    }
    if let (Some(x), Some(y)) = (model_of(&mh), model_of(&mp)) {
        if x != y {
            return Err(Error::bad_input(
                prior,
                format!(
                    "calibrated on model {y}, the Hessians on {x}: give a prior of the same model"
                ),
            ));
        }
    }
    let a_groups: Vec<_> = fh.index.groups.iter().map(|(k, g)| (k, g.n)).collect();
    let b_groups: Vec<_> = fp.index.groups.iter().map(|(k, g)| (k, g.n)).collect();
    if a_groups != b_groups {
        return Err(Error::bad_input(
            prior,
            format!(
                "holds other Hessian groups than {} (another model or a sharded file?)",
                h.display()
            ),
        ));
    }
    let mut meta = mh.clone();
    let src = mp
        .get("tq.source")
        .cloned()
        .unwrap_or_else(|| prior.display().to_string());
    meta.insert("tq.prior".into(), src);
    meta.insert("tq.prior_weight".into(), a.to_string());
    let store = fh
        .order
        .first()
        .and_then(|k| fh.store(k))
        .unwrap_or_default();
    let index: Vec<Hessian> = fh
        .order
        .iter()
        .map(|k| fh.index.groups[k].clone())
        .collect();
    let refs: Vec<&Hessian> = index.iter().collect();
    let mut w = HessianWriter::create(out, &refs, &meta, store, WriteMode::Once)?;
    for g in &index {
        let key = g.tensors.join(",");
        let x = fh.load_group(&key)?;
        let y = fp.load_group(&key)?;
        w.write(&Hessian {
            h: blend_matrix(&x.h, &y.h, g.n, a),
            ..g.clone()
        })?;
    }
    w.finish()?;
    Ok(Blended {
        groups: index.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{Hessians, Store};

    fn file(dir: &Path, name: &str, seed: usize, cols: usize, fp: &str) -> std::path::PathBuf {
        let rows = 24;
        let x: Vec<f32> = (0..rows * cols)
            .map(|j| (((j * 7 + seed * 131) * 7919) % 211) as f32 / 37.0 - 2.5)
            .collect();
        let mut hs = Hessians::default();
        hs.accumulate(&["a.weight", "b.weight"], &x, rows, cols);
        let meta = BTreeMap::from([
            ("tq.complete".to_string(), "true".to_string()),
            ("tq.fingerprint".to_string(), fp.to_string()),
            ("tq.source".to_string(), format!("{name}.txt")),
        ]);
        let p = dir.join(format!("{name}.safetensors"));
        hs.save(&p, &meta, Store::F64).unwrap();
        p
    }

    /// The blend keeps H's diagonal and token count, averages the correlations (checked against
    /// the correlation matrices computed here), copies H at weight 0, and refuses a prior of
    /// another shape or model and a weight outside [0, 1].
    #[test]
    fn blend_keeps_the_diagonal_and_averages_correlations() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (h, p) = (
            file(d, "h", 1, 12, "m.gguf:100:aa:512"),
            file(d, "p", 2, 12, "m.gguf:100:bb:512"),
        );
        let out = d.join("b.safetensors");
        assert_eq!(blend(&h, &p, 0.25, &out).unwrap().groups, 1);
        let (hh, _) = Hessians::load(&h).unwrap();
        let (pp, _) = Hessians::load(&p).unwrap();
        let (bb, meta) = Hessians::load(&out).unwrap();
        let (x, y, z) = (
            hh.for_tensor("a.weight").unwrap(),
            pp.for_tensor("b.weight").unwrap(),
            bb.for_tensor("a.weight").unwrap(),
        );
        let n = 12;
        assert_eq!(z.tokens, x.tokens);
        assert_eq!(meta["tq.prior"], "p.txt");
        assert_eq!(meta["tq.prior_weight"], "0.25");
        let corr =
            |m: &[f64], i: usize, j: usize| m[i * n + j] / (m[i * n + i] * m[j * n + j]).sqrt();
        let mut moved = 0;
        for i in 0..n {
            assert_eq!(z.h[i * n + i], x.h[i * n + i]);
            for j in 0..n {
                let want = 0.75 * corr(&x.h, i, j) + 0.25 * corr(&y.h, i, j);
                let got = corr(&z.h, i, j);
                assert!((got - want).abs() < 1e-12, "({i}, {j}): {got} vs {want}");
                moved += (z.h[i * n + j] != x.h[i * n + j]) as usize;
            }
        }
        assert!(
            moved > n * (n - 1) / 2,
            "the off-diagonal entries moved: {moved}"
        );

        let zero = d.join("zero.safetensors");
        blend(&h, &p, 0.0, &zero).unwrap();
        assert_eq!(
            Hessians::load(&zero).unwrap().0.groups["a.weight,b.weight"].h,
            x.h
        );

        let other = file(d, "o", 3, 10, "m.gguf:100:cc:512");
        let e = blend(&h, &other, 0.5, &out).unwrap_err().to_string();
        assert!(
            e.contains("o.safetensors") && e.contains("other Hessian groups"),
            "{e}"
        );
        let model = file(d, "q", 3, 12, "n.gguf:7:cc:512");
        let e = blend(&h, &model, 0.5, &out).unwrap_err().to_string();
        assert!(
            e.contains("q.safetensors") && e.contains("same model"),
            "{e}"
        );
        let e = blend(&h, &p, 1.5, &out).unwrap_err().to_string();
        assert!(e.contains("--weight 1.5"), "{e}");
    }
}
