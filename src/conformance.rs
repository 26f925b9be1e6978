//! `tq conformance`: run a conformance vector file through the CPU reference and count passes
//! per op. Two schemas (`../shared/conformance/README.md`):
//! - `turboquant-conformance/v1` (the fork's tq4_1s, tq3_1s, turbo2_0/3_0/4_0): every case is
//!   quantized and its expected bytes dequantized through the registry row the file's `type`
//!   names, so a new type with vectors needs no code here;
//! - the seed design's 2-bit file (`seed2bit.json`: `pack2bit`, `requant2bit`, `ldlqRound2bit`)
//!   through [`crate::types::seed2bit`].
//!
//! Comparison is the README's: bytes exactly, floats bit for bit except that an expected NaN
//! only asks for a NaN.
//!
//! With a GPU backend ([`run_file_on`]) the vectors also go through the bundled kernels where
//! there is one (ops named `op[backend]`): the fork's files through each type's dequantize kernel
//! (bit-exact with `expected_dequant_f32`); `seed2bit.json`'s `pack2bit` cases in the design's
//! own layout through the tq2_r kernels: the reconstruction (decode, and the whole-row rotation
//! back on the device when the case is incoherent) against the case's `deq`, and the mat-vec.
//! The sign generator and the encoders (`pack2bit`, `requant2bit`, `ldlqRound2bit`) have no
//! kernel and run on the CPU only.

use crate::error::{Error, Result};
use crate::gpu::{self, Backend, TwoBit, TwoBitLayout, DOT_REL_BOUND};
use crate::types::{seed2bit, TensorType};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Pass counts of one op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpCount {
    pub op: String,
    pub pass: usize,
    pub total: usize,
}

/// The result of one file: what it was, counts per op (in first-seen order), and one line per
/// failing case and op naming the case.
#[derive(Clone, Debug)]
pub struct Report {
    pub schema: String,
    pub ops: Vec<OpCount>,
    pub failures: Vec<String>,
    /// What ran where (with a GPU backend): tolerances, CPU-only ops.
    pub notes: Vec<String>,
}

impl Report {
    pub fn pass(&self) -> bool {
        self.failures.is_empty() && self.ops.iter().all(|o| o.pass == o.total)
    }

    fn record(&mut self, op: &str, id: &str, failure: Option<String>) {
        let i = match self.ops.iter().position(|o| o.op == op) {
            Some(i) => i,
            None => {
                self.ops.push(OpCount {
                    op: op.to_string(),
                    pass: 0,
                    total: 0,
                });
                self.ops.len() - 1
            }
        };
        self.ops[i].total += 1;
        match failure {
            None => self.ops[i].pass += 1,
            Some(why) => self.failures.push(format!("{op} {id}: {why}")),
        }
    }
}

/// The fork's schema tag.
const FORK_SCHEMA: &str = "turboquant-conformance/v1";

/// Read and run one vector file through the CPU references.
pub fn run_file(path: &Path) -> Result<Report> {
    run_file_on(path, None)
}

/// Read and run one vector file through the CPU references and, with `backend`, through its GPU
/// kernels where there are kernels for the file's ops.
pub fn run_file_on(path: &Path, backend: Option<&mut dyn Backend>) -> Result<Report> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => Error::bad_input(
            path,
            "not UTF-8 text; give a conformance vector file (JSON)",
        ),
        _ => Error::io(path, e),
    })?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| {
        Error::bad_input(
            path,
            format!("not valid JSON ({e}); give a conformance vector file such as ../shared/conformance/tq4_1s.json"),
        )
    })?;
    let f = File {
        path: path.to_path_buf(),
    };
    if doc.get("schema").and_then(Value::as_str) == Some(FORK_SCHEMA) {
        run_fork(&f, &doc, backend)
    } else if doc.get("signs").is_some() && doc.get("cases").is_some() {
        run_seed2bit(&f, &doc, backend)
    } else {
        let what = match doc.get("schema") {
            Some(s) => format!("unknown schema {s}"),
            None => "no `schema` key and not a seed2bit file".to_string(),
        };
        Err(f.bad(format!(
            "{what}; tq knows `{FORK_SCHEMA}` (tq4_1s, tq3_1s, turbo2_0/3_0/4_0) and seed2bit.json"
        )))
    }
}

