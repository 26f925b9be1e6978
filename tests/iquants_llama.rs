//! The IQ2 encoders (IQ2_XXS, IQ2_XS, IQ2_S) against llama.cpp's own `llama-quantize`, byte for
//! byte. llama.cpp quantizes these types only with an importance matrix (IQ2_XXS / IQ2_XS assert
//! one; llama-quantize refuses all three without `--imatrix` except for `token_embd` / `output`),
//! so every case writes an imatrix with tq (`calib::imatrix::write_gguf`), runs
//! `llama-quantize --imatrix FILE --pure in.gguf out.gguf TYPE` and encodes the same tensors with
//! tq's `Encoder::Weighted` given the same imatrix as `tq::calib::imatrix::load` reads it:
//!
//! * `imatrix_ones`: importance 1 everywhere, which is also what the registry's IQ2_XXS / IQ2_XS
//!   encoders (no imatrix) use — checked equal to them here;
//! * `imatrix_spread`: per-column importance 1/100 .. 100, as real imatrices have;
//! * `no_imatrix` (IQ2_S only): `token_embd.weight` and `output.weight`, which llama-quantize
//!   writes without an imatrix (ggml's own weights `σ²/4 + x²`), against the registry's IQ2_S;
//! * `smollm2_ffn_down`: SmolLM2's 30 `ffn_down` matrices (rows of 1536) decoded to f32, with a
//!   spread imatrix.
//!
//! llama-quantize's `IQ2_M` file type has IQ2_S as its default tensor type (and `IQ2_S` has
//! IQ2_XS), so `--pure IQ2_M` writes IQ2_S tensors. Each case checks recorded hashes of
//! llama-quantize's output (`fixtures/iq2_expected.json`, recorded with `TQ_KQ_RECORD=1` by
//! `scripts/dev/kquants_llama_oracle.sh`) everywhere, and llama-quantize live where it is built
//! (missing: recorded as not run, a failure under `TQ_REQUIRE_DATA=1`).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use std::process::Command;

use fixtures::gguf_gen::{gaussian, pseudo_bytes};
use fixtures::llama_oracle::{
    first_diff, llama_metadata, registry_bytes, run_llama, smollm2_ffn_down, write_f32_gguf,
    Expected, Tensor, SMOLLM2_SHAPE,
};
use serde_json::{json, Value as Json};
use tq::gguf::GgufFile;
use tq::quant::{encode_rows, Diagonal, Encoder};
use tq::types::TensorType;

/// (type, llama-quantize file type whose default tensor type it is).
const IQ2: [(&str, &str); 3] = [
    ("iq2_xxs", "IQ2_XXS"),
    ("iq2_xs", "IQ2_XS"),
    ("iq2_s", "IQ2_M"),
];

const EXPECTED: Expected = Expected {
    path: "fixtures/iq2_expected.json",
    about: "Facts from llama.cpp (the copy vendored in the PyPI sdist llama-cpp-python==0.3.36, built by scripts/build-llama.sh): blake3 of each tensor's data bytes as written by llama-quantize [--imatrix FILE] --pure <in.gguf> <out.gguf> {IQ2_XXS,IQ2_XS,IQ2_M} from F32 input, the imatrix written by tq (see tests/iquants_llama.rs for the tensors and importances). Recorded by scripts/dev/kquants_llama_oracle.sh; checked by tests/iquants_llama.rs.",
    script: "scripts/dev/kquants_llama_oracle.sh",
    record_var: "TQ_KQ_RECORD",
};

/// `general.name` of the F32 input files.
const NAME: &str = "tq iq2 oracle";

