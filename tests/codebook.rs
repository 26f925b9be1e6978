//! Lloyd-Max codebooks against an independent oracle (scipy, `scripts/oracle/codebooks.py`), the
//! standard N(0,1) tables, the turbo4 regression, and the `tq codebook` command line.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::tq;
use serde_json::Value;
use tq::math::lloyd_max::{evaluate, fit_empirical, lloyd_max, lloyd_max_bits, Dist, Samples};

/// The fork's May-2026 turbo4 table (FORMATS.md §3), positive half.
const TURBO4_MAY: [f64; 8] = [
    0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195, 0.173926,
];

fn symmetric(half: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = half.iter().rev().map(|x| -x).collect();
    v.extend(half);
    v
}

fn dist_of(name: &str, d: Option<usize>) -> Dist {
    match name {
        "beta" => Dist::Beta { d: d.unwrap() },
        "gaussian" => Dist::Gaussian { d: d.unwrap() },
        "normal01" => Dist::Normal01,
        other => panic!("unknown dist {other}"),
    }
}

#[test]
fn tables_match_scipy_oracle() {
    let Some(doc) = fixtures::oracle_json("math/lloyd_max.json") else {
        return;
    };
    let mut worst_c: f64 = 0.0;
    let mut worst_mse: f64 = 0.0;
    let tables = doc["tables"].as_array().unwrap();
    assert!(
        tables.len() >= 60,
        "oracle file has {} tables",
        tables.len()
    );
    for t in tables {
        let d = t["d"].as_u64().map(|d| d as usize);
        let dist = dist_of(t["dist"].as_str().unwrap(), d);
        let bits = t["bits"].as_u64().unwrap() as u32;
        let want: Vec<f64> = t["centroids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let cb = lloyd_max_bits(&dist, bits);
        let sigma = dist.second_moment().sqrt();
        assert_eq!(cb.centroids.len(), want.len());
        for (i, (got, exp)) in cb.centroids.iter().zip(&want).enumerate() {
            let e = (got - exp).abs() / sigma;
            worst_c = worst_c.max(e);
            assert!(
                e < 1e-9,
                "{dist:?} bits {bits} centroid {i}: {got} vs scipy {exp} ({e:.2e} σ)"
            );
        }
        let mse = t["mse"].as_f64().unwrap();
        let rel = (cb.mse - mse).abs() / mse;
        worst_mse = worst_mse.max(rel);
        assert!(
            rel < 1e-8,
            "{dist:?} bits {bits}: MSE {} vs scipy quad {mse} (rel {rel:.2e})",
            cb.mse
        );
        assert!(
            cb.last_step < 1e-10 * sigma,
            "{dist:?} bits {bits}: not converged ({:e})",
            cb.last_step
        );
    }
    eprintln!(
        "{} tables: worst centroid deviation {worst_c:.2e} σ, worst MSE deviation {worst_mse:.2e} (relative)",
        tables.len()
    );
}

/// 40-digit references (mpmath, optional: written only where mpmath is importable, e.g.
/// `python3 scripts/oracle/codebooks.py --out $TQ_CACHE/oracle --mp-only`). The scipy solve above is
/// good to ~1e-9 σ on the worst-conditioned 8-bit tables; this holds ours to 1e-10 σ.
#[test]
fn tables_match_mpmath_reference() {
    // mpmath is pinned in the oracle venv, so under TQ_REQUIRE_DATA=1 a missing file fails.
    let Some(doc) = fixtures::oracle_json("math/lloyd_max_mp.json") else {
        return;
    };
    for t in doc["tables"].as_array().unwrap() {
        let d = t["d"].as_u64().map(|d| d as usize);
        let dist = dist_of(t["dist"].as_str().unwrap(), d);
        let bits = t["bits"].as_u64().unwrap() as u32;
        let num = |v: &Value| v.as_str().unwrap().parse::<f64>().unwrap();
        let want: Vec<f64> = t["centroids"].as_array().unwrap().iter().map(num).collect();
        let cb = lloyd_max_bits(&dist, bits);
        let sigma = dist.second_moment().sqrt();
        let worst = cb
            .centroids
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs() / sigma)
            .fold(0.0, f64::max);
        let mse = num(&t["mse"]);
        let rel = (cb.mse - mse).abs() / mse;
        eprintln!(
            "{dist:?} bits {bits}: worst centroid deviation {worst:.2e} σ, MSE rel {rel:.2e}"
        );
        assert!(worst < 1e-10, "{dist:?} bits {bits}: {worst:e} σ");
        assert!(rel < 1e-10, "{dist:?} bits {bits}: MSE {} vs {mse}", cb.mse);
    }
}