/// The file being read, for error messages that name it and the case.
struct File {
    path: PathBuf,
}

impl File {
    fn bad(&self, msg: impl Into<String>) -> Error {
        Error::bad_input(&self.path, msg)
    }

    fn field<'a>(&self, v: &'a Value, id: &str, key: &str) -> Result<&'a Value> {
        v.get(key).ok_or_else(|| {
            self.bad(format!(
                "case {id}: missing `{key}`; the file is not a complete conformance vector file"
            ))
        })
    }

    fn usize(&self, v: &Value, id: &str, key: &str) -> Result<usize> {
        self.field(v, id, key)?
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .filter(|&x| x <= 1 << 28)
            .ok_or_else(|| self.bad(format!("case {id}: `{key}` is not a count")))
    }

    /// An array of integers in `[lo, hi]`.
    fn ints(&self, v: &Value, id: &str, key: &str, lo: i64, hi: i64) -> Result<Vec<i64>> {
        let arr = self
            .field(v, id, key)?
            .as_array()
            .ok_or_else(|| self.bad(format!("case {id}: `{key}` is not an array")))?;
        arr.iter()
            .map(|x| {
                x.as_i64().filter(|x| (lo..=hi).contains(x)).ok_or_else(|| {
                    self.bad(format!(
                        "case {id}: `{key}` holds {x}, not an integer in {lo}..={hi}"
                    ))
                })
            })
            .collect()
    }

    /// An array of u32 words (numbers).
    fn words(&self, v: &Value, id: &str, key: &str) -> Result<Vec<u32>> {
        Ok(self
            .ints(v, id, key, 0, u32::MAX as i64)?
            .into_iter()
            .map(|x| x as u32)
            .collect())
    }

    /// An array of 8-digit hex u32 strings (the fork's files).
    fn hex_words(&self, v: &Value, id: &str, key: &str) -> Result<Vec<u32>> {
        let arr = self
            .field(v, id, key)?
            .as_array()
            .ok_or_else(|| self.bad(format!("case {id}: `{key}` is not an array")))?;
        arr.iter()
            .map(|x| {
                x.as_str()
                    .and_then(|s| u32::from_str_radix(s, 16).ok())
                    .ok_or_else(|| self.bad(format!("case {id}: `{key}` holds {x}, not a hex u32")))
            })
            .collect()
    }

    fn hex_bytes(&self, v: &Value, id: &str, key: &str) -> Result<Vec<u8>> {
        let s = self.field(v, id, key)?.as_str().unwrap_or("");
        if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.bad(format!("case {id}: `{key}` is not a hex byte string")));
        }
        Ok((0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or(0))
            .collect())
    }
}

fn cases<'a>(f: &File, doc: &'a Value) -> Result<&'a Vec<Value>> {
    doc.get("cases")
        .and_then(Value::as_array)
        .ok_or_else(|| f.bad("`cases` is not an array"))
}

fn case_id(c: &Value) -> &str {
    c.get("id").and_then(Value::as_str).unwrap_or("?")
}

/// First differing positions of two word lists, or `None` when equal.
fn diff_words(got: &[u32], want: &[u32], what: &str) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let bad: Vec<String> = (0..got.len())
        .filter(|&i| got[i] != want[i])
        .take(4)
        .map(|i| format!("[{i}] got {:08x} want {:08x}", got[i], want[i]))
        .collect();
    (!bad.is_empty()).then(|| format!("{what} differ: {}", bad.join(", ")))
}

/// Float comparison of the README: bit for bit, an expected NaN only asks for a NaN.
fn diff_floats(got: &[f32], want: &[u32], what: &str) -> Option<String> {
    let got: Vec<u32> = got
        .iter()
        .zip(want)
        .map(|(g, &w)| {
            if f32::from_bits(w).is_nan() && g.is_nan() {
                w
            } else {
                g.to_bits()
            }
        })
        .chain(got.iter().skip(want.len()).map(|g| g.to_bits()))
        .collect();
    diff_words(&got, want, what)
}

