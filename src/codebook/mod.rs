//! Lloyd-Max codebooks as a product: fit them (`math::lloyd_max` does the solving), read sample
//! files and hand-written tables, evaluate any table against a distribution, and emit tables for
//! engines ([`emit`]: text, JSON, C, CUDA, Metal, WGSL, Rust). `tq codebook` is a thin shell
//! over [`job`]; see `docs/codebook.md`.

pub(crate) mod emit;
pub mod job;

use emit::g;
pub use emit::render;

use crate::error::{Error, Result};
use crate::math::lloyd_max::{evaluate, fit_empirical, lloyd_max, Codebook, Dist, Samples};
use std::fmt::Write as _;
use std::path::Path;

/// Every `--format` [`render`] knows.
pub const FORMATS: &[&str] = &["text", "json", "c", "cuda", "metal", "wgsl", "rust"];

/// Fit one codebook per (distribution, bit width), in that order: Lloyd-Max on the density, or
/// on `samples` when given (then `dists` only sets the count).
pub fn fit(dists: &[Dist], bits: &[u32], samples: Option<&Samples>) -> Vec<Codebook> {
    let mut books = Vec::new();
    for dist in dists {
        for &b in bits {
            books.push(match samples {
                Some(s) => fit_empirical(s, 1 << b),
                None => lloyd_max(dist, 1 << b),
            });
        }
    }
    books
}

pub const MAX_BETA_DIM: usize = 16384;

pub fn dedup_keep_order<T: PartialEq + Copy>(v: &mut Vec<T>) {
    let mut seen = Vec::with_capacity(v.len());
    v.retain(|x| {
        let new = !seen.contains(x);
        seen.push(*x);
        new
    });
}

pub fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

// ------------------------------------------------------------------ input

/// Load sample values: raw little-endian f32, or a 1-D .npy of <f4 / <f8.
pub fn load_samples(path: &Path) -> Result<Samples> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let vals: Vec<f32> = if bytes.starts_with(b"\x93NUMPY") {
        parse_npy(path, &bytes)?
    } else {
        if bytes.len() % 4 != 0 {
            return Err(Error::bad_input(
                path,
                format!(
                    "{} bytes is not a whole number of little-endian f32 values",
                    bytes.len()
                ),
            ));
        }
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    if vals.is_empty() {
        return Err(Error::bad_input(path, "no sample values"));
    }
    if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
        return Err(Error::bad_input(
            path,
            format!("sample {i} is not finite ({})", vals[i]),
        ));
    }
    Ok(Samples::new(&vals))
}

fn parse_npy(path: &Path, b: &[u8]) -> Result<Vec<f32>> {
    let bad = |m: &str| Error::bad_input(path, format!(".npy: {m}"));
    if b.len() < 10 {
        return Err(bad("truncated header"));
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10usize),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(bad(&format!("unsupported format version {v}"))),
    };
    let end = start
        .checked_add(hlen)
        .filter(|&e| e <= b.len())
        .ok_or_else(|| bad("truncated header"))?;
    let header = std::str::from_utf8(&b[start..end]).map_err(|_| bad("header is not text"))?;
    if header.contains("'fortran_order': True") {
        return Err(bad("fortran_order arrays are not supported"));
    }
    let data = &b[end..];
    if header.contains("'<f4'") {
        if !data.len().is_multiple_of(4) {
            return Err(bad("data is not a whole number of f32"));
        }
        Ok(data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect())
    } else if header.contains("'<f8'") {
        if !data.len().is_multiple_of(8) {
            return Err(bad("data is not a whole number of f64"));
        }
        Ok(data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect())
    } else {
        Err(bad(
            "dtype must be little-endian float32 ('<f4') or float64 ('<f8')",
        ))
    }
}

/// Parse a table spec: a file or an inline list, optionally "±"/"pm:"-prefixed (symmetric half).
pub fn parse_table(spec: &str) -> Result<Vec<f64>> {
    let p = Path::new(spec);
    let looks_like_path = spec.contains('/')
        || [".txt", ".json", ".csv", ".tsv"]
            .iter()
            .any(|ext| spec.ends_with(ext));
    if !p.is_file() && (p.exists() || looks_like_path) {
        return Err(Error::Usage(format!(
            "tq codebook: --evaluate {spec:?}: {} (give a table file or an inline list like \"±0.45,1.51\")",
            if p.exists() { "not a regular file" } else { "no such file" }
        )));
    }
    let (text, origin): (String, Option<&Path>) = if p.is_file() {
        (
            std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?,
            Some(p),
        )
    } else {
        (spec.to_string(), None)
    };
    let err = |m: String| match origin {
        Some(p) => Error::bad_input(p, m),
        None => Error::Usage(format!("tq codebook: --evaluate: {m}")),
    };
    let trimmed = text.trim_start();
    let mut vals: Vec<f64> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))?;
        let arr = if let Some(a) = v.as_array() {
            a.clone()
        } else if let Some(t) = v.get("tables").and_then(|t| t.as_array()) {
            if t.len() != 1 {
                return Err(err(format!(
                    "JSON holds {} tables; evaluate one at a time",
                    t.len()
                )));
            }
            t[0].get("centroids")
                .and_then(|c| c.as_array())
                .cloned()
                .ok_or_else(|| err("no centroids".into()))?
        } else if let Some(c) = v.get("centroids").and_then(|c| c.as_array()) {
            c.clone()
        } else {
            return Err(err(
                "expected an array of numbers or an object with \"centroids\"".into(),
            ));
        };
        arr.iter()
            .map(|x| x.as_f64().ok_or_else(|| err(format!("not a number: {x}"))))
            .collect::<Result<_>>()?
    } else {
        let body: String = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        let mut body = body.trim().to_string();
        let sym = ["±", "+-", "pm:"]
            .iter()
            .find(|pre| body.starts_with(**pre))
            .map(|pre| pre.len());
        if let Some(n) = sym {
            body = body[n..].to_string();
        }
        let body = body.trim().trim_start_matches('{').trim_end_matches('}');
        let mut v = Vec::new();
        for tok in body
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
        {
            let x: f64 = tok
                .trim_end_matches('f')
                .parse()
                .map_err(|_| err(format!("not a number: {tok:?}")))?;
            v.push(x);
        }
        if sym.is_some() {
            if v.iter().any(|&x| x < 0.0) {
                return Err(err("a ± table lists the positive half only".into()));
            }
            let mut full: Vec<f64> = v.iter().rev().map(|x| -x).collect();
            full.extend(&v);
            v = full;
        }
        v
    };
    if vals.is_empty() {
        return Err(err("empty table".into()));
    }
    if vals.iter().any(|x| !x.is_finite()) {
        return Err(err("table values must be finite".into()));
    }
    vals.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(vals)
}

