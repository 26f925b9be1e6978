//! `tq codebook` as one call ([`run`]): the flags as plain values ([`CodebookFlags`]), every
//! flag combination checked (one rule, one message), then one table fitted per head dim and bit
//! width ([`fit`]) or a given table scored ([`evaluate_table`]), rendered in `--format`, and
//! written to `--out` or handed back to print.

use super::{
    dedup_keep_order, evaluate_table, fit, is_identifier, load_samples, parse_table, render,
    FORMATS, MAX_BETA_DIM,
};
use crate::error::{Error, Result};
use crate::math::lloyd_max::Dist;
use std::path::PathBuf;

/// The flags of `tq codebook` as plain values (the CLI fills this in; nothing is checked yet).
#[derive(Clone, Debug, Default)]
pub struct CodebookFlags {
    pub head_dim: Vec<usize>,
    pub bits: Vec<u32>,
    /// `--dist DIST [FILE]`: one or two values.
    pub dist: Vec<String>,
    pub samples: Option<PathBuf>,
    pub format: String,
    pub out: Option<PathBuf>,
    pub name: String,
    pub evaluate: Option<String>,
    pub units: String,
}

/// Run `tq codebook`: the text is written to `--out` (then `None` comes back), or returned to be
/// printed.
// Long because it checks every flag combination (one block per rule, each with its own
// message) before the work, which is `fit` / `evaluate_table`.
pub fn run(a: CodebookFlags) -> Result<Option<String>> {
    crate::io::check_outputs(&[("--out", a.out.as_deref())], &[a.samples.as_deref()])?;
    if !FORMATS.contains(&a.format.as_str()) {
        return Err(Error::Usage(format!(
            "tq codebook: unknown --format {:?} (expected one of {})",
            a.format,
            FORMATS.join(", ")
        )));
    }
    if !is_identifier(&a.name) {
        return Err(Error::Usage(format!(
            "tq codebook: --name {:?} is not a valid identifier",
            a.name
        )));
    }
    let mut a = a;
    if let [d, file] = a.dist.as_slice() {
        if d != "empirical" {
            return Err(Error::Usage(format!(
                "tq codebook: --dist {d} takes no file (only --dist empirical FILE does)"
            )));
        }
        if a.samples.is_some() {
            return Err(Error::Usage(
                "tq codebook: give the sample file once (--dist empirical FILE or --samples FILE)"
                    .into(),
            ));
        }
        a.samples = Some(PathBuf::from(file));
        a.dist.truncate(1);
    }
    let dist_name = match (a.dist.first(), &a.samples) {
        (Some(d), _) => d.clone(),
        (None, Some(_)) => "empirical".into(),
        (None, None) => "beta".into(),
    };
    if !["beta", "gaussian", "normal01", "empirical"].contains(&dist_name.as_str()) {
        return Err(Error::Usage(format!(
            "tq codebook: unknown --dist {dist_name:?} (expected beta, gaussian, normal01 or empirical)"
        )));
    }
    for &d in &a.head_dim {
        if d < 3 {
            return Err(Error::Usage(format!(
                "tq codebook: --head-dim {d} must be at least 3"
            )));
        }
        if dist_name == "beta" && d > MAX_BETA_DIM {
            return Err(Error::Usage(format!(
                "tq codebook: --head-dim {d}: the exact (beta) density is solved to 1e-10 only for d <= {MAX_BETA_DIM}; use --dist gaussian, its N(0, 1/d) limit, which differs by O(1/d)"
            )));
        }
    }
    // A repeated value would emit the same constant twice (a file that does not compile).
    dedup_keep_order(&mut a.head_dim);
    dedup_keep_order(&mut a.bits);
    let samples = match (&a.samples, dist_name.as_str()) {
        (Some(p), "empirical") => Some(load_samples(p)?),
        (None, "empirical") => {
            return Err(Error::Usage(
                "tq codebook: --dist empirical needs --samples FILE".into(),
            ))
        }
        (Some(_), d) => {
            return Err(Error::Usage(format!(
                "tq codebook: --samples only goes with --dist empirical, not {d}"
            )))
        }
        (None, _) => None,
    };
    let needs_dim = matches!(dist_name.as_str(), "beta" | "gaussian");
    if needs_dim && a.head_dim.is_empty() {
        return Err(Error::Usage(format!(
            "tq codebook: --dist {dist_name} needs --head-dim D"
        )));
    }
    let dists: Vec<Dist> = match dist_name.as_str() {
        "beta" => a.head_dim.iter().map(|&d| Dist::Beta { d }).collect(),
        "gaussian" => a.head_dim.iter().map(|&d| Dist::Gaussian { d }).collect(),
        "normal01" => vec![Dist::Normal01],
        _ => vec![Dist::Empirical {
            samples: 0,
            mean_sq: 0.0,
        }],
    };

    let text = if let Some(spec) = &a.evaluate {
        if a.head_dim.len() > 1 {
            return Err(Error::Usage(
                "tq codebook: --evaluate takes a single --head-dim".into(),
            ));
        }
        if !["text", "json"].contains(&a.format.as_str()) {
            return Err(Error::Usage(
                "tq codebook: --evaluate prints text or json".into(),
            ));
        }
        let mut table = parse_table(spec)?;
        match a.units.as_str() {
            "value" => {}
            "sigma" => {
                let d = a.head_dim.first().copied().ok_or_else(|| {
                    Error::Usage("tq codebook: --units sigma needs --head-dim D".into())
                })?;
                let s = 1.0 / (d as f64).sqrt();
                table.iter_mut().for_each(|v| *v *= s);
            }
            u => {
                return Err(Error::Usage(format!(
                    "tq codebook: unknown --units {u:?} (value or sigma)"
                )))
            }
        }
        let ev = evaluate_table(&dists[0], samples.as_ref(), &table);
        if a.format == "json" {
            let mut s = serde_json::to_string_pretty(&ev.to_json())
                .map_err(|e| Error::internal(format!("JSON encoding failed: {e}")))?;
            s.push('\n');
            s
        } else {
            ev.render_text()
        }
    } else {
        if a.units != "value" {
            return Err(Error::Usage(
                "tq codebook: --units only applies to --evaluate".into(),
            ));
        }
        let bits = if a.bits.is_empty() {
            vec![4]
        } else {
            a.bits.clone()
        };
        for &b in &bits {
            if !(1..=8).contains(&b) {
                return Err(Error::Usage(format!(
                    "tq codebook: --bits {b} is out of range 1..=8"
                )));
            }
        }
        let books = fit(&dists, &bits, samples.as_ref());
        let src = a.samples.as_ref().map(|p| p.display().to_string());
        render(&books, &a.format, &a.name, src.as_deref())
    };

    match &a.out {
        Some(p) => crate::io::write_file(p, text.as_bytes()).map(|()| None),
        None => Ok(Some(text)),
    }
}
