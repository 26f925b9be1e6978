//! Rotations and sign generators: numpy's PCG64 reproduced bit for bit (against values dumped by
//! `scripts/oracle/codebooks.py`), the engines' sign arrays, FWHT variants equal, inverse rotations
//! equal to the identity, and the incoherence of each rotation on real SmolLM2 rows.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use serde_json::Value;
use tq::math::hadamard::{fwht, fwht_scalar, rht_forward, rht_inverse};
use tq::math::lloyd_max::{lloyd_max_bits, Dist};
use tq::math::pcg64::{row_signs, turbo_signs, Pcg64, SeedSequence, DEFAULT_ROW_SEED};
use tq::math::rotation::{excess_kurtosis, incoherence, Method, Rotation};
use tq::math::signs::{tq_block_signs, TURBO_S1, TURBO_S2};

fn pcg_oracle() -> Option<Value> {
    fixtures::oracle_json("math/pcg64.json")
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().parse().unwrap())
        .collect()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

#[test]
fn pcg64_matches_numpy() {
    let Some(o) = pcg_oracle() else { return };
    let seeds = o["seeds"].as_array().unwrap();
    assert!(seeds.len() >= 5);
    for s in seeds {
        let seed: u128 = s["seed"].as_str().unwrap().parse().unwrap();
        let ss = SeedSequence::new(seed);
        let pool: Vec<u32> = ints(&s["pool"]).iter().map(|&x| x as u32).collect();
        assert_eq!(ss.pool.to_vec(), pool, "seed {seed}: SeedSequence pool");
        assert_eq!(
            ss.generate_state_u64(4),
            u64s(&s["state_u64x4"]),
            "seed {seed}: generate_state u64"
        );
        let w32: Vec<u32> = ints(&s["state_u32x8"]).iter().map(|&x| x as u32).collect();
        assert_eq!(
            ss.generate_state_u32(8),
            w32,
            "seed {seed}: generate_state u32"
        );
        let mut g = Pcg64::new(seed);
        assert_eq!(
            g.state.to_string(),
            s["init_state"].as_str().unwrap(),
            "seed {seed}: state"
        );
        assert_eq!(
            g.inc.to_string(),
            s["init_inc"].as_str().unwrap(),
            "seed {seed}: inc"
        );
        let raw: Vec<u64> = (0..32).map(|_| g.next_u64()).collect();
        assert_eq!(raw, u64s(&s["raw"]), "seed {seed}: random_raw");
    }
}

#[test]
fn choice_and_integers_match_numpy() {
    let Some(o) = pcg_oracle() else { return };
    let mut g = Pcg64::new(42);
    let s1: Vec<i64> = g.choice_pm1(128).into_iter().map(i64::from).collect();
    let s2: Vec<i64> = g.choice_pm1(128).into_iter().map(i64::from).collect();
    assert_eq!(s1, ints(&o["choice_s1"]));
    assert_eq!(s2, ints(&o["choice_s2"]));
    // ... and the arrays the engines compile in (FORMATS.md §3).
    let e1: Vec<i64> = TURBO_S1.iter().map(|&v| v as i64).collect();
    let e2: Vec<i64> = TURBO_S2.iter().map(|&v| v as i64).collect();
    assert_eq!(s1, e1);
    assert_eq!(s2, e2);
    let (a, b) = turbo_signs();
    assert_eq!((a, b), (TURBO_S1, TURBO_S2));
    // Bounded integers: 32-bit Lemire (ranges 2 and 7, buffered halves) and 64-bit Lemire.
    let mut g = Pcg64::new(42);
    let i2: Vec<i64> = (0..64).map(|_| g.integers_below(2) as i64).collect();
    let i7: Vec<i64> = (0..64).map(|_| g.integers_below(7) as i64).collect();
    let big: Vec<u64> = (0..16)
        .map(|_| g.integers_below(1_000_000_000_000))
        .collect();
    assert_eq!(i2, ints(&o["integers_0_2"]));
    assert_eq!(i7, ints(&o["integers_0_7"]));
    assert_eq!(big, u64s(&o["integers_0_1e12"]));
}

