//! Quality against the reference: PPL, the PPL ratio, mean and p99 KLD and same-top-1, computed by
//! `eval` exactly as `tq eval` (and llama-perplexity) compute them, each judged by [`verdict`]
//! against its threshold. `--chunks auto` stops adding windows once every judged check is decided.

use super::{
    verdict, Bound, Check, Chunks, Limit, Num, Options, Quality, RefSource, Status, Thresholds,
};
use crate::error::{one_line, Result};
use crate::eval::backend::BackendReport;
use crate::eval::{evaluate_until, session, EvalResult};
use crate::gguf::GgufFile;
use crate::model::{Model, Numerics};

/// `--chunks auto` never stops before this many windows (a verdict on one window's tokens
/// would rest on errors that assume independent tokens more than a single text passage allows).
pub const MIN_AUTO_WINDOWS: usize = 2;

pub(super) struct QualityRun {
    pub quality: Quality,
    pub checks: Vec<Check>,
    pub tokens_blake3: String,
    pub backend: Option<BackendReport>,
}

/// The `backend/kld_vs_cpu` check: the kernel run's distributions against the CPU run's on the
/// same windows, held to the bound (both the mean and the largest token's KLD; a deterministic
/// comparison, so no noise interval).
/// `ppl` is the kernel run's PPL (the evaluation's own).
pub(super) fn backend_check(b: &BackendReport, ppl: f64) -> Check {
    let on = |m: &std::collections::BTreeMap<String, usize>| {
        m.iter()
            .map(|(t, n)| format!("{n} {t}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(c) = &b.comparison else {
        return Check::new(
            "backend",
            "kld_vs_cpu",
            Status::Skipped,
            format!(
                "{}: no weight of a type with a mat-mul kernel: everything ran on the CPU",
                b.backend
            ),
        );
    };
    let mut ch = Check::new(
        "backend",
        "kld_vs_cpu",
        if c.within_bound {
            Status::Pass
        } else {
            Status::Fail
        },
        format!(
            "{} on {}: {} weights through its kernels, {} on the CPU; KLD(cpu||{}) mean {:.3e}, max {:.3e} (bound: mean <= {:.0e}, max <= {:.0e}), max |dlogit| {:.2e}, same top-1 {:.2}%, PPL {:.4} vs {:.4} on the CPU",
            b.backend,
            one_line(&b.device),
            if b.on_backend.is_empty() { "no".to_string() } else { on(&b.on_backend) },
            if b.on_cpu.is_empty() { "none".to_string() } else { on(&b.on_cpu) },
            b.backend,
            c.kld.value,
            c.kld_max,
            c.bound.mean,
            c.bound.max,
            c.max_abs_logit_diff,
            100.0 * c.same_top,
            ppl,
            c.ppl_cpu.value
        ),
    );
    ch.value = Some(Num {
        value: c.kld.value,
        err: c.kld.err,
    });
    ch.limit = Some(Limit {
        bound: Bound::Max,
        value: c.bound.mean,
    });
    ch
}

/// The quality checks of a (partial) result under `t`.
pub(super) fn judge(r: &EvalResult, t: &Thresholds) -> Vec<Check> {
    let Some(k) = &r.kld else {
        return vec![Check::new(
            "quality",
            "ppl",
            Status::Skipped,
            format!(
                "PPL {:.4} ± {:.4}; no reference: nothing to compare with",
                r.ppl.value, r.ppl.err
            ),
        )];
    };
    let one = |name: &str, flag: &str, v: Num, limit: Option<f64>, bound: Bound| {
        let mut c = match limit {
            None => Check::new(
                "quality",
                name,
                Status::Skipped,
                format!("no threshold ({flag})"),
            ),
            Some(l) => {
                let lim = Limit { bound, value: l };
                let s = verdict(v.value, v.err, lim);
                let mut c = Check::new("quality", name, s, "");
                c.limit = Some(lim);
                c
            }
        };
        c.value = Some(v);
        c
    };
    vec![
        one(
            "ppl_ratio",
            "--max-ppl-ratio",
            Num {
                value: k.ppl_ratio.value,
                err: k.ppl_ratio.err,
            },
            t.max_ppl_ratio,
            Bound::Max,
        ),
        one(
            "kld",
            "--max-kld",
            Num {
                value: k.kld.value,
                err: k.kld.err,
            },
            t.max_kld,
            Bound::Max,
        ),
        one(
            "kld_p99",
            "--max-p99-kld",
            Num {
                value: k.kld_p99,
                err: k.kld_p99_err,
            },
            t.max_p99_kld,
            Bound::Max,
        ),
        one(
            "top1",
            "--min-top1",
            Num {
                value: 100.0 * k.same_top.value,
                err: 100.0 * k.same_top.err,
            },
            t.min_top1,
            Bound::Min,
        ),
    ]
}

pub(super) fn run(o: &Options, file: &GgufFile, ref_file: Option<&GgufFile>) -> Result<QualityRun> {
    let mut model = Model::new(file, Numerics::Ggml)?;
    if let Some(b) = o.backend {
        model.use_backend(b)?;
    }
    let ref_model = match ref_file {
        Some(f) => Some(Model::new(f, Numerics::Ggml)?),
        None => None,
    };
    let ref_logits = match o.reference {
        RefSource::Logits(p) => Some(p),
        _ => None,
    };
    let limit = match o.chunks {
        Chunks::All => None,
        Chunks::Fixed(n) | Chunks::Auto { max: n } => Some(n),
    };
    let (win, reference) = session::windows_and_reference(
        file,
        o.input,
        o.ctx,
        limit,
        ref_logits,
        ref_model.as_ref(),
    )?;
    let batch = o.batch.unwrap_or_else(|| {
        let b = session::default_batch(
            &win,
            model.cfg.n_vocab,
            ref_model.is_some() || o.backend.is_some(),
        );
        // auto decides after every batch: small batches let it stop sooner.
        match o.chunks {
            Chunks::Auto { .. } => b.min(MIN_AUTO_WINDOWS),
            _ => b,
        }
    });
    let t = o.thresholds;
    let decided = |r: &EvalResult| {
        r.n_chunk >= MIN_AUTO_WINDOWS
            && judge(r, &t)
                .iter()
                .all(|c| matches!(c.status, Status::Pass | Status::Fail | Status::Skipped))
    };
    let stop: Option<&dyn Fn(&EvalResult) -> bool> = match o.chunks {
        Chunks::Auto { .. } => Some(&decided),
        _ => None,
    };
    let r = evaluate_until(&model, &win, reference, None, batch, o.progress, stop)?;
    let mut h = blake3::Hasher::new();
    for tok in &win.tokens {
        h.update(&tok.to_le_bytes());
    }
    let k = r.kld.as_ref();
    let quality = Quality {
        windows: r.n_chunk,
        windows_available: win.n_chunk,
        tokens_scored: r.tokens_scored,
        ppl: Num {
            value: r.ppl.value,
            err: r.ppl.err,
        },
        ppl_ref: k.map(|k| Num {
            value: k.ppl_base.value,
            err: k.ppl_base.err,
        }),
        ppl_ratio: k.map(|k| Num {
            value: k.ppl_ratio.value,
            err: k.ppl_ratio.err,
        }),
        kld: k.map(|k| Num {
            value: k.kld.value,
            err: k.kld.err,
        }),
        kld_p99: k.map(|k| Num {
            value: k.kld_p99,
            err: k.kld_p99_err,
        }),
        kld_max: k.map(|k| k.kld_max),
        top1: k.map(|k| Num {
            value: 100.0 * k.same_top.value,
            err: 100.0 * k.same_top.err,
        }),
        seconds: r.seconds,
    };
    let mut checks = judge(&r, &t);
    if let Some(b) = &r.backend {
        checks.push(backend_check(b, r.ppl.value));
    }
    Ok(QualityRun {
        checks,
        quality,
        tokens_blake3: h.finalize().to_hex().to_string(),
        backend: r.backend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::backend::{Comparison, KldBound};
    use crate::eval::kld::Est;

    fn report(kld: f64, kld_max: f64) -> BackendReport {
        let bound = KldBound::GGML;
        BackendReport {
            backend: "wgpu".into(),
            device: "test".into(),
            resident_bytes: 1,
            on_backend: [("tq4_1s".to_string(), 2)].into(),
            on_cpu: [("q8_0".to_string(), 1)].into(),
            backend_tensors: vec!["a".into(), "b".into()],
            cpu_tensors: vec!["output.weight".into()],
            comparison: Some(Comparison {
                tokens: 10,
                ppl_cpu: Est {
                    value: 10.0,
                    err: 1.0,
                },
                kld: Est {
                    value: kld,
                    err: kld / 10.0,
                },
                kld_max,
                max_abs_logit_diff: 0.1,
                same_top: 1.0,
                bound,
                within_bound: kld <= bound.mean && kld_max <= bound.max,
                seconds_backend: 1.0,
                seconds_cpu: 1.0,
            }),
        }
    }

    /// Pass inside the bound, fail beyond it (the mean or one token), skipped without a comparison;
    /// the value and limit carry the numbers into the JSON and JUnit reports.
    #[test]
    fn backend_check_follows_the_bound() {
        let c = backend_check(&report(1e-5, 1e-3), 10.0);
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert_eq!(c.limit.unwrap().value, KldBound::GGML.mean);
        assert_eq!(c.value.unwrap().value, 1e-5);
        assert!(c.detail.contains("2 tq4_1s") && c.detail.contains("1 q8_0 on the CPU"));
        assert_eq!(
            backend_check(&report(1e-3, 1e-3), 10.0).status,
            Status::Fail
        );
        assert_eq!(backend_check(&report(1e-5, 0.5), 10.0).status, Status::Fail);
        let mut none = report(0.0, 0.0);
        none.comparison = None;
        assert_eq!(backend_check(&none, 10.0).status, Status::Skipped);
    }
}
