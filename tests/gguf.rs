//! GGUF reader/writer: round trips (real SmolLM2 file and generated fixtures), gguf-py as an
//! independent reader of what we write, and hostile inputs (never a panic, always a clear error).

#[path = "../fixtures/mod.rs"]
mod fixtures;

use fixtures::gguf_gen;
use std::path::Path;
use tq::gguf::{GgufFile, GgufWriter, TensorSpec, Value};

/// Re-write `f` through the streaming writer (data in chunks of `chunk` bytes).
fn rewrite(f: &GgufFile, out: &Path, chunk: usize) {
    let specs: Vec<TensorSpec> = f.tensors.iter().map(|t| t.spec()).collect();
    let mut w = GgufWriter::create(out, f.version, &f.metadata, &specs).unwrap();
    for t in &f.tensors {
        for c in f.tensor_data(t).chunks(chunk) {
            w.write_data(c).unwrap();
        }
    }
    w.finish().unwrap();
}

#[test]
fn smollm2_round_trip_is_byte_identical() {
    let Some(path) = fixtures::smollm2() else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(f.architecture(), Some("llama"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rt.gguf");
    rewrite(&f, &out, 1 << 20);
    let a = std::fs::read(&path).unwrap();
    let b = std::fs::read(&out).unwrap();
    assert_eq!(a.len(), b.len());
    assert!(
        a == b,
        "round trip differs at byte {:?}",
        a.iter().zip(&b).position(|(x, y)| x != y)
    );
    // Only the final file exists: no temporary left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn generated_fixtures_read_and_round_trip() {
    for (version, align) in [
        (3, None),
        (2, None),
        (3, Some(64)),
        (3, Some(1)),
        (2, Some(256)),
    ] {
        let fx = gguf_gen::standard(version, align);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fx.gguf");
        std::fs::write(&p, &fx.bytes).unwrap();
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.version, version);
        assert_eq!(f.alignment, fx.alignment);
        assert_eq!(
            f.metadata, fx.metadata,
            "metadata (types, values, order) preserved"
        );
        assert_eq!(f.tensors.len(), fx.tensors.len());
        for (t, (name, dims, id, data)) in f.tensors.iter().zip(&fx.tensors) {
            assert_eq!(&t.name, name);
            assert_eq!(&t.dims, dims);
            assert_eq!(t.type_id, *id);
            assert_eq!(f.tensor_data(t), &data[..], "{name}");
        }
        for chunk in [7, 1 << 20] {
            let out = dir.path().join("out.gguf");
            rewrite(&f, &out, chunk);
            assert_eq!(
                std::fs::read(&out).unwrap(),
                fx.bytes,
                "v{version} align {align:?} chunk {chunk}"
            );
        }
        let size = tq::gguf::writer::file_size(
            version,
            &f.metadata,
            &f.tensors.iter().map(|t| t.spec()).collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(size, fx.bytes.len() as u64);
    }
}

#[test]
fn writer_leaves_no_partial_file() {
    let fx = gguf_gen::standard(3, None);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fx.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    let f = GgufFile::open(&p).unwrap();
    let specs: Vec<TensorSpec> = f.tensors.iter().map(|t| t.spec()).collect();
    let out = dir.path().join("out.gguf");
    // Too little data: finish() fails and nothing exists under the final name.
    let mut w = GgufWriter::create(&out, 3, &f.metadata, &specs).unwrap();
    w.write_data(&[0u8; 10]).unwrap();
    let e = w.finish().unwrap_err().to_string();
    assert!(e.contains("received 10 of 256 bytes"), "{e}");
    assert!(!out.exists());
    // Dropped mid-way (an error elsewhere): the temporary file is removed too.
    let w = GgufWriter::create(&out, 3, &f.metadata, &specs).unwrap();
    drop(w);
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only the input remains"
    );
    // Too much data is an error, not a silently longer file.
    let mut w = GgufWriter::create(&out, 3, &f.metadata, &specs[..1]).unwrap();
    assert!(w.write_data(&vec![0u8; 257]).is_err());
}

/// gguf-py (an independent implementation) reads what our writer writes.
#[test]
fn gguf_py_reads_our_output() {
    let py = fixtures::cache_dir().join("venv/bin/python");
    let Some(py) = fixtures::data_file(py, "scripts/oracle.sh (creates the Python venv)") else {
        return;
    };
    // gguf-py knows stock type ids only, so this fixture leaves out the TQ4_1S tensor.
    let fx = gguf_gen::build(
        3,
        Some(64),
        gguf_gen::all_value_types(),
        &[
            ("a", vec![64], 0, 1, 4),
            ("b", vec![64, 3], 1, 1, 2),
            ("c", vec![256, 2], 12, 256, 144),
            ("d", vec![32], 8, 32, 34),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fx.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    let f = GgufFile::open(&p).unwrap();
    let out = dir.path().join("ours.gguf");
    rewrite(&f, &out, 4096);
    let script = r#"
import sys, json, gguf
r = gguf.GGUFReader(sys.argv[1])
kv = {}
for f in r.fields.values():
    if f.name.startswith('GGUF.'): continue
    kv[f.name] = [int(t) for t in f.types]
ts = [[t.name, [int(x) for x in t.shape], int(t.tensor_type), int(t.n_bytes), bytes(t.data.tobytes()).hex()[:64]] for t in r.tensors]
print(json.dumps({"kv": kv, "tensors": ts, "name": str(r.fields['general.name'].contents())}))
"#;
    let o = std::process::Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gguf-py failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["name"], "fixture ünïcode ✓");
    let kv = j["kv"].as_object().unwrap();
    assert_eq!(kv.len(), f.metadata.len());
    for (k, v) in &f.metadata {
        let types = kv[k].as_array().unwrap();
        assert_eq!(types[0].as_u64().unwrap(), v.value_type() as u64, "{k}");
    }
    let ts = j["tensors"].as_array().unwrap();
    assert_eq!(ts.len(), f.tensors.len());
    for (t, pj) in f.tensors.iter().zip(ts) {
        assert_eq!(pj[0], t.name.as_str());
        assert_eq!(pj[2].as_u64().unwrap(), t.type_id as u64);
        {
            assert_eq!(pj[3].as_u64().unwrap(), t.size, "{}", t.name);
            let hex: String = f
                .tensor_data(t)
                .iter()
                .take(32)
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(pj[4].as_str().unwrap(), hex, "{}", t.name);
        }
    }
}

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, String> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.gguf");
    std::fs::write(&p, bytes).unwrap();
    GgufFile::open(&p).map_err(|e| {
        let s = e.to_string();
        assert!(s.contains("bad.gguf"), "error names the file: {s}");
        assert!(!s.contains('\n'), "one line: {s}");
        assert_eq!(e.exit_code(), 2);
        s
    })
}

/// In-memory validation (same parser as `open`), for the bulk corruption tests.
fn check(bytes: &[u8]) -> Result<usize, String> {
    let r = tq::gguf::reader::validate(bytes, &tq::types::profile::Profile::default());
    if let Err(e) = &r {
        assert!(!e.contains('\n'), "one line: {e}");
    }
    r
}

#[test]
fn every_truncation_is_a_clean_error() {
    let fx = gguf_gen::standard(3, None);
    let f = open_bytes(&fx.bytes).unwrap();
    let data_end = fx.bytes.len();
    for cut in 0..data_end {
        // Cuts inside the padding after the last tensor still leave a valid file.
        let last = f
            .tensors
            .iter()
            .map(|t| f.data_offset + t.offset + t.size)
            .max()
            .unwrap() as usize;
        let r = if cut % 97 == 0 {
            open_bytes(&fx.bytes[..cut]).map(|_| 0)
        } else {
            check(&fx.bytes[..cut])
        };
        if cut >= last {
            assert!(r.is_ok(), "cut {cut}");
        } else {
            assert!(r.is_err(), "cut at {cut} of {data_end} accepted");
        }
    }
}

#[test]
fn mutated_files_never_panic() {
    let fx = gguf_gen::standard(3, None);
    let header_len = open_bytes(&fx.bytes).unwrap().header_len as usize;
    let noise = gguf_gen::pseudo_bytes(99, 40_000);
    for i in 0..10_000 {
        let mut b = fx.bytes.clone();
        let pos = (u16::from_le_bytes([noise[4 * i], noise[4 * i + 1]]) as usize) % header_len;
        b[pos] = noise[4 * i + 2];
        if noise[4 * i + 3] & 1 == 0 {
            b[(pos + 1) % header_len] ^= 0x80;
        }
        // Ok or a clean one-line error; a panic fails the test.
        if i % 500 == 0 {
            let _ = open_bytes(&b);
        } else {
            let _ = check(&b);
        }
    }
}

/// Patch helpers for targeted corruptions.
fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn push_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn tensor_info(b: &mut Vec<u8>, name: &str, dims: &[u64], ty: u32, off: u64) {
    push_str(b, name);
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&off.to_le_bytes());
}

