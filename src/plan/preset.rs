//! llama-quantize's file types by name (`tq convert --preset Q4_K_M`): the per-tensor types
//! llama-quantize would give the same model, as a table of presets and a few rules by tensor
//! role, layer position and architecture.
//!
//! The facts are those of the llama.cpp the upstream profile pins (scripts/build-llama.sh,
//! commit 0c1e570): `llama_ftype_get_default_type`, `tensor_allows_quantization`,
//! `tensor_get_category`, `llama_tensor_get_type_impl`, `tensor_type_fallback` and
//! `tensor_requires_imatrix` in src/llama-quant.cpp, and the names in tools/quantize/quantize.cpp.
//! Written here from those facts (not copied): the order tensors are visited in (by layer, then
//! name) matters, because some rules count the attn_v / ffn_down tensors seen so far.
//!
//! The result is one type per tensor, which the planner then executes like any per-tensor
//! override: round-to-nearest, `--imatrix` weighting or LDLQ (`--calib`) at the same types.

use crate::error::{Error, Result};
use crate::source::{SourceTensor, TensorSource};
use crate::types::TensorType;
use regex::Regex;
use std::collections::BTreeMap;

/// A llama-quantize file type (`llama_ftype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Ftype {
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q2_K_S,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ1_S,
    IQ1_M,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ2_M,
    IQ3_XXS,
    IQ3_XS,
    IQ3_S,
    IQ3_M,
    IQ4_NL,
    IQ4_XS,
    TQ1_0,
    TQ2_0,
    MXFP4_MOE,
}

/// One preset: its name (as llama-quantize spells it), `general.file_type` and default type.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub ftype: Ftype,
    /// `llama_ftype` value written to `general.file_type`.
    pub file_type: u32,
    /// The type of every quantizable tensor no rule changes (`llama_ftype_get_default_type`).
    pub default: TensorType,
}

macro_rules! p {
    ($name:literal, $ft:ident, $id:literal, $def:ident) => {
        Preset {
            name: $name,
            ftype: Ftype::$ft,
            file_type: $id,
            default: TensorType::$def,
        }
    };
}

/// Every preset, in llama-quantize's order of its help text.
#[rustfmt::skip]
pub const PRESETS: &[Preset] = &[
    p!("Q4_0", Q4_0, 2, Q4_0),          p!("Q4_1", Q4_1, 3, Q4_1),
    p!("MXFP4_MOE", MXFP4_MOE, 38, MXFP4),
    p!("Q5_0", Q5_0, 8, Q5_0),          p!("Q5_1", Q5_1, 9, Q5_1),
    p!("IQ2_XXS", IQ2_XXS, 19, IQ2XXS), p!("IQ2_XS", IQ2_XS, 20, IQ2XS),
    p!("IQ2_S", IQ2_S, 28, IQ2XS),      p!("IQ2_M", IQ2_M, 29, IQ2S),
    p!("IQ1_S", IQ1_S, 24, IQ1S),       p!("IQ1_M", IQ1_M, 31, IQ1M),
    p!("TQ1_0", TQ1_0, 36, TQ1_0),      p!("TQ2_0", TQ2_0, 37, TQ2_0),
    p!("Q2_K", Q2_K, 10, Q2K),          p!("Q2_K_S", Q2_K_S, 21, Q2K),
    p!("IQ3_XXS", IQ3_XXS, 23, IQ3XXS), p!("IQ3_S", IQ3_S, 26, IQ3S),
    p!("IQ3_M", IQ3_M, 27, IQ3S),       p!("IQ3_XS", IQ3_XS, 22, IQ3S),
    p!("Q3_K_S", Q3_K_S, 11, Q3K),      p!("Q3_K_M", Q3_K_M, 12, Q3K),
    p!("Q3_K_L", Q3_K_L, 13, Q3K),
    p!("IQ4_NL", IQ4_NL, 25, IQ4NL),    p!("IQ4_XS", IQ4_XS, 30, IQ4XS),
    p!("Q4_K_S", Q4_K_S, 14, Q4K),      p!("Q4_K_M", Q4_K_M, 15, Q4K),
    p!("Q5_K_S", Q5_K_S, 16, Q5K),      p!("Q5_K_M", Q5_K_M, 17, Q5K),
    p!("Q6_K", Q6_K, 18, Q6K),          p!("Q8_0", Q8_0, 7, Q8_0),
    p!("F16", F16, 1, F16),             p!("BF16", BF16, 32, BF16),
];

