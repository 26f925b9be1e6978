//! Issue 30 diagnosis: the per-matrix Hessian-weighted error of the i-quant encoders on SmolLM2's
//! `ffn_down` matrices (the only i-quant tensors of its IQ presets) under the calibration Hessian
//! and under a held-out one (e.g. from the evaluation text), relative to llama.cpp's imatrix
//! encoder given the calibration Hessian's diagonal. Where LDLQ wins on the calibration tokens
//! but not on held-out ones, it fits the calibration sample rather than the model.
//!
//!   cargo run --release --example iq_proxy -- MODEL.gguf H_CALIB.safetensors H_HELD.safetensors \
//!       iq3_xxs [--layers 0,7,14,21,28] [--rows 128] [--tensor ffn_down] \
//!       [--variants band:damp:refit[:shrink],...]
//!
//! `shrink` s pulls the calibration Hessian towards its diagonal before factoring,
//! `H' = (1 − s)·H + s·diag(H)` (what `tq convert --shrink` does); any type with LDLQ (k-quants and
//! legacy types too) and any tensor role (`--tensor ffn_gate`) can be screened.
//!
//! Prints, per layer and variant, `error / imatrix error` under both Hessians, then the geometric
//! mean over the layers.

use tq::gguf::GgufFile;
use tq::quant::{encode_rows, ldlq, Encoder, Hessians};
use tq::types::{self, TensorType};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
    };
    let (model, hc, hh, ty) = (&args[0], &args[1], &args[2], &args[3]);
    let ty = TensorType::parse(ty).expect("type");
    let layers: Vec<usize> = get("--layers")
        .map(|s| s.split(',').map(|v| v.parse().unwrap()).collect())
        .unwrap_or(vec![0, 7, 14, 21, 28]);
    let rows: usize = get("--rows").map_or(128, |s| s.parse().unwrap());
    let role = get("--tensor").map_or("ffn_down", |s| s.as_str());
    let variants: Vec<(usize, f64, usize, f64)> = get("--variants")
        .map(|s| {
            s.split(',')
                .map(|v| {
                    let p: Vec<&str> = v.split(':').collect();
                    (
                        p[0].parse().unwrap(),
                        p[1].parse().unwrap(),
                        p[2].parse().unwrap(),
                        p.get(3).map_or(0.0, |v| v.parse().unwrap()),
                    )
                })
                .collect()
        })
        .unwrap_or(vec![
            (0, 0.01, 0, 0.0),
            (64, 0.01, 0, 0.0),
            (64, 0.01, 2, 0.0),
            (0, 0.01, 2, 0.0),
        ]);
    let f = GgufFile::open(std::path::Path::new(model)).unwrap();
    let (hc, _) = Hessians::load(std::path::Path::new(hc)).unwrap();
    let (hh, _) = Hessians::load(std::path::Path::new(hh)).unwrap();
    // `--held-minus H_SUB`: the held-out Hessian is H_HELD − H_SUB (e.g. all of a text minus its
    // first windows, the calibration ones: the rest of the same text, disjoint from them).
    let hm = get("--held-minus").map(|p| Hessians::load(std::path::Path::new(p)).unwrap().0);
    let mut logs = vec![(0f64, 0f64); variants.len()];
    println!(
        "{ty}, {rows} rows per matrix; error / imatrix encoder's error (calibration H, held-out H)"
    );
    for &l in &layers {
        let name = format!("blk.{l}.{role}.weight");
        let t = f.tensors.iter().find(|t| t.name == name).unwrap();
        let n = t.dims[0] as usize;
        let mut w = vec![0f32; t.n_elements() as usize];
        types::dequantize(t.ty, f.tensor_data(t), &mut w, &name).unwrap();
        w.truncate(rows * n);
        let (c, h) = (hc.for_tensor(&name).unwrap(), hh.for_tensor(&name).unwrap());
        let held: Vec<f64> = match &hm {
            Some(m) => {
                let m = m.for_tensor(&name).unwrap();
                h.h.iter().zip(&m.h).map(|(a, b)| a - b).collect()
            }
            None => h.h.clone(),
        };
        let imp: Vec<f32> = (0..n)
            .map(|i| (c.h[i * n + i] / c.tokens as f64) as f32)
            .collect();
        let dec = |b: &[u8]| {
            let mut y = vec![0f32; w.len()];
            types::dequantize(ty, b, &mut y, &name).unwrap();
            y
        };
        let im = dec(&encode_rows(ty, &name, &w, n, &Encoder::Weighted(&imp)).unwrap());
        let (ic, ih) = (
            ldlq::proxy_loss(&c.h, n, &w, &im),
            ldlq::proxy_loss(&held, n, &w, &im),
        );
        let mut line = format!("blk.{l:2} imatrix {ic:.3e} {ih:.3e}");
        for (k, &(band, damp, refit, shrink)) in variants.iter().enumerate() {
            let fac = ldlq::factor_hessian(ty, c, damp, shrink, refit, &name).unwrap();
            let q = dec(&ldlq::quantize_ldlq(ty, &w, n, &fac, band));
            let (lc, lh) = (
                ldlq::proxy_loss(&c.h, n, &w, &q) / ic,
                ldlq::proxy_loss(&held, n, &w, &q) / ih,
            );
            logs[k].0 += lc.ln();
            logs[k].1 += lh.ln();
            line += &format!(" | b{band} d{damp} r{refit} s{shrink} {lc:.3} {lh:.3}");
        }
        println!("{line}");
    }
    let nl = layers.len() as f64;
    for (k, &(band, damp, refit, shrink)) in variants.iter().enumerate() {
        println!(
            "geomean band {band} damp {damp} refit {refit} shrink {shrink}: calibration {:.3}x, held-out {:.3}x",
            (logs[k].0 / nl).exp(),
            (logs[k].1 / nl).exp()
        );
    }
}
