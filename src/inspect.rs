//! `tq inspect`: a report on a GGUF or safetensors file — metadata, tensor table, totals per
//! type, parameter count and bits per weight. Only headers are read (tensor data stays unmapped
//! pages), so a multi-GB file is inspected in milliseconds.

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::source::st::SafetensorsFile;
use crate::source::TensorSource;
use crate::types::profile::Profile;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Serialize)]
pub struct MetaEntry {
    pub key: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub value: serde_json::Value,
    #[serde(skip)]
    pub text: String,
}

#[derive(Serialize)]
pub struct TensorRow {
    pub name: String,
    /// GGUF and Hugging Face directories: ggml order (ne0 = row length first). safetensors:
    /// PyTorch order.
    pub shape: Vec<u64>,
    #[serde(rename = "type")]
    pub ty: String,
    pub bytes: u64,
    pub offset: u64,
}

#[derive(Serialize, Default)]
pub struct TypeTotal {
    #[serde(rename = "type")]
    pub ty: String,
    pub tensors: u64,
    pub elements: u64,
    pub bytes: u64,
}

#[derive(Serialize, Default)]
pub struct Report {
    pub file: String,
    pub format: &'static str,
    pub version: Option<u32>,
    pub file_bytes: u64,
    pub alignment: Option<u64>,
    pub profile: Option<String>,
    pub metadata: Vec<MetaEntry>,
    pub tensors: Vec<TensorRow>,
    pub totals: Vec<TypeTotal>,
    pub parameters: u64,
    pub tensor_bytes: u64,
    /// Tensor bytes × 8 / parameters (llama.cpp's "BPW").
    pub bpw: f64,
    /// File bytes × 8 / parameters (header and padding included).
    pub bpw_file: f64,
    /// 2-D (and higher) weights only: their bytes × 8 / their elements.
    pub bpw_2d: f64,
    pub parameters_2d: u64,
}

/// Arrays longer than this are summarized (`--full` lifts it).
pub const SUMMARY_ITEMS: usize = 8;

pub fn inspect(path: &Path, profile: &Profile, full: bool) -> Result<Report> {
    if path.is_dir() {
        return dir_report(path, full);
    }
    let mut head = [0u8; 16];
    let n = {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        f.read(&mut head).map_err(|e| Error::io(path, e))?
    };
    if n >= 4 && &head[..4] == crate::gguf::MAGIC {
        Ok(gguf_report(
            &GgufFile::open_with(path, profile)?,
            profile,
            full,
        ))
    } else if crate::source::st::looks_like_safetensors(&head[..n]) {
        Ok(st_report(&SafetensorsFile::open(path)?))
    } else {
        Err(Error::bad_input(path, "neither a GGUF file (magic \"GGUF\") nor a safetensors file (8-byte length + JSON header)"))
    }
}

/// GGUF-typed metadata (a GGUF file's, or what an HF directory would write) as report entries;
/// long arrays summarized unless `full`.
fn gguf_metadata(md: &[(String, crate::gguf::Value)], full: bool) -> Vec<MetaEntry> {
    let items = if full { usize::MAX } else { SUMMARY_ITEMS };
    md.iter()
        .map(|(k, v)| MetaEntry {
            key: k.clone(),
            ty: match v {
                crate::gguf::Value::Array(t, _) => format!("array[{}]", t.name()),
                _ => v.value_type().name().to_string(),
            },
            value: v.to_json(if full { None } else { Some(items) }),
            text: v.summary(items),
        })
        .collect()
}

fn gguf_report(f: &GgufFile, profile: &Profile, full: bool) -> Report {
    let metadata = gguf_metadata(&f.metadata, full);
    let tensors = f
        .tensors
        .iter()
        .map(|t| TensorRow {
            name: t.name.clone(),
            shape: t.dims.clone(),
            ty: t.ty.name().to_string(),
            bytes: t.size,
            offset: t.offset,
        })
        .collect();
    finish(Report {
        file: f.path.display().to_string(),
        format: "gguf",
        version: Some(f.version),
        file_bytes: f.file_len(),
        alignment: Some(f.alignment),
        profile: Some(profile.name.clone()),
        metadata,
        tensors,
        // totals, parameters and bits per weight: filled in by `finish`
        ..Default::default()
    })
}