/// 16 edge rows of 256: zeros, constants, tiny values around both group epsilons, one spike,
/// exact lattice values, odd sign counts, sparse rows, large values.
fn edge_rows() -> Vec<f32> {
    let g = |seed: u64| gaussian(seed, 256, 1.0);
    let mut spike = vec![0.0; 256];
    spike[37] = 3.0;
    let rows: Vec<Vec<f32>> = vec![
        vec![0.0; 256],
        vec![0.5; 256],
        vec![-0.75; 256],
        g(301).iter().map(|v| v * 1e-9).collect(), // below IQ2_S's epsilon only
        g(302).iter().map(|v| v * 1e-20).collect(), // below both
        spike,
        (0..256).map(|i| [8.0, 25.0, 43.0][i % 3]).collect(), // the decoded levels
        (0..256)
            .map(|i| if i % 8 == 3 { -1.0 } else { 1.0 })
            .collect(), // one negative per row: odd parity
        g(305)
            .iter()
            .enumerate()
            .map(|(i, v)| if i < 128 { 0.0 } else { *v })
            .collect(),
        g(306).iter().map(|v| v * 1e4).collect(),
        g(307).iter().map(|v| v.abs() + 0.1).collect(),
        g(308).iter().map(|v| -v.abs() - 0.1).collect(),
        g(309)
            .iter()
            .zip(pseudo_bytes(310, 256))
            .map(|(v, b)| if b < 230 { 0.0 } else { *v })
            .collect(),
        g(311)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1u32 << (i / 32)) as f32)
            .collect(),
        vec![-0.0; 256],
        g(312)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 16 == 5 { 1e3 } else { v * 1e-3 })
            .collect(),
    ];
    rows.concat()
}

fn synthetic(prefix: &str) -> Vec<Tensor> {
    let mut ts = Vec::new();
    let mut add = |name: &str, cols: u64, rows: u64, data: Vec<f32>| {
        assert_eq!(data.len() as u64, cols * rows, "{name}");
        ts.push(Tensor {
            name: format!("{prefix}{name}"),
            dims: [cols, rows],
            data,
        });
    };
    add("attn_q.weight", 256, 48, gaussian(101, 256 * 48, 0.02));
    let ranged = fixtures::llama_oracle::ranged_rows(32);
    add("ffn_up.weight", 512, 32, ranged);
    let heavy = fixtures::llama_oracle::heavy_rows(24);
    add("ffn_down.weight", 768, 24, heavy);
    add("attn_output.weight", 256, 16, edge_rows());
    add(
        "ffn_gate.weight",
        1024,
        8,
        fixtures::gguf_gen::uniform(105, 1024 * 8),
    );
    ts
}

/// Per-column importance for every tensor: `ones` (exactly 1 after llama's `sum / count`) or a
/// spread 1/100 .. 100.
fn imatrix_diagonals(ts: &[Tensor], ones: bool) -> Vec<Diagonal> {
    ts.iter()
        .enumerate()
        .map(|(k, t)| Diagonal {
            tensors: vec![t.name.clone()],
            tokens: 64,
            d: if ones {
                vec![64.0; t.dims[0] as usize]
            } else {
                fixtures::gguf_gen::uniform(900 + k as u64, t.dims[0] as usize)
                    .iter()
                    .map(|u| 64.0 * 10f64.powf(2.0 * *u as f64))
                    .collect()
            },
        })
        .collect()
}

/// How tq encodes one case.
#[derive(Clone, Copy)]
enum Ours<'a> {
    /// The registry's encoder (no imatrix).
    Registry,
    /// `--imatrix`: the importance-weighted encoder, the imatrix as tq loads it.
    Imatrix(&'a tq::calib::imatrix::Imatrix),
}

fn ours(ty: TensorType, t: &Tensor, how: Ours) -> Vec<u8> {
    match how {
        Ours::Registry => registry_bytes(ty, t),
        Ours::Imatrix(im) => {
            let imp = im.for_tensor(&t.name).expect("imatrix entry");
            let enc = Encoder::choose(ty, None, Some(imp));
            assert_eq!(enc.name(), "imatrix", "{ty}");
            encode_rows(ty, &t.name, &t.data, t.dims[0] as usize, &enc).expect("encode")
        }
    }
}

