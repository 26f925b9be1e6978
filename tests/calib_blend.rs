//! `tq calib blend` through the binary: the blended file keeps the first file's diagonal and
//! moves its off-diagonal entries; a prior of another shape or a weight outside [0, 1] is refused
//! with one line naming the problem, exit 2, and no output file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tq::quant::{Hessian, Hessians, Store};

fn tq(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .output()
        .unwrap()
}

/// A Hessian file with one group `X Xᵀ` of `n` inputs from a fixed pseudo-random `X`.
fn hessian_file(dir: &Path, name: &str, n: usize, seed: u64) -> PathBuf {
    let rows = 3 * n;
    let mut s = seed;
    let x: Vec<f64> = (0..rows * n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        })
        .collect();
    let mut h = vec![0f64; n * n];
    for r in x.chunks_exact(n) {
        for i in 0..n {
            for j in 0..n {
                h[i * n + j] += r[i] * r[j];
            }
        }
    }
    let mut hs = Hessians::default();
    hs.groups.insert(
        "a.weight".into(),
        Hessian {
            tensors: vec!["a.weight".into()],
            n,
            h,
            tokens: rows as u64,
        },
    );
    let meta = BTreeMap::from([
        ("tq.complete".to_string(), "true".to_string()),
        ("tq.fingerprint".to_string(), format!("m.gguf:1:{name}:512")),
    ]);
    let p = dir.join(format!("{name}.safetensors"));
    hs.save(&p, &meta, Store::F64).unwrap();
    p
}

#[test]
fn calib_blend_cli() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (h, p) = (hessian_file(d, "h", 8, 1), hessian_file(d, "p", 8, 2));
    let out = d.join("b.safetensors");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let o = tq(&[
        "calib",
        "blend",
        &s(&h),
        &s(&p),
        "--weight",
        "0.5",
        "-o",
        &s(&out),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (a, _) = Hessians::load(&h).unwrap();
    let (b, meta) = Hessians::load(&out).unwrap();
    let (a, b) = (&a.groups["a.weight"], &b.groups["a.weight"]);
    assert_eq!(b.tokens, a.tokens);
    assert_eq!(meta["tq.prior_weight"], "0.5");
    for i in 0..8 {
        assert_eq!(b.h[i * 8 + i], a.h[i * 8 + i]);
        for j in (0..8).filter(|&j| j != i) {
            assert_ne!(b.h[i * 8 + j], a.h[i * 8 + j], "({i}, {j}) unchanged");
        }
    }

    let other = hessian_file(d, "o", 6, 3);
    for (args, want) in [
        (vec![s(&h), s(&other)], "other Hessian groups"),
        (
            vec![s(&h), s(&p), "--weight".into(), "2".into()],
            "--weight 2",
        ),
    ] {
        let bad = d.join("bad.safetensors");
        let mut a: Vec<String> = vec!["calib".into(), "blend".into()];
        a.extend(args);
        a.extend(["-o".to_string(), s(&bad)]);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = tq(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains(want) && err.trim().lines().count() == 1,
            "{err}"
        );
        assert!(!bad.exists());
    }
}