fn with_data(mut b: Vec<u8>, data_len: usize) -> Vec<u8> {
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    b.extend(std::iter::repeat_n(0u8, data_len));
    b
}

#[test]
fn targeted_corruptions_give_specific_errors() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad magic", b"GGUL\x03\0\0\0".to_vec(), "not a GGUF file"),
        (
            "version 9",
            {
                let mut b = header(0, 0);
                b[4] = 9;
                b
            },
            "unsupported GGUF version 9",
        ),
        (
            "absurd kv count",
            header(0, u64::MAX / 2),
            "metadata entries",
        ),
        (
            "absurd tensor count",
            header(1 << 40, 0),
            "tensors, more than the file",
        ),
        (
            "huge string",
            {
                let mut b = header(0, 1);
                b.extend_from_slice(&u64::MAX.to_le_bytes());
                b.extend_from_slice(&[0; 16]);
                b
            },
            "truncated",
        ),
        (
            "huge array",
            {
                let mut b = header(0, 1);
                push_str(&mut b, "a");
                b.extend_from_slice(&9u32.to_le_bytes());
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&(1u64 << 60).to_le_bytes());
                b
            },
            "array claims",
        ),
        (
            "bad value type",
            {
                let mut b = header(0, 1);
                push_str(&mut b, "k");
                b.extend_from_slice(&77u32.to_le_bytes());
                b
            },
            "unknown value type 77",
        ),
        (
            "bad bool",
            {
                let mut b = header(0, 1);
                push_str(&mut b, "k");
                b.extend_from_slice(&7u32.to_le_bytes());
                b.push(5);
                b
            },
            "invalid bool",
        ),
        (
            "dup key",
            {
                let mut b = header(0, 2);
                for _ in 0..2 {
                    push_str(&mut b, "k");
                    b.extend_from_slice(&0u32.to_le_bytes());
                    b.push(1);
                }
                b
            },
            "duplicate metadata key 'k'",
        ),
        (
            "bad alignment",
            {
                let mut b = header(0, 1);
                push_str(&mut b, "general.alignment");
                b.extend_from_slice(&4u32.to_le_bytes());
                b.extend_from_slice(&48u32.to_le_bytes());
                b
            },
            "power of two",
        ),
        (
            "too many dims",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[1, 1, 1, 1, 1], 0, 0);
                with_data(b, 4)
            },
            "5 dimensions",
        ),
        (
            "dims overflow",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[1 << 32, 1 << 32], 0, 0);
                with_data(b, 4)
            },
            "overflows",
        ),
        (
            // A zero dimension makes the element count 0 but not the row count (dims[1..]).
            "zero before an overflow",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[0, 1 << 32, 1 << 32], 0, 0);
                with_data(b, 4)
            },
            "overflows",
        ),
        (
            "byte size overflow",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[1 << 31, (1 << 31) - 1], 28, 0);
                with_data(b, 8)
            },
            "f64 elements overflows",
        ),
        (
            "offset + size overflows",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[16], 0, u64::MAX - 31);
                with_data(b, 64)
            },
            "offset + size overflows",
        ),
        (
            "unknown type",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[32], 99, 0);
                with_data(b, 64)
            },
            "unknown ggml type id 99",
        ),
        (
            "row not a block multiple",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[33], 8, 0);
                with_data(b, 64)
            },
            "not a multiple of the q8_0 block size 32",
        ),
        (
            "misaligned",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[4], 0, 3);
                with_data(b, 64)
            },
            "not a multiple of the alignment",
        ),
        (
            "out of file",
            {
                let mut b = header(1, 0);
                tensor_info(&mut b, "t", &[64], 0, 0);
                with_data(b, 100)
            },
            "data section has 100",
        ),
        (
            "overlap",
            {
                let mut b = header(2, 0);
                tensor_info(&mut b, "a", &[16], 0, 0);
                tensor_info(&mut b, "b", &[16], 0, 32);
                with_data(b, 128)
            },
            "overlap",
        ),
        (
            "dup tensor",
            {
                let mut b = header(2, 0);
                tensor_info(&mut b, "a", &[8], 0, 0);
                tensor_info(&mut b, "a", &[8], 0, 32);
                with_data(b, 64)
            },
            "duplicate tensor name 'a'",
        ),
    ];
    for (what, bytes, expect) in cases {
        let e = open_bytes(&bytes).expect_err(what);
        assert!(
            e.contains(expect),
            "{what}: got '{e}', expected it to contain '{expect}'"
        );
    }
}

