//! `tq codebook`: Lloyd-Max codebooks per head dim / bit width, emitted as constants for an engine,
//! and `--evaluate` to score any table against the optimum. Guide: `docs/codebook.md`.
use crate::error::{Error, Result};
use crate::math::lloyd_max::{evaluate, fit_empirical, lloyd_max, Codebook, Dist, Samples};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CodebookArgs {
    /// Head dim(s) d: the dimension of the rotation (comma-separated for a batch, e.g. 64,128,256).
    /// Needed for --dist beta and gaussian.
    #[arg(long, value_delimiter = ',')]
    pub head_dim: Vec<usize>,
    /// Bit width(s), 1..=8 (comma-separated for a batch, e.g. 2,3,4). Default 4.
    #[arg(long, value_delimiter = ',')]
    pub bits: Vec<u32>,
    /// Distribution: beta (exact coordinate of a rotated unit vector, the default), gaussian
    /// (its N(0, 1/d) limit), normal01 (N(0,1), weight-block convention), empirical FILE (or
    /// empirical with --samples FILE).
    #[arg(long, num_args = 1..=2, value_names = ["DIST", "FILE"])]
    pub dist: Vec<String>,
    /// Sample file for --dist empirical: raw little-endian f32 values, or a 1-D .npy (<f4 / <f8).
    #[arg(long)]
    pub samples: Option<PathBuf>,
    /// Output format: text (default), json, c, cuda, metal, wgsl, rust.
    #[arg(long, default_value = "text")]
    pub format: String,
    /// Write to this file instead of standard output.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Prefix of the emitted constant names.
    #[arg(long, default_value = "TQ_CB")]
    pub name: String,
    /// Evaluate a table instead of computing one: a file (JSON from this command, or numbers
    /// separated by commas/whitespace) or an inline list "v1,v2,..."; a leading "±" (or "pm:")
    /// means the list is the positive half of a symmetric table.
    #[arg(long, allow_hyphen_values = true)]
    pub evaluate: Option<String>,
    /// Units of the --evaluate table: value (default) or sigma (multiples of σ = 1/√d).
    #[arg(long, default_value = "value")]
    pub units: String,
}

const FORMATS: &[&str] = &["text", "json", "c", "cuda", "metal", "wgsl", "rust"];

