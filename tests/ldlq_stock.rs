//! LDLQ into stock GGUF types (issue 18) on real data: SmolLM2 tensors and Hessians calibrated on
//! Botchan. The output blocks are ordinary q8_0 / q5_0 / q4_0 / q2_K / q3_K / q4_K / q5_K / q6_K /
//! iq4_nl / iq4_xs blocks (decoded
//! here by the registry's decoders, which are checked against gguf-py and llama-quantize), and
//! LDLQ lowers the Hessian-weighted error against round-to-nearest at the same bytes.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::s;
use tq::gguf::GgufFile;
use tq::quant::ldlq;
use tq::types::{self, TensorType};

#[test]
fn ldlq_beats_rtn_on_smollm2_tensors_in_stock_types() {
    let Some((smol, hs)) = fixtures::smollm2_botchan_hessians(2048) else {
        return;
    };
    let f = GgufFile::open(&smol).unwrap();
    use TensorType::*;
    for (name, tys) in [
        (
            "blk.7.ffn_down.weight",
            &[Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS][..],
        ),
        // 576 columns: whole 32-value blocks (iq4_nl), not 256 (no k-quant, no iq4_xs).
        ("blk.7.attn_q.weight", &[Q4_0, Q5_0, Q8_0, IQ4NL][..]),
    ] {
        let (w, n) = fixtures::tensor_rows(&f, name, 64);
        let h = hs.for_tensor(name).unwrap();
        for &ty in tys {
            let bytes = ty.bytes_for(w.len() as u64).unwrap() as usize;
            let mut rtn = vec![0u8; bytes];
            types::quantize(ty, &w, &mut rtn, name).unwrap();
            let fac =
                ldlq::factor_hessian(ty, h, 0.01, 0.0, ldlq::Refit::DEFAULT.passes, name).unwrap();
            let q = ldlq::quantize_ldlq(ty, &w, n, &fac, 0);
            assert_eq!(q.len(), bytes, "{ty}: same bytes as round-to-nearest");
            let dec = |b: &[u8]| {
                let mut y = vec![0f32; w.len()];
                types::dequantize(ty, b, &mut y, name).unwrap();
                y
            };
            let l_rtn = ldlq::proxy_loss(&h.h, n, &w, &dec(&rtn));
            let l_ldlq = ldlq::proxy_loss(&h.h, n, &w, &dec(&q));
            let q64 = ldlq::quantize_ldlq(ty, &w, n, &fac, 64);
            let l_64 = ldlq::proxy_loss(&h.h, n, &w, &dec(&q64));
            eprintln!(
                "{name} {ty}: H-weighted relative error RTN {l_rtn:.3e}, LDLQ full {l_ldlq:.3e} ({:.2}x), band 64 {l_64:.3e} ({:.2}x)",
                l_ldlq / l_rtn,
                l_64 / l_rtn
            );
            // Small calibration (4 windows): the gain in this proxy is modest on real tensors
            // (the whole-model KLD gain is larger: docs/bench/stock-ldlq.md), but it must be there.
            assert!(l_ldlq < l_rtn, "{name} {ty}: {l_ldlq} vs {l_rtn}");
            // The 2- and 3-bit grids leave round-to-nearest far more to correct (measured
            // 0.30x / 0.27x).
            if matches!(ty, Q2K | Q3K) {
                assert!(l_ldlq < 0.5 * l_rtn, "{name} {ty}: {l_ldlq} vs {l_rtn}");
            }
        }
    }
}

/// `tq calib --imatrix-out` writes llama.cpp's imatrix; `tq convert --imatrix` reads it back and
/// fits the stock tensors' block parameters under it (recorded in `tq.tensor_methods`), which
/// changes the bytes against round-to-nearest but not the size.
#[test]
fn imatrix_round_trip_through_calib_and_convert() {
    let Some(smol) = fixtures::smollm2() else {
        return;
    };
    let Some(text) = fixtures::botchan() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (hp, ip) = (dir.path().join("h.st"), dir.path().join("im.gguf"));
    let (code, _, err) = fixtures::tq(&[
        "calib",
        s(&smol),
        "--text",
        s(&text),
        "--tokens",
        "256",
        "--ctx",
        "128",
        "-o",
        s(&hp),
        "--imatrix-out",
        s(&ip),
    ]);
    assert_eq!(code, 0, "{err}");
    let im = tq::calib::imatrix::load(&ip).unwrap();
    assert_eq!(im.entries.len(), 210, "every linear weight of SmolLM2");
    let conv = |out: &std::path::Path, extra: &[&str]| {
        let mut a = vec![
            "convert",
            s(&smol),
            "--weights",
            "q5_0",
            "--target",
            "upstream",
            "-q",
            "-o",
            s(out),
        ];
        a.extend_from_slice(extra);
        let (code, _, err) = fixtures::tq(&a);
        assert_eq!(code, 0, "{err}");
        GgufFile::open(out).unwrap()
    };
    let (a, b) = (dir.path().join("rtn.gguf"), dir.path().join("im.gguf.out"));
    let fr = conv(&a, &[]);
    let fi = conv(&b, &["--imatrix", s(&ip)]);
    let methods = format!("{:?}", fi.get("tq.tensor_methods").unwrap());
    // The source is Q4_1, so these are requantized.
    assert!(
        methods.contains("\"blk.3.attn_q.weight=q5_0:requant-imatrix\""),
        "tq.tensor_methods lacks blk.3.attn_q.weight=q5_0:requant-imatrix"
    );
    let t = "blk.3.ffn_up.weight";
    let (tr, ti) = (fr.tensor(t).unwrap(), fi.tensor(t).unwrap());
    assert_eq!(fr.tensor_data(tr).len(), fi.tensor_data(ti).len());
    assert_ne!(fr.tensor_data(tr), fi.tensor_data(ti));
}