fn run_fork(f: &File, doc: &Value, mut backend: Option<&mut dyn Backend>) -> Result<Report> {
    let tname = doc.get("type").and_then(Value::as_str).unwrap_or("");
    let ty = TensorType::from_name(tname)
        .filter(|t| t.info().quantize.is_some() && t.info().dequantize.is_some())
        .ok_or_else(|| {
            f.bad(format!(
                "type `{tname}` has no quantizer and dequantizer in tq; this tq checks tq4_1s, tq3_1s and turbo2_0/3_0/4_0"
            ))
        })?;
    let info = ty.info();
    let top = |k: &str| doc.get(k).and_then(Value::as_u64);
    if top("block_elements") != Some(info.block_size as u64)
        || top("block_bytes") != Some(info.block_bytes as u64)
    {
        return Err(f.bad(format!(
            "block_elements/block_bytes are not {}'s {} values in {} bytes",
            info.name, info.block_size, info.block_bytes
        )));
    }
    let (q, dq) = (info.quantize.unwrap(), info.dequantize.unwrap());
    let mut rep = Report {
        schema: format!("{FORK_SCHEMA} ({})", info.name),
        ops: Vec::new(),
        failures: Vec::new(),
        notes: Vec::new(),
    };
    if let Some(b) = &backend {
        let on = b.kind().name();
        rep.notes.push(if gpu::KERNEL_TYPES.contains(&ty) {
            format!(
                "{}.dequantize[{on}]: the expected bytes through the {on} dequantize kernel, \
                 bit-exact with expected_dequant_f32; quantize is CPU only (no encoder kernel)",
                info.name
            )
        } else {
            format!("{}: no GPU kernel; CPU reference only", info.name)
        });
        if !gpu::KERNEL_TYPES.contains(&ty) {
            backend = None;
        }
    }
    for c in cases(f, doc)? {
        let id = case_id(c);
        let n = f.usize(c, id, "n")?;
        let input = f.hex_words(c, id, "input_f32")?;
        let bytes = f.hex_bytes(c, id, "expected_bytes")?;
        let deq = f.hex_words(c, id, "expected_dequant_f32")?;
        let want_bytes = ty.bytes_for(n as u64);
        if n == 0 || input.len() != n || deq.len() != n || want_bytes != Some(bytes.len() as u64) {
            return Err(f.bad(format!(
                "case {id}: n = {n} does not match its arrays ({} inputs, {} bytes, {} outputs) in whole {} blocks",
                input.len(),
                bytes.len(),
                deq.len(),
                info.name
            )));
        }
        let x: Vec<f32> = input.iter().map(|&b| f32::from_bits(b)).collect();
        let mut got = vec![0u8; bytes.len()];
        q(&x, &mut got);
        let qf = (got != bytes).then(|| {
            let i = (0..got.len()).find(|&i| got[i] != bytes[i]).unwrap_or(0);
            format!(
                "bytes differ from byte {i} (block {}): got {:02x} want {:02x}",
                i / info.block_bytes,
                got[i],
                bytes[i]
            )
        });
        rep.record(&format!("{}.quantize", info.name), id, qf);
        let mut out = vec![0f32; n];
        dq(&bytes, &mut out);
        rep.record(
            &format!("{}.dequantize", info.name),
            id,
            diff_floats(&out, &deq, "dequantized values"),
        );
        if let Some(b) = backend.as_deref_mut() {
            let got = b.dequantize(ty, &bytes)?;
            rep.record(
                &format!("{}.dequantize[{}]", info.name, b.kind().name()),
                id,
                diff_floats(&got, &deq, "dequantized values"),
            );
        }
    }
    Ok(rep)
}

