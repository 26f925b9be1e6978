//! `--mix-cache FILE`: what a mix measured (the sensitivity table, the probes' and the
//! uncalibrated tensors' KLDs, the fit) saved as JSON, so that another `--target-size` or
//! `--target-bpw` on the same model plans in seconds. The file is keyed by what the measurements
//! depend on (the model's and calibration's contents, the candidate types, the KLD text and the
//! settings); a different key is measured again (and the file replaced), a file that is not a
//! cache is an error. Numbers are stored as their f64 bits, so a plan from the cache is the plan a
//! cold run makes, byte for byte, except that each measured plan is kept with its types too: a
//! later size that it fits takes it when it measured best (the mix never gets worse with more
//! bytes over what it has measured), where a cold run would not have measured it.

use super::report::Probe;
use crate::error::{Error, Result};
use crate::plan::mix::Table;
use crate::quant::sensitivity::Estimate;
use crate::types::TensorType;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The format's name and version, the first key of every cache file.
const FORMAT: &str = "tq-mix-cache-1";

/// What a mix measured.
pub(crate) struct Measured {
    pub table: Table,
    pub probes: Vec<Probe>,
    /// Per item: the candidates' measured KLDs (uncalibrated items with a fit), or none.
    pub direct: Vec<Option<Vec<f64>>>,
    pub direct_report: Vec<(String, TensorType, f64)>,
    pub alpha: Option<f64>,
    pub role_alpha: BTreeMap<String, f64>,
    pub r2: Option<f64>,
    pub r2_roles: Option<f64>,
    /// Whole plans' measured KLDs (best of few), by the plan's key (a hash of its types).
    pub plans: BTreeMap<String, f64>,
    /// Those plans' summed predictions (where the fit prices every type of the plan): with
    /// `plans`, the points of the calibration (`calibrate.rs`).
    pub predicted: BTreeMap<String, f64>,
    /// Those plans' names and types (every planned tensor's, in plan order), by the same key:
    /// what another size needs to write one of them.
    pub plan_types: BTreeMap<String, PlanTypes>,
    /// The activation-rounding part of `table`'s errors (same shape), when it was measured.
    pub act: Option<Vec<Vec<Vec<f64>>>>,
}

/// A measured plan as the cache keeps it: its name ("knapsack", "preset Q4_1", ...) and each
/// planned tensor's name and type, in plan order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PlanTypes {
    pub name: String,
    pub types: Vec<(String, TensorType)>,
}