// ------------------------------------------------------------------ evaluate

/// The score of a given table against the Lloyd-Max optimum with the same number of levels.
pub struct Evaluation {
    pub dist: Dist,
    pub table: Vec<f64>,
    pub mse: f64,
    pub optimum: Codebook,
    /// The scalar multiple of the table with the lowest MSE, and that MSE.
    pub best_scale: f64,
    pub best_scale_mse: f64,
}

pub fn evaluate_table(dist: &Dist, samples: Option<&Samples>, table: &[f64]) -> Evaluation {
    let mse_of = |t: &[f64]| -> f64 {
        match samples {
            Some(s) => s.mse(t),
            None => evaluate(dist, t),
        }
    };
    let optimum = match samples {
        Some(s) => fit_empirical(s, table.len()),
        None => lloyd_max(dist, table.len()),
    };
    let mse = mse_of(table);
    // Golden-section search on log(scale) over [1/8, 8].
    let f = |ls: f64| -> f64 {
        let k = ls.exp();
        let t: Vec<f64> = table.iter().map(|v| v * k).collect();
        mse_of(&t)
    };
    let (mut lo, mut hi) = ((0.125f64).ln(), 8f64.ln());
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut x1, mut x2) = (hi - g * (hi - lo), lo + g * (hi - lo));
    let (mut f1, mut f2) = (f(x1), f(x2));
    for _ in 0..80 {
        if f1 < f2 {
            hi = x2;
            x2 = x1;
            f2 = f1;
            x1 = hi - g * (hi - lo);
            f1 = f(x1);
        } else {
            lo = x1;
            x1 = x2;
            f1 = f2;
            x2 = lo + g * (hi - lo);
            f2 = f(x2);
        }
    }
    let best = 0.5 * (lo + hi);
    let (best_scale, best_scale_mse) = if f(best) < mse {
        (best.exp(), f(best))
    } else {
        (1.0, mse)
    };
    let dist = match samples {
        Some(_) => optimum.dist.clone(),
        None => dist.clone(),
    };
    Evaluation {
        dist,
        table: table.to_vec(),
        mse,
        optimum,
        best_scale,
        best_scale_mse,
    }
}

impl Evaluation {
    pub fn ratio(&self) -> f64 {
        self.mse / self.optimum.mse
    }

    pub fn render_text(&self) -> String {
        let n = self.table.len();
        let m2 = self.dist.second_moment();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "distribution: {} - {}",
            self.dist.name(),
            self.dist.describe()
        );
        let bits = if n.is_power_of_two() {
            format!(" ({} bits)", n.trailing_zeros())
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "table: {n} levels{bits}, range [{}, {}]",
            g(self.table[0]),
            g(self.table[n - 1])
        );
        let per_vec = |m: f64| {
            self.dist
                .dim()
                .map(|d| format!(", per vector {:.6}", m * d as f64))
                .unwrap_or_default()
        };
        let _ = writeln!(
            s,
            "MSE of the table:   {:.6e} per coordinate ({:.6} of E[x^2]){}",
            self.mse,
            self.mse / m2,
            per_vec(self.mse)
        );
        let _ = writeln!(
            s,
            "Lloyd-Max optimum:  {:.6e} per coordinate ({:.6} of E[x^2]){}",
            self.optimum.mse,
            self.optimum.mse / m2,
            per_vec(self.optimum.mse)
        );
        if self.optimum.mse > 0.0 {
            let _ = writeln!(s, "ratio to optimum:   {:.4}", self.ratio());
        } else {
            // Fewer distinct samples than levels: the optimum reproduces them exactly.
            let _ = writeln!(s, "ratio to optimum:   n/a (the optimum's MSE is 0)");
        }
        if (self.best_scale - 1.0).abs() > 1e-3 {
            let _ = writeln!(
                s,
                "best rescaling:     x{:.4} gives {:.6e} (ratio {:.4}): the table is {}",
                self.best_scale,
                self.best_scale_mse,
                self.best_scale_mse / self.optimum.mse,
                if self.best_scale > 1.0 {
                    "too narrow"
                } else {
                    "too wide"
                }
            );
        }
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "dist": self.dist.name(),
            "head_dim": self.dist.dim(),
            "levels": self.table.len(),
            "table": self.table,
            "mse": self.mse,
            "mse_normalized": self.mse / self.dist.second_moment(),
            "mse_per_vector": self.dist.dim().map(|d| self.mse * d as f64),
            "optimum_mse": self.optimum.mse,
            "optimum_centroids": self.optimum.centroids,
            "ratio": (self.optimum.mse > 0.0).then(|| self.ratio()),
            "best_scale": self.best_scale,
            "best_scale_mse": self.best_scale_mse,
        })
    }
}