#[test]
fn turbo4_may_table_against_oracle() {
    let Some(doc) = fixtures::oracle_json("math/lloyd_max.json") else {
        return;
    };
    for t in doc["turbo4_may"].as_array().unwrap() {
        let dist = dist_of(t["dist"].as_str().unwrap(), Some(128));
        let table = symmetric(&TURBO4_MAY);
        let mse = evaluate(&dist, &table);
        let want = t["mse"].as_f64().unwrap();
        assert!(
            (mse - want).abs() < 1e-9 * want,
            "{dist:?}: {mse} vs {want}"
        );
        let ratio = mse / lloyd_max_bits(&dist, 4).mse;
        assert!((ratio - t["ratio"].as_f64().unwrap()).abs() < 1e-7);
    }
}

/// Regression: the May-2026 turbo4 table is ~2.1x the optimal MSE for d = 128 (FORMATS.md §3).
#[test]
fn turbo4_may_table_is_about_twice_the_optimum() {
    let table = symmetric(&TURBO4_MAY);
    let beta = Dist::Beta { d: 128 };
    let r_beta = evaluate(&beta, &table) / lloyd_max_bits(&beta, 4).mse;
    let gauss = Dist::Gaussian { d: 128 };
    let r_gauss = evaluate(&gauss, &table) / lloyd_max_bits(&gauss, 4).mse;
    assert!((2.05..2.15).contains(&r_beta), "beta ratio {r_beta}");
    assert!((2.10..2.17).contains(&r_gauss), "gaussian ratio {r_gauss}");
    // The June-2026 replacement is within 1% of the optimum.
    let june = symmetric(&[
        0.01114, 0.03369, 0.05709, 0.08205, 0.10960, 0.14149, 0.18139, 0.24021,
    ]);
    let r_june = evaluate(&beta, &june) / lloyd_max_bits(&beta, 4).mse;
    assert!(r_june < 1.01, "june ratio {r_june}");
}

#[test]
fn standard_normal_tables() {
    let close = |a: f64, b: f64, t: f64| (a - b).abs() <= t;
    let b2 = lloyd_max_bits(&Dist::Normal01, 2);
    assert!(close(b2.centroids[2], 0.4528, 5e-5) && close(b2.centroids[3], 1.5104, 5e-5));
    assert!(close(b2.mse, 0.1175, 5e-5));
    let b3 = lloyd_max_bits(&Dist::Normal01, 3);
    for (g, w) in b3.centroids[4..]
        .iter()
        .zip([0.2451, 0.7560, 1.3439, 2.1519])
    {
        assert!(close(*g, w, 5e-5));
    }
    assert!(close(b3.mse, 0.03455, 5e-6));
    let b4 = lloyd_max_bits(&Dist::Normal01, 4);
    assert!(close(b4.centroids[15], 2.7326, 5e-5));
    assert!(close(b4.mse, 0.009501, 5e-7));
    // The TQ4_1S table of FORMATS.md §2 is this one to 6 decimals.
    let c4 = [
        0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.732590,
    ];
    for (g, w) in b4.centroids[8..].iter().zip(c4) {
        assert!(close(*g, w, 1e-6), "{g} vs {w}");
    }
    // Gaussian(d) is N(0,1) scaled by 1/√d.
    let g = lloyd_max_bits(&Dist::Gaussian { d: 128 }, 3);
    for (x, y) in g.centroids.iter().zip(&b3.centroids) {
        assert!((x * 128f64.sqrt() - y).abs() < 1e-12);
    }
}

// Codebook computation time is a benchmark (`cargo bench --bench math`, docs/bench/math.md),
// not a timed test.

#[test]
fn empirical_fit_on_a_quantile_sample_approaches_the_exact_table() {
    // A "perfect" sample of N(0, 1/64): the normal quantiles at (i + 1/2)/n.
    let exact = lloyd_max(&Dist::Gaussian { d: 64 }, 8);
    let sigma = (1.0f64 / 64.0).sqrt();
    let n = 40_000;
    let v: Vec<f32> = (0..n)
        .map(|i| (sigma * probit((i as f64 + 0.5) / n as f64)) as f32)
        .collect();
    let cb = fit_empirical(&Samples::new(&v), 8);
    for (a, b) in cb.centroids.iter().zip(&exact.centroids) {
        assert!((a - b).abs() < 0.01 * sigma, "{a} vs {b}");
    }
    assert!((cb.mse - exact.mse).abs() < 0.01 * exact.mse);
}

/// Acklam-style rational approximation to the normal quantile (|error| < 1.2e-9), test helper.
fn probit(p: f64) -> f64 {
    let a = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383577518672690e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    let b = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    let c = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    let d = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let pl = 0.02425;
    if p < pl {
        let q = (-2.0 * p.ln()).sqrt();
        (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5])
            / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0)
    } else if p > 1.0 - pl {
        -probit(1.0 - p)
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
            / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0)
    }
}

