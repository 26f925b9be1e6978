//! The one encoder path, held: the bytes the mix's sensitivity pass measures for a sampled row are
//! the bytes the converted file holds, for every calibrated encoder (LDLQ from text, the imatrix's
//! weighted fit, round-to-nearest) and the types that have them.

use super::{convert, ConvertFlags, Job};
use crate::calib::input::{calibrate_text, TextOptions};
use crate::quant::sensitivity::{encode, sample_rows, Factors, Weighting};
use crate::types::profile::Profile;
use crate::types::TensorType;

#[test]
fn sensitivity_bytes_are_the_converted_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let model = p("m.gguf");
    std::fs::write(&model, crate::gguf_gen::tiny_llama_tok(1, 256, 256).bytes).unwrap();
    let text = p("t.txt");
    std::fs::write(&text, crate::gguf_gen::pseudo_text(500)).unwrap();
    let o = TextOptions {
        tokens: 256,
        ctx: 32,
        batch: 4,
        quiet: true,
    };
    let profile = Profile::default();
    let hs = calibrate_text(&model, &profile, &text, &o).unwrap();
    let im_path = p("im.gguf");
    crate::calib::imatrix::write_gguf(&hs.diagonals(), &im_path, "t", 32).unwrap();
    let im = crate::calib::imatrix::load(&im_path).unwrap().entries;
    let src = crate::source::open(&model, &profile).unwrap();
    let names = ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"];
    use TensorType::*;
    for ty in [
        TQ4_1S, TQ3_1S, TQ2R, TQ2T, Q2K, Q4K, Q6K, IQ4XS, IQ4NL, Q4_0, Q8_0,
    ] {
        for mode in ["rtn", "imatrix", "ldlq"] {
            let out = p(&format!("{ty}-{mode}.gguf"));
            let mut f = ConvertFlags {
                input: model.clone(),
                output: Some(out.clone()),
                weights: Some(ty.name().into()),
                quiet: true,
                calib_tokens: o.tokens,
                calib_ctx: o.ctx,
                calib_batch: o.batch,
                kld_windows: 2,
                ..Default::default()
            };
            match mode {
                "imatrix" => f.imatrix = Some(im_path.clone()),
                "ldlq" => f.calib = Some(text.clone()),
                _ => {}
            }
            let job = Job::resolve(f).unwrap();
            convert(&job).unwrap();
            let file = crate::gguf::GgufFile::open(&out).unwrap();
            for name in names {
                let i = src.tensors().iter().position(|t| t.name == name).unwrap();
                let dims = &src.tensors()[i].dims;
                let (n, n_rows) = (dims[0] as usize, dims[1]);
                let picks = sample_rows(n_rows, 5);
                let mut rows = vec![0f32; picks.len() * n];
                for (r, b) in picks.iter().zip(rows.chunks_mut(n)) {
                    src.read_rows_f32(i, *r, b).unwrap();
                }
                let imp = im.get(name).unwrap();
                let w = match mode {
                    "ldlq" => Weighting::Hessian {
                        h: hs.for_tensor(name).unwrap(),
                        ldlq: Default::default(),
                    },
                    "imatrix" => Weighting::Diagonal(imp),
                    _ => Weighting::Identity,
                };
                let ours = encode(name, &rows, n, ty, &w, &mut Factors::new()).unwrap();
                let t = file.tensor(name).unwrap();
                assert_eq!(t.ty, ty, "{name}");
                let data = file.tensor_data(t);
                let rb = ty.bytes_for(n as u64).unwrap() as usize;
                for (k, &r) in picks.iter().enumerate() {
                    let r = r as usize;
                    assert_eq!(
                        &ours[k * rb..(k + 1) * rb],
                        &data[r * rb..(r + 1) * rb],
                        "{ty} {mode}: {name} row {r}: sensitivity and convert disagree"
                    );
                }
            }
        }
    }
}

/// `tq convert --target-bpw --calib TEXT --kld-text`: the mix that calibrates block by block in
/// each pass (holding one block's Hessians) chooses the plan, measures the probes' and the plans'
/// KLDs and writes the bytes of the mix that calibrated once and held every Hessian, bit for bit.
#[test]
fn streamed_mix_is_the_in_memory_mix() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let (model, text, _) = crate::calib::input::tiny_model_and_text(dir.path());
    let run = |in_memory: bool| {
        let out = p(&format!("mix-{in_memory}.gguf"));
        let f = ConvertFlags {
            input: model.clone(),
            output: Some(out.clone()),
            target: Some("upstream".into()),
            target_bpw: Some(5.0),
            calib: Some(text.clone()),
            calib_tokens: 512,
            calib_ctx: 64,
            calib_batch: 4,
            kld_text: Some(text.clone()),
            kld_windows: 2,
            kld_probes: 6,
            mix_rows: 64,
            mix_exact_rows: crate::quant::sensitivity::EXACT_ROWS,
            quiet: true,
            mix_in_memory: in_memory,
            ..Default::default()
        };
        let o = convert(&Job::resolve(f).unwrap()).unwrap();
        (o, std::fs::read(&out).unwrap())
    };
    let (a, bytes_a) = run(false);
    let (b, bytes_b) = run(true);
    let types = |o: &super::Outcome| -> Vec<(String, TensorType)> {
        o.plan
            .entries
            .iter()
            .map(|e| (e.name.clone(), e.dst))
            .collect()
    };
    assert_eq!(types(&a), types(&b), "the plans differ");
    let (ma, mb) = (a.mix.as_ref().unwrap(), b.mix.as_ref().unwrap());
    let probes = |m: &super::mix::MixReport| -> Vec<(String, TensorType, u64, u64)> {
        m.probes
            .iter()
            .map(|p| (p.tensor.clone(), p.ty, p.err.to_bits(), p.kld.to_bits()))
            .collect()
    };
    assert!(!ma.probes.is_empty() && ma.probes.iter().all(|p| p.kld > 0.0));
    assert!(
        ma.probes.iter().any(|p| p.tensor.starts_with("blk.")),
        "probes in the blocks (Hessian data from a pass)"
    );
    assert_eq!(probes(ma), probes(mb), "the probes differ");
    let tried = |m: &super::mix::MixReport| -> Vec<(String, u64, u64)> {
        m.tried
            .iter()
            .map(|t| (t.name.clone(), t.file, t.kld.to_bits()))
            .collect()
    };
    assert!(ma.tried.len() >= 2, "several plans measured");
    assert_eq!(tried(ma), tried(mb), "the measured plans differ");
    assert_eq!(
        ma.err.to_bits(),
        mb.err.to_bits(),
        "the sensitivity differs"
    );
    assert_eq!(ma.chosen, mb.chosen);
    assert!(bytes_a == bytes_b, "the written files differ");
}
