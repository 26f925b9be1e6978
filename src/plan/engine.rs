//! What an engine needs to *load* the file `convert` would write, checked on the source before
//! anything is written: tensor names within ggml's limit, the hyper-parameters a known
//! architecture reads, and every tensor it loads present with the shape it expects. llama.cpp
//! (and `tq eval`) refuse such files; `convert` warns about each problem, and `--strict` makes
//! them an error. Architectures tq does not know are checked for names only.

use crate::arch::{expected_tensors, layer_of, moe_sizes, Arch, Shapes};
use crate::error::{one_line, Error, Result};
use crate::source::TensorSource;

/// ggml's `GGML_MAX_NAME` (64, the terminating NUL included): longer tensor names are refused
/// by llama.cpp's GGUF reader.
pub const GGML_MAX_NAME: usize = 64;

/// Hyper-parameters above this are out of range (as the runtime's config reader says).
const MAX_HPARAM: u64 = 1 << 24;

/// A name from the file for a message: escaped, and cut when very long.
fn shown(name: &str) -> String {
    let s = one_line(name);
    if s.chars().count() <= 80 {
        return s;
    }
    format!("{}…", s.chars().take(79).collect::<String>())
}

/// Every reason an engine would refuse the converted file, one line each naming the tensor or
/// metadata key (empty: nothing found).
pub fn engine_checks(src: &dyn TensorSource) -> Vec<String> {
    let mut out = vec![];
    let tensors = src.tensors();
    for t in tensors {
        if t.name.len() >= GGML_MAX_NAME {
            out.push(format!(
                "tensor name '{}' is {} bytes, over ggml's limit of {} (GGML_MAX_NAME {GGML_MAX_NAME} with the NUL): llama.cpp refuses the file",
                shown(&t.name),
                t.name.len(),
                GGML_MAX_NAME - 1
            ));
        }
    }
    let Some(arch_name) = src.meta_str("general.architecture") else {
        out.push(
            "metadata key general.architecture is missing: engines cannot load the file".into(),
        );
        return out;
    };
    let Some(arch) = Arch::from_name(arch_name) else {
        return out; // not an architecture tq knows: names only
    };
    let a = arch.name();
    let mut bad = false;
    let mut req = |k: &str, out: &mut Vec<String>| -> u64 {
        let key = format!("{a}.{k}");
        match src.meta_u64(&key) {
            Some(v) if v > 0 && v <= MAX_HPARAM => v,
            Some(v) => {
                out.push(format!("metadata {key} = {v} is out of range (1..={MAX_HPARAM}): engines cannot load the file"));
                bad = true;
                0
            }
            None => {
                out.push(format!(
                    "metadata key {key} is missing (or not an unsigned integer): engines cannot load the file"
                ));
                bad = true;
                0
            }
        }
    };
    let n_layer = req("block_count", &mut out);
    let n_embd = req("embedding_length", &mut out);
    let n_ff = req("feed_forward_length", &mut out);
    let n_head = req("attention.head_count", &mut out);
    if bad {
        return out;
    }
    let n_head_kv = src
        .meta_u64(&format!("{a}.attention.head_count_kv"))
        .unwrap_or(n_head);
    if n_head_kv == 0 || n_head_kv > n_head || n_head % n_head_kv != 0 {
        out.push(format!(
            "metadata {a}.attention.head_count_kv = {n_head_kv} does not divide {a}.attention.head_count = {n_head}: engines cannot load the file"
        ));
        return out;
    }
    let head_dim = match src.meta_u64(&format!("{a}.attention.key_length")) {
        Some(d) if d > 0 && d <= MAX_HPARAM => d,
        Some(d) => {
            out.push(format!(
                "metadata {a}.attention.key_length = {d} is out of range (1..={MAX_HPARAM})"
            ));
            return out;
        }
        None if n_embd % n_head == 0 => n_embd / n_head,
        None => {
            out.push(format!(
                "metadata {a}.embedding_length = {n_embd} is not a multiple of {a}.attention.head_count = {n_head} (and {a}.attention.key_length is missing)"
            ));
            return out;
        }
    };
    // token_embd gives n_vocab.
    let find = |name: &str| tensors.iter().find(|t| t.name == name);
    let n_vocab = match find("token_embd.weight") {
        None => {
            out.push("tensor token_embd.weight is missing: engines cannot load the file".into());
            return out;
        }
        Some(t) if t.dims.len() != 2 || t.dims[0] != n_embd => {
            out.push(format!(
                "tensor token_embd.weight has shape {:?}, the {a} architecture expects [{n_embd}, n_vocab] ({a}.embedding_length = {n_embd})",
                t.dims
            ));
            return out;
        }
        Some(t) => t.dims[1],
    };
    // Blocks: the metadata's count against the tensors that are there. Only the blocks both
    // agree on are checked tensor by tensor, so a wrong count is one line, not one per tensor.
    let blocks_held = tensors
        .iter()
        .filter_map(|t| layer_of(&t.name))
        .max()
        .map_or(0, |m| m as u64 + 1);
    if blocks_held != n_layer {
        out.push(format!(
            "metadata {a}.block_count = {n_layer} but the file holds tensors of {blocks_held} blocks: engines cannot load the file"
        ));
    }
    let (n_expert, n_ff_exp) = moe_sizes(a, n_ff, &|k| src.meta_u64(k));
    let shapes = Shapes {
        n_layer: n_layer.min(blocks_held),
        n_embd,
        n_ff,
        q_dim: n_head * head_dim,
        kv_dim: n_head_kv * head_dim,
        head_dim,
        n_vocab,
        n_expert,
        n_ff_exp,
    };
    let fused = |l: u64| find(&format!("blk.{l}.attn_qkv.weight")).is_some();
    for x in expected_tensors(arch, &shapes, &fused) {
        match find(&x.name) {
            Some(t) if t.dims == x.dims => {}
            Some(t) => {
                let swapped = t.dims.iter().rev().eq(x.dims.iter());
                out.push(format!(
                    "tensor {} has shape {:?}, the {a} architecture expects {:?}{}: engines cannot load the file",
                    x.name,
                    t.dims,
                    x.dims,
                    if swapped { " (dimensions swapped?)" } else { "" }
                ));
            }
            None if x.required => out.push(format!(
                "tensor {} is missing (the {a} architecture needs it): engines cannot load the file",
                x.name
            )),
            None => {}
        }
    }
    out
}

/// [`engine_checks`] for `convert`: the problems as warnings, or with `strict` the first one as
/// an error (naming how many there are) before anything is written.
pub fn check_engine(src: &dyn TensorSource, strict: bool) -> Result<Vec<String>> {
    let issues = engine_checks(src);
    if strict && !issues.is_empty() {
        let more = match issues.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        return Err(Error::bad_input(
            src.name(),
            format!("--strict: {}{more}; nothing was written", issues[0]),
        ));
    }
    Ok(issues)
}