/// A u8 array costs one byte per element in the file but a whole `Value` in memory: a corrupt
/// count backed by a (sparse) file of that size must be refused, not decoded into 32x its size.
#[test]
fn metadata_value_budget_bounds_memory() {
    let n = tq::gguf::reader::MAX_METADATA_VALUES + 1;
    let mut b = header(0, 1);
    push_str(&mut b, "big");
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&0u32.to_le_bytes()); // of u8
    b.extend_from_slice(&n.to_le_bytes());
    b.resize(b.len() + n as usize, 0);
    let e = open_bytes(&b).expect_err("oversized u8 array accepted");
    assert!(e.contains("'big'") && e.contains("limit"), "{e}");
}

#[test]
fn metadata_accessors() {
    let fx = gguf_gen::standard(3, None);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fx.gguf");
    std::fs::write(&p, &fx.bytes).unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.get_u64("test.u32"), Some(4_000_000_000));
    assert_eq!(f.get_u64("test.i8"), None);
    assert_eq!(f.get_f64("test.f64"), Some(std::f64::consts::PI));
    assert!(matches!(f.get("test.arr_nested"), Some(Value::Array(..))));
    assert_eq!(
        f.tensor("blk.0.attn_v.weight").unwrap().ty,
        tq::types::TensorType::TQ4_1S
    );
}
