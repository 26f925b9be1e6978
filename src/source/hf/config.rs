//! `config.json` → the architecture and the `{arch}.*` GGUF keys, as llama.cpp's
//! `convert_hf_to_gguf.py` writes them for the llama, qwen2 and qwen3 families.

use crate::error::{Error, Result};
use crate::gguf::Value;
use serde_json::{Map, Value as Json};
use std::path::{Path, PathBuf};

pub use crate::arch::Arch;

/// The architectures tq converts, with their Hugging Face classes (for error messages).
pub fn supported_list() -> String {
    Arch::ALL
        .iter()
        .map(|a| format!("{} ({})", a.name(), a.hf_classes().join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `config.json`, with a nested `text_config` merged over the top level (as convert_hf_to_gguf).
pub struct Config {
    pub path: PathBuf,
    pub hp: Map<String, Json>,
    /// `architectures[0]` as written.
    pub hf_arch: String,
    pub arch: Arch,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
}

impl Config {
    pub fn open(dir: &Path) -> Result<Config> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::bad_input(
                    dir,
                    "no config.json: tq converts GGUF files and Hugging Face model directories (config.json + *.safetensors + tokenizer files)",
                )
            } else {
                Error::io(&path, e)
            }
        })?;
        Config::parse(&path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config> {
        let bad = |m: String| Error::bad_input(path, m);
        let v: Json = serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let Json::Object(mut hp) = v else {
            return Err(bad("expected a JSON object".into()));
        };
        // convert_hf_to_gguf reads architectures from the top level, a text_config's wins.
        let arch_of = |m: &Map<String, Json>| {
            m.get("architectures")
                .and_then(|a| a.as_array())
                .and_then(|a| a.first())
                .and_then(|a| a.as_str())
                .map(str::to_string)
        };
        let mut hf_arch = arch_of(&hp);
        if let Some(Json::Object(tc)) = hp.get("text_config").cloned() {
            if let Some(a) = arch_of(&tc) {
                hf_arch = Some(a);
            }
            for (k, v) in tc {
                hp.insert(k, v);
            }
        }
        let hf_arch = hf_arch.ok_or_else(|| {
            bad(format!(
                "no \"architectures\" entry; tq converts: {}",
                supported_list()
            ))
        })?;
        let arch = Arch::from_hf_class(&hf_arch).ok_or_else(|| {
            bad(format!(
                "unsupported architecture '{}'; tq converts: {}",
                crate::error::one_line(&hf_arch),
                supported_list()
            ))
        })?;
        let mut c = Config {
            path: path.to_path_buf(),
            hp,
            hf_arch,
            arch,
            n_layer: 0,
            n_embd: 0,
            n_head: 0,
            n_head_kv: 0,
        };
        c.n_layer = c.req_u64(&["n_layers", "num_hidden_layers", "n_layer", "num_layers"])?;
        c.n_embd = c.req_u64(&["hidden_size", "n_embd", "dim"])?;
        c.n_head = c.req_u64(&["n_heads", "num_attention_heads"])?;
        c.n_head_kv = c.req_u64(&["n_kv_heads", "num_key_value_heads"])?;
        for (what, v) in [
            ("layer count", c.n_layer),
            ("hidden size", c.n_embd),
            ("attention head count", c.n_head),
            ("key/value head count", c.n_head_kv),
        ] {
            if v == 0 || v > 1 << 20 {
                return Err(bad(format!("{what} {v} is out of range")));
            }
        }
        if c.n_layer > 4096 {
            return Err(bad(format!("layer count {} is out of range", c.n_layer)));
        }
        if !c.n_head.is_multiple_of(c.n_head_kv) {
            return Err(bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {} (llama.cpp shares each key/value head among a whole number of query heads)",
                c.n_head, c.n_head_kv
            )));
        }
        if c.head_dim_explicit()?.is_none() && !c.n_embd.is_multiple_of(c.n_head) {
            return Err(bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {} and there is no head_dim",
                c.n_embd, c.n_head
            )));
        }
        Ok(c)
    }

    /// The first of `keys` present (convert_hf_to_gguf's `find_hparam`).
    pub fn find(&self, keys: &[&str]) -> Option<&Json> {
        keys.iter()
            .find_map(|k| self.hp.get(*k))
            .filter(|v| !v.is_null())
    }

    fn req_u64(&self, keys: &[&str]) -> Result<u64> {
        match self.find(keys) {
            Some(v) => json_u64(v).ok_or_else(|| {
                Error::bad_input(
                    &self.path,
                    format!(
                        "'{}' must be a non-negative integer",
                        keys_present(self, keys)
                    ),
                )
            }),
            None => Err(Error::bad_input(
                &self.path,
                format!("missing '{}'", keys_wanted(keys)),
            )),
        }
    }

    fn opt_u64(&self, keys: &[&str]) -> Result<Option<u64>> {
        match self.find(keys) {
            None => Ok(None),
            Some(v) => json_u64(v).map(Some).ok_or_else(|| {
                Error::bad_input(
                    &self.path,
                    format!(
                        "'{}' must be a non-negative integer",
                        keys_present(self, keys)
                    ),
                )
            }),
        }
    }

    fn opt_f64(&self, keys: &[&str]) -> Result<Option<f64>> {
        match self.find(keys) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                Error::bad_input(
                    &self.path,
                    format!("'{}' must be a number", keys_present(self, keys)),
                )
            }),
        }
    }

    /// A config.json number written as a GGUF f32: a number that is finite as an f32 (a string,
    /// `1e300` or NaN is an error naming the key, not a silent default or `inf`).
    fn f32_of(&self, key: &str, v: &Json) -> Result<f32> {
        match v.as_f64() {
            Some(x) if (x as f32).is_finite() => Ok(x as f32),
            Some(x) => Err(Error::bad_input(
                &self.path,
                format!("'{key}' is {x:e}, out of the f32 range a GGUF holds"),
            )),
            None => Err(Error::bad_input(
                &self.path,
                format!(
                    "'{key}' must be a number, not {}",
                    crate::error::one_line(&v.to_string())
                ),
            )),
        }
    }

    pub fn tie_word_embeddings(&self) -> bool {
        self.hp
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    }

    pub fn vocab_size(&self) -> Result<Option<u64>> {
        self.opt_u64(&["vocab_size"])
    }

    /// `rope_parameters` or `rope_scaling`, with `rope_theta` and friends mirrored into it.
    pub fn rope_parameters(&self) -> Map<String, Json> {
        let mut rp = self
            .hp
            .get("rope_parameters")
            .or_else(|| self.hp.get("rope_scaling"))
            .and_then(|v| v.as_object())
            .cloned()
            .unwrap_or_default();
        if !rp.contains_key("full_attention") && !rp.contains_key("sliding_attention") {
            let mirror = |rp: &mut Map<String, Json>, dst: &str, keys: &[&str]| {
                if !rp.contains_key(dst) {
                    if let Some(v) = self.find(keys) {
                        rp.insert(dst.into(), v.clone());
                    }
                }
            };
            if let Some(v) = self.find(&[
                "local_rope_theta",
                "rope_local_theta",
                "rope_theta_local",
                "swa_rope_theta",
                "rope_local_base_freq",
            ]) {
                let mut m = Map::new();
                m.insert("rope_theta".into(), v.clone());
                rp.insert("sliding_attention".into(), Json::Object(m));
            }
            mirror(
                &mut rp,
                "rope_theta",
                &[
                    "global_rope_theta",
                    "rope_global_theta",
                    "rope_theta_global",
                    "rope_theta",
                    "rotary_emb_base",
                ],
            );
            if !rp.contains_key("rope_type") {
                if let Some(t) = rp.get("type").cloned() {
                    rp.insert("rope_type".into(), t);
                }
            }
            mirror(
                &mut rp,
                "partial_rotary_factor",
                &["partial_rotary_factor", "rope_pct", "rope_percent"],
            );
            mirror(
                &mut rp,
                "original_max_position_embeddings",
                &["original_max_position_embeddings"],
            );
        }
        rp
    }

    fn full_rope(&self) -> Map<String, Json> {
        let rp = self.rope_parameters();
        match rp.get("full_attention").and_then(|v| v.as_object()) {
            Some(f) => f.clone(),
            None => rp,
        }
    }

    /// The `{arch}.*` keys of `TextModel.set_gguf_parameters` (+ the llama class's), then
    /// `general.file_type`: appended to `md` in convert_hf_to_gguf's order.
    pub fn arch_metadata(&self, file_type: u32, md: &mut Vec<(String, Value)>) -> Result<()> {
        let a = self.arch.name();
        let mut put = |k: &str, v: Value| md.push((format!("{a}.{k}"), v));
        put(
            "block_count",
            Value::U32(u32_of(&self.path, "block count", self.n_layer)?),
        );
        if let Some(n) = self.opt_u64(&[
            "max_position_embeddings",
            "n_ctx",
            "n_positions",
            "max_length",
            "max_sequence_length",
            "model_max_length",
        ])? {
            put(
                "context_length",
                Value::U32(u32_of(&self.path, "context length", n)?),
            );
        }
        put(
            "embedding_length",
            Value::U32(u32_of(&self.path, "hidden size", self.n_embd)?),
        );
        if let Some(n) = self.n_ff()? {
            put(
                "feed_forward_length",
                Value::U32(u32_of(&self.path, "intermediate size", n)?),
            );
        }
        put("attention.head_count", Value::U32(self.n_head as u32));
        put("attention.head_count_kv", Value::U32(self.n_head_kv as u32));
        if self.hp.get("is_causal").and_then(|v| v.as_bool()) == Some(false) {
            put("attention.causal", Value::Bool(false));
        }
        let rope = self.full_rope();
        if let Some(rt) = rope.get("rope_type").and_then(|v| v.as_str()) {
            let factor = rope.get("factor").and_then(|v| v.as_f64());
            let f32v = |k: &str| {
                rope.get(k)
                    .and_then(|v| v.as_f64())
                    .map(|x| Value::F32(x as f32))
            };
            match (rt, factor) {
                ("linear", Some(f)) => {
                    put("rope.scaling.type", Value::string("linear"));
                    put("rope.scaling.factor", Value::F32(f as f32));
                }
                ("yarn", Some(f)) => {
                    put("rope.scaling.type", Value::string("yarn"));
                    put("rope.scaling.factor", Value::F32(f as f32));
                    let orig = rope
                        .get("original_max_position_embeddings")
                        .and_then(json_u64)
                        .ok_or_else(|| {
                            Error::bad_input(
                                &self.path,
                                "yarn rope scaling needs original_max_position_embeddings",
                            )
                        })?;
                    put(
                        "rope.scaling.original_context_length",
                        Value::U32(u32_of(&self.path, "original context length", orig)?),
                    );
                    if let Some(v) = f32v("extrapolation_factor") {
                        put("rope.scaling.yarn_ext_factor", v);
                    }
                    if let Some(v) = f32v("attention_factor").or_else(|| f32v("attn_factor")) {
                        put("rope.scaling.yarn_attn_factor", v);
                    }
                    if let Some(v) = f32v("beta_fast") {
                        put("rope.scaling.yarn_beta_fast", v);
                    }
                    if let Some(v) = f32v("beta_slow") {
                        put("rope.scaling.yarn_beta_slow", v);
                    }
                }
                ("su" | "longrope", _) => put("rope.scaling.type", Value::string("longrope")),
                // llama3: a rope_freqs tensor (see `rope_freqs`); others: nothing written.
                _ => {}
            }
        }
        if let Some(t) = rope.get("rope_theta") {
            put("rope.freq_base", Value::F32(self.f32_of("rope_theta", t)?));
        }
        if let Some(t) = self
            .rope_parameters()
            .get("sliding_attention")
            .and_then(|v| v.get("rope_theta"))
        {
            put(
                "rope.freq_base_swa",
                Value::F32(self.f32_of("sliding-window rope_theta", t)?),
            );
        }
        if let Some(e) = self.opt_f64(&["rms_norm_eps", "norm_eps"])? {
            let e = self.f32_of("rms_norm_eps", &Json::from(e))?;
            put("attention.layer_norm_rms_epsilon", Value::F32(e));
        }
        if let Some(e) = self.opt_f64(&["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])? {
            let e = self.f32_of("layer_norm_eps", &Json::from(e))?;
            put("attention.layer_norm_epsilon", Value::F32(e));
        }
        if let Some(hd) = self.head_dim_explicit()? {
            put("attention.key_length", Value::U32(hd as u32));
            put("attention.value_length", Value::U32(hd as u32));
        }
        md.push(("general.file_type".into(), Value::U32(file_type)));
        if self.arch == Arch::Llama {
            if let Some(v) = self.vocab_size()? {
                md.push((
                    format!("{a}.vocab_size"),
                    Value::U32(u32_of(&self.path, "vocab size", v)?),
                ));
            }
            let rope_dim = self.head_dim()?;
            md.push((
                format!("{a}.rope.dimension_count"),
                Value::U32(rope_dim as u32),
            ));
        }
        Ok(())
    }

    /// `head_dim` when config.json states it.
    pub fn head_dim_explicit(&self) -> Result<Option<u64>> {
        match self.hp.get("head_dim").filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => match json_u64(v) {
                Some(h) if h > 0 && h <= 1 << 16 => Ok(Some(h)),
                _ => Err(Error::bad_input(
                    &self.path,
                    "'head_dim' must be a positive integer",
                )),
            },
        }
    }

    /// The per-head dimension: `head_dim`, else hidden size / heads (exact: checked at parse).
    pub fn head_dim(&self) -> Result<u64> {
        Ok(self
            .head_dim_explicit()?
            .unwrap_or(self.n_embd / self.n_head))
    }

    /// `intermediate_size` (the keys convert_hf_to_gguf reads for `feed_forward_length`).
    pub fn n_ff(&self) -> Result<Option<u64>> {
        self.opt_u64(&[
            "prefix_dense_intermediate_size",
            "dense_intermediate_size",
            "intermediate_size",
            "n_inner",
            "hidden_dim",
        ])
    }

    /// The PyTorch-order shape config.json implies for a GGUF-named tensor, with each dimension
    /// explained (`None`: a tensor whose shape the hyper-parameters do not fix, or a dimension
    /// config.json does not state).
    pub fn expected_shape(&self, gguf_name: &str) -> Result<Option<Vec<(u64, String)>>> {
        let hd = self.head_dim()?;
        let e = (self.n_embd, format!("hidden_size {}", self.n_embd));
        let q = (
            self.n_head * hd,
            format!("num_attention_heads {} x head_dim {hd}", self.n_head),
        );
        let kv = (
            self.n_head_kv * hd,
            format!("num_key_value_heads {} x head_dim {hd}", self.n_head_kv),
        );
        let ff = self.n_ff()?.map(|f| (f, format!("intermediate_size {f}")));
        let vocab = self.vocab_size()?.map(|v| (v, format!("vocab_size {v}")));
        let (stem, suffix) = gguf_name.rsplit_once('.').unwrap_or((gguf_name, ""));
        let part = match stem.strip_prefix("blk.") {
            Some(rest) => rest.split_once('.').map_or(rest, |(_, p)| p),
            None => stem,
        };
        let two = |a: Option<(u64, String)>, b: Option<(u64, String)>| match (a, b) {
            (Some(a), Some(b)) => Some(vec![a, b]),
            _ => None,
        };
        Ok(match (part, suffix) {
            ("token_embd" | "output", "weight") => two(vocab, Some(e)),
            ("output_norm" | "attn_norm" | "ffn_norm", "weight") => Some(vec![e]),
            ("attn_q", "weight") => Some(vec![q, e]),
            ("attn_k" | "attn_v", "weight") => Some(vec![kv, e]),
            ("attn_output", "weight") => Some(vec![e, q]),
            ("attn_q", "bias") => Some(vec![q]),
            ("attn_k" | "attn_v", "bias") => Some(vec![kv]),
            ("attn_output", "bias") => Some(vec![e]),
            ("attn_q_norm" | "attn_k_norm", "weight") => Some(vec![(hd, format!("head_dim {hd}"))]),
            ("ffn_gate" | "ffn_up", "weight") => two(ff, Some(e)),
            ("ffn_down", "weight") => two(Some(e), ff),
            ("ffn_gate" | "ffn_up", "bias") => ff.map(|f| vec![f]),
            ("ffn_down", "bias") => Some(vec![e]),
            _ => None,
        })
    }

    /// llama3-type rope scaling: the `rope_freqs.weight` factors convert_hf_to_gguf generates.
    pub fn rope_freqs(&self) -> Result<Option<Vec<f32>>> {
        let rope = self.full_rope();
        let is_llama3 = rope
            .get("rope_type")
            .and_then(|v| v.as_str())
            .is_some_and(|t| t.eq_ignore_ascii_case("llama3"));
        if !is_llama3 || self.arch != Arch::Llama {
            return Ok(None);
        }
        let num = |k: &str, d: f64| rope.get(k).and_then(|v| v.as_f64()).unwrap_or(d);
        let base = match rope.get("rope_theta") {
            Some(v) => f64::from(self.f32_of("rope_theta", v)?),
            None => 10000.0,
        };
        let dim = self
            .head_dim_explicit()?
            .unwrap_or(self.n_embd / self.n_head);
        if dim < 2 {
            return Err(Error::bad_input(
                &self.path,
                "head dimension too small for rope",
            ));
        }
        let factor = num("factor", 8.0);
        let low = num("low_freq_factor", 1.0);
        let high = num("high_freq_factor", 4.0);
        let old_ctx = num("original_max_position_embeddings", 8192.0);
        let low_wavelen = old_ctx / low;
        let high_wavelen = old_ctx / high;
        // torch arithmetic in float32, as the reference does.
        let mut out = Vec::new();
        let mut i = 0u64;
        while i < dim {
            let e = (i as f32) / (dim as f32);
            let freq = 1.0f32 / (base as f32).powf(e);
            let wavelen = (2.0 * std::f64::consts::PI) as f32 / freq;
            let w = wavelen as f64;
            out.push(if w < high_wavelen {
                1.0
            } else if w > low_wavelen {
                factor as f32
            } else {
                let smooth = ((old_ctx as f32 / wavelen) - low as f32) / (high as f32 - low as f32);
                1.0 / ((1.0 - smooth) / factor as f32 + smooth)
            });
            i += 2;
        }
        Ok(Some(out))
    }
}

