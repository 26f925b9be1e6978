//! `tq convert --target-bpw / --target-size` (issue 18, part 2): the whole file within the budget,
//! the same plan and bytes for any thread count, one-line errors, and on SmolLM2 a calibrated mix
//! whose predicted KLD is reported beside the measured one.

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::{s, tq};
use std::path::{Path, PathBuf};
use tq::gguf::GgufFile;

fn write(dir: &Path, name: &str, fx: &fixtures::gguf_gen::Fixture) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, &fx.bytes).unwrap();
    p
}

/// The tiny 2-block model (256 wide, a real tokenizer) and 2,500 words of text, in `dir`.
fn tiny_and_text(dir: &Path) -> (PathBuf, PathBuf) {
    let model = write(
        dir,
        "tiny.gguf",
        &fixtures::gguf_gen::tiny_llama_tok(2, 256, 256),
    );
    let text = dir.join("t.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(2500)).unwrap();
    (model, text)
}

/// A small calibrated upstream mix: `tq convert MODEL --target upstream TARGET… --calib TEXT
/// --calib-tokens 1024 --kld-probes 4 EXTRA… -o OUT` with `env`; exit 0 asserted; (stdout, stderr).
fn mix_run(
    model: &Path,
    text: &Path,
    target: &[&str],
    out: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    let args = [
        &["convert", s(model), "--target", "upstream"][..],
        target,
        &[
            "--calib",
            s(text),
            "--calib-tokens",
            "1024",
            "--kld-probes",
            "4",
            "-o",
            s(out),
        ],
        extra,
    ]
    .concat();
    let (code, stdout, err) = fixtures::tq_env(&args, env);
    assert_eq!(code, 0, "{args:?}: {err}");
    (stdout, err)
}

/// The smallest file size an infeasible-target error names.
fn smallest_file_named(err: &str) -> u64 {
    err.split("candidate types give (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"))
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Per tensor: name → type, from a `--dry-run --json` plan.
fn types(plan: &serde_json::Value) -> Vec<(String, String)> {
    plan["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["type"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn budget_is_respected_and_the_plan_is_what_is_written() {
    let dir = tempfile::tempdir().unwrap();
    // Rows of 256: k-quants fit, so the candidates span q2_K … f16.
    let inp = write(
        dir.path(),
        "in.gguf",
        &fixtures::gguf_gen::tiny_llama(2, 256, 512, 96),
    );
    let mut last_types = None;
    for bpw in ["3.0", "4.5", "6.5", "9"] {
        let (code, out, err) = tq(&[
            "convert",
            s(&inp),
            "--target",
            "upstream",
            "--target-bpw",
            bpw,
            "--dry-run",
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        let plan = json(&out);
        let m = &plan["mix"];
        let target = m["target_bytes"].as_u64().unwrap();
        let params = plan["parameters"].as_u64().unwrap();
        let x: f64 = bpw.parse().unwrap();
        assert_eq!(target, (x * params as f64 / 8.0).floor() as u64);
        let size = plan["file_bytes"].as_u64().unwrap();
        assert!(size <= target, "{bpw}: {size} > {target}");
        assert_eq!(m["file_bytes"].as_u64().unwrap(), size);
        // Within the slack of the budget unless every tensor already has its largest type.
        let t = types(&plan);
        assert!(
            t.iter()
                .all(|(n, ty)| n.ends_with("norm.weight") == (ty == "f32")),
            "{t:?}"
        );
        assert!(
            m["weighting"].as_str().unwrap().starts_with("identity"),
            "no calibration: plain squared error, said so"
        );
        assert_ne!(
            Some(&t),
            last_types.as_ref(),
            "{bpw}: a larger budget changes the mix"
        );
        last_types = Some(t.clone());

        // The written file is the planned one: same size, same types, under the budget.
        let o = dir.path().join(format!("out-{bpw}.gguf"));
        let (code, _, err) = tq(&[
            "convert",
            s(&inp),
            "--target",
            "upstream",
            "--target-bpw",
            bpw,
            "-q",
            "-o",
            s(&o),
        ]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(std::fs::metadata(&o).unwrap().len(), size);
        let f = GgufFile::open(&o).unwrap();
        for (tt, (n, ty)) in f.tensors.iter().zip(&t) {
            assert_eq!((&tt.name, tt.ty.name()), (n, ty.as_str()));
        }
        assert_eq!(f.get_str("tq.recipe"), Some("mix"));
        assert_eq!(
            f.get_str("tq.mix.target_bytes"),
            Some(target.to_string().as_str())
        );
        assert!(f.get_str("tq.mix.fit").unwrap().starts_with("none"));
    }
}

#[test]
fn same_plan_and_bytes_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let inp = write(
        dir.path(),
        "in.gguf",
        &fixtures::gguf_gen::tiny_llama(2, 256, 512, 96),
    );
    let mut got = vec![];
    for th in ["1", "2"] {
        let o = dir.path().join(format!("out{th}.gguf"));
        let args = [
            "convert",
            s(&inp),
            "--target-size",
            "0.9MB",
            "--threads",
            th,
            "--mix-rows",
            "7",
        ];
        let (code, plan, err) = tq(&[&args[..], &["--dry-run", "--json"]].concat());
        assert_eq!(code, 0, "{err}");
        let plan = json(&plan);
        let (code, _, err) = tq(&[&args[..], &["-q", "-o", s(&o)]].concat());
        assert_eq!(code, 0, "{err}");
        got.push((types(&plan), std::fs::read(&o).unwrap()));
    }
    assert_eq!(got[0].0, got[1].0, "plans differ");
    assert!(got[0].1 == got[1].1, "bytes differ");
    // The fork profile's default candidates include TQ types, and a layer's attention q/k/v/o
    // holding one share that type (stock types may differ, as upstream).
    let f = GgufFile::open(dir.path().join("out1.gguf")).unwrap();
    for l in 0..2 {
        let ty = |n: &str| {
            f.tensors
                .iter()
                .find(|t| t.name == format!("blk.{l}.{n}.weight"))
                .unwrap()
                .ty
        };
        let group = ["attn_q", "attn_k", "attn_v", "attn_output"].map(ty);
        if group.iter().any(|t| t.is_tq_weight()) {
            assert!(group.iter().all(|&t| t == group[0]), "{group:?}");
        }
    }
    assert!(f.get_u64("general.file_type").is_some());
}

#[test]
fn bad_requests_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let inp = write(
        dir.path(),
        "in.gguf",
        &fixtures::gguf_gen::tiny_llama(2, 256, 512, 96),
    );
    let cases: [(&[&str], &str); 6] = [
        (
            &["--target-bpw", "4", "--target-size", "1MB"],
            "not --target-bpw and --target-size",
        ),
        (&["--target-bpw", "4", "--types", "q4_0,q9_9"], "q9_9"),
        (
            &[
                "--target-bpw",
                "4",
                "--target",
                "upstream",
                "--types",
                "q4_0,tq4_1s",
            ],
            "does not load in target profile 'upstream'",
        ),
        (&["--target-bpw", "1.0"], "below the smallest file"),
        (
            &["--target-size", "12 parsecs"],
            "--target-size '12 parsecs'",
        ),
        (
            &["--types", "q4_0"],
            "give --target-bpw, --target-size or --target-kld",
        ),
    ];
    for (args, want) in cases {
        let o = dir.path().join("o.gguf");
        let (code, _, err) = tq(&[&["convert", s(&inp), "-o", s(&o)][..], args].concat());
        assert_eq!(code, 2, "{args:?}: {err}");
        let line = err.trim();
        assert_eq!(line.lines().count(), 1, "{args:?}: {err}");
        assert!(line.contains(want), "{args:?}: {err}");
        assert!(!o.exists());
    }
    // The infeasible budget names the minimum size.
    let (_, _, err) = tq(&["convert", s(&inp), "--target-bpw", "1.0", "--dry-run"]);
    let min = smallest_file_named(&err);
    // And that size is exactly feasible.
    let (code, out, err) = tq(&[
        "convert",
        s(&inp),
        "--target-size",
        &min.to_string(),
        "--dry-run",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(json(&out)["file_bytes"].as_u64().unwrap() <= min);
}

/// Calibrated without `--kld-text`, the token embedding (no Hessian) keeps q8_0, so the
/// smallest file is larger than every tensor at its smallest type: a target under it fails at
/// once, before the sensitivity pass (no progress line of it, with progress every 10 ms), and
/// the size it names is exactly feasible.
#[test]
fn an_infeasible_target_fails_before_measuring_with_the_kept_q8_0() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = tiny_and_text(dir.path());
    let h = dir.path().join("H.safetensors");
    let (code, _, err) = tq(&[
        "calib",
        s(&model),
        "--text",
        s(&text),
        "--tokens",
        "512",
        "-q",
        "-o",
        s(&h),
    ]);
    assert_eq!(code, 0, "{err}");
    let base = [
        "convert",
        s(&model),
        "--target",
        "upstream",
        "--calib",
        s(&h),
        "--dry-run",
    ];
    let env = [("TQ_PROGRESS_SECS", "0.01")];
    let (code, _, err) = fixtures::tq_env(&[&base[..], &["--target-bpw", "1.0"]].concat(), &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("below the smallest file"), "{err}");
    assert!(
        !err.contains("sensitivity"),
        "measured before failing: {err}"
    );
    let min = smallest_file_named(&err);
    let (code, out, err) = fixtures::tq_env(
        &[&base[..], &["--target-size", &min.to_string(), "--json"]].concat(),
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let plan = json(&out);
    assert!(plan["file_bytes"].as_u64().unwrap() <= min);
    let embd = types(&plan)
        .into_iter()
        .find(|(n, _)| n == "token_embd.weight")
        .expect("token_embd in the plan");
    assert_eq!(embd.1, "q8_0");
}

/// SmolLM2 (the Q4_1 file, requantized), calibrated on Botchan: the mix at a size fits it, and
/// the predicted KLD (fit on 7 single-tensor KLDs, one per role) is reported beside the measured one.
#[test]
fn smollm2_mix_predicts_and_verifies_its_kld() {
    let Some(smol) = fixtures::smollm2() else {
        return;
    };
    let Some(text) = fixtures::botchan() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().join("mix.gguf");
    let target = 80_000_000u64;
    let (code, out, err) = tq(&[
        "convert",
        s(&smol),
        "--target",
        "upstream",
        "--target-size",
        "80MB",
        "--calib",
        s(&text),
        "--calib-tokens",
        "1024",
        "--ldlq-band",
        "64",
        "--mix-rows",
        "16",
        "--kld-windows",
        "2",
        "--kld-probes",
        "7",
        "--verify",
        "--json",
        // The conversion writes the measured plans' encodings instead of encoding again (a
        // quarter of this test's time; the bytes are the same, tested in
        // mix_cache_keeps_the_measured_plans_encodings).
        "--mix-cache",
        s(&dir.path().join("smol.mixcache")),
        "-o",
        s(&o),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("tensors written from the measured plans' encodings"),
        "{err}"
    );
    let j = json(&out);
    let size = std::fs::metadata(&o).unwrap().len();
    assert!(size <= target, "{size} > {target}");
    let m = &j["mix"];
    let pred = m["predicted_kld"].as_f64().unwrap();
    let got = j["verify"]["kld"].as_f64().unwrap();
    eprintln!(
        "SmolLM2 mix at 80 MB: {size} bytes, predicted KLD {pred:.5}, measured {got:.5} (2 windows of Botchan; per-role R2 of ln KLD {})",
        m["r2_roles"]
    );
    assert_eq!(m["probes"].as_array().unwrap().len(), 7);
    assert!(pred > 0.0 && got > 0.0 && got < 1.0, "{pred} vs {got}");
    // The fit ranks tensors; its absolute KLD is known to be off by 3-5x either way (single-tensor
    // KLDs do not add up to the whole mix's: 3x low on SmolLM2 F16 at 105 MB, 5x high on this
    // Q4_1 input at 80 MB; docs/bench/mix.md). A bound that catches a broken fit, not a claim.
    assert!(pred / got < 10.0 && got / pred < 10.0, "{pred} vs {got}");
    let f = GgufFile::open(&o).unwrap();
    assert!(f
        .get_str("tq.mix.predicted_kld")
        .unwrap()
        .parse::<f64>()
        .is_ok());
}

/// tq's own 2-bit trellis type is never a default candidate (no engine but tq loads it), but
/// `--types` can ask for it under the fork profiles (tq's ids there); at the cheapest budget the
/// mix takes it on every matrix whose rows hold its 64-value blocks, and the file is written.
#[test]
fn tq2_t_is_a_candidate_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let inp = write(
        dir.path(),
        "in.gguf",
        &fixtures::gguf_gen::tiny_llama(2, 256, 512, 96),
    );
    let base = [
        "convert",
        s(&inp),
        "--target",
        "fork",
        "--types",
        "q8_0,tq2_t",
    ];
    // Upstream llama.cpp cannot load it: a usage error naming the type.
    let (code, _, err) = tq(&[
        "convert",
        s(&inp),
        "--target",
        "upstream",
        "--types",
        "q8_0,tq2_t",
        "--target-bpw",
        "4",
        "--dry-run",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tq2_t") && err.contains("upstream"), "{err}");
    // Far below anything: the error names the cheapest mix's size.
    let (code, _, err) = tq(&[&base[..], &["--target-bpw", "0.5", "--dry-run"]].concat());
    assert_eq!(code, 2, "{err}");
    let min: u64 = err
        .split("smallest file the candidate types give (")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in: {err}"));
    let min_s = min.to_string();
    let (code, out, err) =
        tq(&[&base[..], &["--target-size", &min_s, "--dry-run", "--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let plan = json(&out);
    let mut n2t = 0;
    for t in plan["tensors"].as_array().unwrap() {
        let dims: Vec<u64> = t["shape"]
            .as_array()
            .map(|d| d.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        let name = t["name"].as_str().unwrap();
        if dims.len() == 2 && dims[0].is_multiple_of(64) && !name.starts_with("token_embd") {
            assert_eq!(t["type"], "tq2_t", "{name}: {t}");
            n2t += 1;
        }
    }
    assert!(n2t >= 14, "only {n2t} tq2_t tensors");
    let o = dir.path().join("out.gguf");
    let (code, _, err) = tq(&[&base[..], &["--target-size", &min_s, "-q", "-o", s(&o)]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::metadata(&o).unwrap().len() <= min);
}

/// `--verify --max-kld X` is a gate that can fail: exit 3 with the file kept and the message
/// saying so when the measured KLD is over X, exit 0 under a loose X; the reference logits it
/// measures against never outlive the command, also when measuring fails.
#[test]
fn verify_max_kld_gates_the_written_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(
        dir.path(),
        "tiny.gguf",
        &fixtures::gguf_gen::tiny_llama_tok(1, 64, 128),
    );
    let text = dir.path().join("t.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(1500)).unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = dir.path().join("q.gguf");
    let run = |x: &str, text: &Path| {
        fixtures::tq_env(
            &[
                "convert",
                s(&model),
                "--weights",
                "q4_0",
                "--kld-text",
                s(text),
                "--verify",
                "--max-kld",
                x,
                "--json",
                "-o",
                s(&out),
            ],
            &[("TMPDIR", s(&tmp))],
        )
    };
    let (code, stdout, err) = run("0", &text);
    assert_eq!(code, 3, "{err}");
    assert!(out.exists(), "the file must be kept");
    assert!(
        err.contains("verify failed") && err.contains("the file is kept"),
        "{err}"
    );
    let j = json(&stdout);
    assert_eq!(j["verify"]["pass"], false, "{j}");
    assert!(j["verify"]["kld"].as_f64().unwrap() > 0.0);
    let (code, stdout, err) = run("10", &text);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&stdout)["verify"]["pass"], true);
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "temp files left"
    );
    // Measuring fails (too little text for 2 windows): an error, and no logits left behind.
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "the cat sat").unwrap();
    let (code, _, err) = run("10", &short);
    assert_ne!(code, 0, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "temp files left"
    );
    // --max-kld without --verify, or not a number >= 0: usage errors.
    let (code, _, err) = tq(&["convert", s(&model), "--max-kld", "0.1", "-o", s(&out)]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run("-1", &text);
    assert_eq!(code, 2, "{err}");
}

/// Off a terminal, every long phase of a mix prints progress lines with an ETA on stderr (every
/// `TQ_PROGRESS_SECS`, 10 by default; shortened here), `-q` prints none, and `--json` keeps
/// stdout one JSON document.
#[test]
fn mix_phases_print_progress_with_eta_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = tiny_and_text(dir.path());
    let out = dir.path().join("mix.gguf");
    let run = |quiet: bool| {
        let mut args = vec![
            "convert",
            s(&model),
            "--target",
            "upstream",
            "--target-bpw",
            "6",
            "--calib",
            s(&text),
            "--calib-tokens",
            "1024",
            "--kld-probes",
            "4",
            "--verify",
            "--json",
            "-o",
            s(&out),
        ];
        if quiet {
            args.push("-q");
        }
        fixtures::tq_env(&args, &[("TQ_PROGRESS_SECS", "0.001")])
    };
    let (code, stdout, err) = run(false);
    assert_eq!(code, 0, "{err}");
    let mix = &json(&stdout)["mix"];
    assert!(mix.is_object(), "{stdout}");
    // The activation-rounding term was measured and is part of the plan's error.
    let act = mix["activation_rounding_error"].as_f64().unwrap_or(0.0);
    assert!(
        act > 0.0 && act < mix["error"].as_f64().unwrap(),
        "{stdout}"
    );
    for phase in [
        "sensitivity",
        "activation rounding",
        "KLD reference",
        "KLD probes",
        "KLD probes' encodings",
        "measured plans",
        "writing",
        "verify",
    ] {
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with(&format!("tq: {phase} ")))
            .collect();
        assert!(
            lines.iter().any(|l| l.contains("elapsed, eta ")),
            "{phase}: no progress line in\n{err}"
        );
        assert!(
            lines.iter().any(|l| l.contains(" done in ")),
            "{phase}: no end line in\n{err}"
        );
    }
    // The calibration's own lines come from the conversion's pass only: the mix's passes
    // (sensitivity, probes' encodings, measured plans) report as their phase, not as
    // calibration blocks.
    let calib_lines = err
        .lines()
        .filter(|l| l.starts_with("tq calib: block 1/"))
        .count();
    assert_eq!(calib_lines, 1, "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("tq: mix: the KLD probes' encodings: block 1/")),
        "{err}"
    );
    let (code, stdout, err) = run(true);
    assert_eq!(code, 0, "{err}");
    assert!(json(&stdout)["mix"].is_object());
    assert_eq!(err, "", "-q prints nothing");
}

/// `--mix-cache`: a second size on the same model reuses the first run's measurements (no
/// sensitivity or KLD probes run: no progress lines for them, and a line saying so) and writes
/// the file a cold run at that size writes, byte for byte (a smaller size: no plan measured
/// before fits it); a larger size takes a plan measured at another size when it measured best,
/// so its KLD is at most theirs; another KLD setting measures again; a file that is not a cache
/// is a one-line error, exit 2, nothing written.
#[test]
fn mix_cache_plans_a_second_size_without_measuring() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = tiny_and_text(dir.path());
    let cache = dir.path().join("mix-cache.json");
    let run_json = |bpw: &str, out: &Path, extra: &[&str]| {
        let extra = [&["--json"][..], extra].concat();
        let env = [("TQ_PROGRESS_SECS", "0.001")];
        mix_run(&model, &text, &["--target-bpw", bpw], out, &extra, &env)
    };
    let run = |bpw: &str, out: &Path, extra: &[&str]| run_json(bpw, out, extra).1;
    let written = |out: &str| json(out)["mix"]["measured_kld"].as_f64().unwrap();
    let measured = |err: &str| err.contains("tq: sensitivity ") || err.contains("tq: KLD probes ");
    let with_cache = ["--mix-cache", s(&cache)];
    let (out6, err) = run_json("6", &dir.path().join("a.gguf"), &with_cache);
    assert!(
        err.contains("no cache yet; measuring") && measured(&err),
        "{err}"
    );
    assert!(cache.exists());
    let b = dir.path().join("b.gguf");
    let (out5, err) = run_json("5", &b, &with_cache);
    assert!(err.contains("measurements reused"), "{err}");
    assert!(!measured(&err), "measured again:\n{err}");
    // A larger size: every plan measured at 6 and 5 bpw fits, so it writes no worse than either.
    let (out7, _) = run_json("7", &dir.path().join("e.gguf"), &with_cache);
    let (k5, k6, k7) = (written(&out5), written(&out6), written(&out7));
    let plans = json(&out7)["mix"]["plans"].clone();
    assert!(
        plans.as_array().unwrap().iter().any(|p| p["plan"]
            .as_str()
            .unwrap()
            .ends_with("(measured at another size)")
            && p["from_cache"] == true),
        "the best plan measured at another size is a candidate: {plans}"
    );
    assert!(k7 <= k6 && k7 <= k5, "7 bpw {k7} vs 6 bpw {k6}, 5 bpw {k5}");
    let c = dir.path().join("c.gguf");
    let err = run("5", &c, &[]);
    assert!(measured(&err), "{err}");
    assert!(
        std::fs::read(&b).unwrap() == std::fs::read(&c).unwrap(),
        "the file planned from the cache differs from a cold run's"
    );
    // Another row sample: measured again, and the cache replaced.
    let err = run("5", &c, &[&with_cache[..], &["--mix-rows", "32"]].concat());
    assert!(
        err.contains("measured with another settings; measuring") && measured(&err),
        "{err}"
    );
    // Not a cache.
    std::fs::write(&cache, "not json").unwrap();
    let o = dir.path().join("d.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--target-bpw",
        "6",
        "--mix-cache",
        s(&cache),
        "-o",
        s(&o),
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("mix-cache.json") && err.contains("--mix-cache"),
        "{err}"
    );
    assert!(!o.exists());
}

/// Never worse than a preset: at the byte size of tq's own `--preset P --calib` file plus the
/// mix's own metadata (`tq.mix.*`, under 4 KB; llama.cpp's preset files carry about 1 KB more
/// metadata than tq's, so at their bytes the preset's plan fits too: 896 bytes to spare on SmolLM2
/// Q4_K_M), the mix (whose candidates include that preset's plan) writes a file whose KLD on the
/// `--kld-text` windows is at most the preset file's, both measured by `tq eval` on those windows.
#[test]
fn the_mix_is_never_worse_than_a_preset_at_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = tiny_and_text(dir.path());
    let calib = ["--calib", s(&text), "--calib-tokens", "1024"];
    let kld = |f: &Path| {
        let (code, out, err) = tq(&[
            "eval",
            s(f),
            "--ref",
            s(&model),
            "--text",
            s(&text),
            "--chunks",
            "2",
            "--json",
            "-q",
        ]);
        assert_eq!(code, 0, "{err}");
        json(&out)["result"]["kld"]["kld"]["value"]
            .as_f64()
            .unwrap()
    };
    for preset in ["Q4_K_M", "Q3_K_S"] {
        let p = dir.path().join(format!("{preset}.gguf"));
        let args = [
            &["convert", s(&model), "--preset", preset, "-q", "-o", s(&p)][..],
            &calib,
        ]
        .concat();
        let (code, _, err) = tq(&args);
        assert_eq!(code, 0, "{err}");
        let size = (std::fs::metadata(&p).unwrap().len() + 4096).to_string();
        let m = dir.path().join(format!("mix-{preset}.gguf"));
        let target = ["--target-size", size.as_str()];
        let (out, _) = mix_run(&model, &text, &target, &m, &["--json", "-q"], &[]);
        let plans = json(&out)["mix"]["plans"].clone();
        let names: Vec<&str> = plans
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["plan"].as_str().unwrap())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n.starts_with(&format!("preset {preset}"))),
            "{preset}'s own plan is a candidate at its size: {names:?}"
        );
        let (km, kp) = (kld(&m), kld(&p));
        eprintln!("{preset} ({size} bytes): mix {km:.6}, preset {kp:.6}, plans {names:?}");
        assert!(km <= kp * (1.0 + 1e-9), "{preset}: mix {km} > preset {kp}");
    }
}

/// `--mix-cache` keeps the measured plans' encodings beside the cache (`FILE.enc/`): the
/// conversion writes the chosen plan's tensors from them, and another size's measured plans read
/// them instead of encoding again; every file is byte-identical to a run without the cache.
#[test]
fn mix_cache_keeps_the_measured_plans_encodings() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = tiny_and_text(dir.path());
    let cache = dir.path().join("mix-cache.json");
    let run = |bpw: &str, out: &Path, extra: &[&str]| {
        let env = [("TQ_PROGRESS_SECS", "1000")];
        mix_run(&model, &text, &["--target-bpw", bpw], out, extra, &env).1
    };
    // "tq: --mix-cache: N of …": N.
    let count = |err: &str, what: &str| -> usize {
        let line = err
            .lines()
            .find(|l| l.starts_with("tq: --mix-cache: ") && l.contains(what))
            .unwrap_or_else(|| panic!("no '{what}' line:\n{err}"));
        line["tq: --mix-cache: ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let with_cache = ["--mix-cache", s(&cache)];
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    let err = run("6", &b, &with_cache);
    assert!(
        count(&err, "tensors written from the measured plans' encodings") > 0,
        "{err}"
    );
    assert!(dir.path().join("mix-cache.json.enc").is_dir());
    run("6", &a, &[]);
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the file written from the kept encodings differs from a run without the cache"
    );
    // Another size: its measured plans read the kept encodings; same file as a cold run.
    let (c, d) = (dir.path().join("c.gguf"), dir.path().join("d.gguf"));
    let err = run("5", &c, &with_cache);
    assert!(count(&err, "encodings read from") > 0, "{err}");
    run("5", &d, &[]);
    assert!(
        std::fs::read(&c).unwrap() == std::fs::read(&d).unwrap(),
        "the second size planned from the kept encodings differs from a cold run's"
    );
}

/// Best of few, measured: with `--kld-text` the mix measures whole plans (the knapsack's and the
/// llama.cpp presets that fit) on the windows, writes the best measured that fits, and says so;
/// `--verify` measures the written file on the same windows and gets the chosen plan's KLD.
#[test]
fn the_best_measured_plan_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = tiny_and_text(dir.path());
    let out = dir.path().join("mix.gguf");
    let extra = ["--verify", "--json", "-q"];
    let (stdout, _) = mix_run(&model, &text, &["--target-bpw", "6"], &out, &extra, &[]);
    let j = json(&stdout);
    let m = &j["mix"];
    let target = m["target_bytes"].as_u64().unwrap();
    let plans = m["plans"].as_array().unwrap();
    let names: Vec<&str> = plans.iter().map(|p| p["plan"].as_str().unwrap()).collect();
    assert_eq!(names[0], "knapsack", "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("preset ")),
        "the presets that fit are candidates: {names:?}"
    );
    // The chosen plan is the least measured KLD among those that fit.
    let best = plans
        .iter()
        .filter(|p| p["file_bytes"].as_u64().unwrap() <= target)
        .min_by(|a, b| {
            a["measured_kld"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["measured_kld"].as_f64().unwrap())
        })
        .unwrap();
    assert_eq!(m["chosen"], best["plan"], "{m}");
    let size = std::fs::metadata(&out).unwrap().len();
    assert!(size <= target);
    assert_eq!(size, m["file_bytes"].as_u64().unwrap());
    // What was measured in memory is what was written.
    let measured = m["measured_kld"].as_f64().unwrap();
    let verified = j["verify"]["kld"].as_f64().unwrap();
    assert!(
        (measured - verified).abs() <= 1e-9 * verified.max(1e-6),
        "measured {measured} vs the written file's {verified}"
    );
}

/// The upstream candidates include the i-quants below q2_K (iq1_s … iq2_s): a target under the
/// cheapest k-quant mix of a model whose rows hold 256-value superblocks is reached with them,
/// and written.
#[test]
fn targets_below_the_k_quants_take_i_quants() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(
        dir.path(),
        "tiny.gguf",
        &fixtures::gguf_gen::tiny_llama_tok(2, 256, 256),
    );
    let plan = |extra: &[&str]| {
        let args = [
            &[
                "convert",
                s(&model),
                "--target",
                "upstream",
                "--target-bpw",
                "9",
                "--dry-run",
                "--json",
            ][..],
            extra,
        ]
        .concat();
        let (code, out, err) = tq(&args);
        assert_eq!(code, 0, "{err}");
        json(&out)
    };
    let kquants = plan(&["--types", "q2_K,q3_K,q4_K,q5_K,q6_K,q8_0,f16"]);
    let k_min = kquants["mix"]["min_bytes"].as_u64().unwrap();
    let all = plan(&[]);
    let i_min = all["mix"]["min_bytes"].as_u64().unwrap();
    assert!(i_min < k_min, "i-quants: {i_min} vs k-quants {k_min}");
    let size = ((i_min + k_min) / 2).to_string();
    let out = dir.path().join("low.gguf");
    let (code, _, err) = tq(&[
        "convert",
        s(&model),
        "--target",
        "upstream",
        "--target-size",
        &size,
        "-q",
        "-o",
        s(&out),
    ]);
    assert_eq!(code, 0, "{err}");
    let f = GgufFile::open(&out).unwrap();
    let iq: Vec<String> = f
        .tensors
        .iter()
        .filter(|t| {
            matches!(
                t.ty.name(),
                "iq1_s" | "iq1_m" | "iq2_xxs" | "iq2_xs" | "iq2_s"
            )
        })
        .map(|t| format!("{} {}", t.name, t.ty.name()))
        .collect();
    assert!(!iq.is_empty(), "no i-quant below q2_K in the mix");
    // Whether llama.cpp loads it is not checked here: this fixture lacks
    // llama.context_length, which llama.cpp's loader requires (llama-quantize COPY lists the
    // iq2_xxs/iq2_xs tensors, then stops on that key).
}

