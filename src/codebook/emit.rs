//! Codebook tables as source text for engines: one constant per (dim, bits), with the header
//! lines (bits, distribution, MSE, scale convention) every format carries.

use crate::math::lloyd_max::{Codebook, Dist};
use std::fmt::Write as _;

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

pub(crate) fn g(v: f64) -> String {
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
// One function on purpose: one match arm per output format, each a few lines of syntax.
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
    use crate::codebook::parse_table;
    use crate::math::lloyd_max::{lloyd_max, midpoints};

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