/// One case: recorded hashes always; llama-quantize live (and re-recording) when it is built.
/// `imatrix`: the diagonals to write as llama.cpp's imatrix (`None`: no `--imatrix`).
fn check_case(key: &str, ts: &[Tensor], tys: &[(&str, &str)], imatrix: Option<Vec<Diagonal>>) {
    let dir = tempfile::tempdir().unwrap();
    let im_path = dir.path().join("imatrix.gguf");
    let im = imatrix.map(|d| {
        tq::calib::imatrix::write_gguf(&d, &im_path, "synthetic", 64).unwrap();
        tq::calib::imatrix::load(&im_path).unwrap()
    });
    let how = im.as_ref().map_or(Ours::Registry, Ours::Imatrix);
    let mine: Vec<Vec<Vec<u8>>> = tys
        .iter()
        .map(|(tn, _)| {
            let ty = TensorType::from_name(tn).unwrap();
            ts.iter().map(|t| ours(ty, t, how)).collect()
        })
        .collect();
    if let Some(bin) = fixtures::llama_quantize() {
        let inp = dir.path().join("in-f32.gguf");
        let (l, e, h) = SMOLLM2_SHAPE;
        write_f32_gguf(&inp, llama_metadata(NAME, l, e, h), ts);
        let mut section = serde_json::Map::new();
        let mut problems = Vec::new();
        for ((tname, ftype), mine) in tys.iter().zip(&mine) {
            let ty = TensorType::from_name(tname).unwrap();
            let out = dir.path().join(format!("{tname}.gguf"));
            let theirs = run_llama(&bin, &inp, &out, ftype, im.as_ref().map(|_| &*im_path));
            let mut hashes = serde_json::Map::new();
            let mut same = 0;
            for (t, ob) in ts.iter().zip(mine) {
                let (lty, lb) = &theirs[&t.name];
                assert_eq!(*lty, ty, "{}: llama-quantize wrote {lty}", t.name);
                hashes.insert(t.name.clone(), json!(fixtures::blake3_hex(lb)));
                match first_diff(ty, t, ob, lb) {
                    None => same += 1,
                    Some(d) => problems.push(d),
                }
            }
            eprintln!(
                "{key} {tname}: {same}/{} tensors byte-identical to llama-quantize",
                ts.len()
            );
            section.insert(tname.to_string(), Json::Object(hashes));
        }
        if EXPECTED.recording() {
            EXPECTED.record(key, Json::Object(section));
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
    let exp = EXPECTED.load();
    let mut bad = Vec::new();
    for ((tname, _), mine) in tys.iter().zip(&mine) {
        for (t, ob) in ts.iter().zip(mine) {
            let want = exp[key][tname][&t.name]
                .as_str()
                .unwrap_or_else(|| panic!("no recorded hash for {key} {tname} {}", t.name));
            if fixtures::blake3_hex(ob) != want {
                bad.push(format!("{tname} {}", t.name));
            }
        }
    }
    assert!(bad.is_empty(), "{key}: differ from llama-quantize: {bad:?}");
}

#[test]
fn imatrix_ones_matches_llama_and_the_registry() {
    let ts = synthetic("blk.0.");
    // Importance 1 is the registry's IQ2_XXS / IQ2_XS encoder.
    let d = imatrix_diagonals(&ts, true);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ones.gguf");
    tq::calib::imatrix::write_gguf(&d, &p, "ones", 64).unwrap();
    let im = tq::calib::imatrix::load(&p).unwrap();
    for tn in ["iq2_xxs", "iq2_xs"] {
        let ty = TensorType::from_name(tn).unwrap();
        for t in &ts {
            assert!(
                im.for_tensor(&t.name).unwrap().iter().all(|&v| v == 1.0),
                "ones"
            );
            assert_eq!(
                ours(ty, t, Ours::Registry),
                ours(ty, t, Ours::Imatrix(&im)),
                "{tn} {}",
                t.name
            );
        }
    }
    check_case("imatrix_ones", &ts, &IQ2, Some(d));
}

#[test]
fn imatrix_spread_matches_llama() {
    let ts = synthetic("blk.1.");
    let d = imatrix_diagonals(&ts, false);
    check_case("imatrix_spread", &ts, &IQ2, Some(d));
}

/// IQ2_S without an imatrix: the tensors llama-quantize writes without one.
#[test]
fn iq2_s_without_imatrix_matches_llama() {
    let mut s = synthetic("");
    let mut edge = s.swap_remove(3);
    let mut g = s.swap_remove(0);
    edge.name = "token_embd.weight".into();
    g.name = "output.weight".into();
    let ts = [edge, g];
    check_case("no_imatrix", &ts, &IQ2[2..], None);
}

#[test]
fn smollm2_ffn_down_matches_llama() {
    let Some(ts) = smollm2_ffn_down() else { return };
    let d = imatrix_diagonals(&ts, false);
    check_case("smollm2_ffn_down", &ts, &IQ2, Some(d));
}

/// `tq convert --weights iq2_xs` writes the registry's IQ2_XS bytes where rows hold 256-value
/// super-blocks (falling back to iq4_nl elsewhere, as llama-quantize does), with `--imatrix` the
/// importance-weighted bytes (`Encoder::Weighted`, checked against llama-quantize above), and the
/// same file for any thread count.
#[test]
fn convert_writes_iq2_with_and_without_imatrix() {
    let dir = tempfile::tempdir().unwrap();
    // n_embd 64: attention/ffn_gate/up rows of 64 fall back; ffn_down rows of 256 hold IQ2.
    let fx = fixtures::gguf_gen::tiny_llama(1, 64, 256, 96);
    let inp = dir.path().join("in.gguf");
    std::fs::write(&inp, &fx.bytes).unwrap();
    let src = GgufFile::open(&inp).unwrap();
    let name = "blk.0.ffn_down.weight";
    let x = src.tensor_f32(src.tensor(name).unwrap()).unwrap();
    let imp: Vec<f32> = fixtures::gguf_gen::uniform(77, 256)
        .iter()
        .map(|u| 10f32.powf(2.0 * u))
        .collect();
    let d = Diagonal {
        tensors: vec![name.to_string()],
        tokens: 10,
        d: imp.iter().map(|&v| v as f64 * 10.0).collect(),
    };
    let im_path = dir.path().join("imatrix.gguf");
    tq::calib::imatrix::write_gguf(&[d], &im_path, "t", 10).unwrap();
    let im = tq::calib::imatrix::load(&im_path).unwrap();
    for tn in ["iq2_xxs", "iq2_xs", "iq2_s"] {
        let ty = TensorType::from_name(tn).unwrap();
        let t = Tensor {
            name: name.into(),
            dims: [256, x.len() as u64 / 256],
            data: x.clone(),
        };
        for with_im in [false, true] {
            let mut outs = vec![];
            for th in ["1", "3"] {
                let out = dir.path().join(format!("{tn}-{with_im}-{th}.gguf"));
                let mut args = vec!["convert", fixtures::s(&inp), "--weights", tn];
                if with_im {
                    args.extend(["--imatrix", fixtures::s(&im_path)]);
                }
                args.extend([
                    "--target",
                    "upstream",
                    "--threads",
                    th,
                    "-q",
                    "-o",
                    fixtures::s(&out),
                ]);
                let (code, _, err) = fixtures::tq(&args);
                assert_eq!(code, 0, "{err}");
                let f = GgufFile::open(&out).unwrap();
                let tt = f.tensor(name).unwrap();
                assert_eq!(tt.ty, ty, "{tn}");
                let want = if with_im {
                    ours(ty, &t, Ours::Imatrix(&im))
                } else {
                    ours(ty, &t, Ours::Registry)
                };
                assert!(f.tensor_data(tt) == &want[..], "{tn} imatrix {with_im}");
                assert_eq!(
                    f.tensor(&name.replace("ffn_down", "attn_q")).unwrap().ty,
                    TensorType::IQ4NL
                );
                outs.push(std::fs::read(out).unwrap());
            }
            assert!(outs[0] == outs[1], "{tn}: bytes depend on the thread count");
        }
    }
}

/// CPU seconds (user + system) of this process, or of its waited-for children.
fn cpu_seconds(who: i32) -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given; `who` is RUSAGE_SELF/CHILDREN.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(who, &mut ru) }, 0, "getrusage");
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(ru.ru_utime) + s(ru.ru_stime)
}

