//! `general.*` authorship keys the way gguf-py's `Metadata.load` derives them: the README.md model
//! card's YAML front matter, then config.json's `_name_or_path`, then the directory name, and the
//! sampling defaults of generation_config.json.

use crate::gguf::{Value, ValueType};
use regex::Regex;
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use std::path::Path;

/// A front-matter value: a scalar (kept as text) or a list of scalars.
#[derive(Clone, Debug, PartialEq)]
pub enum Yaml {
    Str(String),
    List(Vec<String>),
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    if s.len() >= 2
        && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\'')))
    {
        return s[1..s.len() - 1].to_string();
    }
    // A trailing comment.
    match s.find(" #") {
        Some(i) => s[..i].trim_end().to_string(),
        None => s.to_string(),
    }
}

/// The YAML front matter of a model card: top-level `key: scalar`, `key: [a, b]` and `key:` followed
/// by `- item` lines. Nested mappings are skipped (gguf-py does not use them).
pub fn front_matter(text: &str) -> BTreeMap<String, Yaml> {
    let mut out = BTreeMap::new();
    let mut lines = text.lines();
    if lines.next() != Some("---") {
        return out;
    }
    let mut pending: Option<(String, Vec<String>)> = None;
    let flush = |p: &mut Option<(String, Vec<String>)>, out: &mut BTreeMap<String, Yaml>| {
        if let Some((k, items)) = p.take() {
            if !items.is_empty() {
                out.insert(k, Yaml::List(items));
            }
        }
    };
    for line in lines {
        if line == "---" {
            break;
        }
        let line = line.replace('\t', "  ");
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some(item) = t
            .strip_prefix("- ")
            .or(if t == "-" { Some("") } else { None })
        {
            if let Some((_, items)) = pending.as_mut() {
                if !item.contains(": ") {
                    items.push(unquote(item));
                }
            }
            continue;
        }
        if line.starts_with(' ') {
            continue; // nested mapping content
        }
        flush(&mut pending, &mut out);
        let Some((k, v)) = t.split_once(':') else {
            continue;
        };
        let (k, v) = (unquote(k), v.trim());
        if v.is_empty() {
            pending = Some((k, vec![]));
        } else if v.starts_with('[') && v.ends_with(']') {
            let inner = &v[1..v.len() - 1];
            let items: Vec<String> = inner
                .split(',')
                .map(unquote)
                .filter(|s| !s.is_empty())
                .collect();
            out.insert(k, Yaml::List(items));
        } else {
            out.insert(k, Yaml::Str(unquote(v)));
        }
    }
    flush(&mut pending, &mut out);
    out
}

/// Python's `str.islower()`.
fn py_islower(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_uppercase() {
            return false;
        }
        if c.is_lowercase() {
            cased = true;
        }
    }
    cased
}