#[test]
fn own_row_signs_match_numpy_bits() {
    let Some(o) = pcg_oracle() else { return };
    for (_, v) in o["own_signs"].as_object().unwrap() {
        let seed = v["seed"].as_u64().unwrap();
        let n = v["n"].as_u64().unwrap() as usize;
        let want: Vec<f32> = ints(&v["signs"]).iter().map(|&x| x as f32).collect();
        assert_eq!(row_signs(seed, n), want, "seed {seed} n {n}");
    }
    assert_eq!(DEFAULT_ROW_SEED, 0x7471);
}

#[test]
fn golden_ratio_signs_match() {
    let s = tq_block_signs();
    if let Some(o) = pcg_oracle() {
        let want: Vec<f32> = ints(&o["golden_ratio_signs"])
            .iter()
            .map(|&x| x as f32)
            .collect();
        assert_eq!(s.to_vec(), want);
    }
    // Independent of the dump: the definition.
    for (i, v) in s.iter().enumerate() {
        let top = ((i as u64 * 0x9E37_79B9) & 0xFFFF_FFFF) >> 31;
        assert_eq!(*v, if top == 1 { -1.0 } else { 1.0 });
    }
}

/// Deterministic test data: N(0,1) by Box–Muller from the PCG64 stream.
fn gaussian(seed: u64, n: usize) -> Vec<f32> {
    let mut g = Pcg64::new(seed as u128);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let u1 = ((g.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = ((g.next_u64() >> 11) as f64) / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        out.push((r * (2.0 * std::f64::consts::PI * u2).cos()) as f32);
        out.push((r * (2.0 * std::f64::consts::PI * u2).sin()) as f32);
    }
    out.truncate(n);
    out
}

#[test]
fn fwht_optimized_equals_scalar() {
    for n in [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384] {
        let x = gaussian(n as u64, n);
        let (mut a, mut b) = (x.clone(), x.clone());
        fwht_scalar(&mut a);
        fwht(&mut b);
        assert!(
            a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
            "n = {n}"
        );
    }
}

#[test]
fn inverse_rotations_are_identity() {
    // Power-of-two randomized Hadamard.
    for n in [32usize, 128, 4096, 16384] {
        let x = gaussian(1000 + n as u64, n);
        let s = row_signs(DEFAULT_ROW_SEED, n);
        let mut y = x.clone();
        rht_forward(&mut y, &s);
        rht_inverse(&mut y, &s);
        let err = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        // log2(n) butterfly levels of f32 rounding on values of size ~√n·|x|/√n.
        assert!(err < 1e-6 * (n as f32).log2() * 4.0, "n {n}: {err}");
    }
    // Every method on awkward lengths.
    for n in [
        3usize, 12, 20, 48, 96, 172, 320, 576, 768, 1536, 2304, 5120, 1000,
    ] {
        for m in [Method::Auto, Method::Dct, Method::Block, Method::ZeroPad] {
            let r = Rotation::new(n, m, DEFAULT_ROW_SEED).unwrap();
            let x = gaussian(n as u64, n);
            let y = r.forward(&x);
            let (ex, ey): (f64, f64) = (
                x.iter().map(|v| (*v as f64).powi(2)).sum(),
                y.iter().map(|v| (*v as f64).powi(2)).sum(),
            );
            assert!(
                (ex - ey).abs() < 1e-5 * ex,
                "n {n} {m:?}: norm {ex} -> {ey}"
            );
            let z = r.inverse(&y);
            let err = x
                .iter()
                .zip(&z)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                err < 1e-5,
                "n {n} {m:?} ({}): max error {err}",
                r.describe()
            );
        }
    }
    assert!(Rotation::new(172, Method::Hadamard, 1).is_err());
}

struct Stats {
    mu_mean: f64,
    mu_p99: f64,
    mu_max: f64,
    kurt: f64,
    q3: f64,
}

