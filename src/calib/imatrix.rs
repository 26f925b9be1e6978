//! llama.cpp's importance matrix ("imatrix"): per weight tensor, the mean of the squared input
//! activations per column — the diagonal of tq's Hessian `H = Σ x xᵀ` divided by the token count.
//!
//! - [`write_gguf`]: tq's Hessians as the GGUF imatrix that `llama-imatrix` writes by default and
//!   `llama-quantize --imatrix` reads: `general.type = "imatrix"`, `imatrix.datasets`,
//!   `imatrix.chunk_count`, `imatrix.chunk_size`, and per weight `NAME.in_sum2` (f32, `[n, 1]`:
//!   `Σ x²` per column) and `NAME.counts` (f32, `[1, 1]`: tokens).
//! - [`load`]: that GGUF form, or the legacy `.dat` form (`i32` entry count; per entry `i32`
//!   name length, name, `i32` ncall, `i32` n, `n` f32 already averaged), as per-column importance
//!   for `tq convert --imatrix` (diagonal-only weighting of the stock types' block parameters).

use crate::error::{Error, Result};
use crate::gguf::writer::{GgufWriter, TensorSpec};
use crate::gguf::{GgufFile, Value};
use crate::quant::Diagonal;
use std::collections::BTreeMap;
use std::path::Path;

/// Per weight tensor name, the mean squared input per column.
#[derive(Debug, Default)]
pub struct Imatrix {
    pub entries: BTreeMap<String, Vec<f32>>,
}

impl Imatrix {
    pub fn for_tensor(&self, name: &str) -> Option<&[f32]> {
        self.entries.get(name).map(|v| v.as_slice())
    }
}