/// `--target-kld X`: the smallest mix whose calibrated prediction is at most X, confirmed on the
/// KLD windows: the written file's measured KLD (`--verify`, on the same windows) is at most X, a
/// smaller X gives a larger file, and the predicted and measured KLDs are reported; bad values,
/// a clash with the other targets, no text to measure on and an unreachable X are one-line
/// errors (exit 2) with nothing written.
#[test]
fn target_kld_writes_the_smallest_mix_measured_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = tiny_and_text(dir.path());
    let cache = dir.path().join("mix-cache.json");
    let run = |target: &[&str], out: &Path, extra: &[&str]| {
        let args = [
            &["convert", s(&model), "--target", "upstream"][..],
            target,
            &[
                "--calib",
                s(&text),
                "--calib-tokens",
                "1024",
                "--kld-probes",
                "4",
                "--mix-cache",
                s(&cache),
                "--json",
                "-o",
                s(out),
            ],
            extra,
        ]
        .concat();
        tq(&args)
    };
    // The KLDs this model reaches: the mix at 5 bpw (its plans then calibrate the search).
    let (code, stdout, err) = run(&["--target-bpw", "5"], &dir.path().join("b5.gguf"), &["-q"]);
    assert_eq!(code, 0, "{err}");
    let m5 = json(&stdout)["mix"]["measured_kld"].as_f64().unwrap();
    assert!(m5 > 0.0);
    let mut last: Option<(f64, u64)> = None;
    for x in [2.0 * m5, m5 / 2.0] {
        let xs = format!("{x}");
        let out = dir.path().join(format!("k{x}.gguf"));
        let (code, stdout, err) = run(&["--target-kld", &xs], &out, &["--verify"]);
        assert_eq!(code, 0, "{x}: {err}");
        let j = json(&stdout);
        let m = &j["mix"];
        let verified = j["verify"]["kld"].as_f64().unwrap();
        assert!(
            verified <= x,
            "--target-kld {x}: the written file measured {verified}"
        );
        assert_eq!(j["verify"]["pass"], true);
        let measured = m["measured_kld"].as_f64().unwrap();
        assert!((measured - verified).abs() <= 1e-9 * verified.max(1e-6));
        assert_eq!(m["target_kld"].as_f64(), Some(x));
        let sizes = m["target_kld_sizes"].as_array().unwrap();
        assert!(!sizes.is_empty() && sizes.len() <= 4, "{m}");
        assert!(m["predicted_kld"].as_f64().is_some(), "{m}");
        assert!(m["calibration"]["plans"].as_u64().unwrap() >= 1, "{m}");
        // A progress line per size measured.
        let lines = err
            .lines()
            .filter(|l| l.starts_with("tq: --target-kld "))
            .count();
        assert_eq!(lines, sizes.len(), "{err}");
        let size = std::fs::metadata(&out).unwrap().len();
        if let Some((x0, s0)) = last {
            assert!(
                size > s0,
                "--target-kld {x} gave {size} bytes, {x0} gave {s0}"
            );
        }
        last = Some((x, size));
    }
    // Bad values and clashes: one line, exit 2, nothing written.
    let out = dir.path().join("bad.gguf");
    for (target, want) in [
        (&["--target-kld", "0"][..], "--target-kld 0"),
        (&["--target-kld", "NaN"], "--target-kld NaN"),
        (&["--target-kld=-0.1"], "--target-kld -0.1"),
        (
            &["--target-kld", "0.1", "--target-size", "1MB"],
            "--target-size and --target-kld",
        ),
        (
            &["--target-kld", "0.1", "--target-bpw", "5"],
            "--target-bpw and --target-kld",
        ),
    ] {
        let (code, _, err) = run(target, &out, &[]);
        assert_eq!(code, 2, "{target:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{target:?}: {err}");
        assert!(!out.exists());
    }
    let (code, _, err) = tq(&["convert", s(&model), "--target-kld", "0.1", "-o", s(&out)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--kld-text"), "{err}");
    // Unreachable with small types only: the least reachable KLD named, and what to change.
    let (code, _, err) = run(
        &["--target-kld", "1e-9"],
        &out,
        &["--types", "q2_K,q3_K", "-q"],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("the least KLD")
            && err.contains("--types")
            && err.contains("raise --target-kld"),
        "{err}"
    );
    assert!(!out.exists());
}