pub fn run(a: CodebookArgs) -> Result<()> {
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
                .map_err(|e| Error::Usage(format!("JSON encoding failed: {e}")))?;
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
        let mut books = Vec::new();
        for dist in &dists {
            for &b in &bits {
                let cb = match &samples {
                    Some(s) => fit_empirical(s, 1 << b),
                    None => lloyd_max(dist, 1 << b),
                };
                books.push(cb);
            }
        }
        let src = a.samples.as_ref().map(|p| p.display().to_string());
        render(&books, &a.format, &a.name, src.as_deref())
    };

    match &a.out {
        Some(p) => std::fs::write(p, text).map_err(|e| Error::io(p, e)),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Largest d for `--dist beta`: the solver's incomplete-beta tails lose digits as the density
/// narrows (measured: centroids within 7e-11 σ up to 16384, 2.4e-10 σ at 65536).
pub const MAX_BETA_DIM: usize = 16384;

fn dedup_keep_order<T: PartialEq + Copy>(v: &mut Vec<T>) {
    let mut seen = Vec::with_capacity(v.len());
    v.retain(|x| {
        let new = !seen.contains(x);
        seen.push(*x);
        new
    });
}

fn is_identifier(s: &str) -> bool {
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
        if data.len() % 4 != 0 {
            return Err(bad("data is not a whole number of f32"));
        }
        Ok(data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect())
    } else if header.contains("'<f8'") {
        if data.len() % 8 != 0 {
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

// ------------------------------------------------------------------ output

/// Shortest decimal that round-trips the f32 value (always with '.' or an exponent).
fn f32_lit(v: f64) -> String {
    let s = format!("{:?}", v as f32);
    if s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") {
        s
    } else {
        format!("{s}.0")
    }
}

fn g(v: f64) -> String {
    format!("{v:.6}")
}

fn const_name(prefix: &str, cb: &Codebook) -> String {
    let bits = cb.bits().unwrap_or(0);
    match cb.dist.dim() {
        Some(d) => format!("{prefix}_{}_D{d}_B{bits}", cb.dist.name().to_uppercase()),
        None => format!("{prefix}_{}_B{bits}", cb.dist.name().to_uppercase()),
    }
}

fn scale_convention(cb: &Codebook) -> &'static str {
    match cb.dist {
        Dist::Beta { .. } | Dist::Gaussian { .. } => {
            "values are coordinates of the L2-normalized, rotated vector: x_rot ~= ||x|| * C[idx] \
             (turbo convention: store the norm, multiply back)"
        }
        Dist::Normal01 => {
            "values are in units of the block scale s (the block's RMS): x ~= s * C[idx] (TQ weight convention)"
        }
        Dist::Empirical { .. } => "values are in the units of the samples: x ~= C[idx]",
    }
}

/// The header lines (without comment markers) describing one codebook.
fn header_lines(cb: &Codebook, source: Option<&str>) -> Vec<String> {
    let n = cb.levels();
    let b = cb.bits().unwrap_or(0);
    let mut v = vec![format!(
        "Lloyd-Max codebook, {b} bit{} ({n} levels); written by tq codebook {}",
        if b == 1 { "" } else { "s" },
        env!("CARGO_PKG_VERSION")
    )];
    let dim = cb
        .dist
        .dim()
        .map(|d| format!("d = {d}, "))
        .unwrap_or_default();
    v.push(format!("distribution: {dim}{}", cb.dist.describe()));
    if let Some(src) = source {
        v.push(format!("samples: {src}"));
    }
    let mut mse = format!(
        "MSE per coordinate {:.6e} ({:.6} of E[x^2] = {:.6e})",
        cb.mse,
        cb.mse_normalized(),
        cb.dist.second_moment()
    );
    if let Some(pv) = cb.mse_per_vector() {
        let _ = write!(mse, "; per vector {pv:.6}");
    }
    v.push(mse);
    v.push(format!("scale: {}", scale_convention(cb)));
    v.push(
        "encode: idx = number of thresholds t with v >= t (thresholds are centroid midpoints)"
            .into(),
    );
    v
}

fn list(vals: &[f64], per_line: usize, indent: &str, suffix: &str) -> String {
    let mut s = String::new();
    for (i, chunk) in vals.chunks(per_line).enumerate() {
        if i > 0 {
            s.push('\n');
        }
        s.push_str(indent);
        let items: Vec<String> = chunk
            .iter()
            .map(|&v| format!("{}{suffix}", f32_lit(v)))
            .collect();
        s.push_str(&items.join(", "));
        s.push(',');
    }
    s
}

/// Render codebooks in one of the output formats.
pub fn render(books: &[Codebook], format: &str, prefix: &str, source: Option<&str>) -> String {
    let mut s = String::new();
    match format {
        "json" => {
            let tables: Vec<serde_json::Value> = books
                .iter()
                .map(|cb| {
                    serde_json::json!({
                        "name": const_name(prefix, cb),
                        "dist": cb.dist.name(),
                        "head_dim": cb.dist.dim(),
                        "bits": cb.bits(),
                        "levels": cb.levels(),
                        "centroids": cb.centroids,
                        "thresholds": cb.thresholds,
                        "mse": cb.mse,
                        "mse_normalized": cb.mse_normalized(),
                        "mse_per_vector": cb.mse_per_vector(),
                        "second_moment": cb.dist.second_moment(),
                        "scale": scale_convention(cb),
                        "samples": source,
                        "solver_iterations": cb.iterations,
                        "converged_to": cb.last_step,
                    })
                })
                .collect();
            let doc = serde_json::json!({
                "generator": format!("tq codebook {}", env!("CARGO_PKG_VERSION")),
                "tables": tables,
            });
            s = serde_json::to_string_pretty(&doc).unwrap_or_default();
            s.push('\n');
        }
        "text" => {
            for (i, cb) in books.iter().enumerate() {
                if i > 0 {
                    s.push('\n');
                }
                for l in header_lines(cb, source) {
                    let _ = writeln!(s, "# {l}");
                }
                let _ = writeln!(s, "{:>5}  {:>14}  {:>14}", "idx", "centroid", "threshold");
                for (j, c) in cb.centroids.iter().enumerate() {
                    let t = cb
                        .thresholds
                        .get(j)
                        .map(|t| format!("{t:>14.9}"))
                        .unwrap_or_default();
                    let row = format!("{j:>5}  {c:>14.9}  {t}");
                    let _ = writeln!(s, "{}", row.trim_end());
                }
            }
        }
        _ => {
            let (open, line, close) = match format {
                "c" | "cuda" | "metal" => ("/*", " *", " */"),
                _ => ("//", "//", ""),
            };
            for (i, cb) in books.iter().enumerate() {
                if i > 0 {
                    s.push('\n');
                }
                let name = const_name(prefix, cb);
                let hl = header_lines(cb, source);
                if close.is_empty() {
                    for l in &hl {
                        let _ = writeln!(s, "{line} {l}");
                    }
                } else {
                    let _ = writeln!(s, "{open} {}", hl[0]);
                    for l in &hl[1..] {
                        let _ = writeln!(s, "{line} {l}");
                    }
                    let _ = writeln!(s, "{close}");
                }
                for (what, vals) in [("CENTROIDS", &cb.centroids), ("THRESHOLDS", &cb.thresholds)] {
                    let n = vals.len();
                    let id = format!("{name}_{what}");
                    match format {
                        "c" => {
                            let _ = writeln!(
                                s,
                                "static const float {id}[{n}] = {{\n{}\n}};",
                                list(vals, 8, "    ", "f")
                            );
                        }
                        "cuda" => {
                            let _ = writeln!(
                                s,
                                "static __constant__ float {id}[{n}] = {{\n{}\n}};",
                                list(vals, 8, "    ", "f")
                            );
                        }
                        "metal" => {
                            let _ = writeln!(
                                s,
                                "constant float {id}[{n}] = {{\n{}\n}};",
                                list(vals, 8, "    ", "f")
                            );
                        }
                        "wgsl" => {
                            let _ = writeln!(
                                s,
                                "const {id} = array<f32, {n}>(\n{}\n);",
                                list(vals, 8, "    ", "")
                            );
                        }
                        _ => {
                            let _ = writeln!(
                                s,
                                "pub const {id}: [f32; {n}] = [\n{}\n];",
                                list(vals, 8, "    ", "")
                            );
                        }
                    }
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::lloyd_max::midpoints;

    #[test]
    fn table_specs() {
        assert_eq!(parse_table("±0.5,1.5").unwrap(), vec![-1.5, -0.5, 0.5, 1.5]);
        assert_eq!(
            parse_table("pm: 0.5 1.5").unwrap(),
            vec![-1.5, -0.5, 0.5, 1.5]
        );
        assert_eq!(parse_table("1, -1, 0.25f").unwrap(), vec![-1.0, 0.25, 1.0]);
        assert_eq!(parse_table("[0.1, -0.1]").unwrap(), vec![-0.1, 0.1]);
        assert!(parse_table("±-1,2").is_err());
        assert!(parse_table("x").is_err());
        assert!(parse_table("").is_err());
    }

    #[test]
    fn literals_round_trip() {
        for v in [0.011302f64, -2.7326, 1.0, 1e-7, 0.5] {
            let s = f32_lit(v);
            assert!(s.contains('.') || s.contains('e'));
            assert_eq!(s.parse::<f32>().unwrap(), v as f32);
        }
    }

    #[test]
    fn midpoints_are_thresholds() {
        let cb = lloyd_max(&Dist::Beta { d: 64 }, 8);
        assert_eq!(cb.thresholds, midpoints(&cb.centroids));
    }
}