/// Q4_1 / Q5_1 (the fallback of llama-quantize's presets for rows that cannot hold a k-quant
/// super-block: SmolLM2's 576-wide matrices) on real rows and Hessians: LDLQ (`tq convert
/// --calib`'s encoder at its default damping, shrinkage and band) has a lower Hessian-weighted
/// error `tr(ΔW H ΔWᵀ)` than llama.cpp's importance-weighted encoder (byte-identical to
/// `llama-quantize --imatrix`: tests/legacy_imatrix_llama.rs) given the same Hessian's diagonal
/// as its imatrix, and than round-to-nearest. The Hessians come from 2,048 Botchan tokens, or
/// from the file `TQ_TEST_HESSIANS` names (docs/bench/presets.md used 8,192 tokens).
///
/// SmolLM2's block matrices are stored as Q4_1, so their values sit on a Q4_1 grid that both
/// weighted encoders re-find (q5_1 at half the step): the off-grid rows here are the q8_0
/// `token_embd` rows (real weights, 576 wide) under the real Hessians of 576-input matrices, and
/// the on-grid rows check that LDLQ re-finds the source grid as well as the imatrix search does.
#[test]
fn q4_1_q5_1_ldlq_beats_the_imatrix_encoder_on_smollm2() {
    use tq::quant::{encode_rows, Encoder};
    let (smol, hs) = match std::env::var_os("TQ_TEST_HESSIANS") {
        Some(p) => match fixtures::smollm2() {
            Some(smol) => (
                smol,
                tq::quant::Hessians::load(std::path::Path::new(&p))
                    .unwrap()
                    .0,
            ),
            None => return,
        },
        None => match fixtures::smollm2_botchan_hessians(2048) {
            Some(x) => x,
            None => return,
        },
    };
    let f = GgufFile::open(&smol).unwrap();
    // 128 token_embd rows spread over the vocabulary.
    let (emb, n) = fixtures::tensor_rows(&f, "token_embd.weight", 49152);
    let off_grid: Vec<f32> = (0..128)
        .flat_map(|r| emb[r * 383 * n..(r * 383 + 1) * n].to_vec())
        .collect();
    drop(emb);
    let (mut sum_l, mut sum_i) = (0f64, 0f64);
    for (hname, rows_of) in [
        ("blk.7.attn_q.weight", "token_embd.weight"),
        ("blk.20.ffn_gate.weight", "token_embd.weight"),
        ("blk.7.attn_q.weight", "blk.7.attn_q.weight"),
    ] {
        let h = hs.for_tensor(hname).unwrap();
        let on_grid = rows_of != "token_embd.weight";
        let w = if on_grid {
            fixtures::tensor_rows(&f, rows_of, 64).0
        } else {
            off_grid.clone()
        };
        let imp: Vec<f32> = (0..n).map(|i| h.h[i * n + i] as f32).collect();
        for ty in [TensorType::Q4_1, TensorType::Q5_1] {
            let loss = |b: &[u8]| {
                let mut y = vec![0f32; w.len()];
                types::dequantize(ty, b, &mut y, rows_of).unwrap();
                ldlq::proxy_loss(&h.h, n, &w, &y)
            };
            let enc = |e: &Encoder| encode_rows(ty, rows_of, &w, n, e).unwrap();
            let rtn = enc(&Encoder::Nearest);
            let imx = enc(&Encoder::Weighted(&imp));
            let fac = ldlq::factor_hessian(
                ty,
                h,
                ldlq::default_damp(ty),
                ldlq::default_shrink(ty),
                ldlq::Refit::DEFAULT.passes,
                hname,
            )
            .unwrap();
            let q = enc(&Encoder::Ldlq {
                factor: &fac,
                band: ldlq::default_band(ty),
                hessian: None,
            });
            assert_eq!(
                (q.len(), imx.len()),
                (rtn.len(), rtn.len()),
                "{ty}: same bytes"
            );
            let (l_rtn, l_imx, l_q) = (loss(&rtn), loss(&imx), loss(&q));
            eprintln!(
                "{rows_of} rows, {hname}'s Hessian, {ty}: H-weighted relative error RTN {l_rtn:.3e}, imatrix {l_imx:.3e} ({:.3}x RTN), LDLQ {l_q:.3e} ({:.3}x imatrix)",
                l_imx / l_rtn,
                l_q / l_imx
            );
            if on_grid {
                // Q4_1 round-to-nearest re-finds its own grid too; q5_1's does not.
                assert!(
                    l_imx <= 1e-3 * l_rtn.max(l_q),
                    "{hname} {ty}: {l_imx} vs {l_rtn}"
                );
                assert!(
                    l_q <= l_imx + 1e-6 * l_rtn,
                    "{hname} {ty}: {l_q} vs {l_imx}"
                );
            } else {
                assert!(
                    l_q < l_imx && l_imx < l_rtn,
                    "{hname} {ty}: {l_q} / {l_imx} / {l_rtn}"
                );
                sum_l += l_q;
                sum_i += l_imx;
            }
        }
    }
    eprintln!("off-grid rows: LDLQ / imatrix = {:.3}", sum_l / sum_i);
}