fn st_report(f: &SafetensorsFile) -> Report {
    let metadata = f
        .metadata
        .iter()
        .map(|(k, v)| MetaEntry {
            key: k.clone(),
            ty: "string".into(),
            value: serde_json::json!(v),
            text: format!("{v:?}"),
        })
        .collect();
    let tensors = f
        .tensors
        .iter()
        .map(|t| TensorRow {
            name: t.name.clone(),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            ty: format!("{:?}", t.dtype).to_lowercase(),
            bytes: (t.end - t.start) as u64,
            offset: t.start as u64,
        })
        .collect();
    finish(Report {
        file: f.path.display().to_string(),
        format: "safetensors",
        version: None,
        file_bytes: f.file_len(),
        alignment: None,
        profile: None,
        metadata,
        tensors,
        // totals, parameters and bits per weight: filled in by `finish`
        ..Default::default()
    })
}

/// A directory: a Hugging Face model directory (config.json beside the shards) is shown as the
/// GGUF `tq convert DIR` would write before quantizing (its metadata, GGUF tensor names in ggml
/// order, source types). Anything else: an error that names the files to pass instead.
fn dir_report(dir: &Path, full: bool) -> Result<Report> {
    if !dir.join("config.json").is_file() {
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
        let mut files: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(".safetensors") || n.ends_with(".gguf"))
            .collect();
        files.sort();
        let hint = match files.len() {
            0 => "it holds no .gguf or .safetensors file".to_string(),
            n => format!(
                "pass one of its {n} .gguf / .safetensors files ({}{})",
                files
                    .iter()
                    .take(3)
                    .map(|f| crate::error::one_line(f))
                    .collect::<Vec<_>>()
                    .join(", "),
                if n > 3 { ", ..." } else { "" }
            ),
        };
        return Err(Error::bad_input(
            dir,
            format!(
                "is a directory without config.json, not a Hugging Face model directory: {hint}"
            ),
        ));
    }
    let src = crate::source::hf::HfSource::open(dir)?;
    let metadata = gguf_metadata(src.metadata(), full);
    let mut offset = 0;
    let tensors = src
        .tensors()
        .iter()
        .map(|t| {
            let bytes = t.ty.bytes_for(t.n_elements()).unwrap_or(0);
            let row = TensorRow {
                name: t.name.clone(),
                shape: t.dims.clone(),
                ty: t.ty.name().to_string(),
                bytes,
                offset,
            };
            offset += bytes;
            row
        })
        .collect();
    let file_bytes = src.shard_bytes();
    Ok(finish(Report {
        file: dir.display().to_string(),
        format: "hf",
        version: None,
        file_bytes,
        alignment: None,
        profile: None,
        metadata,
        tensors,
        // totals, parameters and bits per weight: filled in by `finish`
        ..Default::default()
    }))
}

/// Fill in totals and bits per weight from the tensor rows.
fn finish(mut r: Report) -> Report {
    let mut totals: BTreeMap<String, TypeTotal> = BTreeMap::new();
    let (mut bytes_2d, mut el_2d) = (0u64, 0u64);
    for t in &r.tensors {
        let n: u64 = t.shape.iter().product();
        let e = totals.entry(t.ty.clone()).or_insert_with(|| TypeTotal {
            ty: t.ty.clone(),
            ..Default::default()
        });
        e.tensors += 1;
        e.elements += n;
        e.bytes += t.bytes;
        r.parameters += n;
        r.tensor_bytes += t.bytes;
        if t.shape.iter().filter(|&&d| d > 1).count() >= 2 {
            bytes_2d += t.bytes;
            el_2d += n;
        }
    }
    let per = |b: u64, n: u64| {
        if n == 0 {
            0.0
        } else {
            b as f64 * 8.0 / n as f64
        }
    };
    r.bpw = per(r.tensor_bytes, r.parameters);
    r.bpw_file = per(r.file_bytes, r.parameters);
    r.bpw_2d = per(bytes_2d, el_2d);
    r.parameters_2d = el_2d;
    let mut t: Vec<TypeTotal> = totals.into_values().collect();
    t.sort_by_key(|x| std::cmp::Reverse(x.bytes));
    r.totals = t;
    r
}

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// Names and keys longer than this many characters are cut (with `…`) in the text report; the
/// JSON report keeps them whole. Engines refuse tensor names over 63 bytes (GGML_MAX_NAME), so
/// only odd files reach it.
pub const NAME_CELL: usize = 64;