/// Incoherence, excess kurtosis and the 3-bit N(0,1) Lloyd-Max error (per-row RMS scale,
/// relative to the row energy; 0.0345 for Gaussian rows) over a set of rows.
fn stats(rows: &[Vec<f32>]) -> Stats {
    let cb = lloyd_max_bits(&Dist::Normal01, 3);
    let mut mus: Vec<f64> = rows.iter().map(|r| incoherence(r)).collect();
    mus.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let kurt = rows.iter().map(|r| excess_kurtosis(r)).sum::<f64>() / rows.len() as f64;
    let mut q3 = 0.0;
    for r in rows {
        let e: f64 = r.iter().map(|&v| (v as f64).powi(2)).sum();
        let rms = (e / r.len() as f64).sqrt();
        if rms == 0.0 {
            continue;
        }
        let err: f64 = r
            .iter()
            .map(|&v| {
                let u = v as f64 / rms;
                let k = cb.thresholds.iter().filter(|&&t| u >= t).count();
                (u - cb.centroids[k]).powi(2) * rms * rms
            })
            .sum();
        q3 += err / e;
    }
    Stats {
        mu_mean: mus.iter().sum::<f64>() / mus.len() as f64,
        mu_p99: mus[(mus.len() * 99) / 100],
        mu_max: *mus.last().unwrap(),
        kurt,
        q3: q3 / rows.len() as f64,
    }
}

/// Incoherence of every rotation option on real SmolLM2-135M rows (lengths 576 and 1536, and
/// 172 = 43·4, which has no Hadamard order: the first 172 entries of the 576-wide rows).
/// Prints a Markdown table (run with `--nocapture`); the numbers are in docs/codebook.md.
#[test]
fn smollm2_incoherence() {
    let Some(path) = fixtures::smollm2() else {
        return;
    };
    let f = tq::gguf::GgufFile::open(&path).unwrap();
    let layers = [0usize, 10, 20, 29];
    // (row length, width of the source tensors, tensors)
    let groups: [(usize, usize, &[&str]); 3] = [
        (576, 576, &["attn_q", "attn_k", "attn_output", "ffn_up"]),
        (1536, 1536, &["ffn_down"]),
        (172, 576, &["attn_q", "attn_k", "attn_output", "ffn_up"]),
    ];
    let mut report = String::from(
        "| row length | rotation | rows | mean μ | p99 μ | max μ | excess kurtosis | 3-bit NMSE |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (len, width, names) in groups {
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for l in layers {
            for nm in names {
                let name = format!("blk.{l}.{nm}.weight");
                let t = f.tensor(&name).unwrap_or_else(|| panic!("{name} missing"));
                assert_eq!(t.dims[0] as usize, width, "{name}");
                let v = f.tensor_f32(t).unwrap();
                rows.extend(v.chunks_exact(width).map(|r| r[..len].to_vec()));
            }
        }
        let mut line = |label: &str, rs: &[Vec<f32>]| -> Stats {
            let s = stats(rs);
            report.push_str(&format!(
                "| {len} | {label} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.4} |\n",
                rs.len(),
                s.mu_mean,
                s.mu_p99,
                s.mu_max,
                s.kurt,
                s.q3
            ));
            s
        };
        let none = line("none", &rows);
        let mut by_method = Vec::new();
        for m in [Method::Auto, Method::Dct, Method::Block, Method::ZeroPad] {
            let r = Rotation::new(len, m, DEFAULT_ROW_SEED).unwrap();
            let rot: Vec<Vec<f32>> = rows.iter().map(|x| r.forward(x)).collect();
            let label = format!("{} ({})", m.name(), r.describe());
            by_method.push((m, line(&label, &rot)));
        }
        let gauss: Vec<Vec<f32>> = (0..rows.len())
            .map(|i| gaussian(i as u64 + 7, len))
            .collect();
        let g = line("i.i.d. Gaussian rows (reference)", &gauss);
        let auto = &by_method[0].1;
        let block = &by_method[2].1;
        // The chosen rotation must make rows about as incoherent as Gaussian noise, and beat
        // block-diagonal Hadamard and no rotation.
        assert!(
            auto.mu_mean < none.mu_mean,
            "{len}: auto {} vs none {}",
            auto.mu_mean,
            none.mu_mean
        );
        assert!(
            auto.mu_mean <= block.mu_mean * 1.02,
            "{len}: auto {} vs block {}",
            auto.mu_mean,
            block.mu_mean
        );
        assert!(
            auto.mu_mean < g.mu_mean * 1.10,
            "{len}: auto {} vs gaussian {}",
            auto.mu_mean,
            g.mu_mean
        );
        assert!(
            auto.q3 < g.q3 * 1.10,
            "{len}: auto 3-bit NMSE {} vs gaussian {}",
            auto.q3,
            g.q3
        );
    }
    eprintln!("{report}");
}