/// Python's `str.title()`.
fn py_title(s: &str) -> String {
    let mut out = String::new();
    let mut prev_cased = false;
    for c in s.chars() {
        let cased = c.is_uppercase() || c.is_lowercase();
        if cased {
            if prev_cased {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
        } else {
            out.push(c);
        }
        prev_cased = cased;
    }
    out
}

/// gguf-py `Metadata.id_to_title`.
pub fn id_to_title(s: &str) -> String {
    let ver = Regex::new(r"^(v\d+(?:\.\d+)*|\d.*)$").unwrap();
    s.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            if py_islower(w) && !ver.is_match(w) {
                py_title(w)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Default, Debug, Clone, PartialEq)]
pub struct IdParts {
    pub full: Option<String>,
    pub org: Option<String>,
    pub basename: Option<String>,
    pub finetune: Option<String>,
    pub version: Option<String>,
    pub size_label: Option<String>,
}

/// gguf-py `Metadata.get_model_id_components`.
// One function on purpose: a line-by-line port of the same-named gguf-py function (its regexes
// and fallbacks), which tests/hf.rs compares on gguf-py's own cases.
pub fn model_id_components(model_id: &str, total_params: i64) -> IdParts {
    if model_id.contains(' ') {
        return IdParts {
            full: Some(model_id.to_string()),
            ..Default::default()
        };
    }
    let (mut org, full) = match model_id.split_once('/') {
        Some((o, f)) => (Some(o.to_string()), f.to_string()),
        None => (None, model_id.to_string()),
    };
    if org.as_deref().is_some_and(|o| o.starts_with('.')) {
        org = None;
    }
    let re_version = Regex::new(r"(?i)^(?:v|iter)?\d+(?:[.]\d+)*$").unwrap();
    let re_type = Regex::new(r"(?i)^(?:i?q\d(?:_\w)*|b?fp?(?:16|32))$").unwrap();
    let re_size = Regex::new(
        r"(?i)^(?:(?:(?:[A]|\d+[x])?\d+(?:[._]\d+)?[KMBT][\d]?)|small|mini|medium|large|x?xl)$",
    )
    .unwrap();
    let re_fine = Regex::new(r"(?i)^(?:chat|instruct|vision|lora)$").unwrap();
    let mut parts: Vec<String> = full
        .split('-')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let mut types: Vec<Vec<&'static str>> = vec![vec![]; parts.len()];
    for i in 0..parts.len() {
        let part = parts[i].clone();
        if re_version.is_match(&part) {
            types[i].push("version");
        } else if re_type.is_match(&part) {
            types[i].push("type");
            parts[i] = part.to_uppercase();
        } else if i > 0 && re_size.is_match(&part) {
            let mut p: Vec<char> = part.replace('_', ".").chars().collect();
            let n = p.len();
            if p[n - 1].is_ascii_digit() && n >= 2 {
                let (a, b) = (p[n - 2], p[n - 1]);
                p.truncate(n - 2);
                p.extend(['.', b, a]);
            }
            let n = p.len();
            if n > 1 && p[n - 2].is_ascii_digit() && "kmbt".contains(p[n - 1]) {
                p[n - 1] = p[n - 1].to_ascii_uppercase();
            }
            if total_params != 0 {
                let n = p.len();
                let num: String = p[..n - 1].iter().collect();
                if let Ok(x) = num.parse::<f64>() {
                    let pos = " KMBT".find(p[n - 1]).map(|i| i as i32).unwrap_or(-1);
                    let label = x * 1000f64.powi(pos);
                    let t = total_params;
                    let ctx = if t < 0 {
                        label < (t.abs() / 8) as f64
                    } else {
                        (label - t as f64).abs() > (7 * t / 8) as f64
                    };
                    if ctx {
                        types[i].push("finetune");
                        p[n - 1] = p[n - 1].to_ascii_lowercase();
                    }
                }
            }
            if types[i].is_empty() {
                types[i].push("size_label");
            }
            parts[i] = p.into_iter().collect();
        } else if i > 0 && re_fine.is_match(&part) {
            if total_params < 0 && part.eq_ignore_ascii_case("lora") {
                types[i].push("type");
            } else {
                types[i].push("finetune");
            }
        }
    }
    let has_numeric_size = parts
        .iter()
        .zip(&types)
        .any(|(n, t)| t.contains(&"size_label") && n.chars().any(|c| c.is_ascii_digit()));
    if has_numeric_size {
        for (n, t) in parts.iter().zip(types.iter_mut()) {
            if t.contains(&"size_label") && n.chars().all(char::is_alphabetic) {
                t.retain(|x| *x != "size_label");
            }
        }
    }
    let mut at_start = true;
    for (p, t) in parts.iter().zip(types.iter_mut()) {
        let first_alpha = p.chars().next().is_some_and(char::is_alphabetic);
        if at_start && ((t.is_empty() && first_alpha) || t.contains(&"version")) {
            t.push("basename");
        } else {
            at_start = false;
            if t.is_empty() {
                t.push("finetune");
            }
        }
    }
    for t in types.iter_mut().rev() {
        if t.contains(&"basename") && t.len() > 1 {
            t.retain(|x| *x != "basename");
        } else {
            break;
        }
    }
    let join = |f: &dyn Fn(&Vec<&str>) -> bool| {
        let v: Vec<&str> = parts
            .iter()
            .zip(&types)
            .filter(|(_, t)| f(t))
            .map(|(p, _)| p.as_str())
            .collect();
        (!v.is_empty()).then(|| v.join("-"))
    };
    let mut basename = join(&|t| t.contains(&"basename"));
    let size_label = {
        let mut seen: Vec<&str> = vec![];
        for (p, t) in parts.iter().zip(&types) {
            if t.contains(&"size_label") && !seen.contains(&p.as_str()) {
                seen.push(p);
            }
        }
        (!seen.is_empty()).then(|| seen.join("-"))
    };
    let finetune = join(&|t| t.contains(&"finetune"));
    let version = join(&|t| t.contains(&"version") && !t.contains(&"basename"));
    if size_label.is_none() && finetune.is_none() && version.is_none() {
        basename = None;
    }
    IdParts {
        full: Some(full),
        org,
        basename,
        finetune,
        version,
        size_label,
    }
}

/// gguf-py `model_weight_count_rounded_notation(n, min_digits=2)`.
pub fn size_label(n: u64) -> String {
    let n = n as f64;
    let (x, s) = if n > 1e12 {
        (n * 1e-12, "T")
    } else if n > 1e9 {
        (n * 1e-9, "B")
    } else if n > 1e6 {
        (n * 1e-6, "M")
    } else {
        (n * 1e-3, "K")
    };
    // Python round(): half to even.
    let r = x.round_ties_even() as u64;
    let digits = r.to_string().trim_start_matches('0').len();
    let fix = 2usize.saturating_sub(digits);
    format!("{x:.fix$}{s}")
}

#[derive(Default, Debug)]
struct Meta {
    s: BTreeMap<&'static str, String>,
    license: Option<String>,
    base_models: Option<Vec<Vec<(&'static str, String)>>>,
    datasets: Option<Vec<Vec<(&'static str, String)>>>,
    tags: Option<Vec<String>>,
    languages: Option<Vec<String>>,
}

fn entity(id: &str, total_params: i64) -> Vec<(&'static str, String)> {
    let mut e = vec![];
    let from_id = |e: &mut Vec<(&'static str, String)>, id: &str, url: bool| {
        let c = model_id_components(id, total_params);
        if let Some(f) = &c.full {
            e.push(("name", id_to_title(f)));
        }
        if let Some(o) = &c.org {
            e.push(("organization", id_to_title(o)));
        }
        if let Some(v) = &c.version {
            e.push(("version", v.clone()));
        }
        if url {
            if let (Some(o), Some(f)) = (&c.org, &c.full) {
                e.push(("repo_url", format!("https://huggingface.co/{o}/{f}")));
            }
        }
    };
    if id.starts_with("http://") || id.starts_with("https://") || id.starts_with("ssh://") {
        e.push(("repo_url", id.to_string()));
        if id.contains("huggingface.co") {
            let re = Regex::new(r"^https?://huggingface.co/([^/]+/[^/]+)$").unwrap();
            if let Some(m) = re.captures(id) {
                from_id(&mut e, &m[1], false);
            }
        }
    } else {
        from_id(&mut e, id, true);
    }
    e
}

const ENTITY_KEYS: &[&str] = &[
    "name",
    "author",
    "version",
    "organization",
    "description",
    "url",
    "doi",
    "uuid",
    "repo_url",
];

/// An optional file of the model directory: None when it is absent; when it is there but cannot
/// be read as text, a warning naming it (what it would have given is left out), then None.
fn read_optional(p: &Path) -> Option<String> {
    match std::fs::read_to_string(p) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            eprintln!(
                "tq: warning: {}: cannot be read ({e}); the metadata it holds is not copied into the GGUF",
                p.display()
            );
            None
        }
    }
}

/// The general.* keys (after general.architecture / general.type) in gguf-py's order.
// One function on purpose: it emits the keys in gguf-py's order, one block per key, so a
// diff against convert_hf_to_gguf's output reads top to bottom.
pub fn general_metadata(
    dir: &Path,
    config: &Map<String, Json>,
    total_params: u64,
) -> Vec<(String, Value)> {
    let card = read_optional(&dir.join("README.md"))
        .map(|t| front_matter(&t))
        .unwrap_or_default();
    let gp = dir.join("generation_config.json");
    let gen: Map<String, Json> = read_optional(&gp)
        .and_then(|t| match serde_json::from_str::<Json>(&t) {
            Ok(Json::Object(m)) => Some(m),
            _ => {
                eprintln!(
                    "tq: warning: {}: not a JSON object; its generation settings are not copied into the GGUF metadata",
                    gp.display()
                );
                None
            }
        })
        .unwrap_or_default();
    let total = total_params.min(i64::MAX as u64) as i64;
    let mut m = Meta::default();
    let scalar = |k: &str| match card.get(k) {
        Some(Yaml::Str(s)) => Some(s.clone()),
        Some(Yaml::List(l)) => Some(l.join(",")),
        None => None,
    };
    let use_card = |m: &mut Meta, key: &'static str, ck: &str| {
        if !m.s.contains_key(key) {
            if let Some(v) = scalar(ck) {
                m.s.insert(key, v);
            }
        }
    };
    for (key, ck) in [
        ("name", "name"),
        ("author", "author"),
        ("version", "version"),
        ("organization", "organization"),
        ("description", "description"),
        ("finetune", "finetune"),
        ("basename", "basename"),
        ("size_label", "size_label"),
        ("source_url", "url"),
        ("source_doi", "doi"),
        ("source_uuid", "uuid"),
        ("source_repo_url", "repo_url"),
        ("name", "model_name"),
        ("author", "model_author"),
        ("version", "model_version"),
        ("organization", "model_organization"),
        ("description", "model_description"),
        ("finetune", "model_finetune"),
        ("basename", "model_basename"),
        ("size_label", "model_size_label"),
        ("source_url", "model_url"),
        ("source_doi", "model_doi"),
        ("source_uuid", "model_uuid"),
        ("source_repo_url", "model_repo_url"),
        ("name", "model_name"),
        ("author", "model_creator"),
        ("basename", "model_type"),
    ] {
        use_card(&mut m, key, ck);
    }
    let list = |k: &str| match card.get(k) {
        Some(Yaml::Str(s)) => Some(vec![s.clone()]),
        Some(Yaml::List(l)) => Some(l.clone()),
        None => None,
    };
    let first = |keys: &[&str]| {
        keys.iter()
            .find(|k| card.contains_key(**k))
            .and_then(|k| list(k))
    };
    if ["base_model", "base_models", "base_model_sources"]
        .iter()
        .any(|k| card.contains_key(*k))
    {
        let ids = first(&["base_model", "base_models", "base_model_sources"]).unwrap_or_default();
        m.base_models = Some(ids.iter().map(|id| entity(id, total)).collect());
    }
    if ["datasets", "dataset", "dataset_sources"]
        .iter()
        .any(|k| card.contains_key(*k))
    {
        let ids = first(&["datasets", "dataset", "dataset_sources"]).unwrap_or_default();
        m.datasets = Some(ids.iter().map(|id| entity(id, total)).collect());
    }
    m.license = scalar("license");
    use_card(&mut m, "license_name", "license_name");
    use_card(&mut m, "license_link", "license_link");
    for (dst, k) in [
        (0, "tags"),
        (0, "pipeline_tag"),
        (1, "languages"),
        (1, "language"),
    ] {
        if let Some(v) = list(k) {
            let slot = if dst == 0 {
                &mut m.tags
            } else {
                &mut m.languages
            };
            slot.get_or_insert_with(Vec::new).extend(v);
        }
    }
    let apply_id = |m: &mut Meta, c: IdParts| {
        let mut set = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                m.s.entry(k).or_insert(v);
            }
        };
        set("name", c.full.as_deref().map(id_to_title));
        set("organization", c.org.as_deref().map(id_to_title));
        set("basename", c.basename);
        set("finetune", c.finetune);
        set("version", c.version);
        set("size_label", c.size_label);
    };
    if let Some(id) = config.get("_name_or_path").and_then(|v| v.as_str()) {
        if id.matches('/').count() <= 1 {
            apply_id(&mut m, model_id_components(id, total));
        }
    }
    let dir_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    apply_id(&mut m, model_id_components(&dir_name, total));
    m.s.entry("name").or_insert(dir_name);
    if total_params > 0 {
        m.s.entry("size_label")
            .or_insert_with(|| size_label(total_params));
    }

    let mut md: Vec<(String, Value)> = vec![];
    // Sampling defaults from generation_config.json.
    let num = |k: &str| gen.get(k).and_then(|v| v.as_f64());
    let int = |k: &str| gen.get(k).and_then(|v| v.as_i64()).map(|v| v as i32);
    if let Some(s) = gen.get("sequence").and_then(|v| v.as_str()) {
        md.push(("general.sampling.sequence".into(), Value::string(s)));
    }
    let mut f = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            md.push((format!("general.sampling.{k}"), v));
        }
    };
    f("top_k", int("top_k").map(Value::I32));
    f("top_p", num("top_p").map(|x| Value::F32(x as f32)));
    f("min_p", num("min_p").map(|x| Value::F32(x as f32)));
    f(
        "xtc_probability",
        num("xtc_probability").map(|x| Value::F32(x as f32)),
    );
    f(
        "xtc_threshold",
        num("xtc_threshold").map(|x| Value::F32(x as f32)),
    );
    f("temp", num("temperature").map(|x| Value::F32(x as f32)));
    f("penalty_last_n", int("penalty_last_n").map(Value::I32));
    f(
        "penalty_repeat",
        num("penalty_repeat")
            .or_else(|| num("repetition_penalty"))
            .map(|x| Value::F32(x as f32)),
    );
    f("mirostat", int("mirostat").map(Value::I32));
    f(
        "mirostat_tau",
        num("mirostat_tau").map(|x| Value::F32(x as f32)),
    );
    f(
        "mirostat_eta",
        num("mirostat_eta").map(|x| Value::F32(x as f32)),
    );

    let s = |k: &str| m.s.get(k).cloned();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            md.push((format!("general.{k}"), Value::string(&v)));
        }
    };
    for k in [
        "name",
        "author",
        "version",
        "organization",
        "finetune",
        "basename",
        "description",
        "quantized_by",
        "size_label",
    ] {
        put(k, s(k));
    }
    put("license", m.license.clone());
    put("license.name", s("license_name"));
    put("license.link", s("license_link"));
    for k in ["url", "doi", "uuid", "repo_url"] {
        put(k, s(k));
    }
    put("source.url", s("source_url"));
    put("source.doi", s("source_doi"));
    put("source.uuid", s("source_uuid"));
    put("source.repo_url", s("source_repo_url"));
    for (what, list) in [("base_model", &m.base_models), ("dataset", &m.datasets)] {
        if let Some(list) = list {
            md.push((
                format!("general.{what}.count"),
                Value::U32(list.len() as u32),
            ));
            for (i, e) in list.iter().enumerate() {
                for k in ENTITY_KEYS {
                    if let Some((_, v)) = e.iter().find(|(kk, _)| kk == k) {
                        md.push((format!("general.{what}.{i}.{k}"), Value::string(v)));
                    }
                }
            }
        }
    }
    for (k, v) in [("tags", &m.tags), ("languages", &m.languages)] {
        if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
            md.push((
                format!("general.{k}"),
                Value::Array(
                    ValueType::String,
                    v.iter().map(|s| Value::string(s)).collect(),
                ),
            ));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_name() {
        let c = model_id_components("HuggingFaceTB/smollm2-135M-8k-lc100k-mix1-ep2", 134_515_008);
        assert_eq!(c.org.as_deref(), Some("HuggingFaceTB"));
        assert_eq!(c.basename.as_deref(), Some("smollm2"));
        assert_eq!(c.size_label.as_deref(), Some("135M"));
        assert_eq!(c.finetune.as_deref(), Some("8k-lc100k-mix1-ep2"));
        assert_eq!(c.version, None);
        assert_eq!(
            id_to_title("smollm2-135M-8k-lc100k-mix1-ep2"),
            "Smollm2 135M 8k Lc100K Mix1 Ep2"
        );
    }

    #[test]
    fn other_ids() {
        // Expected values: gguf-py 0.19's Metadata.get_model_id_components on the same ids.
        for (id, n, want) in [
            (
                "meta-llama/Meta-Llama-3.1-8B-Instruct",
                8_030_261_248u64,
                ("Meta-Llama-3.1", Some("Instruct"), None, Some("8B")),
            ),
            (
                "Qwen/Qwen2.5-0.5B",
                494_032_768,
                ("Qwen2.5", None, None, Some("0.5B")),
            ),
            (
                "mistralai/Mistral-7B-Instruct-v0.3",
                7_248_023_552,
                ("Mistral", Some("Instruct"), Some("v0.3"), Some("7B")),
            ),
            (
                "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                1_100_048_384,
                ("TinyLlama", Some("Chat"), Some("v1.0"), Some("1.1B")),
            ),
        ] {
            let c = model_id_components(id, n as i64);
            assert_eq!(c.basename.as_deref(), Some(want.0), "{id}");
            assert_eq!(c.finetune.as_deref(), want.1, "{id}");
            assert_eq!(c.version.as_deref(), want.2, "{id}");
            assert_eq!(c.size_label.as_deref(), want.3, "{id}");
        }
        assert_eq!(size_label(134_515_008), "135M");
        assert_eq!(size_label(494_032_768), "494M");
        assert_eq!(size_label(1_500_000_000), "1.5B");
    }

    #[test]
    fn card() {
        let fm = front_matter("---\nlicense: apache-2.0\nlanguage:\n- en\n- fr\ntags: [a, \"b\"]\nmodel-index:\n  - name: x\n---\n# hi\n");
        assert_eq!(fm["license"], Yaml::Str("apache-2.0".into()));
        assert_eq!(fm["language"], Yaml::List(vec!["en".into(), "fr".into()]));
        assert_eq!(fm["tags"], Yaml::List(vec!["a".into(), "b".into()]));
        assert!(!fm.contains_key("model-index"));
        assert!(front_matter("no front matter").is_empty());
    }
}
