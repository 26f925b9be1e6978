//! Kill anywhere (issue "Trust"): every resumable command, killed from outside with SIGKILL at
//! seeded pseudo-random instants of its run — in the middle of a tensor, during a checkpoint
//! write, while finishing — and then rerun with `--resume` (itself killed too, at some instants)
//! until it completes, writes exactly the bytes of an uninterrupted run and leaves no partial
//! output, checkpoint or temporary file behind.
//!
//! For each mode the harness runs the command twice uninterrupted (the reference bytes, the same
//! both times, and the duration `T`, the shorter), then kills it at `TQ_KILL_INSTANTS` (default
//! 10) instants spread over `(0, T)` (one per `T/n` slice, at a random place in it), and at two
//! instants it waits for: while a checkpoint's temporary file exists (a checkpoint write), and
//! after the last checkpoint (the final fill of the header and rename), each retried at most
//! twice when a loaded machine made the poll miss its window. Every other random kill's first
//! `--resume` is killed as well, at a random instant of `(0, T)`, and the aimed checkpoint-write
//! kill's in a checkpoint write of its own. The windows are widened by the test pauses of
//! `src/io/hooks.rs` (`TQ_TEST_DATA_DELAY_MS` after each chunk of data, `TQ_TEST_RENAME_DELAY_MS`
//! before every rename), which change timing only. Where each kill landed is read from the files
//! it left (see [`Phase`]) and printed with the seed: `TQ_KILL_SEED=S cargo test --test kill --
//! --nocapture` replays a run's instants (as far as timing allows).

#![cfg(unix)]

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::s;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Milliseconds of the test pauses (`src/io/hooks.rs`), for every run of the harness.
const DATA_DELAY_MS: u64 = 12;
const RENAME_DELAY_MS: u64 = 12;

/// The model: blocks, hidden size, ffn size (`tiny_llama_tok`), and the calibration.
const LAYERS: u32 = 4;
const EMBD: u64 = 256;
const FF: u64 = 512;
const CALIB_TOKENS: &str = "512";
const CALIB_CTX: &str = "64";

/// SplitMix64: the instants' generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The run's seed: `TQ_KILL_SEED`, else the clock (printed, so a failure can be replayed).
fn base_seed() -> u64 {
    match std::env::var("TQ_KILL_SEED") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("TQ_KILL_SEED={v}: not a u64")),
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_007
        }
    }
}

fn instants() -> usize {
    std::env::var("TQ_KILL_INSTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(10)
}

/// Where a kill landed, read from the files the killed run left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// No partial output yet: start-up, a mix's measurements, a calibration before its first write.
    BeforeOutput,
    /// The partial output holds exactly its checkpoint's bytes (or only its header): inside a
    /// tensor (quantizing, or its bytes still buffered) or a calibration block (forward pass).
    InTensor,
    /// The partial output holds bytes past its checkpoint: a tensor's or a Hessian group's data
    /// written, its checkpoint not yet.
    PastCheckpoint,
    /// A checkpoint's temporary file of the killed process exists: inside a checkpoint write.
    CheckpointWrite,
    /// The last checkpoint is written: filling the header, syncing, renaming into place.
    Finishing,
    /// The output has its final name (checkpoint removal or other outputs left).
    AfterRename,
    /// The run had completed before the kill.
    Completed,
}

/// When to kill a run.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// Let it finish.
    Never,
    /// At this time after the start.
    At(Duration),
    /// When the temporary file of its `k`-th checkpoint write (0-based, or a later one) appears.
    CheckpointWrite(u64),
    /// Half a rename pause after its last checkpoint appears.
    Finishing,
}

/// A mode: a command writing `outputs` (the first is the resumable one) into a case directory.
struct Mode {
    name: &'static str,
    /// Arguments; `{OUT}` and `{OUT2}` stand for the outputs' paths.
    args: Vec<String>,
    outputs: Vec<&'static str>,
}

struct Harness {
    mode: Mode,
    root: PathBuf,
    /// `TQ_KILL_SEED` (or the clock's), and this mode's seed drawn from it.
    base: u64,
    seed: u64,
    reference: Vec<Vec<u8>>,
    /// Bytes of the resumable output: its last checkpoint's position.
    full_len: u64,
    /// Is the main output a safetensors file (`tq calib`): its header is written before any
    /// checkpoint.
    safetensors: bool,
    t: Duration,
    phases: BTreeMap<(bool, Phase), usize>,
    runs: usize,
}