// ------------------------------------------------------------------ CLI

#[test]
fn cli_evaluate_turbo4_shows_ratio() {
    let (rc, out, err) = tq(&[
        "codebook",
        "--evaluate",
        "±0.006938,0.020989,0.035597,0.051262,0.068756,0.089527,0.117195,0.173926",
        "--head-dim",
        "128",
        "--dist",
        "gaussian",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("ratio to optimum:   2.13"), "{out}");
    assert!(out.contains("too narrow"), "{out}");
    // Same in σ units, JSON output.
    let sig: Vec<String> = TURBO4_MAY
        .iter()
        .map(|v| format!("{}", v * 128f64.sqrt()))
        .collect();
    let spec = format!("±{}", sig.join(","));
    let (rc, out, err) = tq(&[
        "codebook",
        "--evaluate",
        &spec,
        "--head-dim",
        "128",
        "--units",
        "sigma",
        "--format",
        "json",
    ]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let r = v["ratio"].as_f64().unwrap();
    assert!((2.05..2.15).contains(&r), "{r}");
}

#[test]
fn cli_formats() {
    for (fmt, needle) in [
        (
            "c",
            "static const float TQ_CB_BETA_D128_B3_CENTROIDS[8] = {",
        ),
        (
            "cuda",
            "static __constant__ float TQ_CB_BETA_D128_B3_THRESHOLDS[7] = {",
        ),
        (
            "metal",
            "constant float TQ_CB_BETA_D128_B3_CENTROIDS[8] = {",
        ),
        (
            "wgsl",
            "const TQ_CB_BETA_D128_B3_CENTROIDS = array<f32, 8>(",
        ),
        (
            "rust",
            "pub const TQ_CB_BETA_D128_B3_CENTROIDS: [f32; 8] = [",
        ),
        ("text", "# MSE per coordinate 2.6535"),
    ] {
        let (rc, out, err) = tq(&[
            "codebook",
            "--head-dim",
            "128",
            "--bits",
            "3",
            "--format",
            fmt,
        ]);
        assert_eq!(rc, 0, "{fmt}: {err}");
        assert!(out.contains(needle), "{fmt}:\n{out}");
        // The header states d, bits, the distribution, the MSE and the scale convention.
        for h in [
            "d = 128",
            "3 bits (8 levels)",
            "coordinate of a random unit vector in R^128",
            "MSE per coordinate 2.6535",
            "per vector 0.0339",
            "scale: values are coordinates of the L2-normalized, rotated vector",
        ] {
            assert!(out.contains(h), "{fmt}: header lacks {h:?}:\n{out}");
        }
        assert!(out.is_ascii(), "{fmt}: output is ASCII");
        assert!(
            out.lines().all(|l| l == l.trim_end()),
            "{fmt}: trailing spaces"
        );
    }
    let (rc, out, _) = tq(&[
        "codebook",
        "--head-dim",
        "64,128,160,256",
        "--bits",
        "2,3,4",
        "--format",
        "json",
    ]);
    assert_eq!(rc, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    let tables = v["tables"].as_array().unwrap();
    assert_eq!(tables.len(), 12);
    // Repeated values in a batch are emitted once (a C file with a repeated constant would not
    // compile).
    let (rc, dup, _) = tq(&[
        "codebook",
        "--head-dim",
        "128,128",
        "--bits",
        "3,3",
        "--format",
        "c",
    ]);
    assert_eq!(rc, 0);
    assert_eq!(dup.matches("TQ_CB_BETA_D128_B3_CENTROIDS[8]").count(), 1);
    for t in tables {
        let d = t["head_dim"].as_u64().unwrap() as usize;
        let bits = t["bits"].as_u64().unwrap() as u32;
        let c: Vec<f64> = t["centroids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let exact = lloyd_max_bits(&Dist::Beta { d }, bits);
        // serde_json's default float parser may be off by an ulp.
        for (x, y) in c.iter().zip(&exact.centroids) {
            assert!((x - y).abs() <= 1e-15 * y.abs(), "{x} vs {y}");
        }
        assert_eq!(t["thresholds"].as_array().unwrap().len(), c.len() - 1);
    }
    // Round trip: a JSON table evaluates to ratio 1.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.json");
    let (rc, _, _) = tq(&[
        "codebook",
        "--head-dim",
        "96",
        "--bits",
        "4",
        "--format",
        "json",
        "-o",
        p.to_str().unwrap(),
    ]);
    assert_eq!(rc, 0);
    let (rc, out, _) = tq(&[
        "codebook",
        "--evaluate",
        p.to_str().unwrap(),
        "--head-dim",
        "96",
    ]);
    assert_eq!(rc, 0);
    assert!(out.contains("ratio to optimum:   1.0000"), "{out}");
    // An asymmetric list that starts with a minus sign (the TQ3_1S table, FORMATS.md §2).
    let c3 = "-1.996684 -1.291398 -0.740341 -0.247508 0.230106 0.725222 1.277503 1.988943";
    let (rc, out, err) = tq(&["codebook", "--evaluate", c3, "--dist", "normal01"]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("ratio to optimum:   1.02"), "{out}");
}

#[test]
fn cli_empirical_samples() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("acts.f32");
    let vals: Vec<f32> = (0..10_000)
        .map(|i| probit((i as f64 + 0.5) / 10_000.0) as f32)
        .collect();
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&raw, &bytes).unwrap();
    // The 2-bit table fitted to a sample file given by `source` (flags naming the file).
    let fit2 = |source: &[&str]| -> Value {
        let mut args = vec!["codebook"];
        args.extend_from_slice(source);
        args.extend(["--bits", "2", "--format", "json"]);
        let (rc, out, err) = tq(&args);
        assert_eq!(rc, 0, "{source:?}: {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        v["tables"][0]["centroids"].clone()
    };
    let c = fit2(&["--samples", raw.to_str().unwrap()]);
    assert!((c[3].as_f64().unwrap() - 1.5104).abs() < 0.01, "{c}");
    // The same data as .npy (<f4).
    let npy = dir.path().join("acts.npy");
    let mut h = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        vals.len()
    );
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    f.extend((h.len() as u16).to_le_bytes());
    f.extend(h.as_bytes());
    f.extend(&bytes);
    std::fs::write(&npy, f).unwrap();
    assert_eq!(fit2(&["--samples", npy.to_str().unwrap()]), c);
    // Bad sample files: one-line errors, exit code 2.
    std::fs::write(&raw, [0u8; 6]).unwrap();
    let (rc, _, err) = tq(&["codebook", "--samples", raw.to_str().unwrap()]);
    assert_eq!(rc, 2);
    assert!(
        err.contains("acts.f32") && err.trim().lines().count() == 1,
        "{err}"
    );
    // The spelling, --dist empirical FILE, is the same as --samples FILE.
    assert_eq!(fit2(&["--dist", "empirical", npy.to_str().unwrap()]), c);
    // Fewer distinct samples than levels: the optimum is exact, no "inf" ratio.
    std::fs::write(&raw, 0.5f32.to_le_bytes()).unwrap();
    let (rc, out, err) = tq(&[
        "codebook",
        "--samples",
        raw.to_str().unwrap(),
        "--evaluate",
        "0.1,0.9",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("ratio to optimum:   n/a"), "{out}");
    std::fs::write(&raw, f32::NAN.to_le_bytes()).unwrap();
    let (rc, _, err) = tq(&["codebook", "--samples", raw.to_str().unwrap()]);
    assert_eq!(rc, 2);
    assert!(err.contains("not finite"), "{err}");
}

#[test]
fn cli_usage_errors() {
    for args in [
        vec!["codebook", "--bits", "4"],
        vec!["codebook", "--head-dim", "2"],
        vec!["codebook", "--head-dim", "128", "--bits", "9"],
        vec!["codebook", "--head-dim", "128", "--format", "java"],
        vec!["codebook", "--head-dim", "128", "--dist", "laplace"],
        vec!["codebook", "--dist", "empirical"],
        vec!["codebook", "--evaluate", "1,x", "--head-dim", "128"],
        vec!["codebook", "--evaluate", "±-1,2", "--head-dim", "128"],
        vec![
            "codebook",
            "--evaluate",
            "no_such_table.txt",
            "--head-dim",
            "128",
        ],
        vec!["codebook", "--evaluate", "/tmp", "--head-dim", "128"],
        vec!["codebook", "--head-dim", "128", "--dist", "beta", "x.f32"],
        vec!["codebook", "--head-dim", "65536", "--bits", "4"],
    ] {
        let (rc, out, err) = tq(&args);
        assert_eq!(rc, 2, "{args:?}: {out}{err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("tq: error:"), "{args:?}: {err}");
    }
    let (_, _, err) = tq(&[
        "codebook",
        "--evaluate",
        "no_such_table.txt",
        "--head-dim",
        "64",
    ]);
    assert!(err.contains("no such file"), "{err}");
    // Above the beta limit the Gaussian limit is still available.
    let (rc, _, err) = tq(&["codebook", "--head-dim", "65536", "--dist", "gaussian"]);
    assert_eq!(rc, 0, "{err}");
}