/// A name or key as a text-report cell: control characters escaped, cut to [`NAME_CELL`].
pub fn cell(name: &str) -> String {
    let s = crate::error::one_line(name);
    if s.chars().count() <= NAME_CELL {
        return s;
    }
    let mut cut: String = s.chars().take(NAME_CELL - 1).collect();
    cut.push('…');
    cut
}

/// Width of a column of cells (in characters, as `{:w$}` pads), at least `min`.
pub fn column_width(cells: &[String], min: usize) -> usize {
    cells
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(0)
        .max(min)
}

/// Human-readable rendering.
pub fn render_text(r: &Report, show_tensors: bool) -> String {
    use std::fmt::Write;
    // Names and keys come from the file: control characters are escaped, never printed raw.
    use crate::error::one_line as esc;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: {}{} · {} ({} bytes)",
        esc(&r.file),
        r.format,
        r.version.map(|v| format!(" v{v}")).unwrap_or_default(),
        human(r.file_bytes),
        r.file_bytes
    );
    if r.format == "hf" {
        let _ = writeln!(
            s,
            "Hugging Face model directory (size: its shards): the metadata and tensors tq convert writes from it before quantizing (GGUF names, ggml order, source types); inspect a .safetensors shard for its own table"
        );
    }
    if let Some(a) = r.alignment {
        let _ = writeln!(
            s,
            "alignment {a}, type ids resolved with profile '{}'",
            r.profile.as_deref().unwrap_or("-")
        );
    }
    let _ = writeln!(s, "\nmetadata ({} keys):", r.metadata.len());
    let keys: Vec<String> = r.metadata.iter().map(|m| cell(&m.key)).collect();
    let kw = column_width(&keys, 0);
    for (m, k) in r.metadata.iter().zip(&keys) {
        let _ = writeln!(s, "  {k:kw$}  {:<14} {}", m.ty, esc(&m.text));
    }
    if show_tensors {
        let _ = writeln!(s, "\ntensors ({}):", r.tensors.len());
        let names: Vec<String> = r.tensors.iter().map(|t| cell(&t.name)).collect();
        let nw = column_width(&names, 4);
        let _ = writeln!(
            s,
            "  {:nw$}  {:<22} {:<8} {:>12}",
            "name", "shape", "type", "bytes"
        );
        for (t, name) in r.tensors.iter().zip(&names) {
            let shape = t
                .shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(" x ");
            let _ = writeln!(s, "  {name:nw$}  {:<22} {:<8} {:>12}", shape, t.ty, t.bytes);
        }
    }
    let _ = writeln!(s, "\ntotals per type:");
    for t in &r.totals {
        let _ = writeln!(
            s,
            "  {:<8} {:>5} tensors {:>14} elements {:>12}  ({:.2} bpw)",
            t.ty,
            t.tensors,
            t.elements,
            human(t.bytes),
            t.bytes as f64 * 8.0 / t.elements.max(1) as f64
        );
    }
    let _ = writeln!(
        s,
        "\nparameters: {} ({:.1} M)",
        r.parameters,
        r.parameters as f64 / 1e6
    );
    let _ = writeln!(s, "tensor data: {}", human(r.tensor_bytes));
    let _ = writeln!(
        s,
        "bits per weight: {:.4} (tensors), {:.4} (whole file), {:.4} (2-D weights only, {} params)",
        r.bpw, r.bpw_file, r.bpw_2d, r.parameters_2d
    );
    s
}
