//! Target profiles: which GGUF type id means which [`TensorType`] in a given engine.
//!
//! Stock ggml types have the same id everywhere (from the registry). TurboQuant types have
//! different ids in different forks, so their ids are data here — one table per profile — and a
//! user can supply another with `--type-map FILE` (JSON: `{"name": "...", "types": {"tq4_1s": 46, ...}}`).
//!
//! A profile also says how its engine behaves where that changes what tq writes: the KV cache
//! ([`KvRules`]), whether it loads TQ weight types ([`Profile::tq_weights`]) and whether a layer's
//! attention projections must share a TQ type ([`Profile::unify_attention_tq`]). Code asks these
//! fields, never a profile's name.

use super::turbo::Turbo4Table;
use super::{TensorType, TYPES};
use crate::error::{Error, Result};
use std::path::Path;

/// How an engine lays turbo KV groups over a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurboGroups {
    /// Every head is zero-padded to a multiple of 128 and stored as 128-value groups (the fork:
    /// a 64-wide head is one group holding 64 zeros, 50 bytes per 64 real values for turbo3).
    Pad128,
    /// 64-wide heads as one 64-value group (first 64 signs, scale 1/8), other heads as Pad128.
    /// No engine builds this by default; it is what `tq codebook --head-dim 64` tables are for.
    Native64,
}

impl TurboGroups {
    pub fn parse(s: &str) -> Result<TurboGroups> {
        match s {
            "pad128" | "pad" => Ok(TurboGroups::Pad128),
            "64" | "native64" => Ok(TurboGroups::Native64),
            o => Err(Error::Usage(format!(
                "--turbo-groups {}: expected pad128 (the fork's layout) or 64",
                crate::error::one_line(o)
            ))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TurboGroups::Pad128 => "pad128",
            TurboGroups::Native64 => "64",
        }
    }
}

/// What an engine does with the KV cache by default (FORMATS.md §3): the part of a target
/// profile that `tq eval --ctk/--ctv`, `tq kv` and the presets simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvRules {
    /// The engine has the turbo2/3/4 cache types.
    pub turbo: bool,
    pub groups: TurboGroups,
    /// turbo tables and the turbo4 block (May: 68 bytes; June: 66).
    pub table: Turbo4Table,
    /// Quantized stock caches (q8_0, q4_0, …) are Hadamard-rotated by default.
    pub rotate_stock: bool,
    /// Turbo K == V with n_head / n_head_kv >= 6 promotes K to q8_0 by default.
    pub auto_asym: bool,
    /// `-ctv turbo2` on >= 8 layers turns on layer-adaptive mode 7 (q8_0 V on the first and last
    /// two layers) by default.
    pub turbo2_boundary: bool,
    /// Which of these facts were read off the engine and which are inferred.
    pub provenance: &'static str,
}

const KV_FORK_MAY: KvRules = KvRules {
    turbo: true,
    groups: TurboGroups::Pad128,
    table: Turbo4Table::May,
    rotate_stock: false,
    auto_asym: true,
    turbo2_boundary: true,
    provenance: "verified at fork commit 69d8e4be4 (src/llama-kv-cache.cpp and a SmolLM2 run): \
                 zero-padding to 128, May tables with 68-byte turbo4, attn_rot_k/v = 0, \
                 auto-asymmetric K and turbo2 boundary V on by default",
};

const KV_FORK_JUNE: KvRules = KvRules {
    table: Turbo4Table::LloydMax,
    provenance: "June-2026 table and 66-byte turbo4 from the fork's PR #197 (documented, not run \
                 here); padding, no rotation, auto-asymmetric and boundary V inferred unchanged \
                 from 69d8e4be4; the 3-bit table is kept (its reported change is unverified)",
    ..KV_FORK_MAY
};

const KV_UPSTREAM: KvRules = KvRules {
    turbo: false,
    groups: TurboGroups::Pad128,
    table: Turbo4Table::LloydMax,
    rotate_stock: true,
    auto_asym: false,
    turbo2_boundary: false,
    provenance: "upstream llama.cpp since April 2026: quantized caches rotated \
                 (LLAMA_ATTN_ROT_DISABLE=1 turns it off); no turbo types",
};

