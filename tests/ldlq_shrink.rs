//! `tq convert --shrink S`: the Hessian pulled towards its diagonal before LDLQ (issue 30). On
//! real data (SmolLM2's `ffn_down`, Botchan), with few calibration tokens, LDLQ at full strength
//! fits the calibration sample: its error under the calibration Hessian is far below the imatrix
//! encoder's while under a Hessian of other text it is not. Shrinking trades a little of the first
//! for more of the second. The held-out Hessian is that of the next windows of the same text
//! (4,096 tokens minus the 2,048 calibrated on: disjoint windows).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use tq::gguf::GgufFile;
use tq::quant::{ldlq, Encoder};
use tq::types::{self, TensorType};

#[test]
fn shrink_trades_calibration_fit_for_held_out_error() {
    let Some((smol, cal)) = fixtures::smollm2_botchan_hessians(2048) else {
        return;
    };
    let Some((_, all)) = fixtures::smollm2_botchan_hessians(4096) else {
        return;
    };
    let f = GgufFile::open(&smol).unwrap();
    let name = "blk.7.ffn_down.weight";
    let (w, n) = fixtures::tensor_rows(&f, name, 64);
    let c = cal.for_tensor(name).unwrap();
    let a = all.for_tensor(name).unwrap();
    assert_eq!((c.tokens, a.tokens), (2048, 4096));
    // The Hessian of windows 4..8 alone.
    let held: Vec<f64> = a.h.iter().zip(&c.h).map(|(x, y)| x - y).collect();
    let ty = TensorType::IQ3XXS;
    let dec = |b: &[u8]| {
        let mut y = vec![0f32; w.len()];
        types::dequantize(ty, b, &mut y, name).unwrap();
        y
    };
    let imp: Vec<f32> = (0..n)
        .map(|i| (c.h[i * n + i] / c.tokens as f64) as f32)
        .collect();
    let im = dec(&tq::quant::encode_rows(ty, name, &w, n, &Encoder::Weighted(&imp)).unwrap());
    let (im_c, im_h) = (
        ldlq::proxy_loss(&c.h, n, &w, &im),
        ldlq::proxy_loss(&held, n, &w, &im),
    );
    let run = |s: f64| {
        let fac = ldlq::factor_hessian(ty, c, 0.01, s, 2, name).unwrap();
        let q = ldlq::quantize_ldlq(ty, &w, n, &fac, 0);
        let y = dec(&q);
        let r = (
            ldlq::proxy_loss(&c.h, n, &w, &y) / im_c,
            ldlq::proxy_loss(&held, n, &w, &y) / im_h,
        );
        eprintln!(
            "{name} {ty} full band, shrink {s}: error / imatrix encoder's: calibration {:.3}, held-out {:.3}",
            r.0, r.1
        );
        (q, r)
    };
    let (q0, (cal0, held0)) = run(0.0);
    let (_, (cal5, held5)) = run(0.5);
    // Shrink 0 is the Hessian as calibrated: the same bytes as factoring it directly.
    let direct = ldlq::factor(&c.h, n, 0.01, name).unwrap();
    let via = ldlq::factor_hessian(ty, c, 0.01, 0.0, 0, name).unwrap();
    assert_eq!(
        ldlq::quantize_ldlq(ty, &w, n, &via, 0),
        ldlq::quantize_ldlq(ty, &w, n, &direct, 0)
    );
    assert_ne!(
        q0,
        ldlq::quantize_ldlq(ty, &w, n, &direct, 0),
        "refit 2 changes the bytes"
    );
    // Overfit without shrinkage: far better than the imatrix encoder on the calibration tokens,
    // much less so on the next ones.
    assert!(cal0 < 0.7 && held0 > cal0 + 0.2, "{cal0} {held0}");
    // Shrinking gives up calibration fit and gains on held-out tokens.
    assert!(cal5 > cal0, "calibration error {cal5} vs {cal0}");
    assert!(held5 < held0, "held-out error {held5} vs {held0}");
}