/// One pack2bit case through the tq2_r kernels: the reconstruction and a mat-vec.
#[allow(clippy::too_many_arguments)]
fn seed2bit_on_gpu(
    b: &mut dyn Backend,
    p: &seed2bit::Packed,
    n: usize,
    k: usize,
    incoherent: bool,
    deq: &[u32],
    seed: u64,
    id: &str,
    rep: &mut Report,
) -> Result<()> {
    let on = b.kind().name();
    if deq.len() != n * k {
        return Err(Error::Unsupported(format!(
            "{} reconstructed values for {n} x {k}",
            deq.len()
        )));
    }
    let data = TwoBit::seed_bytes(&p.qw, &p.sc);
    let w = TwoBit {
        layout: TwoBitLayout::Seed,
        data: &data,
        rows: n,
        cols: k,
        rotated: incoherent,
    };
    let got = b.twobit_decode(&w, true)?;
    let why = if incoherent {
        // Row i of R has entries ±1/√K: Σ_j |R_ij·a_j| = ‖a_row‖₁/√K.
        let a: Vec<f64> = (0..n * k)
            .map(|i| seed2bit::level(seed2bit::get_code(&p.qw, i), p.sc[i / seed2bit::QK2]).abs())
            .collect();
        let mut worst: Option<(usize, f64)> = None;
        for (r, row) in a.chunks_exact(k).enumerate() {
            let s = row.iter().sum::<f64>() / (k as f64).sqrt();
            for i in r * k..(r + 1) * k {
                let (g, want) = (got[i] as f64, f32::from_bits(deq[i]) as f64);
                let e = (g - want).abs();
                let ok = e <= DOT_REL_BOUND * s || (g.is_nan() && want.is_nan());
                if !ok && worst.is_none_or(|(_, w)| e > w) {
                    worst = Some((i, e));
                }
            }
        }
        worst.map(|(i, e)| {
            format!(
                "reconstruction (deq) [{i}]: got {:e} want {:e} (|err| {e:e} above the bound)",
                got[i],
                f32::from_bits(deq[i])
            )
        })
    } else {
        diff_floats(&got, deq, "reconstruction (deq)")
    };
    rep.record(&format!("reconstruct[{on}]"), id, why);
    // The mat-vec, against the f64 product of the expected reconstruction.
    let x = gpu::random_activation(k, &mut gpu::Rng::new(seed));
    let y = b.twobit_matvec(&w, &x, false)?;
    let mut why = None;
    for (r, yr) in y.iter().enumerate() {
        let (mut d, mut s) = (0f64, 0f64);
        for (j, &xj) in x.iter().enumerate() {
            let v = f32::from_bits(deq[r * k + j]) as f64 * xj as f64;
            d += v;
            s += v.abs();
        }
        let e = (*yr as f64 - d).abs();
        if e > DOT_REL_BOUND * s && why.is_none() {
            why = Some(format!(
                "mat-vec row {r}: got {yr:e}, f64 reference {d:e} (sum|w*x| = {s:e})"
            ));
        }
    }
    rep.record(&format!("matvec[{on}]"), id, why);
    Ok(())
}

fn f32s(w: Vec<u32>) -> Vec<f32> {
    w.into_iter().map(f32::from_bits).collect()
}