fn partial_name(out: &str) -> String {
    format!(".{out}.tq-partial")
}

fn checkpoint_pos(dir: &Path, out: &str) -> Option<u64> {
    let b = std::fs::read(dir.join(format!("{}.json", partial_name(out)))).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
    v["pos"].as_u64()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

impl Harness {
    fn new(mode: Mode, root: &Path, base: u64) -> Harness {
        let seed = base
            ^ mode.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
        let root = root.join(mode.name);
        std::fs::create_dir(&root).unwrap();
        let safetensors = mode.outputs[0].ends_with(".safetensors");
        Harness {
            mode,
            root,
            base,
            seed,
            reference: vec![],
            full_len: 0,
            safetensors,
            t: Duration::ZERO,
            phases: BTreeMap::new(),
            runs: 0,
        }
    }

    fn args(&self, dir: &Path, resume: bool) -> Vec<String> {
        let mut a: Vec<String> = self
            .mode
            .args
            .iter()
            .map(|x| {
                let mut x = x.clone();
                for (i, o) in self.mode.outputs.iter().enumerate() {
                    let tag = if i == 0 {
                        "{OUT}".to_string()
                    } else {
                        format!("{{OUT{}}}", i + 1)
                    };
                    x = x.replace(&tag, s(&dir.join(o)));
                }
                x
            })
            .collect();
        if resume {
            a.push("--resume".into());
        }
        a
    }

    /// Where a run of process `pid` writing into `dir` was when it was killed.
    fn phase(&self, dir: &Path, pid: u32) -> Phase {
        let out = self.mode.outputs[0];
        let tmp = format!(".{}.json.tq-tmp-{pid}-", partial_name(out));
        let files = names(dir);
        if files.iter().any(|n| n.starts_with(&tmp)) {
            return Phase::CheckpointWrite;
        }
        if dir.join(out).exists() {
            return Phase::AfterRename;
        }
        let Ok(m) = std::fs::metadata(dir.join(partial_name(out))) else {
            return Phase::BeforeOutput;
        };
        let pos = match checkpoint_pos(dir, out) {
            Some(p) if p == self.full_len => return Phase::Finishing,
            Some(p) => p,
            // A Hessian file's header is written at once; a GGUF's is buffered with the first
            // tensor's bytes.
            None if self.safetensors && m.len() >= 8 => {
                let mut b = [0u8; 8];
                use std::io::Read;
                std::fs::File::open(dir.join(partial_name(out)))
                    .and_then(|mut f| f.read_exact(&mut b))
                    .unwrap();
                8 + u64::from_le_bytes(b)
            }
            None => 0,
        };
        if m.len() > pos {
            Phase::PastCheckpoint
        } else {
            Phase::InTensor
        }
    }

    /// Run the command (with `--resume` when `resume`) in `dir` until `trigger` or its end:
    /// `Ok(phase)` when it completed or was killed, `Err(stderr)` when it failed.
    fn run(&mut self, dir: &Path, resume: bool, trigger: Trigger) -> Result<Phase, String> {
        self.runs += 1;
        let log = self.root.join(format!("log-{}.txt", self.runs));
        let mut child = Command::new(env!("CARGO_BIN_EXE_tq"))
            .args(self.args(dir, resume))
            .env("TQ_TEST_DATA_DELAY_MS", DATA_DELAY_MS.to_string())
            .env("TQ_TEST_RENAME_DELAY_MS", RENAME_DELAY_MS.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("run tq");
        let pid = child.id();
        let t0 = Instant::now();
        let out = self.mode.outputs[0];
        let tmp = format!(".{}.json.tq-tmp-{pid}-", partial_name(out));
        let mut finishing_seen: Option<Instant> = None;
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            let fire = match trigger {
                Trigger::Never => false,
                Trigger::At(t) => t0.elapsed() >= t,
                Trigger::CheckpointWrite(k) => names(dir).iter().any(|n| {
                    n.strip_prefix(&tmp)
                        .and_then(|c| c.parse::<u64>().ok())
                        .is_some_and(|c| c >= k)
                }),
                Trigger::Finishing => {
                    if finishing_seen.is_none() && checkpoint_pos(dir, out) == Some(self.full_len) {
                        finishing_seen = Some(Instant::now());
                    }
                    finishing_seen
                        .is_some_and(|t| t.elapsed() >= Duration::from_millis(RENAME_DELAY_MS / 2))
                }
            };
            if fire {
                // SIGKILL; a run that ended meanwhile is a zombie until waited for: no error.
                child.kill().unwrap();
                break child.wait().unwrap();
            }
            let step = match trigger {
                Trigger::At(t) => t.saturating_sub(t0.elapsed()).min(Duration::from_millis(5)),
                _ => Duration::from_micros(500),
            };
            std::thread::sleep(step);
        };
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        if status.signal() == Some(libc::SIGKILL) {
            return Ok(self.phase(dir, pid));
        }
        if status.code() == Some(0) {
            return Ok(Phase::Completed);
        }
        Err(format!("{status}: {err}"))
    }

    /// Two uninterrupted runs: the reference bytes (the same twice) and the duration `T` (the
    /// shorter: the first run also warms the page cache).
    fn reference(&mut self) {
        self.t = Duration::MAX;
        for k in 0..2 {
            let dir = self.root.join(format!("reference-{k}"));
            std::fs::create_dir(&dir).unwrap();
            let t0 = Instant::now();
            let r = self.run(&dir, false, Trigger::Never);
            self.t = self.t.min(t0.elapsed());
            assert_eq!(r, Ok(Phase::Completed), "{}: reference run", self.mode.name);
            let bytes: Vec<Vec<u8>> = self
                .mode
                .outputs
                .iter()
                .map(|o| std::fs::read(dir.join(o)).unwrap())
                .collect();
            assert!(
                k == 0 || bytes == self.reference,
                "{}: two uninterrupted runs differ",
                self.mode.name
            );
            self.reference = bytes;
            assert_eq!(
                names(&dir),
                self.sorted_outputs(),
                "{}: files",
                self.mode.name
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
        self.full_len = self.reference[0].len() as u64;
    }

    fn sorted_outputs(&self) -> Vec<String> {
        let mut v: Vec<String> = self.mode.outputs.iter().map(|o| o.to_string()).collect();
        v.sort();
        v
    }

    /// One case: kill the first run at `first`, its first `--resume` at `then`, resume until it
    /// completes; check the bytes and the directory.
    fn case(&mut self, label: &str, first: Trigger, then: Trigger) -> Phase {
        let dir = self.root.join(label);
        std::fs::create_dir(&dir).unwrap();
        let ctx = |h: &Harness, what: &str| {
            format!(
                "{} {label} (TQ_KILL_SEED={} replays; T = {:?}): {what}",
                h.mode.name, h.base, h.t
            )
        };
        let mut trigger = first;
        let mut resume = false;
        let mut trail = vec![];
        for attempt in 0.. {
            assert!(attempt < 6, "{}", ctx(self, &format!("no end: {trail:?}")));
            let phase = match self.run(&dir, resume, trigger) {
                Ok(p) => p,
                Err(e) => panic!("{}", ctx(self, &format!("after {trail:?}: {e}"))),
            };
            trail.push(phase);
            if !matches!(trigger, Trigger::Never) {
                *self.phases.entry((resume, phase)).or_default() += 1;
            }
            if phase == Phase::Completed && resume {
                break;
            }
            // A first run that completed before its kill: --resume must still end with the
            // same bytes (nothing to resume, or a checkpoint whose partial is gone).
            trigger = if resume { Trigger::Never } else { then };
            resume = true;
        }
        for (o, want) in self.mode.outputs.iter().zip(&self.reference) {
            let got = std::fs::read(dir.join(o)).unwrap();
            assert!(
                &got == want,
                "{}",
                ctx(
                    self,
                    &format!("{o} differs from the reference after {trail:?}")
                )
            );
        }
        assert_eq!(
            names(&dir),
            self.sorted_outputs(),
            "{}",
            ctx(self, &format!("files left after {trail:?}"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
        trail[0]
    }

    fn all(&mut self) {
        let start = Instant::now();
        let n = instants();
        eprintln!(
            "kill {}: TQ_KILL_SEED={} (mode seed {}), {n} instants",
            self.mode.name, self.base, self.seed
        );
        self.reference();
        let mut rng = Rng(self.seed);
        let t = self.t.as_secs_f64();
        for i in 0..n {
            // One instant per slice of (0, T), anywhere in it.
            let at = t * (i as f64 + rng.unit()) / n as f64;
            let then = if i % 2 == 1 {
                Trigger::At(Duration::from_secs_f64(t * rng.unit().max(0.01)))
            } else {
                Trigger::Never
            };
            self.case(
                &format!("at-{i}"),
                Trigger::At(Duration::from_secs_f64(at.max(0.001))),
                then,
            );
        }
        // Aimed kills: retried (at most twice) when a loaded machine made the poll miss.
        let aimed = [
            (
                "checkpoint-write",
                Trigger::CheckpointWrite(rng.next() % 4),
                Trigger::CheckpointWrite(rng.next() % 2),
                Phase::CheckpointWrite,
            ),
            (
                "finishing",
                Trigger::Finishing,
                Trigger::Never,
                Phase::Finishing,
            ),
        ];
        for (label, first, then, aim) in aimed {
            for attempt in 0..3 {
                if self.case(&format!("{label}-{attempt}"), first, then) == aim {
                    break;
                }
            }
        }
        let mut lines = vec![];
        for ((resume, phase), c) in &self.phases {
            lines.push(format!(
                "  {}{phase:?}: {c}",
                if *resume { "resume killed in " } else { "" }
            ));
        }
        eprintln!(
            "kill {}: T = {:.2} s, {} runs in {:.1} s; kills by phase:\n{}",
            self.mode.name,
            t,
            self.runs,
            start.elapsed().as_secs_f64(),
            lines.join("\n")
        );
        // The targeted kills landed where they aim (the rename pause makes the windows wide).
        assert!(
            self.phases.contains_key(&(false, Phase::CheckpointWrite)),
            "{}: no kill in a checkpoint write: {:?}",
            self.mode.name,
            self.phases
        );
        assert!(
            self.phases.contains_key(&(false, Phase::Finishing)),
            "{}: no kill while finishing: {:?}",
            self.mode.name,
            self.phases
        );
    }
}

/// The inputs of a mode: the model, the text and (when asked for) a Hessian file.
struct Inputs {
    _dir: tempfile::TempDir,
    root: PathBuf,
    model: PathBuf,
    text: PathBuf,
}

fn inputs() -> Inputs {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let model = root.join("model.gguf");
    std::fs::write(
        &model,
        fixtures::gguf_gen::tiny_llama_tok(LAYERS, EMBD, FF).bytes,
    )
    .unwrap();
    let text = root.join("calib.txt");
    std::fs::write(&text, fixtures::gguf_gen::pseudo_text(3000)).unwrap();
    Inputs {
        _dir: dir,
        root,
        model,
        text,
    }
}

fn calib_args(i: &Inputs) -> Vec<String> {
    [
        "calib",
        s(&i.model),
        "--text",
        s(&i.text),
        "--tokens",
        CALIB_TOKENS,
        "--ctx",
        CALIB_CTX,
    ]
    .map(String::from)
    .to_vec()
}

/// A Hessian file of the model on the text (uninterrupted).
fn hessians(i: &Inputs) -> PathBuf {
    let h = i.root.join("H.safetensors");
    let mut a = calib_args(i);
    a.extend(["-o".into(), s(&h).into()]);
    let (code, _, err) = fixtures::tq(&a);
    assert_eq!(code, 0, "{err}");
    h
}

fn convert(i: &Inputs, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["convert", s(&i.model), "-q", "-o", "{OUT}"]
        .map(String::from)
        .to_vec();
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

fn text_calib(i: &Inputs) -> Vec<String> {
    [
        "--calib",
        s(&i.text),
        "--calib-tokens",
        CALIB_TOKENS,
        "--calib-ctx",
        CALIB_CTX,
    ]
    .map(String::from)
    .to_vec()
}

fn check(name: &'static str, i: &Inputs, args: Vec<String>, outputs: Vec<&'static str>) {
    let mut h = Harness::new(
        Mode {
            name,
            args,
            outputs,
        },
        &i.root,
        base_seed(),
    );
    h.all();
}

#[test]
fn convert_rtn() {
    let i = inputs();
    let a = convert(&i, &["--weights", "tq4_1s"]);
    check("convert-rtn", &i, a, vec!["out.gguf"]);
}

#[test]
fn convert_calib_file() {
    let i = inputs();
    let h = hessians(&i);
    let a = convert(&i, &["--weights", "tq4_1s", "--calib", s(&h)]);
    check("convert-calib-file", &i, a, vec!["out.gguf"]);
}

#[test]
fn convert_calib_text() {
    let i = inputs();
    let mut a = convert(&i, &["--weights", "tq3_1s"]);
    a.extend(text_calib(&i));
    check("convert-calib-text", &i, a, vec!["out.gguf"]);
}

#[test]
fn convert_calib_sequential() {
    let i = inputs();
    let mut a = convert(&i, &["--weights", "tq4_1s", "--calib-sequential"]);
    a.extend(text_calib(&i));
    check("convert-calib-sequential", &i, a, vec!["out.gguf"]);
}

/// A mix half-way between all-q4_0 and all-q8_0 (measured on the weights: a mix with `--calib`
/// quantizes every candidate with LDLQ first, which costs more than the CI budget here; its
/// writing is that of `convert_calib_file`).
#[test]
fn convert_target_size() {
    let i = inputs();
    let size = |w: &str| -> u64 {
        let (code, out, err) = fixtures::tq(&[
            "convert",
            s(&i.model),
            "--weights",
            w,
            "--dry-run",
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["file_bytes"].as_u64().unwrap()
    };
    let target = (size("q4_0") + size("q8_0")) / 2;
    let a = convert(
        &i,
        &[
            "--target-size",
            &target.to_string(),
            "--types",
            "q4_0,q5_0,q8_0,tq4_1s",
        ],
    );
    check("convert-target-size", &i, a, vec!["out.gguf"]);
}

/// `tq calib`, with an imatrix written at the end (from the Hessians' diagonals, read back from
/// the partial file on a resumed run).
#[test]
fn calib() {
    let i = inputs();
    let mut a = calib_args(&i);
    a.extend(["-o", "{OUT}", "--imatrix-out", "{OUT2}"].map(String::from));
    check("calib", &i, a, vec!["H.safetensors", "imatrix.gguf"]);
}

/// The state the aimed `finishing` kill leaves, made without timing: a run stopped at its last
/// checkpoint (`TQ_CONVERT_ABORT_AFTER` = the tensor count), whose partial output then gets the
/// input's hash filled into its header as the finishing run does before its rename. `--resume`
/// continues that header (it was refused as "written for another plan or metadata").
#[test]
fn resume_after_the_input_hash_was_filled() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(
        &model,
        fixtures::gguf_gen::tiny_llama_with_tokenizer().bytes,
    )
    .unwrap();
    let out = dir.path().join("out").join("o.gguf");
    std::fs::create_dir(out.parent().unwrap()).unwrap();
    let args = |more: &[&str]| {
        let mut a: Vec<String> = [
            "convert",
            s(&model),
            "--weights",
            "q4_0",
            "-q",
            "-o",
            s(&out),
        ]
        .map(String::from)
        .to_vec();
        a.extend(more.iter().map(|x| x.to_string()));
        a
    };
    let (code, _, err) = fixtures::tq(&args(&[]));
    assert_eq!(code, 0, "{err}");
    let want = std::fs::read(&out).unwrap();
    let n = tq::gguf::GgufFile::open(&out).unwrap().tensors.len();
    std::fs::remove_file(&out).unwrap();
    let (code, _, err) = fixtures::tq_env(
        &args(&[]),
        &[("TQ_CONVERT_ABORT_AFTER", n.to_string().as_str())],
    );
    assert_eq!(code, 137, "{err}");
    let partial = out.with_file_name(partial_name("o.gguf"));
    let placeholder = std::fs::read(&partial).unwrap();
    assert_eq!(placeholder.len(), want.len());
    assert!(placeholder != want, "the hash is filled at the end");
    std::fs::write(&partial, &want).unwrap();
    let (code, _, err) = fixtures::tq(&args(&["--resume"]));
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read(&out).unwrap() == want);
    assert_eq!(names(out.parent().unwrap()), ["o.gguf"]);
}