#[derive(Clone, Debug)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// Non-stock types and their ids in this engine. A stock id listed here is shadowed.
    pub extra: Vec<(TensorType, u32)>,
    /// `general.file_type` (llama_ftype) values of this engine's whole-model TurboQuant types.
    pub file_types: Vec<(TensorType, u32)>,
    /// The engine's KV-cache behaviour.
    pub kv: KvRules,
    /// The engine loads the TQ weight types (TQ3_1S, TQ4_1S), so a `--target-bpw` mix offers
    /// them by default. When false, no TQ weight type may have an id (checked on load).
    /// Type-map key `"tq_weights"`, default true.
    pub tq_weights: bool,
    /// A layer's attention projections (q, k, v, o) all take one type when any of them is a TQ
    /// weight type: the fork's TQ kernels (its Metal mul_mm path) rotate the activation the four
    /// share in place, so a mixed group would multiply a stock weight by a rotated input.
    /// The planner unifies such a group and a mix chooses its type once. Upstream has no such
    /// kernels (its own Q4_K_M mixes q8_0/q6_K attn_v with q4_K q/k/o), so it keeps the types
    /// asked for. Type-map key `"unify_attention_tq"`, default true.
    pub unify_attention_tq: bool,
}

struct BuiltIn {
    name: &'static str,
    description: &'static str,
    extra: &'static [(TensorType, u32)],
    file_types: &'static [(TensorType, u32)],
    kv: KvRules,
    tq_weights: bool,
    unify_attention_tq: bool,
}

use TensorType::*;

const FORK_IDS: &[(TensorType, u32)] = &[
    (Turbo2, 42),
    (Turbo3, 43),
    (Turbo4, 44),
    (TQ3_1S, 45),
    (TQ4_1S, 46),
    // tq2_r is tq's own: 120 is far above every id upstream or the fork has assigned (≤ 46).
    (TQ2R, 120),
    // tq2_t (issue 19) is tq's own too: the next id.
    (TQ2T, 121),
];

/// Built-in profiles. `fork` is the default: TheTom/llama-cpp-turboquant as of June 2026 (type
/// ids unchanged since 2026-04-15); `fork-69d8e4be4` is the commit the conformance vectors and
/// the KV measurements pin (May KV tables).
const BUILT_IN: &[BuiltIn] = &[
    BuiltIn {
        name: "fork",
        description: "TurboQuant llama.cpp fork (June 2026 and later): TQ3_1S=45, TQ4_1S=46; KV turbo2/3/4=42/43/44, June turbo4 table (66 bytes), heads padded to 128, no KV rotation; tq's tq2_r=120, tq2_t=121",
        extra: FORK_IDS,
        file_types: &[(TQ3_1S, 43), (TQ4_1S, 44)],
        kv: KV_FORK_JUNE,
        tq_weights: true,
        unify_attention_tq: true,
    },
    BuiltIn {
        name: "fork-69d8e4be4",
        description: "TurboQuant fork at commit 69d8e4be4 (2026-05-04): ids as `fork` (tq2_r=120 and tq2_t=121 are tq's own); May KV tables (68-byte turbo4), heads padded to 128, no KV rotation",
        extra: FORK_IDS,
        file_types: &[(TQ3_1S, 43), (TQ4_1S, 44)],
        kv: KV_FORK_MAY,
        tq_weights: true,
        unify_attention_tq: true,
    },
    BuiltIn {
        name: "fork-pre-2026-04-15",
        description: "TurboQuant fork before 2026-04-15: TQ3_1S=44, TQ4_1S=45",
        extra: &[(TQ3_1S, 44), (TQ4_1S, 45)],
        file_types: &[(TQ3_1S, 43), (TQ4_1S, 44)],
        kv: KV_FORK_MAY,
        tq_weights: true,
        unify_attention_tq: true,
    },
    BuiltIn {
        name: "upstream",
        description: "upstream llama.cpp / ggml: stock types only (no TurboQuant type loads); quantized KV caches rotated",
        extra: &[],
        file_types: &[],
        kv: KV_UPSTREAM,
        tq_weights: false,
        unify_attention_tq: false,
    },
];

impl Default for Profile {
    fn default() -> Self {
        Profile::built_in("fork").expect("default profile exists")
    }
}

