//! Work split across machines: `tq convert --shard I/N` + `tq assemble` give the bytes of a
//! one-process `tq convert` (with and without `--calib H.safetensors`), `tq calib --shard` +
//! `tq calib merge` give the one-process Hessians (exactly for one shard, to rounding for more),
//! and incomplete, duplicated, foreign or damaged pieces are refused with one-line errors.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::{Path, PathBuf};

fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    let fx = fixtures::gguf_gen::tiny_llama(2, 64, 128, 96);
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, &fx.bytes).unwrap();
    let ids: Vec<String> = (0..400u32)
        .map(|i| ((i * i + 7 * (i / 5)) % 96).to_string())
        .collect();
    let toks = dir.join("tokens.txt");
    std::fs::write(&toks, ids.join(" ")).unwrap();
    (model, toks)
}

fn ok(args: &[&str]) -> String {
    let (code, _, err) = tq(args);
    assert_eq!(code, 0, "tq {}: {err}", args.join(" "));
    err
}

fn fails(args: &[&str]) -> String {
    let (code, _, err) = tq(args);
    assert_eq!(code, 2, "tq {} should fail: {err}", args.join(" "));
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

/// Shard the conversion `flags` of `model` into `n` fragments (threads vary per shard), assemble
/// them in reverse order and return the output's path.
fn sharded(dir: &Path, model: &Path, flags: &[&str], n: usize, tag: &str) -> PathBuf {
    let mut frags = Vec::new();
    for i in 0..n {
        let f = dir.join(format!("{tag}-{i}.tqfrag"));
        let shard = format!("{i}/{n}");
        let threads = (1 + i % 3).to_string();
        let mut a = vec!["convert", s(model), "-o", s(&f), "--shard", &shard];
        a.extend(["--threads", &threads, "-q"]);
        a.extend(flags);
        ok(&a);
        frags.push(f);
    }
    let out = dir.join(format!("{tag}.gguf"));
    let mut a = vec!["assemble".to_string()];
    a.extend(frags.iter().rev().map(|f| s(f).to_string()));
    a.extend(["-o".into(), s(&out).into()]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    ok(&a);
    out
}

fn one_process(dir: &Path, model: &Path, flags: &[&str], tag: &str) -> PathBuf {
    let out = dir.join(format!("{tag}.gguf"));
    let mut a = vec!["convert", s(model), "-o", s(&out), "-q"];
    a.extend(flags);
    ok(&a);
    out
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[test]
fn assembled_fragments_are_the_one_process_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (model, toks) = setup(d);
    // Without calibration, a mixed plan (recipe, overrides): 1, 3 and more shards than tensors.
    let flags = ["--weights", "tq4_1s", "--tensor-type", "ffn_down=q8_0"];
    let want = one_process(d, &model, &flags, "one");
    for n in [1, 3, 40] {
        let got = sharded(d, &model, &flags, n, &format!("plain{n}"));
        assert!(
            same_bytes(&got, &want),
            "{n} shards differ from one process"
        );
    }
    // Without provenance, too.
    let np = ["--weights", "q4_0", "--no-provenance"];
    let want = one_process(d, &model, &np, "one-np");
    assert!(same_bytes(&sharded(d, &model, &np, 2, "np"), &want));

    // With --calib H.safetensors (LDLQ from a Hessian file).
    let h = d.join("h.safetensors");
    ok(&[
        "calib",
        s(&model),
        "--token-file",
        s(&toks),
        "--tokens",
        "256",
        "--ctx",
        "32",
        "--batch",
        "2",
        "-o",
        s(&h),
    ]);
    let cflags = ["--weights", "tq4_1s", "--calib", s(&h)];
    let want = one_process(d, &model, &cflags, "one-calib");
    let rtn = one_process(d, &model, &["--weights", "tq4_1s"], "one-rtn");
    assert!(
        !same_bytes(&want, &rtn),
        "LDLQ changed nothing: the test would not see it"
    );
    for n in [2, 5] {
        let got = sharded(d, &model, &cflags, n, &format!("calib{n}"));
        assert!(same_bytes(&got, &want), "{n} shards with --calib differ");
    }
}

#[test]
fn assemble_refuses_incomplete_foreign_or_damaged_sets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (model, toks) = setup(d);
    let frag = |i: usize, n: usize, weights: &str| {
        let f = d.join(format!("{weights}-{i}-{n}.tqfrag"));
        let shard = format!("{i}/{n}");
        ok(&[
            "convert",
            s(&model),
            "-o",
            s(&f),
            "--shard",
            &shard,
            "--weights",
            weights,
            "-q",
        ]);
        f
    };
    let (a0, a1, a2) = (
        frag(0, 3, "tq4_1s"),
        frag(1, 3, "tq4_1s"),
        frag(2, 3, "tq4_1s"),
    );
    let out = d.join("out.gguf");
    let e = fails(&["assemble", s(&a0), s(&a2), "-o", s(&out)]);
    assert!(e.contains("missing shard(s) 1/3"), "{e}");
    let e = fails(&["assemble", s(&a0), s(&a1), s(&a1), s(&a2), "-o", s(&out)]);
    assert!(e.contains("shard 1/3 given twice"), "{e}");
    // A shard of another conversion (other --weights), and of another shard count.
    let b1 = frag(1, 3, "q8_0");
    let e = fails(&["assemble", s(&a0), s(&b1), s(&a2), "-o", s(&out)]);
    assert!(
        e.contains("q8_0-1-3.tqfrag") && e.contains("another conversion"),
        "{e}"
    );
    let c1 = frag(1, 2, "tq4_1s");
    let e = fails(&["assemble", s(&a0), s(&c1), s(&a2), "-o", s(&out)]);
    assert!(e.contains("another conversion"), "{e}");
    // Damaged tensor data: caught by the fragment's blake3, and no output is left behind.
    let mut bytes = std::fs::read(&a1).unwrap();
    let hl = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    bytes[16 + hl + 5] ^= 0x40;
    let bad = d.join("bad-1.tqfrag");
    std::fs::write(&bad, &bytes).unwrap();
    let e = fails(&["assemble", s(&a0), s(&bad), s(&a2), "-o", s(&out)]);
    assert!(e.contains("bad-1.tqfrag") && e.contains("blake3"), "{e}");
    assert!(!out.exists());
    // Truncated, and not a fragment at all.
    std::fs::write(&bad, &bytes[..bytes.len() - 3]).unwrap();
    let e = fails(&["assemble", s(&a0), s(&bad), s(&a2), "-o", s(&out)]);
    assert!(e.contains("not a tq fragment"), "{e}");
    let e = fails(&["assemble", s(&a0), s(&model), s(&a2), "-o", s(&out)]);
    assert!(
        e.contains("tiny.gguf") && e.contains("not a tq fragment"),
        "{e}"
    );
    // The output may not be one of the fragments.
    let e = fails(&["assemble", s(&a0), s(&a1), s(&a2), "-o", s(&a1)]);
    assert!(e.contains("-o"), "{e}");
    // Bad --shard values, and --calib TEXT with --shard (calibration is not tensor-parallel).
    let e = fails(&["convert", s(&model), "-o", s(&out), "--shard", "3/3"]);
    assert!(e.contains("expected I/N"), "{e}");
    let text = d.join("calib.txt");
    std::fs::write(&text, "some text to calibrate on ".repeat(50)).unwrap();
    let e = fails(&[
        "convert",
        s(&model),
        "-o",
        s(&out),
        "--shard",
        "0/2",
        "--calib",
        s(&text),
    ]);
    assert!(e.contains("tq calib --shard"), "{e}");
    let _ = toks;
}

fn calib(model: &Path, toks: &Path, out: &Path, extra: &[&str]) {
    let mut a = vec![
        "calib",
        s(model),
        "--token-file",
        s(toks),
        "--tokens",
        "320",
        "--ctx",
        "32",
        "--batch",
        "2",
        "-o",
        s(out),
    ];
    a.extend(extra);
    ok(&a);
}

#[test]
fn merged_calibration_shards_are_the_one_process_hessians() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (model, toks) = setup(d);
    let one = d.join("one.safetensors");
    calib(&model, &toks, &one, &[]);
    let (h1, m1) = tq::quant::Hessians::load(&one).unwrap();
    // 10 windows in 5 batches of 2.
    assert_eq!(m1["tq.windows_total"], "10");

    // One shard: the same values, bit for bit.
    let s0 = d.join("s0-1.safetensors");
    calib(&model, &toks, &s0, &["--shard", "0/1"]);
    let m = d.join("merged1.safetensors");
    ok(&["calib", "merge", s(&s0), "-o", s(&m)]);
    let (hm, mm) = tq::quant::Hessians::load(&m).unwrap();
    assert_eq!(mm["tq.fingerprint"], m1["tq.fingerprint"]);
    for (k, g) in &h1.groups {
        assert_eq!(hm.groups[k].h, g.h, "{k}");
        assert_eq!(hm.groups[k].tokens, g.tokens, "{k}");
    }

    // Three shards (batches 0..1, 1..3, 3..5), merged from the command line in any order:
    // the same fingerprint and token counts, values equal to f64 rounding of the sum order.
    let parts: Vec<PathBuf> = (0..3)
        .map(|i| {
            let p = d.join(format!("s{i}-3.safetensors"));
            calib(
                &model,
                &toks,
                &p,
                &["--shard", &format!("{i}/3"), "--threads", "1"],
            );
            p
        })
        .collect();
    let m3 = d.join("merged3.safetensors");
    ok(&[
        "calib",
        "merge",
        s(&parts[2]),
        s(&parts[0]),
        s(&parts[1]),
        "-o",
        s(&m3),
    ]);
    let (h3, mm3) = tq::quant::Hessians::load(&m3).unwrap();
    assert_eq!(mm3["tq.fingerprint"], m1["tq.fingerprint"]);
    assert_eq!(mm3["tq.windows_done"], "10");
    let mut worst = 0f64;
    for (k, g) in &h1.groups {
        let got = &h3.groups[k];
        assert_eq!(got.tokens, g.tokens, "{k}");
        let scale = g.h.iter().fold(0f64, |m, v| m.max(v.abs()));
        for (a, b) in got.h.iter().zip(&g.h) {
            worst = worst.max((a - b).abs() / scale);
        }
    }
    assert!(
        worst < 1e-13,
        "merged Hessians differ by {worst:e} of max |H|"
    );
    eprintln!("3-shard merge vs one process: max |ΔH| / max |H| = {worst:e}");

    // Refusals: a missing shard, a shard of another text, more shards than batches.
    let e = fails(&["calib", "merge", s(&parts[0]), s(&parts[2]), "-o", s(&m3)]);
    assert!(e.contains("missing shard(s) 1/3"), "{e}");
    let other = d.join("other-1.safetensors");
    let text2 = d.join("tokens2.txt");
    let ids: Vec<String> = (0..400u32)
        .map(|i| ((i * 13 + 5) % 96).to_string())
        .collect();
    std::fs::write(&text2, ids.join(" ")).unwrap();
    calib(&model, &text2, &other, &["--shard", "1/3"]);
    let e = fails(&[
        "calib",
        "merge",
        s(&parts[0]),
        s(&other),
        s(&parts[2]),
        "-o",
        s(&m3),
    ]);
    assert!(
        e.contains("other-1.safetensors") && e.contains("another calibration"),
        "{e}"
    );
    let e = fails(&["calib", "merge", s(&one), "-o", s(&m3)]);
    assert!(e.contains("not a calibration shard"), "{e}");
    let mut a = vec![
        "calib",
        s(&model),
        "--token-file",
        s(&toks),
        "--tokens",
        "320",
        "--ctx",
        "32",
        "--batch",
        "2",
        "-o",
        s(&other),
        "--shard",
        "0/6",
    ];
    let e = fails(&a);
    assert!(e.contains("use at most that many shards"), "{e}");
    a.truncate(a.len() - 2);
    a.extend(["--shard", "0/2", "--sequential"]);
    let (code, _, _) = tq(&a);
    assert_eq!(code, 2, "--shard with --sequential is refused");
}