fn run_seed2bit(f: &File, doc: &Value, mut backend: Option<&mut dyn Backend>) -> Result<Report> {
    let mut rep = Report {
        schema: "seed2bit (FORMATS.md §6)".into(),
        ops: Vec::new(),
        failures: Vec::new(),
        notes: Vec::new(),
    };
    if let Some(b) = &backend {
        let on = b.kind().name();
        rep.notes.push(format!(
            "reconstruct[{on}]: each pack2bit case's expected codes and scales, in the design's \
             own layout, through the tq2_r decode kernel and (incoherent cases) the whole-row \
             rotation back on the device; bit-exact with `deq` without rotation, else \
             |err_i| <= {DOT_REL_BOUND:.3e} * sum_j |R_ij*a_j| (the design rotates back in f64, \
             the kernels in f32)"
        ));
        rep.notes.push(format!(
            "matvec[{on}]: the same weights times a fixed activation (the device rotates it, \
             then the word-oriented GEMV), |err| <= {DOT_REL_BOUND:.3e} * sum|deq*x| against \
             the f64 product of `deq`"
        ));
        rep.notes.push(
            "CPU only (no kernel): signsFor (the host makes the sign vector), pack2bit, \
             requant2bit, ldlqRound2bit (encoders)"
                .into(),
        );
    }
    // The sign generator first: a decoder that gets it wrong gets every rotated case wrong.
    let signs = doc
        .get("signs")
        .and_then(Value::as_object)
        .ok_or_else(|| f.bad("`signs` is not an object of K -> bit string"))?;
    for (k, bits) in signs {
        let id = format!("K={k}");
        let k: usize = k
            .parse()
            .ok()
            .filter(|&k| k <= 1 << 24)
            .ok_or_else(|| f.bad(format!("signs: key {k} is not a row length")))?;
        let want = bits.as_str().unwrap_or("");
        let got: String = seed2bit::signs_for(k)
            .iter()
            .map(|&s| if s > 0.0 { '1' } else { '0' })
            .collect();
        let why = (got != want).then(|| {
            let i = got
                .bytes()
                .zip(want.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            format!("sign bits differ from element {i}")
        });
        rep.record("signsFor", &id, why);
    }
    for c in cases(f, doc)? {
        let id = case_id(c);
        let op = f.field(c, id, "op")?.as_str().unwrap_or("");
        let n = f.usize(c, id, "N")?;
        let k = f.usize(c, id, "K")?;
        // Shape errors from the packer name the op; say which case they are in.
        let shape = |e: Error| f.bad(format!("case {id}: {e}"));
        match op {
            "pack2bit" => {
                let w = f32s(f.words(c, id, "w")?);
                let inc = f
                    .field(c, id, "incoherent")?
                    .as_bool()
                    .ok_or_else(|| f.bad(format!("case {id}: `incoherent` is not true/false")))?;
                let p = seed2bit::pack2bit(&w, n, k, inc).map_err(shape)?;
                let want_sc = f.words(c, id, "sc")?;
                let sc: Vec<u32> = p.sc.iter().map(|s| s.to_bits()).collect();
                let why = diff_words(&p.qw, &f.words(c, id, "qw")?, "codes (qw)")
                    .or_else(|| diff_words(&sc, &want_sc, "scales (sc)"));
                rep.record("pack2bit", id, why);
                // The reconstruction from the *expected* codes and scales, as a decoder sees them.
                let given = seed2bit::Packed {
                    qw: f.words(c, id, "qw")?,
                    sc: f32s(want_sc),
                };
                let deq = seed2bit::reconstruct(&given, n, k, inc).map_err(shape)?;
                let want_deq = f.words(c, id, "deq")?;
                let why = diff_floats(&deq, &want_deq, "reconstruction (deq)");
                rep.record("reconstruct", id, why);
                if let Some(b) = backend.as_deref_mut() {
                    let case = f.usize(c, id, "N")? as u64 * 0x9e37 + k as u64;
                    seed2bit_on_gpu(b, &given, n, k, inc, &want_deq, case, id, &mut rep)
                        .map_err(|e| f.bad(format!("case {id} on {}: {e}", b.kind().name())))?;
                }
            }
            "requant2bit" => {
                let q8: Vec<i8> = f
                    .ints(c, id, "q8", -128, 127)?
                    .into_iter()
                    .map(|x| x as i8)
                    .collect();
                let s = f32s(f.words(c, id, "s")?);
                let p = seed2bit::requant2bit(&q8, &s, n, k).map_err(shape)?;
                let sc: Vec<u32> = p.sc.iter().map(|s| s.to_bits()).collect();
                let want_sc = f.words(c, id, "sc")?;
                let why = diff_words(&p.qw, &f.words(c, id, "qw")?, "codes (qw)")
                    .or_else(|| diff_words(&sc, &want_sc, "scales (sc)"));
                rep.record("requant2bit", id, why);
            }
            "ldlqRound2bit" => {
                let w = f32s(f.words(c, id, "w")?);
                let l = f32s(f.words(c, id, "L")?);
                let sc = f32s(f.words(c, id, "sc")?);
                let band = f.usize(c, id, "band")?;
                let q = seed2bit::ldlq_round2bit(&w, Some(&l), &sc, n, k, band).map_err(shape)?;
                let why = diff_words(&q, &f.words(c, id, "qw")?, "codes (qw)");
                rep.record("ldlqRound2bit", id, why);
                let q = seed2bit::ldlq_round2bit(&w, None, &sc, n, k, band).map_err(shape)?;
                let why = diff_words(&q, &f.words(c, id, "qw_no_L")?, "codes (qw_no_L)");
                rep.record("ldlqRound2bit(no L)", id, why);
            }
            other => {
                return Err(f.bad(format!(
                    "case {id}: unknown op `{other}`; seed2bit ops are pack2bit, requant2bit, ldlqRound2bit"
                )))
            }
        }
    }
    Ok(rep)
}