impl Profile {
    pub fn built_in_names() -> Vec<&'static str> {
        BUILT_IN.iter().map(|b| b.name).collect()
    }

    pub fn built_in(name: &str) -> Option<Profile> {
        BUILT_IN.iter().find(|b| b.name == name).map(|b| Profile {
            name: b.name.to_string(),
            description: b.description.to_string(),
            extra: b.extra.to_vec(),
            file_types: b.file_types.to_vec(),
            kv: b.kv,
            tq_weights: b.tq_weights,
            unify_attention_tq: b.unify_attention_tq,
        })
    }

    /// Resolve `--target NAME` / `--type-map FILE` (the CLI refuses both at once).
    pub fn select(target: Option<&str>, type_map: Option<&Path>) -> Result<Profile> {
        if let Some(path) = type_map {
            return Profile::from_file(path);
        }
        let name = target.unwrap_or("fork");
        Profile::built_in(name).ok_or_else(|| {
            Error::Usage(format!(
                "unknown target profile '{name}'; built-in profiles: {} (or give --type-map FILE)",
                Profile::built_in_names().join(", ")
            ))
        })
    }

    /// Load a type map: `{"name": "my-fork", "types": {"tq3_1s": 46, "tq4_1s": 47}}`, with an
    /// optional `"kv": "PROFILE"` naming the built-in profile whose KV behaviour the engine has
    /// (default `fork`), and optional booleans `"tq_weights"` and `"unify_attention_tq"` (the
    /// [`Profile`] fields of those names; both default to true, the fork's behaviour, which is
    /// what a type map written before they existed meant).
    pub fn from_file(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::bad_input(path, format!("type map is not valid JSON: {e}")))?;
        let bad = |m: String| Error::bad_input(path, m);
        let types = v.get("types").and_then(|t| t.as_object()).ok_or_else(|| {
            bad("type map needs an object \"types\": {\"tq4_1s\": 46, ...}".into())
        })?;
        let mut extra = Vec::new();
        for (k, id) in types {
            let ty = TensorType::from_name(k)
                .ok_or_else(|| bad(format!("unknown type name '{k}' in type map")))?;
            let id = id.as_u64().filter(|&i| i < 1 << 16).ok_or_else(|| {
                bad(format!(
                    "type id for '{k}' must be a small non-negative integer"
                ))
            })?;
            extra.push((ty, id as u32));
        }
        let mut file_types = Vec::new();
        if let Some(ft) = v.get("file_types").and_then(|t| t.as_object()) {
            for (k, id) in ft {
                let ty = TensorType::from_name(k)
                    .ok_or_else(|| bad(format!("unknown type name '{k}' in file_types")))?;
                let id = id
                    .as_u64()
                    .filter(|&i| i < 1 << 16)
                    .ok_or_else(|| bad(format!("file type for '{k}' must be a small integer")))?;
                file_types.push((ty, id as u32));
            }
        }
        let kv = match v.get("kv") {
            None => KV_FORK_JUNE,
            Some(k) => {
                let name = k.as_str().unwrap_or("");
                Profile::built_in(name).map(|p| p.kv).ok_or_else(|| {
                    bad(format!(
                        "\"kv\" must name a built-in profile ({}), got {}",
                        Profile::built_in_names().join(", "),
                        crate::error::one_line(&k.to_string())
                    ))
                })?
            }
        };
        let flag = |key: &str| match v.get(key) {
            None => Ok(true),
            Some(b) => b.as_bool().ok_or_else(|| {
                bad(format!(
                    "\"{key}\" must be true or false, got {}",
                    crate::error::one_line(&b.to_string())
                ))
            }),
        };
        let p = Profile {
            kv,
            tq_weights: flag("tq_weights")?,
            unify_attention_tq: flag("unify_attention_tq")?,
            name: v
                .get("name")
                .and_then(|n| n.as_str())
                .unwrap_or("custom")
                .to_string(),
            description: format!("from {}", path.display()),
            extra,
            file_types,
        };
        p.check().map_err(bad)?;
        Ok(p)
    }

    /// Two types must never share an id within a profile, and an engine without TQ weight
    /// types gives none of them an id.
    fn check(&self) -> std::result::Result<(), String> {
        let mut seen = std::collections::HashMap::new();
        for (ty, id) in self.ids() {
            if let Some(prev) = seen.insert(id, ty) {
                return Err(format!("type id {id} is assigned to both {prev} and {ty}"));
            }
            if ty.is_tq_weight() && !self.tq_weights {
                return Err(format!(
                    "\"tq_weights\": false, but {ty} has type id {id}; drop one of them"
                ));
            }
        }
        Ok(())
    }

    /// All (type, id) pairs of this profile: stock ids not shadowed by an extra id, then extras.
    pub fn ids(&self) -> Vec<(TensorType, u32)> {
        let mut v: Vec<(TensorType, u32)> = TYPES
            .iter()
            .filter_map(|t| t.ty.stock_id().map(|id| (t.ty, id)))
            .filter(|(ty, id)| !self.extra.iter().any(|(ety, eid)| eid == id || ety == ty))
            .collect();
        v.extend(self.extra.iter().copied());
        v
    }

    /// `general.file_type` for a model whose base type is `ty`, as llama-quantize writes it
    /// (k-quants map to their `_M` mixes).
    pub fn file_type_of(&self, ty: TensorType) -> Option<u32> {
        if let Some((_, f)) = self.file_types.iter().find(|(t, _)| *t == ty) {
            return Some(*f);
        }
        Some(match ty {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q8_0 => 7,
            Q5_0 => 8,
            Q5_1 => 9,
            Q2K => 10,
            Q3K => 12,
            Q4K => 15,
            Q5K => 17,
            Q6K => 18,
            IQ4NL => 25,
            IQ4XS => 30,
            BF16 => 32,
            TQ1_0 => 36,
            TQ2_0 => 37,
            _ => return None,
        })
    }

    pub fn type_of(&self, id: u32) -> Option<TensorType> {
        if let Some((ty, _)) = self.extra.iter().find(|(_, eid)| *eid == id) {
            return Some(*ty);
        }
        TYPES
            .iter()
            .find(|t| t.ty.stock_id() == Some(id))
            .map(|t| t.ty)
    }

    pub fn id_of(&self, ty: TensorType) -> Option<u32> {
        if let Some((_, id)) = self.extra.iter().find(|(t, _)| *t == ty) {
            return Some(*id);
        }
        let id = ty.stock_id()?;
        // A stock id taken over by an extra type is not available in this profile.
        if self.extra.iter().any(|(_, eid)| *eid == id) {
            return None;
        }
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_ids() {
        let p = Profile::default();
        assert_eq!(p.id_of(TQ4_1S), Some(46));
        assert_eq!(p.id_of(TQ3_1S), Some(45));
        assert_eq!(p.type_of(46), Some(TQ4_1S));
        assert_eq!(p.type_of(8), Some(Q8_0));
        // In the fork, 40/41 are still the stock NVFP4 / Q1_0; 42.. are turbo.
        assert_eq!(p.type_of(42), Some(Turbo2));
        p.check().unwrap();
    }

    /// tq's own ids: every earlier one kept (files written with them must still load), tq2_t
    /// its own, in both fork profiles.
    #[test]
    fn own_type_ids_are_kept_and_distinct() {
        for name in ["fork", "fork-69d8e4be4"] {
            let p = Profile::built_in(name).unwrap();
            assert_eq!(p.id_of(TQ2R), Some(120), "{name}");
            assert_eq!(p.type_of(120), Some(TQ2R), "{name}");
            assert_eq!(p.id_of(TQ2T), Some(121), "{name}");
            assert_eq!(p.type_of(121), Some(TQ2T), "{name}");
            p.check().unwrap();
        }
        assert_eq!(Profile::built_in("upstream").unwrap().id_of(TQ2T), None);
    }

    /// KV behaviour per engine (FORMATS.md §3): the May fork pads, keeps the May tables and does
    /// not rotate; June changes the tables only; upstream has no turbo types and rotates.
    #[test]
    fn kv_rules_per_profile() {
        let may = Profile::built_in("fork-69d8e4be4").unwrap();
        assert_eq!(may.ids(), Profile::default().ids());
        assert_eq!(may.kv.table, Turbo4Table::May);
        assert_eq!(may.kv.groups, TurboGroups::Pad128);
        assert!(may.kv.turbo && !may.kv.rotate_stock && may.kv.auto_asym && may.kv.turbo2_boundary);
        let june = Profile::default().kv;
        assert_eq!(june.table, Turbo4Table::LloydMax);
        assert_eq!(
            KvRules {
                table: Turbo4Table::May,
                provenance: "",
                ..june
            },
            KvRules {
                provenance: "",
                ..may.kv
            }
        );
        let up = Profile::built_in("upstream").unwrap().kv;
        assert!(!up.turbo && up.rotate_stock && !up.auto_asym);
    }

    #[test]
    fn old_fork_and_upstream() {
        let p = Profile::built_in("fork-pre-2026-04-15").unwrap();
        assert_eq!(p.id_of(TQ4_1S), Some(45));
        assert_eq!(p.type_of(44), Some(TQ3_1S));
        let u = Profile::built_in("upstream").unwrap();
        assert_eq!(u.id_of(TQ4_1S), None);
        assert_eq!(u.type_of(46), None);
        for b in Profile::built_in_names() {
            Profile::built_in(b).unwrap().check().unwrap();
        }
    }

    /// Engine behaviour per built-in profile: the forks load TQ weights and unify a layer's
    /// attention around them; upstream does neither.
    #[test]
    fn engine_behaviour_per_profile() {
        for name in ["fork", "fork-69d8e4be4", "fork-pre-2026-04-15"] {
            let p = Profile::built_in(name).unwrap();
            assert!(p.tq_weights && p.unify_attention_tq, "{name}");
        }
        let up = Profile::built_in("upstream").unwrap();
        assert!(!up.tq_weights && !up.unify_attention_tq);
        // The flag and the id table agree: an engine with TQ weights gives them ids.
        for b in Profile::built_in_names() {
            let p = Profile::built_in(b).unwrap();
            assert_eq!(
                p.tq_weights,
                p.ids().iter().any(|(t, _)| t.is_tq_weight()),
                "{b}"
            );
        }
    }

    /// `"tq_weights"` and `"unify_attention_tq"` in a type map: true (the fork's behaviour)
    /// when absent, as in every type map written before they existed.
    #[test]
    fn type_map_engine_flags() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.json");
        std::fs::write(&f, r#"{"types":{"tq4_1s":68}}"#).unwrap();
        let p = Profile::from_file(&f).unwrap();
        assert!(p.tq_weights && p.unify_attention_tq);
        std::fs::write(
            &f,
            r#"{"types":{"tq4_1s":68},"unify_attention_tq":false,"tq_weights":true}"#,
        )
        .unwrap();
        let p = Profile::from_file(&f).unwrap();
        assert!(p.tq_weights && !p.unify_attention_tq);
        std::fs::write(&f, r#"{"types":{},"tq_weights":false,"kv":"upstream"}"#).unwrap();
        let p = Profile::from_file(&f).unwrap();
        assert!(!p.tq_weights && p.unify_attention_tq && !p.kv.turbo);
        std::fs::write(&f, r#"{"types":{"tq4_1s":68},"tq_weights":false}"#).unwrap();
        let e = Profile::from_file(&f).unwrap_err().to_string();
        assert!(
            e.contains("\"tq_weights\": false, but tq4_1s has type id 68"),
            "{e}"
        );
        std::fs::write(&f, r#"{"types":{},"unify_attention_tq":"yes"}"#).unwrap();
        let e = Profile::from_file(&f).unwrap_err().to_string();
        assert!(
            e.contains("\"unify_attention_tq\" must be true or false"),
            "{e}"
        );
    }

    #[test]
    fn type_map_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.json");
        std::fs::write(&f, r#"{"name":"other","types":{"tq3_1s":67,"TQ4_1S":68}}"#).unwrap();
        let p = Profile::from_file(&f).unwrap();
        assert_eq!(p.id_of(TQ4_1S), Some(68));
        std::fs::write(&f, r#"{"types":{"tq3_1s":8}}"#).unwrap();
        assert_eq!(Profile::from_file(&f).unwrap().type_of(8), Some(TQ3_1S));
        std::fs::write(&f, r#"{"types":{"tq3_1s":50,"tq4_1s":50}}"#).unwrap();
        assert!(Profile::from_file(&f)
            .unwrap_err()
            .to_string()
            .contains("assigned to both"));
        // KV behaviour: a built-in profile's, named by "kv"; the fork's by default.
        std::fs::write(&f, r#"{"types":{"tq4_1s":68},"kv":"upstream"}"#).unwrap();
        let p = Profile::from_file(&f).unwrap();
        assert!(!p.kv.turbo && p.kv.rotate_stock);
        std::fs::write(&f, r#"{"types":{"tq4_1s":68}}"#).unwrap();
        assert_eq!(Profile::from_file(&f).unwrap().kv, Profile::default().kv);
        std::fs::write(&f, r#"{"types":{"tq4_1s":68},"kv":"fork-2027"}"#).unwrap();
        assert!(Profile::from_file(&f)
            .unwrap_err()
            .to_string()
            .contains("\"kv\" must name a built-in profile"));
        std::fs::write(&f, r#"{"types":{"zz":50}}"#).unwrap();
        assert!(Profile::from_file(&f)
            .unwrap_err()
            .to_string()
            .contains("unknown type name 'zz'"));
    }
}