/// What the measurements depend on, by name (`model` → its blake3, `types` → the list, …).
pub(crate) struct Key(pub Vec<(&'static str, String)>);

/// A cache read: its measurements, or why they cannot be used (a note for the user).
pub(crate) enum Loaded {
    Hit(Box<Measured>),
    Miss(String),
}

fn f(x: f64) -> Value {
    json!(x.to_bits())
}

fn of(x: Option<f64>) -> Value {
    x.map_or(Value::Null, f)
}

/// Save `m` under `key` (written beside, then renamed: a reader never sees half a file).
pub(crate) fn save(path: &Path, key: &Key, m: &Measured) -> Result<()> {
    let table: Vec<Value> = m
        .table
        .iter()
        .map(|item| {
            json!(item
                .iter()
                .map(|member| member
                    .iter()
                    .map(|e| json!([f(e.err), f(e.se)]))
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>())
        })
        .collect();
    let v = json!({
        "format": FORMAT,
        "key": key.0.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "table": table,
        "probes": m.probes.iter().map(|p| json!([p.tensor, p.ty.name(), f(p.err), f(p.kld)])).collect::<Vec<_>>(),
        "direct": m.direct.iter().map(|d| d.as_ref().map_or(Value::Null, |v| json!(v.iter().map(|&x| f(x)).collect::<Vec<_>>()))).collect::<Vec<_>>(),
        "direct_report": m.direct_report.iter().map(|(n, t, k)| json!([n, t.name(), f(*k)])).collect::<Vec<_>>(),
        "alpha": of(m.alpha),
        "role_alpha": m.role_alpha.iter().map(|(r, a)| (r.clone(), f(*a))).collect::<serde_json::Map<_, _>>(),
        "r2": of(m.r2),
        "r2_roles": of(m.r2_roles),
        "plans": m.plans.iter().map(|(k, x)| (k.clone(), f(*x))).collect::<serde_json::Map<_, _>>(),
        "plans_predicted": m.predicted.iter().map(|(k, x)| (k.clone(), f(*x))).collect::<serde_json::Map<_, _>>(),
        "act": m.act.as_ref().map_or(Value::Null, |a| json!(a.iter().map(|item| item.iter().map(|mem| mem.iter().map(|&x| f(x)).collect::<Vec<_>>()).collect::<Vec<_>>()).collect::<Vec<_>>())),
        "plan_types": m.plan_types.iter().map(|(k, p)| (k.clone(), json!([p.name, p.types.iter().map(|(n, t)| json!([n, t.name()])).collect::<Vec<_>>()]))).collect::<serde_json::Map<_, _>>(),
    });
    let tmp = path.with_extension(format!("tq-tmp-{}", std::process::id()));
    std::fs::write(&tmp, v.to_string()).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Read the cache at `path` for `key`: a hit, a miss (no file yet, or measured for something
/// else: which parts of the key differ), or an error for a file that is not a readable cache.
pub(crate) fn load(path: &Path, key: &Key) -> Result<Loaded> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Loaded::Miss("no cache yet".into()))
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    let corrupt = |why: &str| {
        Error::bad_input(
            path,
            format!(
                "--mix-cache: not a readable tq mix cache ({why}); delete it or give another file"
            ),
        )
    };
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| corrupt(&e.to_string()))?;
    if v["format"] != FORMAT {
        return Err(corrupt("no 'format' of this tq version"));
    }
    let differ: Vec<&str> = key
        .0
        .iter()
        .filter(|(k, want)| v["key"][*k].as_str() != Some(want.as_str()))
        .map(|(k, _)| *k)
        .collect();
    if !differ.is_empty() {
        return Ok(Loaded::Miss(format!(
            "it was measured with another {}",
            differ.join(", ")
        )));
    }
    decode(&v)
        .ok_or_else(|| corrupt("a field is missing or malformed"))
        .map(|m| Loaded::Hit(Box::new(m)))
}

fn num(v: &Value) -> Option<f64> {
    v.as_u64().map(f64::from_bits)
}

fn opt(v: &Value) -> Option<Option<f64>> {
    if v.is_null() {
        Some(None)
    } else {
        num(v).map(Some)
    }
}

fn ty(v: &Value) -> Option<TensorType> {
    TensorType::from_name(v.as_str()?)
}

fn decode(v: &Value) -> Option<Measured> {
    let table = v["table"]
        .as_array()?
        .iter()
        .map(|item| {
            item.as_array()?
                .iter()
                .map(|member| {
                    member
                        .as_array()?
                        .iter()
                        .map(|e| {
                            Some(Estimate {
                                err: num(&e[0])?,
                                se: num(&e[1])?,
                            })
                        })
                        .collect::<Option<Vec<_>>>()
                })
                .collect::<Option<Vec<_>>>()
        })
        .collect::<Option<Vec<_>>>()?;
    let probes = v["probes"]
        .as_array()?
        .iter()
        .map(|p| {
            Some(Probe {
                tensor: p[0].as_str()?.to_string(),
                ty: ty(&p[1])?,
                err: num(&p[2])?,
                kld: num(&p[3])?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let direct = v["direct"]
        .as_array()?
        .iter()
        .map(|d| {
            if d.is_null() {
                Some(None)
            } else {
                d.as_array()?
                    .iter()
                    .map(num)
                    .collect::<Option<Vec<_>>>()
                    .map(Some)
            }
        })
        .collect::<Option<Vec<_>>>()?;
    let direct_report = v["direct_report"]
        .as_array()?
        .iter()
        .map(|d| Some((d[0].as_str()?.to_string(), ty(&d[1])?, num(&d[2])?)))
        .collect::<Option<Vec<_>>>()?;
    let role_alpha = v["role_alpha"]
        .as_object()?
        .iter()
        .map(|(r, a)| Some((r.clone(), num(a)?)))
        .collect::<Option<BTreeMap<_, _>>>()?;
    // Absent in a cache saved before plans were measured (or their predictions kept): none.
    let map = |name: &str| match v.get(name) {
        None => Some(BTreeMap::new()),
        Some(p) => p
            .as_object()?
            .iter()
            .map(|(k, x)| Some((k.clone(), num(x)?)))
            .collect::<Option<BTreeMap<_, _>>>(),
    };
    let plans = map("plans")?;
    let predicted = map("plans_predicted")?;
    // Absent in a cache saved before the plans' types were kept: none.
    let plan_types = match v.get("plan_types") {
        None => BTreeMap::new(),
        Some(p) => p
            .as_object()?
            .iter()
            .map(|(k, x)| {
                let types = x[1]
                    .as_array()?
                    .iter()
                    .map(|e| Some((e[0].as_str()?.to_string(), ty(&e[1])?)))
                    .collect::<Option<Vec<_>>>()?;
                Some((
                    k.clone(),
                    PlanTypes {
                        name: x[0].as_str()?.to_string(),
                        types,
                    },
                ))
            })
            .collect::<Option<BTreeMap<_, _>>>()?,
    };
    // Absent or null: not measured (a cache saved before the term existed, or without it).
    let act = match v.get("act") {
        None | Some(Value::Null) => None,
        Some(a) => Some(
            a.as_array()?
                .iter()
                .map(|item| {
                    item.as_array()?
                        .iter()
                        .map(|mem| mem.as_array()?.iter().map(num).collect::<Option<Vec<_>>>())
                        .collect::<Option<Vec<_>>>()
                })
                .collect::<Option<Vec<_>>>()?,
        ),
    };
    Some(Measured {
        table,
        probes,
        direct,
        direct_report,
        alpha: opt(&v["alpha"])?,
        role_alpha,
        r2: opt(&v["r2"])?,
        r2_roles: opt(&v["r2_roles"])?,
        plans,
        predicted,
        plan_types,
        act,
    })
}

/// What a mix's measurements depend on besides the candidate types: the model's and the
/// calibration's contents (blake3), the KLD text, the settings, the target profile and the
/// executable (blake3).
pub(super) fn key_of(job: &crate::pipeline::job::Job) -> Result<Key> {
    let a = &job.flags;
    let hash = |p: &Path| crate::io::hash_file(p);
    let mut calib = match &job.calib {
        crate::pipeline::job::CalibInput::None => "none".to_string(),
        crate::pipeline::job::CalibInput::Hessians { path, .. } => {
            format!("hessians {}", hash(path)?)
        }
        crate::pipeline::job::CalibInput::Text {
            path,
            tokens,
            ctx,
            batch,
            sequential,
        } => format!(
            "text {} tokens {tokens} ctx {ctx} batch {batch} sequential {sequential}",
            hash(path)?
        ),
    };
    if let Some(p) = &a.imatrix {
        calib += &format!(" imatrix {}", hash(p)?);
    }
    let kld = match &job.kld_text {
        Some(p) => format!(
            "{} windows {} probes {}",
            hash(p)?,
            a.kld_windows,
            a.kld_probes
        ),
        None => "none".into(),
    };
    let l = &a.ldlq;
    Ok(Key(vec![
        ("model", hash(&a.input)?),
        ("calibration", calib),
        ("kld_text", kld),
        (
            "settings",
            format!(
                "profile {} mix-rows {} per 4096 elements exact {} exact-blocks {} ldlq band {} damp {} refit {} shrink {} act {} probe cap {} head cap {} tq {}",
                job.profile.name,
                a.mix_rows.max(1),
                a.mix_exact_rows.max(1).min(a.mix_rows.max(1)),
                a.mix_exact_blocks,
                l.band_label(),
                l.damp_label(),
                l.refit,
                l.shrink_label(),
                super::act::Mode::from_env().label(),
                super::probe::probe_elements(),
                super::head::head_elements(),
                env!("CARGO_PKG_VERSION")
            ),
        ),
        // Another build's encoders (and so its sensitivity and probes) may differ.
        ("build", build_id().to_string()),
    ]))
}

/// The running executable's blake3: kept bytes are only read back by the build that made them
/// (an encoder may change between builds of one version). Without it, this process's id: no
/// reuse across runs, but correct bytes.
pub(super) fn build_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| crate::io::hash_file(&p).ok())
            .unwrap_or_else(|| format!("process {}", std::process::id()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> Measured {
        Measured {
            table: vec![vec![vec![
                Estimate {
                    err: 0.1,
                    se: 1e-300,
                },
                Estimate {
                    err: f64::INFINITY,
                    se: 0.0,
                },
            ]]],
            probes: vec![Probe {
                tensor: "blk.0.attn_q.weight".into(),
                ty: TensorType::Q4K,
                err: 3.0,
                kld: 1.0 / 3.0,
            }],
            direct: vec![None, Some(vec![0.25, f64::MIN_POSITIVE])],
            direct_report: vec![("token_embd.weight".into(), TensorType::Q8_0, 0.001)],
            alpha: Some(std::f64::consts::PI),
            role_alpha: [("attn_q.weight".to_string(), 2.5)].into(),
            r2: None,
            r2_roles: Some(-0.5),
            plans: [("ab12".to_string(), 0.1f64 / 3.0)].into(),
            predicted: [("ab12".to_string(), 0.2f64 / 3.0)].into(),
            plan_types: [(
                "ab12".to_string(),
                PlanTypes {
                    name: "preset Q4_1".into(),
                    types: vec![
                        ("token_embd.weight".into(), TensorType::Q8_0),
                        ("blk.0.attn_q.weight".into(), TensorType::Q4_1),
                    ],
                },
            )]
            .into(),
            act: Some(vec![vec![vec![0.0, 1.0 / 7.0]]]),
        }
    }

    #[test]
    fn round_trips_exactly_and_misses_on_another_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.json");
        let key = Key(vec![("model", "abc".into()), ("types", "q4_K,q8_0".into())]);
        assert!(matches!(load(&p, &key).unwrap(), Loaded::Miss(_)));
        save(&p, &key, &measured()).unwrap();
        let Loaded::Hit(m) = load(&p, &key).unwrap() else {
            panic!("a miss")
        };
        let want = measured();
        assert_eq!(m.table, want.table);
        assert_eq!(m.direct, want.direct);
        assert_eq!(m.direct_report, want.direct_report);
        assert_eq!(
            (m.alpha, m.r2, m.r2_roles),
            (want.alpha, want.r2, want.r2_roles)
        );
        assert_eq!(m.role_alpha, want.role_alpha);
        assert_eq!(m.plans["ab12"].to_bits(), (0.1f64 / 3.0).to_bits());
        assert_eq!(m.predicted["ab12"].to_bits(), (0.2f64 / 3.0).to_bits());
        assert_eq!(m.plan_types, want.plan_types);
        assert_eq!(m.act, want.act);
        assert_eq!(m.probes[0].kld.to_bits(), (1.0f64 / 3.0).to_bits());
        let other = Key(vec![("model", "abc".into()), ("types", "q8_0".into())]);
        match load(&p, &other).unwrap() {
            Loaded::Miss(why) => assert!(why.contains("types") && !why.contains("model"), "{why}"),
            Loaded::Hit(_) => panic!("another key must miss"),
        }
        // Not a cache: a one-line error naming the file.
        std::fs::write(&p, b"{\"format\": \"tq-mix-cache-1\", \"key\": {\"model\": \"abc\", \"types\": \"q4_K,q8_0\"}, \"table\": 7}").unwrap();
        let e = load(&p, &key).err().expect("corrupt").to_string();
        assert!(e.contains("c.json") && e.contains("--mix-cache"), "{e}");
        std::fs::write(&p, b"\x00garbage").unwrap();
        assert!(load(&p, &key).is_err());
    }
}