/// Write Hessian diagonals (one per group) as a GGUF imatrix (see the module comment).
/// `chunk_size` is the window length.
pub fn write_gguf(diag: &[Diagonal], path: &Path, dataset: &str, chunk_size: usize) -> Result<()> {
    let mut specs = Vec::new();
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut max_tokens = 0u64;
    // Experts (`TENSOR#e` groups): one entry per 3-D tensor as llama-imatrix writes it, the
    // experts' sums of squares as rows of `in_sum2` [n, n_expert] and their token counts in
    // `counts` [1, n_expert].
    let mut experts: std::collections::BTreeMap<&str, Vec<(usize, &Diagonal)>> = Default::default();
    for g in diag {
        for t in &g.tensors {
            if let Some((base, e)) = t.split_once('#') {
                if let Ok(e) = e.parse::<usize>() {
                    experts.entry(base).or_default().push((e, g));
                }
            }
        }
    }
    for (base, list) in &experts {
        let n_exp = list.iter().map(|(e, _)| e + 1).max().unwrap_or(0);
        let n = list[0].1.d.len();
        let mut sum2 = vec![0f32; n * n_exp];
        let mut counts = vec![0f32; n_exp];
        for (e, g) in list {
            for (o, &v) in sum2[e * n..(e + 1) * n].iter_mut().zip(&g.d) {
                *o = v as f32;
            }
            counts[*e] = g.tokens as f32;
            max_tokens = max_tokens.max(g.tokens);
        }
        specs.push(TensorSpec {
            name: format!("{base}.in_sum2"),
            dims: vec![n as u64, n_exp as u64],
            type_id: 0,
            size: 4 * sum2.len() as u64,
        });
        data.push(sum2.iter().flat_map(|v| v.to_le_bytes()).collect());
        specs.push(TensorSpec {
            name: format!("{base}.counts"),
            dims: vec![1, n_exp as u64],
            type_id: 0,
            size: 4 * n_exp as u64,
        });
        data.push(counts.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    for g in diag
        .iter()
        .filter(|g| !g.tensors.iter().any(|t| t.contains('#')))
    {
        let sum2: Vec<u8> = g.d.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
        max_tokens = max_tokens.max(g.tokens);
        for t in &g.tensors {
            specs.push(TensorSpec {
                name: format!("{t}.in_sum2"),
                dims: vec![g.d.len() as u64, 1],
                type_id: 0,
                size: sum2.len() as u64,
            });
            data.push(sum2.clone());
            specs.push(TensorSpec {
                name: format!("{t}.counts"),
                dims: vec![1, 1],
                type_id: 0,
                size: 4,
            });
            data.push((g.tokens as f32).to_le_bytes().to_vec());
        }
    }
    // llama.cpp sorts entries by name; do the same so files are comparable.
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by(|&a, &b| specs[a].name.cmp(&specs[b].name));
    let specs: Vec<TensorSpec> = order.iter().map(|&i| specs[i].clone()).collect();
    let chunks = max_tokens / chunk_size.max(1) as u64;
    let md = vec![
        ("general.type".to_string(), Value::string("imatrix")),
        (
            "imatrix.datasets".to_string(),
            crate::gguf::writer::string_array([dataset.to_string()]),
        ),
        ("imatrix.chunk_count".to_string(), Value::U32(chunks as u32)),
        (
            "imatrix.chunk_size".to_string(),
            Value::U32(chunk_size as u32),
        ),
    ];
    let mut w = GgufWriter::create(path, 3, &md, &specs)?;
    for &i in &order {
        w.write_data(&data[i])?;
    }
    w.finish()
}

/// Read a GGUF or legacy `.dat` imatrix (by content, not by name).
pub fn load(path: &Path) -> Result<Imatrix> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    if bytes.starts_with(b"GGUF") {
        load_gguf(path)
    } else {
        load_dat(path, &bytes)
    }
}

fn load_gguf(path: &Path) -> Result<Imatrix> {
    let f = GgufFile::open(path)?;
    let bad = |why: String| Error::bad_input(path, format!("not a llama.cpp imatrix: {why}"));
    if f.get_str("general.type") != Some("imatrix") {
        return Err(bad("general.type is not \"imatrix\"".into()));
    }
    let mut out = Imatrix::default();
    for t in &f.tensors {
        let Some(name) = t.name.strip_suffix(".in_sum2") else {
            continue;
        };
        let counts = f
            .tensor(&format!("{name}.counts"))
            .ok_or_else(|| bad(format!("{name}.in_sum2 has no {name}.counts")))?;
        let sum2 = f.tensor_f32(t)?;
        let cnt = f.tensor_f32(counts)?;
        let n = t.dims[0] as usize;
        if cnt.is_empty() || sum2.len() != n * cnt.len() {
            return Err(bad(format!(
                "{name}: {} sums for {} counts of {n} columns",
                sum2.len(),
                cnt.len()
            )));
        }
        // Several matrices (experts) share a tensor: add their means column by column.
        let mut v = vec![0f32; n];
        for (m, c) in cnt.iter().enumerate() {
            if *c > 0.0 {
                for (o, s) in v.iter_mut().zip(&sum2[m * n..(m + 1) * n]) {
                    *o += s / c;
                }
            }
        }
        check_values(path, name, &v)?;
        out.entries.insert(name.to_string(), v);
    }
    if out.entries.is_empty() {
        return Err(bad("no NAME.in_sum2 tensors".into()));
    }
    Ok(out)
}

/// An importance is a mean of squares: finite and at least 0.
fn check_values(path: &Path, name: &str, v: &[f32]) -> Result<()> {
    match v.iter().position(|x| !(x.is_finite() && *x >= 0.0)) {
        None => Ok(()),
        Some(i) => Err(Error::bad_input(
            path,
            format!(
                "imatrix entry '{name}' has {} at column {i} (a mean of squares is finite and at least 0): the file is damaged; make it again",
                v[i]
            ),
        )),
    }
}

fn load_dat(path: &Path, b: &[u8]) -> Result<Imatrix> {
    let bad = || {
        Error::bad_input(
            path,
            "neither a GGUF imatrix nor a legacy .dat imatrix (truncated or malformed)",
        )
    };
    let mut pos = 0usize;
    let i32_at = |pos: &mut usize| -> Result<i32> {
        let v = b.get(*pos..*pos + 4).ok_or_else(bad)?;
        *pos += 4;
        Ok(i32::from_le_bytes(v.try_into().unwrap()))
    };
    let n_entries = i32_at(&mut pos)?;
    if n_entries <= 0 {
        return Err(bad());
    }
    let mut out = Imatrix::default();
    for _ in 0..n_entries {
        let len = i32_at(&mut pos)?;
        if len <= 0 {
            return Err(bad());
        }
        let name = b.get(pos..pos + len as usize).ok_or_else(bad)?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| bad())?;
        pos += len as usize;
        let _ncall = i32_at(&mut pos)?;
        let n = i32_at(&mut pos)?;
        if n <= 0 {
            return Err(bad());
        }
        let vals = b.get(pos..pos + 4 * n as usize).ok_or_else(bad)?;
        pos += 4 * n as usize;
        let v = vals
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<f32>>();
        check_values(path, &name, &v)?;
        out.entries.insert(name, v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Hessian;

    #[test]
    fn gguf_round_trip_gives_the_mean_square() {
        let dir = tempfile::tempdir().unwrap();
        let mut hs = crate::quant::Hessians::default();
        let n = 4;
        let mut h = vec![0f64; n * n];
        for i in 0..n {
            h[i * n + i] = (i + 1) as f64 * 10.0;
        }
        hs.groups.insert(
            "a,b".into(),
            Hessian {
                tensors: vec!["blk.0.a.weight".into(), "blk.0.b.weight".into()],
                n,
                h,
                tokens: 5,
            },
        );
        let p = dir.path().join("i.gguf");
        write_gguf(&hs.diagonals(), &p, "text.txt", 512).unwrap();
        let im = load(&p).unwrap();
        assert_eq!(im.entries.len(), 2);
        assert_eq!(
            im.for_tensor("blk.0.b.weight").unwrap(),
            &[2.0, 4.0, 6.0, 8.0]
        );
        // Legacy .dat with one entry.
        let mut d = Vec::new();
        d.extend(1i32.to_le_bytes());
        d.extend(3i32.to_le_bytes());
        d.extend(b"w.x");
        d.extend(7i32.to_le_bytes());
        d.extend(2i32.to_le_bytes());
        d.extend(1.5f32.to_le_bytes());
        d.extend(0.25f32.to_le_bytes());
        let p = dir.path().join("i.dat");
        std::fs::write(&p, &d).unwrap();
        assert_eq!(load(&p).unwrap().for_tensor("w.x").unwrap(), &[1.5, 0.25]);
        std::fs::write(&p, &d[..d.len() - 2]).unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("i.dat") && e.contains("malformed"), "{e}");
    }
}