/// Encode time of IQ2_XS (with an imatrix) on a 7B-shaped `ffn_down` (rows of 11008; 4096 rows,
/// or `TQ_BENCH_ROWS`) against llama-quantize on the same tensor and imatrix, both on
/// `TQ_BENCH_THREADS` threads (default 1), `TQ_BENCH_ROUNDS` alternated rounds (default 3: llama,
/// tq, llama, tq, ...). Per run the CPU time (getrusage: llama-quantize's whole process — load,
/// grid set-up, quantize, write — as a waited-for child; tq's `encode_rows` in a T-thread pool,
/// grid set-up included on the first round only) and the wall time; the bytes are compared every
/// round. docs/bench/iquants.md:
/// `cargo test --release --test iquants_llama encode_time -- --ignored --nocapture`.
#[test]
#[ignore]
fn encode_time_iq2_xs_7b_shape() {
    let Some(bin) = fixtures::llama_quantize() else {
        return;
    };
    let env = |k: &str, d: usize| -> usize {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (threads, rows, rounds) = (
        env("TQ_BENCH_THREADS", 1),
        env("TQ_BENCH_ROWS", 4096) as u64,
        env("TQ_BENCH_ROUNDS", 3),
    );
    let cols = 11008u64;
    let t = Tensor {
        name: "blk.0.ffn_down.weight".into(),
        dims: [cols, rows],
        data: gaussian(4242, (cols * rows) as usize, 0.02),
    };
    let ts = [t];
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("7b-ffn_down-f32.gguf");
    write_f32_gguf(&inp, llama_metadata(NAME, 1, 4096, 32), &ts);
    let im_path = dir.path().join("imatrix.gguf");
    tq::calib::imatrix::write_gguf(&imatrix_diagonals(&ts, false), &im_path, "bench", 64).unwrap();
    let im = tq::calib::imatrix::load(&im_path).unwrap();
    let out = dir.path().join("out.gguf");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let ty = TensorType::IQ2XS;
    let (mut cpu_l, mut cpu_t) = (vec![], vec![]);
    for round in 0..rounds {
        let (c0, w0) = (
            cpu_seconds(libc::RUSAGE_CHILDREN),
            std::time::Instant::now(),
        );
        let st = Command::new(&bin)
            .arg("--imatrix")
            .arg(&im_path)
            .arg("--pure")
            .arg(&inp)
            .arg(&out)
            .arg("IQ2_XS")
            .arg(threads.to_string())
            .output()
            .expect("run llama-quantize");
        let (w_llama, c_llama) = (
            w0.elapsed().as_secs_f64(),
            cpu_seconds(libc::RUSAGE_CHILDREN) - c0,
        );
        assert!(st.status.success());
        let f = GgufFile::open(&out).unwrap();
        let theirs = f.tensor_data(f.tensor(&ts[0].name).unwrap()).to_vec();
        let (c0, w0) = (cpu_seconds(libc::RUSAGE_SELF), std::time::Instant::now());
        let mine = pool.install(|| ours(ty, &ts[0], Ours::Imatrix(&im)));
        let (w_tq, c_tq) = (
            w0.elapsed().as_secs_f64(),
            cpu_seconds(libc::RUSAGE_SELF) - c0,
        );
        assert!(mine == theirs, "bytes differ from llama-quantize");
        eprintln!(
            "round {round}: llama-quantize cpu {c_llama:.2} s (wall {w_llama:.2}), tq cpu {c_tq:.2} s (wall {w_tq:.2}), cpu ratio tq/llama {:.2}",
            c_tq / c_llama
        );
        cpu_l.push(c_llama);
        cpu_t.push(c_tq);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ml, mt) = (med(&mut cpu_l), med(&mut cpu_t));
    eprintln!(
        "IQ2_XS {rows}x{cols}, {threads} thread(s), {rounds} alternated rounds: median CPU llama-quantize {ml:.2} s, tq {mt:.2} s, ratio tq/llama {:.2}; bytes identical",
        mt / ml
    );
}