/// llama-quantize's aliases (`Q4_K` is `Q4_K_M`, ...).
const ALIASES: &[(&str, &str)] = &[("Q3_K", "Q3_K_M"), ("Q4_K", "Q4_K_M"), ("Q5_K", "Q5_K_M")];

/// A preset by name (case-insensitive, as llama-quantize), or a usage error listing them all.
pub fn parse(name: &str) -> Result<&'static Preset> {
    let canon = ALIASES
        .iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(name))
        .map(|(_, p)| *p)
        .unwrap_or(name);
    PRESETS
        .iter()
        .find(|p| p.name.eq_ignore_ascii_case(canon))
        .ok_or_else(|| {
            Error::Usage(format!(
                "unknown preset '{name}'; presets: {} (aliases Q3_K, Q4_K, Q5_K)",
                PRESETS
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// What the rules read from the model's hyper-parameters (llama.cpp's `hparams`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelFacts {
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// Layer 0's query and KV head counts (`n_gqa()` is their ratio).
    pub n_head: u32,
    pub n_head_kv: u32,
    /// `{arch}.expert_count` (0 for a dense model).
    pub n_expert: u32,
    /// `tokenizer.ggml.tokens`' length, else `{arch}.vocab_size` (llama's 32-layer size class).
    pub n_vocab: u32,
}

impl ModelFacts {
    /// Read from the source's GGUF-style metadata.
    pub fn of(src: &dyn TensorSource) -> Result<ModelFacts> {
        let md = src.metadata();
        let get = |k: &str| md.iter().find(|(n, _)| n == k).map(|(_, v)| v);
        let arch = src.meta_str("general.architecture").ok_or_else(|| {
            Error::bad_input(
                std::path::Path::new(&src.name()),
                "no general.architecture: a --preset needs the model's architecture",
            )
        })?;
        // A per-layer array (some models) or one value; llama's n_gqa() reads layer 0.
        let first = |k: &str| -> Option<u64> {
            let v = get(&format!("{arch}.{k}"))?;
            v.as_u64().or_else(|| {
                v.as_array()
                    .and_then(|a| a.first())
                    .and_then(|x| x.as_u64())
            })
        };
        let n_layer = first("block_count").ok_or_else(|| {
            Error::bad_input(
                std::path::Path::new(&src.name()),
                format!("no {arch}.block_count: a --preset needs the layer count"),
            )
        })?;
        let n_head = first("attention.head_count").unwrap_or(0);
        let n_vocab = get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map(|a| a.len() as u64)
            .or_else(|| first("vocab_size"))
            .unwrap_or(0);
        Ok(ModelFacts {
            arch: arch.to_string(),
            n_layer: n_layer as u32,
            n_head: n_head as u32,
            n_head_kv: first("attention.head_count_kv").unwrap_or(n_head) as u32,
            n_expert: first("expert_count").unwrap_or(0) as u32,
            n_vocab: n_vocab as u32,
        })
    }

    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's `LLM_TYPE_70B` (the one size class the rules read): 80-layer llama with GQA,
    /// qwen2, deci, olmo; 68-layer jais2.
    fn is_70b(&self) -> bool {
        match self.arch.as_str() {
            "llama" => self.n_expert != 8 && self.n_layer == 80 && self.n_head != self.n_head_kv,
            "qwen2" | "deci" | "olmo" => self.n_layer == 80,
            "jais2" => self.n_layer == 68,
            _ => false,
        }
    }
}

/// What else the preset's rules depend on.
#[derive(Default)]
pub struct Options<'a> {
    /// An importance matrix (or, in tq, calibration) is given: some rules differ.
    pub has_imatrix: bool,
    pub output_type: Option<TensorType>,
    pub token_embd_type: Option<TensorType>,
    /// `--tensor-type` overrides: a matching tensor takes the override instead of the rules
    /// (and, as in llama-quantize, is not counted by them).
    pub overrides: &'a [(Regex, TensorType)],
}

/// One tensor's type under the preset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub ty: TensorType,
    /// The rule, for the plan's reasons.
    pub why: String,
    /// llama-quantize refuses this tensor's type without an importance matrix.
    pub needs_imatrix: bool,
}

/// Tensor roles as llama-quantize sorts them (`tensor_get_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cat {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn category(name: &str) -> Cat {
    if name == "output.weight" {
        return Cat::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Cat::TokenEmbd;
    }
    // First substring that matches, in llama-quantize's order.
    const BY_SUBSTRING: &[(&str, Cat)] = &[
        ("attn_qkv.weight", Cat::AttnQkv),
        ("attn_kv_b.weight", Cat::AttnKvB),
        ("attn_v.weight", Cat::AttnV),
        ("attn_k.weight", Cat::AttnK),
        ("attn_q.weight", Cat::AttnQ),
        ("attn_output.weight", Cat::AttnOutput),
        ("ffn_up", Cat::FfnUp),
        ("ffn_gate", Cat::FfnGate),
        ("ffn_down", Cat::FfnDown),
    ];
    BY_SUBSTRING
        .iter()
        .find(|(s, _)| name.contains(s))
        .map(|(_, c)| *c)
        .unwrap_or(Cat::Other)
}

