//! LDLQ into IQ2_XXS / IQ2_XS / IQ2_S on real data: SmolLM2's `blk.7.ffn_down` (rows of 1536, the
//! matrices whose rows hold 256-value super-blocks) with its Hessian calibrated on Botchan. The
//! blocks are ordinary IQ2 blocks (decoded by the registry's decoders, checked against gguf-py);
//! LDLQ's Hessian-weighted error is compared with llama.cpp's importance-weighted encoder given
//! the same calibration as an imatrix (the Hessian diagonal per token: what `llama-imatrix`
//! measures), at the same bytes.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::s;
use tq::gguf::GgufFile;
use tq::quant::{encode_rows, ldlq, Encoder};
use tq::types::{self, TensorType};

#[test]
fn ldlq_beats_the_imatrix_encoder_on_smollm2_ffn_down() {
    let Some((smol, hs)) = fixtures::smollm2_botchan_hessians(2048) else {
        return;
    };
    let f = GgufFile::open(&smol).unwrap();
    let name = "blk.7.ffn_down.weight";
    let (w, n) = fixtures::tensor_rows(&f, name, 64);
    let h = hs.for_tensor(name).unwrap();
    let imatrix: Vec<f32> = (0..n)
        .map(|i| (h.h[i * n + i] / h.tokens as f64) as f32)
        .collect();
    for ty in [TensorType::IQ2XXS, TensorType::IQ2XS, TensorType::IQ2S] {
        let dec = |b: &[u8]| {
            let mut y = vec![0f32; w.len()];
            types::dequantize(ty, b, &mut y, name).unwrap();
            y
        };
        let im = encode_rows(ty, name, &w, n, &Encoder::Weighted(&imatrix)).unwrap();
        let mut rtn = vec![0u8; im.len()];
        types::quantize(ty, &w, &mut rtn, name).unwrap();
        let fac = ldlq::factor_hessian(ty, h, 0.01, 0.0, 0, name).unwrap();
        assert!(fac.perm.is_none(), "{ty}: natural column order");
        let q = ldlq::quantize_ldlq(ty, &w, n, &fac, 0);
        assert_eq!(q.len(), im.len(), "{ty}: same bytes as the imatrix encoder");
        // The default path: convert's band and shrinkage for the type and its default refit
        // passes.
        let (band, shrink) = (ldlq::default_band(ty), ldlq::default_shrink(ty));
        assert_eq!((band, shrink), (ldlq::IQ_BAND, ldlq::IQ_SHRINK), "{ty}");
        let fac0 = ldlq::factor_hessian(ty, h, 0.01, shrink, 0, name).unwrap();
        let q64 = ldlq::quantize_ldlq(ty, &w, n, &fac0, band);
        let fac2 = ldlq::factor_hessian(ty, h, 0.01, shrink, 2, name).unwrap();
        let q64r = ldlq::quantize_ldlq(ty, &w, n, &fac2, band);
        let loss = |b: &[u8]| ldlq::proxy_loss(&h.h, n, &w, &dec(b));
        let (l_rtn, l_im, l_ldlq, l_64) = (loss(&rtn), loss(&im), loss(&q), loss(&q64));
        let l_64r = loss(&q64r);
        eprintln!(
            "{name} {ty}: H-weighted relative error no imatrix {l_rtn:.3e}, imatrix {l_im:.3e}, LDLQ full {l_ldlq:.3e} ({:.2}x the imatrix's), band {band} shrink {shrink} {l_64:.3e} ({:.2}x), + refit 2 {l_64r:.3e} ({:.2}x)",
            l_ldlq / l_im,
            l_64 / l_im,
            l_64r / l_im
        );
        // The default still beats the imatrix encoder, and the scale refit lowers it further.
        assert!(l_64 < l_im, "{ty}: band {band} {l_64} vs imatrix {l_im}");
        assert!(l_64r < l_64, "{ty}: refit {l_64r} vs band {band} {l_64}");
        assert!(l_im < l_rtn, "{ty}: the imatrix was not used");
        // Issue 30's bar: at most half the imatrix encoder's error (measured 0.39–0.40x with
        // 2048 calibration tokens, docs/bench/iquants.md).
        assert!(l_ldlq <= 0.5 * l_im, "{ty}: {l_ldlq} vs imatrix {l_im}");
        // Deterministic for any thread count (rows are grouped by a fixed partition).
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| ldlq::quantize_ldlq(ty, &w, n, &fac, 0));
        assert!(one == q, "{ty}: bytes depend on the thread count");
    }
}

/// `tq convert --weights iq2_xs --calib TEXT` on a tiny model: the 256-wide `ffn_down` rows are
/// IQ2_XS rounded with LDLQ (recorded in `tq.tensor_methods`), differ from the imatrix-free
/// encoding at the same size, and the file is the same for 1 and 3 threads.
#[test]
fn convert_calib_rounds_iq2_with_ldlq() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    std::fs::write(&model, fixtures::gguf_gen::tiny_llama_tok(2, 64, 256).bytes).unwrap();
    let text = dir.path().join("calib.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(400)).unwrap();
    let p = |n: &str| dir.path().join(n);
    let convert = |extra: &[&str], out: &std::path::Path| {
        let mut a = vec![
            "convert",
            s(&model),
            "--weights",
            "iq2_xs",
            "--target",
            "upstream",
            "-q",
            "-o",
            s(out),
        ];
        a.extend(extra);
        let (code, _, err) = fixtures::tq(&a);
        assert_eq!(code, 0, "{err}");
        GgufFile::open(out).unwrap()
    };
    let calib = [
        "--calib",
        s(&text),
        "--calib-tokens",
        "512",
        "--calib-ctx",
        "32",
    ];
    let mut a1 = calib.to_vec();
    a1.extend(["--threads", "1"]);
    let mut a3 = calib.to_vec();
    a3.extend(["--threads", "3"]);
    let f1 = convert(&a1, &p("ldlq1.gguf"));
    let f3 = convert(&a3, &p("ldlq3.gguf"));
    let rtn = convert(&[], &p("rtn.gguf"));
    let name = "blk.1.ffn_down.weight";
    let methods = format!("{:?}", f1.get("tq.tensor_methods").unwrap());
    assert!(
        methods.contains(&format!("{name}=iq2_xs:ldlq")),
        "{methods}"
    );
    let (t1, t3, tr) = (
        f1.tensor(name).unwrap(),
        f3.tensor(name).unwrap(),
        rtn.tensor(name).unwrap(),
    );
    assert_eq!(t1.ty, TensorType::IQ2XS);
    assert!(f1.tensor_data(t1) == f3.tensor_data(t3), "thread count");
    assert_eq!(t1.size, tr.size);
    assert!(
        f1.tensor_data(t1) != rtn.tensor_data(tr),
        "LDLQ had no effect"
    );
}
