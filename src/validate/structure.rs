//! Structure checks, streamed: the header (already validated by the reader, with the target
//! profile's type ids), engine constraints (what the planner enforces and what an engine needs to
//! load the file), every tensor decoding to finite values (chunks of rows, pages dropped after
//! each tensor, so memory stays bounded), provenance, and the reference's hash.

use super::{Check, RefId, Status};
use crate::arch::{classify, Role};
use crate::error::{one_line, Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::types::profile::Profile;
use crate::types::{Family, TensorType};
use rayon::prelude::*;
use std::path::Path;

/// Values decoded at a time per tensor (4 MiB of f32 per chunk and worker).
const CHUNK_VALUES: u64 = 1 << 20;

/// Provenance keys `tq convert` writes (see `convert::output_metadata`).
const PROVENANCE_KEYS: [&str; 6] = [
    "tq.version",
    "tq.recipe",
    "tq.flags",
    "tq.input.name",
    "tq.input.blake3",
    "tq.tensor_methods",
];

pub(super) fn checks(file: &GgufFile, path: &Path, profile: &Profile) -> Result<Vec<Check>> {
    let mut types: Vec<TensorType> = file.tensors.iter().map(|t| t.ty).collect();
    types.sort_by_key(|t| t.name());
    types.dedup();
    let header = Check::new(
        "structure",
        "header",
        Status::Pass,
        format!(
            "GGUF v{}, {} tensors, {} metadata keys; types known to profile {}: {}",
            file.version,
            file.tensors.len(),
            file.metadata.len(),
            profile.name,
            types
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let engine = engine_check(file, path, profile)?;
    let finite = finite_check(file);
    let prov = provenance_check(file);
    Ok(vec![header, engine, finite, prov])
}

/// What the planner never writes (token_embd as a TQ type, rows that do not fit the block,
/// KV-only types as weights) and what an engine refuses to load (`plan::engine_checks`).
fn engine_check(file: &GgufFile, path: &Path, profile: &Profile) -> Result<Check> {
    let mut problems = vec![];
    for t in &file.tensors {
        let name = one_line(&t.name);
        if t.ty.is_tq_weight() && classify(&t.name).0 == Role::TokenEmbd {
            problems.push(format!(
                "{name} is {}: token_embd is never a TQ type (the fork's CUDA get_rows lacks TQ)",
                t.ty
            ));
        }
        if t.ty.is_turbo() {
            problems.push(format!(
                "{name} is {}, a KV-cache-only type: engines have no weight kernels for it",
                t.ty
            ));
        }
        if t.row_len() % t.ty.block_size() as u64 != 0 {
            problems.push(format!(
                "{name}: row length {} is not a multiple of {}'s block of {}",
                t.row_len(),
                t.ty,
                t.ty.block_size()
            ));
        }
    }
    let src = crate::source::GgufSource::new(GgufFile::open_with(path, profile)?);
    problems.extend(crate::plan::engine_checks(&src));
    Ok(match problems.len() {
        0 => Check::new(
            "structure",
            "engine",
            Status::Pass,
            "token_embd not TQ, rows fit their blocks, no KV-only types, metadata and tensors an engine needs present",
        ),
        n => Check::new(
            "structure",
            "engine",
            Status::Fail,
            if n == 1 {
                problems[0].clone()
            } else {
                format!("{} (and {} more)", problems[0], n - 1)
            },
        ),
    })
}

/// The first non-finite value of a tensor: (block, row), or an error message if it cannot be decoded.
fn first_non_finite(
    file: &GgufFile,
    t: &TensorInfo,
) -> std::result::Result<Option<(u64, u64)>, String> {
    let row = t.row_len().max(1);
    let row_bytes = t.ty.bytes_for(row).ok_or("row size overflows")?;
    let rows_per = (CHUNK_VALUES / row).max(1);
    let n_rows = t.n_rows().max(1);
    let n_chunks = n_rows.div_ceil(rows_per);
    let data = file.tensor_data(t);
    let found = (0..n_chunks)
        .into_par_iter()
        .map(|c| -> std::result::Result<Option<u64>, String> {
            let r0 = c * rows_per;
            let r1 = (r0 + rows_per).min(n_rows);
            let bytes = &data[(r0 * row_bytes) as usize..(r1 * row_bytes) as usize];
            let mut out = vec![0f32; ((r1 - r0) * row) as usize];
            // By rows: row-rotated types (tq2_r) decode only whole rows.
            crate::types::dequantize_rows(t.ty, bytes, &mut out, row as usize, &t.name)
                .map_err(|e| e.to_string())?;
            Ok(out
                .iter()
                .position(|v| !v.is_finite())
                .map(|i| r0 * row + i as u64))
        })
        .find_first(|r| !matches!(r, Ok(None)));
    file.release(t);
    match found {
        None => Ok(None),
        Some(Err(e)) => Err(e),
        Some(Ok(Some(i))) => Ok(Some((i / t.ty.block_size() as u64, i / row))),
        Some(Ok(None)) => unreachable!("find_first skips clean chunks"),
    }
}

fn finite_check(file: &GgufFile) -> Check {
    let mut undecodable: Vec<&str> = vec![];
    let mut n = 0;
    for t in &file.tensors {
        if t.ty.family() == Family::Raw {
            continue; // integer / f64 tensors: nothing to decode
        }
        if t.ty.info().dequantize.is_none() {
            undecodable.push(t.ty.name());
            continue;
        }
        n += 1;
        match first_non_finite(file, t) {
            Ok(None) => {}
            Ok(Some((block, row))) => {
                return Check::new(
                    "structure",
                    "finite",
                    Status::Fail,
                    format!(
                        "tensor {} ({}): block {block} (row {row}) decodes to NaN/Inf; the file is corrupt, re-create it",
                        one_line(&t.name),
                        t.ty
                    ),
                )
            }
            Err(e) => {
                return Check::new("structure", "finite", Status::Fail, one_line(&e));
            }
        }
    }
    undecodable.sort();
    undecodable.dedup();
    if undecodable.is_empty() {
        Check::new(
            "structure",
            "finite",
            Status::Pass,
            format!("{n} tensors decode to finite values"),
        )
    } else {
        Check::new(
            "structure",
            "finite",
            Status::Skipped,
            format!(
                "{n} tensors decode to finite values; tq cannot decode {} (not checked)",
                undecodable.join(", ")
            ),
        )
    }
}

/// `tq.*` keys: all present or none (another tool's file), and the per-tensor methods consistent
/// with the tensors as stored.
fn provenance_check(file: &GgufFile) -> Check {
    let present: Vec<&str> = PROVENANCE_KEYS
        .iter()
        .copied()
        .filter(|k| file.get(k).is_some())
        .collect();
    let fail = |msg: String| Check::new("structure", "provenance", Status::Fail, msg);
    if present.is_empty() {
        return Check::new(
            "structure",
            "provenance",
            Status::Skipped,
            "no tq.* keys: made by another tool (or with --no-provenance)",
        );
    }
    if let Some(k) = PROVENANCE_KEYS.iter().find(|k| file.get(k).is_none()) {
        return fail(format!(
            "{k} is missing while other tq.* keys are present: the metadata was edited"
        ));
    }
    let hash = file.get_str("tq.input.blake3").unwrap_or("");
    if hash.len() != 64
        || !hash.bytes().all(|b| b.is_ascii_hexdigit())
        || hash == crate::convert::HASH_PLACEHOLDER
    {
        return fail(format!(
            "tq.input.blake3 '{}' is not a blake3 hash (an unfinished conversion?)",
            one_line(hash)
        ));
    }
    let Some(methods) = file.get("tq.tensor_methods").and_then(|v| v.as_array()) else {
        return fail("tq.tensor_methods is not an array of strings".into());
    };
    if methods.len() != file.tensors.len() {
        return fail(format!(
            "tq.tensor_methods lists {} tensors, the file has {}",
            methods.len(),
            file.tensors.len()
        ));
    }
    for (m, t) in methods.iter().zip(&file.tensors) {
        let s = m.as_str().unwrap_or("");
        let Some((name, rest)) = s.split_once('=') else {
            return fail(format!(
                "tq.tensor_methods entry '{}' is not NAME=TYPE:METHOD",
                one_line(s)
            ));
        };
        let ty = rest.split(':').next().unwrap_or("");
        if name != t.name || ty != t.ty.name() {
            return fail(format!(
                "tq.tensor_methods says {}={}, the file stores {} as {}: tensors were changed after conversion",
                one_line(name),
                one_line(ty),
                one_line(&t.name),
                t.ty
            ));
        }
    }
    Check::new(
        "structure",
        "provenance",
        Status::Pass,
        format!(
            "tq {} recipe '{}' from {}",
            one_line(file.get_str("tq.version").unwrap_or("")),
            one_line(file.get_str("tq.recipe").unwrap_or("")),
            one_line(file.get_str("tq.input.name").unwrap_or(""))
        ),
    )
}

/// With a reference GGUF, the artifact's `tq.input.blake3` must be the reference's hash: a
/// different file is an error (a stale or wrong reference would make every number meaningless).
pub(super) fn reference_hash(
    file: &GgufFile,
    path: &Path,
    ref_file: Option<&GgufFile>,
    reference: Option<&RefId>,
) -> Result<Check> {
    let skip = |why: &str| Ok(Check::new("structure", "reference", Status::Skipped, why));
    let (Some(rf), Some(id)) = (ref_file, reference) else {
        return skip("no --ref REF.gguf: the reference's hash is not checked");
    };
    let Some(h) = file.get_str("tq.input.blake3") else {
        return skip(
            "no tq.input.blake3 in the artifact: cannot tell which model it was made from",
        );
    };
    if h != id.blake3 {
        return Err(Error::Usage(format!(
            "{}: stale or wrong reference: {} was made from a file with blake3 {}…, the reference's is {}…; give the model it was converted from",
            rf.path.display(),
            path.display(),
            &one_line(h).chars().take(16).collect::<String>(),
            &id.blake3[..16]
        )));
    }
    Ok(Check::new(
        "structure",
        "reference",
        Status::Pass,
        format!("tq.input.blake3 matches {}", id.name),
    ))
}