/// attn_v-like: what the attn_v rules (and counter) apply to.
fn is_attn_v(c: Cat) -> bool {
    matches!(c, Cat::AttnV | Cat::AttnQkv | Cat::AttnKvB)
}

/// Name fragments of 2-D weights llama-quantize never quantizes (`tensor_allows_quantization`).
const NEVER_CONTAINS: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// glm5-next's further exclusions.
const GLM5_NEXT_NEVER: &[&str] = &[
    "hc_",
    "indexer.attn_q_b",
    "indexer.attn_k",
    "indexer.proj",
    "indexer_compressor_gate",
    "indexer_compressor_ape",
    "ssm_f_a.weight",
    "ssm_f_b.weight",
    "ssm_g_a.weight",
    "ssm_g_b.weight",
    "ssm_beta.weight",
    "attn_kv_a_mqa.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
];

/// ggml_n_dims: dimensions up to the last one above 1 (at least 1).
fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

fn allows_quantization(arch: &str, t: &SourceTensor) -> bool {
    let name = t.name.as_str();
    n_dims(&t.dims) >= 2
        && name.ends_with("weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !NEVER_CONTAINS.iter().any(|s| name.contains(s))
        && !(arch == "glm5-next" && GLM5_NEXT_NEVER.iter().any(|s| name.contains(s)))
}

/// The type llama-quantize uses when a row of `ncols` values cannot hold `t`'s block
/// (`tensor_type_fallback`): a 256-block type goes to a 32-block one, then f16 if that does not
/// fit either. None when `t` has no fallback (llama-quantize refuses the tensor).
pub fn fallback(t: TensorType, ncols: u64) -> Option<TensorType> {
    use TensorType::*;
    if ncols.is_multiple_of(t.block_size() as u64) {
        return Some(t);
    }
    let f = match t {
        IQ1S | IQ1M | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ4XS => IQ4NL,
        Q2_0 | Q2K | Q3K | TQ1_0 | TQ2_0 => Q4_0,
        Q4K => Q5_0,
        Q5K => Q5_1,
        Q6K => Q8_0,
        _ if t.block_size() <= 32 => t,
        _ => return None,
    };
    Some(if ncols.is_multiple_of(f.block_size() as u64) {
        f
    } else {
        F16
    })
}

/// llama-quantize's rule for refusing to write a type without an imatrix.
fn needs_imatrix(name: &str, ty: TensorType, ft: Ftype) -> bool {
    use TensorType::*;
    if matches!(category(name), Cat::Output | Cat::TokenEmbd) {
        return false;
    }
    match ty {
        IQ3XXS | IQ2XXS | IQ2XS | IQ2S | IQ1M | IQ1S => true,
        Q2K => ft == Ftype::Q2_K_S,
        _ => false,
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between.
fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The running state of one pass over the model (llama's `quantize_state_impl` counters).
struct Pass<'a> {
    ft: Ftype,
    m: &'a ModelFacts,
    o: &'a Options<'a>,
    tied: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

/// The layer a per-layer rule reads: the counter for a dense model, the `blk.N.` of the name
/// when the model has experts (whose tensors are not one per layer in order).
fn layer_of(p: &Pass, counter: i64, name: &str) -> Result<(i64, i64)> {
    let n = p.m.n_layer as i64;
    if p.m.n_expert <= 1 {
        return Ok((counter, n));
    }
    let l = crate::arch::classify(name).1.ok_or_else(|| {
        Error::Usage(format!(
            "--preset: cannot tell the layer of {name} (expected blk.N.…)"
        ))
    })? as i64;
    if l >= n {
        return Err(Error::Usage(format!(
            "--preset: {name} is in layer {l} but the model has {n}"
        )));
    }
    Ok((l, n))
}

impl Pass<'_> {
    fn is(&self, fts: &[Ftype]) -> bool {
        fts.contains(&self.ft)
    }

    /// `llama_tensor_get_type_impl`: the rules by role, position and architecture.
    fn rules(
        &mut self,
        t: &SourceTensor,
        mut ty: TensorType,
        c: Cat,
    ) -> Result<(TensorType, &'static str)> {
        use Ftype as F;
        use TensorType::*;
        let (arch, name) = (self.m.arch.as_str(), t.name.as_str());
        let falcon = arch == "falcon";
        let gqa4 = self.m.n_gqa() >= 4;
        let n_exp = self.m.n_expert;
        if arch == "glm5-next"
            && ["attn_q_a", "attn_q_b", "nextn.eh_proj"]
                .iter()
                .any(|s| name.contains(s))
            && !matches!(ty, F32 | BF16 | F16)
        {
            return Ok((Q8_0, "glm5-next projection kept q8_0"));
        }
        const IQ2_GROUP: &[Ftype] = &[
            F::IQ2_XXS,
            F::IQ2_XS,
            F::IQ1_S,
            F::IQ2_S,
            F::IQ2_M,
            F::IQ1_M,
        ];
        let iq2sm = self.is(&[F::IQ2_S, F::IQ2_M]);
        let why;
        if c == Cat::Output || (self.tied && c == Cat::TokenEmbd) {
            why = if c == Cat::Output {
                "output"
            } else {
                "token_embd (tied to the output)"
            };
            if let Some(o) = self.o.output_type {
                ty = o;
            } else if self.ft == F::MXFP4_MOE
                || falcon
                || !t.dims[0].is_multiple_of(ty.block_size() as u64)
            {
                ty = Q8_0;
            } else if self.is(&[
                F::IQ2_XXS,
                F::IQ2_XS,
                F::IQ3_XXS,
                F::IQ1_S,
                F::IQ2_S,
                F::IQ2_M,
                F::IQ1_M,
            ]) {
                ty = Q5K;
            } else if ty != Q8_0 {
                ty = Q6K;
            }
        } else if self.ft == F::MXFP4_MOE {
            let bailing_expert =
                arch == "bailingmoe3" && matches!(c, Cat::FfnUp | Cat::FfnGate | Cat::FfnDown);
            let experts = t.dims.get(2).copied().unwrap_or(1) > 1;
            why = "MXFP4_MOE: experts mxfp4, the rest q8_0";
            ty = if experts && (arch != "bailingmoe3" || bailing_expert) {
                MXFP4
            } else {
                Q8_0
            };
        } else if c == Cat::TokenEmbd {
            why = "token_embd";
            if let Some(e) = self.o.token_embd_type {
                ty = e;
            } else if self.is(&[F::IQ2_XXS, F::IQ2_XS, F::IQ1_S, F::IQ1_M]) {
                ty = Q2K;
            } else if self.is(&[F::IQ2_S, F::IQ2_M, F::IQ3_XXS]) {
                ty = IQ3S;
            } else if self.is(&[F::TQ1_0, F::TQ2_0]) {
                ty = Q4K;
            }
        } else if self.is(IQ2_GROUP) {
            why = "2-bit i-quant rules";
            if is_attn_v(c) {
                ty = if gqa4 || n_exp >= 4 {
                    Q4K
                } else if iq2sm {
                    IQ3S
                } else {
                    Q2K
                };
                self.i_attention_wv += 1;
            } else if n_exp == 8 && c == Cat::AttnK {
                ty = Q4K;
            } else if c == Cat::FfnDown {
                if self.i_ffn_down < self.m.n_layer as i64 / 8 {
                    ty = if iq2sm { IQ3S } else { Q2K };
                }
                self.i_ffn_down += 1;
            } else if c == Cat::AttnOutput {
                if n_exp == 8 {
                    ty = Q5K;
                } else if self.is(&[F::IQ1_S, F::IQ1_M]) {
                    ty = IQ2XXS;
                } else if iq2sm {
                    ty = IQ3S;
                }
            }
        } else if is_attn_v(c) {
            why = "attn_v";
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            match self.ft {
                F::Q2_K => ty = if gqa4 { Q4K } else { Q3K },
                F::Q2_K_S if gqa4 => ty = Q4K,
                F::IQ3_XXS => {
                    ty = if gqa4 {
                        Q4K
                    } else if !self.o.has_imatrix {
                        IQ3S
                    } else {
                        IQ3XXS
                    }
                }
                F::IQ3_XS | F::IQ3_S if gqa4 => ty = Q4K,
                F::IQ3_M => ty = Q4K,
                F::Q3_K_M => ty = if i < 2 { Q5K } else { Q4K },
                F::Q3_K_L => ty = Q5K,
                F::IQ4_NL | F::IQ4_XS if gqa4 => ty = Q5K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => ty = Q6K,
                F::Q4_K_S if i < 4 => ty = Q5K,
                _ => {}
            }
            if self.m.is_70b() && matches!(ty, Q3K | Q4K) {
                ty = Q5K;
            }
            if n_exp == 8 {
                ty = Q8_0;
            }
            self.i_attention_wv += 1;
        } else if c == Cat::AttnK {
            why = "attn_k";
            if n_exp == 8 {
                ty = Q8_0;
            } else if self.ft == F::IQ3_XS {
                ty = IQ3XXS;
            } else if self.ft == F::IQ3_XXS {
                ty = IQ2S;
            }
        } else if c == Cat::AttnQ {
            why = "attn_q";
            if self.ft == F::IQ3_XS {
                ty = IQ3XXS;
            } else if self.ft == F::IQ3_XXS {
                ty = IQ2S;
            }
        } else if c == Cat::FfnDown {
            why = "ffn_down";
            let (i, n) = layer_of(self, self.i_ffn_down, name)?;
            let umb = use_more_bits(i, n);
            let h = self.o.has_imatrix;
            match self.ft {
                F::Q2_K => ty = Q3K,
                // (no later arm is for Q2_K_S, so a false guard changes nothing)
                F::Q2_K_S if i < n / 8 => ty = Q4K,
                F::IQ3_XXS if !h => ty = if i < n / 8 { Q4K } else { Q3K },
                F::Q3_K_M => {
                    ty = if i < n / 16 {
                        Q5K
                    } else if !falcon || umb {
                        Q4K
                    } else {
                        Q3K
                    }
                }
                F::IQ3_M if i < n / 8 || (n_exp == 8 && umb) => ty = Q4K,
                F::Q3_K_L => ty = if falcon { Q4K } else { Q5K },
                F::Q4_K_M => {
                    if falcon {
                        ty = if i < n / 16 {
                            Q6K
                        } else if umb {
                            Q5K
                        } else {
                            Q4K
                        }
                    } else if umb {
                        ty = Q6K
                    }
                }
                F::IQ4_NL | F::IQ4_XS if i < n / 8 && !h => ty = Q5K,
                F::Q5_K_M if umb => ty = Q6K,
                F::Q4_K_S if !falcon && i < n / 8 => ty = Q5K,
                F::Q4_0 if h && i < n / 8 => ty = Q4_1,
                F::Q5_0 if h && i < n / 8 => ty = Q5_1,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if c == Cat::AttnOutput {
            why = "attn_output";
            if !falcon {
                if n_exp == 8 {
                    if self.is(&[
                        F::Q2_K,
                        F::IQ3_XS,
                        F::IQ3_XXS,
                        F::Q3_K_S,
                        F::Q3_K_M,
                        F::IQ4_NL,
                        F::Q4_K_S,
                        F::Q4_K_M,
                        F::IQ3_S,
                        F::IQ3_M,
                        F::IQ4_XS,
                    ]) {
                        ty = Q5K;
                    }
                } else {
                    match self.ft {
                        F::Q2_K => ty = Q3K,
                        F::IQ3_XXS => ty = IQ3S,
                        F::Q3_K_M | F::IQ3_M => ty = Q4K,
                        F::Q3_K_L => ty = Q5K,
                        _ => {}
                    }
                }
            } else if self.ft == F::Q3_K_L {
                ty = Q4K;
            }
        } else if matches!(c, Cat::FfnGate | Cat::FfnUp) {
            // (attn_qkv has its own rule in llama-quantize, but it is attn_v-like and never
            // reaches it.)
            why = "ffn gate/up";
            let counter = if c == Cat::FfnGate {
                self.i_ffn_gate
            } else {
                self.i_ffn_up
            };
            let (i, n) = layer_of(self, counter, name)?;
            if self.ft == F::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
                ty = IQ3XXS;
            }
            if c == Cat::FfnGate {
                self.i_ffn_gate += 1;
            } else {
                self.i_ffn_up += 1;
            }
        } else {
            why = "default type";
        }
        Ok((ty, why))
    }

    /// `llama_tensor_get_type`: exclusions, the output/token-embedding flags, overrides, the
    /// rules, then the row fallback.
    fn choose(&mut self, p: &Preset, t: &SourceTensor) -> Result<Choice> {
        let c = category(&t.name);
        let keep = |why: &str| Choice {
            ty: t.ty,
            why: why.into(),
            needs_imatrix: false,
        };
        if !allows_quantization(&self.m.arch, t) {
            return Ok(keep("never quantized by llama-quantize: kept"));
        }
        let manual = self.o.overrides.iter().find(|(re, _)| re.is_match(&t.name));
        if let (Some(e), Cat::TokenEmbd) = (self.o.token_embd_type, c) {
            if !(t.name == "per_layer_token_embd.weight" && manual.is_some()) {
                return Ok(Choice {
                    ty: e,
                    why: "--token-embedding-type".into(),
                    needs_imatrix: false,
                });
            }
        }
        if let (Some(o), Cat::Output) = (self.o.output_type, c) {
            return Ok(Choice {
                ty: o,
                why: "--output-tensor-type".into(),
                needs_imatrix: false,
            });
        }
        let (mut ty, mut why) = (p.default, "default type".to_string());
        if p.default.is_quantized() {
            if let Some((re, o)) = manual {
                (ty, why) = (*o, format!("--tensor-type {}", re.as_str()));
            } else {
                let (t2, w) = self.rules(t, ty, c)?;
                (ty, why) = (t2, w.to_string());
            }
            let ncols = t.dims.first().copied().unwrap_or(1);
            let f = fallback(ty, ncols).ok_or_else(|| {
                Error::Usage(format!(
                    "--preset {}: {} has rows of {ncols} values, which {ty} cannot hold, and llama-quantize has no fallback for {ty}",
                    p.name, t.name
                ))
            })?;
            if f != ty {
                why = format!(
                    "{why}; {ty} -> {f}: rows of {ncols} are not a multiple of {}",
                    ty.block_size()
                );
                ty = f;
            }
        }
        Ok(Choice {
            needs_imatrix: needs_imatrix(&t.name, ty, p.ftype),
            ty,
            why,
        })
    }
}

/// The type of every tensor of `tensors` under preset `p` (by name), as llama-quantize chooses.
pub fn types(
    p: &Preset,
    m: &ModelFacts,
    tensors: &[SourceTensor],
    o: &Options,
) -> Result<BTreeMap<String, Choice>> {
    // llama's order: by layer (tensors outside blocks first), then by name.
    let mut order: Vec<&SourceTensor> = tensors.iter().collect();
    order.sort_by(|a, b| {
        let la = crate::arch::classify(&a.name).1.map_or(-1, |l| l as i64);
        let lb = crate::arch::classify(&b.name).1.map_or(-1, |l| l as i64);
        la.cmp(&lb).then_with(|| a.name.cmp(&b.name))
    });
    let mut pass = Pass {
        ft: p.ftype,
        m,
        o,
        tied: !tensors.iter().any(|t| t.name == "output.weight"),
        n_attention_wv: tensors
            .iter()
            .filter(|t| is_attn_v(category(&t.name)))
            .count() as i64,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
    };
    let mut out = BTreeMap::new();
    for t in order {
        let c = pass.choose(p, t)?;
        out.insert(t.name.clone(), c);
    }
    Ok(out)
}