/// The key convert_hf_to_gguf's models name (for a missing value): the first `num_*` /
/// `hidden_size` spelling, else the first.
fn keys_wanted<'a>(keys: &[&'a str]) -> &'a str {
    keys.iter()
        .find(|k| k.starts_with("num_") || **k == "hidden_size")
        .unwrap_or(&keys[0])
}

fn keys_present(c: &Config, keys: &[&str]) -> String {
    keys.iter()
        .find(|k| c.hp.contains_key(**k))
        .unwrap_or(&keys[0])
        .to_string()
}

pub fn json_u64(v: &Json) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 1e15)
            .map(|f| f as u64)
    })
}

fn u32_of(path: &Path, what: &str, v: u64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::bad_input(path, format!("{what} {v} does not fit in 32 bits")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(s: &str) -> Result<Config> {
        Config::parse(Path::new("config.json"), s)
    }

    #[test]
    fn unknown_arch_lists_supported() {
        let e = cfg(r#"{"architectures":["GPTNeoXForCausalLM"]}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("unsupported architecture 'GPTNeoXForCausalLM'"),
            "{e}"
        );
        assert!(
            e.contains("LlamaForCausalLM") && e.contains("Qwen3ForCausalLM"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn llama_keys() {
        let c = cfg(
            r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":2,"hidden_size":64,
            "num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":128,
            "max_position_embeddings":256,"rms_norm_eps":1e-5,"rope_theta":10000.0,"vocab_size":100,
            "rope_scaling":{"rope_type":"linear","factor":2.0}}"#,
        )
        .unwrap();
        let mut md = vec![];
        c.arch_metadata(1, &mut md).unwrap();
        let keys: Vec<&str> = md.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "llama.block_count",
                "llama.context_length",
                "llama.embedding_length",
                "llama.feed_forward_length",
                "llama.attention.head_count",
                "llama.attention.head_count_kv",
                "llama.rope.scaling.type",
                "llama.rope.scaling.factor",
                "llama.rope.freq_base",
                "llama.attention.layer_norm_rms_epsilon",
                "general.file_type",
                "llama.vocab_size",
                "llama.rope.dimension_count"
            ]
        );
        assert_eq!(md[12].1, Value::U32(16));
    }

    #[test]
    fn head_dim_and_qwen3() {
        let c = cfg(
            r#"{"architectures":["Qwen3ForCausalLM"],"num_hidden_layers":2,"hidden_size":64,
            "num_attention_heads":4,"num_key_value_heads":2,"head_dim":32}"#,
        )
        .unwrap();
        let mut md = vec![];
        c.arch_metadata(1, &mut md).unwrap();
        assert!(md
            .iter()
            .any(|(k, v)| k == "qwen3.attention.key_length" && *v == Value::U32(32)));
        assert!(!md.iter().any(|(k, _)| k.ends_with("rope.dimension_count")));
    }

    #[test]
    fn hostile_values_are_errors() {
        for s in [
            r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":2,"hidden_size":64,"num_attention_heads":0,"num_key_value_heads":1}"#,
            r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":-1,"hidden_size":64,"num_attention_heads":4,"num_key_value_heads":1}"#,
            r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":"x","hidden_size":64,"num_attention_heads":4,"num_key_value_heads":1}"#,
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64}"#,
            r#"[1]"#,
            r#"{"#,
        ] {
            let e = cfg(s).err().expect(s).to_string();
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_missing_key_is_named_as_config_json_spells_it() {
        let e = cfg(r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing 'hidden_size'"), "{e}");
        let e = cfg(r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing 'num_hidden_layers'"), "{e}");
    }

    #[test]
    fn rope_theta_must_be_an_f32_number() {
        for (theta, want) in [
            (r#""abc""#, "'rope_theta' must be a number, not \"abc\""),
            ("1e300", "'rope_theta' is 1e300, out of the f32 range"),
        ] {
            let c = cfg(&format!(
                r#"{{"architectures":["Qwen2ForCausalLM"],"num_hidden_layers":2,"hidden_size":64,
                "num_attention_heads":4,"num_key_value_heads":2,"rope_theta":{theta}}}"#
            ))
            .unwrap();
            let e = c
                .arch_metadata(1, &mut vec![])
                .expect_err(theta)
                .to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn llama3_rope_freqs() {
        let c = cfg(r#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":2,"hidden_size":512,
            "num_attention_heads":4,"num_key_value_heads":2,"rope_theta":500000.0,
            "rope_scaling":{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#)
        .unwrap();
        let f = c.rope_freqs().unwrap().unwrap();
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 32.0);
        assert!(f.iter().all(|v| (1.0..=32.0).contains(v)));
    }
}
