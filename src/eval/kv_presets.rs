//! KV-cache presets: the candidate `-ctk/-ctv` settings an engine user would try, and a
//! recommendation from a model's shape alone (head dim, GQA ratio, layer count) following the
//! fork's published behaviour (FORMATS.md §3). `tq kv --measure` ranks them on real text instead.

use crate::model::config::Config;
use crate::model::kv::{
    self, auto_asym_applies, bits_per_value, KvLayer, KvRules, KvSpec, LayerRule, Profile,
    TurboGroups,
};
use crate::types::TensorType;

/// One candidate setting.
#[derive(Clone, Debug)]
pub struct Preset {
    pub name: String,
    pub spec: KvSpec,
    /// Why it is on the list / what it trades.
    pub note: String,
    /// The target engine's defaults: what needs an environment variable or a flag to change.
    pub defaults: KvRules,
}

impl Preset {
    /// The llama.cpp command-line flags (per-layer rules have no llama.cpp flag; see `env`).
    pub fn llama_flags(&self) -> String {
        let mut s = format!("-ctk {} -ctv {}", self.spec.k.name(), self.spec.v.name());
        if self.spec.v != TensorType::F16 && self.spec.v != TensorType::F32 {
            // llama.cpp needs flash attention for a quantized V cache.
            s += " -fa on";
        }
        s
    }

    /// Environment the engine needs for this preset (where it departs from the engine's
    /// defaults: the fork's rotation overrides, upstream's rotation switch, the fork's turbo
    /// rules).
    pub fn env(&self) -> Vec<String> {
        let (s, d) = (&self.spec, &self.defaults);
        let mut e = Vec::new();
        let stock_quant = |t: TensorType| t.is_quantized() && !t.is_turbo();
        if s.rotate != d.rotate_stock && (stock_quant(s.k) || stock_quant(s.v)) {
            if s.rotate {
                e.push("LLAMA_ATTN_ROT_K_OVERRIDE=1 LLAMA_ATTN_ROT_V_OVERRIDE=1".to_string());
            } else {
                e.push("LLAMA_ATTN_ROT_DISABLE=1".to_string());
            }
        }
        if d.auto_asym && !s.auto_asym && s.k.is_turbo() {
            e.push("TURBO_AUTO_ASYMMETRIC=0".to_string());
        }
        if let Some(m) = s.layer_adaptive {
            e.push(format!("TURBO_LAYER_ADAPTIVE={m}"));
        }
        e
    }

    /// `tq eval` flags that simulate it.
    pub fn tq_flags(&self) -> String {
        let (sp, d) = (&self.spec, &self.defaults);
        let mut s = format!(
            "--target {} --ctk {} --ctv {}",
            sp.profile,
            sp.k.name(),
            sp.v.name()
        );
        for r in &sp.rules {
            s += &format!(" --kv-layers {}", rule_text(r));
        }
        if sp.rotate != d.rotate_stock {
            s += if sp.rotate {
                " --kv-rotation on"
            } else {
                " --kv-rotation off"
            };
        }
        if sp.auto_asym != d.auto_asym {
            s += if sp.auto_asym {
                " --kv-auto-asym on"
            } else {
                " --kv-auto-asym off"
            };
        }
        if let Some(m) = sp.layer_adaptive {
            s += &format!(" --turbo-layer-adaptive {m}");
        }
        if sp.groups != d.groups {
            s += &format!(" --turbo-groups {}", sp.groups.name());
        }
        if sp.turbo4 != d.table {
            s += &format!(" --turbo-codebook {}", sp.turbo4.name());
        }
        s
    }

    /// Mean bits per stored value (K and V averaged over layers) on this model.
    pub fn bits(&self, cfg: &Config) -> f64 {
        match self
            .spec
            .resolve(cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim)
        {
            Ok(kv) => {
                let (k, v) = kv.bits(cfg.n_layer, cfg.head_dim);
                (k + v) / 2.0
            }
            Err(_) => f64::NAN,
        }
    }

    /// Whether the types fit this model's heads.
    pub fn fits(&self, cfg: &Config) -> bool {
        self.spec
            .resolve(cfg.n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim)
            .is_ok()
    }
}

pub fn rule_text(r: &LayerRule) -> String {
    let ranges: Vec<String> = r
        .ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    let side = |t: Option<TensorType>| t.map_or("-".to_string(), |t| t.name().to_string());
    let types = if r.k == r.v {
        side(r.k)
    } else {
        format!("{}/{}", side(r.k), side(r.v))
    };
    format!("{}={types}", ranges.join(","))
}

/// The first two and last two layers (the fork's boundary layers), when there are ≥ 8.
pub fn boundary_layers(n_layer: usize) -> Option<Vec<(usize, usize)>> {
    (n_layer >= 8).then(|| vec![(0, 1), (n_layer - 2, n_layer - 1)])
}

fn preset(profile: &Profile, name: &str, k: TensorType, v: TensorType, note: &str) -> Preset {
    Preset {
        name: name.to_string(),
        spec: KvSpec {
            k,
            v,
            ..KvSpec::for_profile(profile)
        },
        note: note.to_string(),
        defaults: profile.kv,
    }
}

/// The candidates for a model on a target engine: stock types (with the engine's rotation
/// default, and q4_0 with the other one), the fork's turbo types symmetric and with a q8_0 K
/// where the engine has them, turbo2 with and without the fork's boundary layers, and — for
/// 64-wide heads — the 64-value group layout with its own tables (an engine built with `tq
/// codebook` tables). Candidates whose types do not fit the heads are left out.
pub fn candidates(cfg: &Config, profile: &Profile) -> Vec<Preset> {
    use TensorType::*;
    let r = profile.kv;
    let rot = if r.rotate_stock {
        "stock, rotated (the engine's default)"
    } else {
        "stock, not rotated (the engine's default)"
    };
    let p = |name: &str, k, v, note: &str| preset(profile, name, k, v, note);
    let mut c = vec![
        p("f16", F16, F16, "llama.cpp's default; the reference"),
        p("q8_0", Q8_0, Q8_0, rot),
        p("q4_0", Q4_0, Q4_0, rot),
    ];
    let (alt_name, alt_note) = if r.rotate_stock {
        ("q4_0-norot", "stock without upstream's rotation")
    } else {
        (
            "q4_0-rot",
            "stock with upstream's rotation (the fork's override variables)",
        )
    };
    let mut alt = p(alt_name, Q4_0, Q4_0, alt_note);
    alt.spec.rotate = !r.rotate_stock;
    c.push(alt);
    if r.turbo {
        c.extend([
            p(
                "q8_0/turbo4",
                Q8_0,
                Turbo4,
                "K kept at 8 bits (K error is amplified by softmax)",
            ),
            p(
                "turbo4",
                Turbo4,
                Turbo4,
                "fork: ~+0.2% PPL vs q8_0 published",
            ),
            p("q8_0/turbo3", Q8_0, Turbo3, "K kept at 8 bits"),
            p(
                "turbo3",
                Turbo3,
                Turbo3,
                "fork: ~+1.1% PPL vs q8_0 published",
            ),
            p(
                "turbo4/turbo3",
                Turbo4,
                Turbo3,
                "asymmetric, fork types only",
            ),
            p(
                "turbo3/turbo2",
                Turbo3,
                Turbo2,
                "asymmetric, fork types only",
            ),
        ]);
        if r.turbo2_boundary && kv_presets_boundary(cfg.n_layer) {
            c.push(p(
                "turbo2",
                Turbo2,
                Turbo2,
                "fork: q8_0 V on the first/last 2 layers by itself (TURBO_LAYER_ADAPTIVE mode 7)",
            ));
            let mut u = p(
                "turbo2-uniform",
                Turbo2,
                Turbo2,
                "turbo2 on every layer: ~+6.5% PPL vs q8_0 published",
            );
            u.spec.layer_adaptive = Some(0);
            c.push(u);
        } else {
            c.push(p(
                "turbo2",
                Turbo2,
                Turbo2,
                "fork: ~+6.5% PPL vs q8_0 published",
            ));
            if let Some(ranges) = boundary_layers(cfg.n_layer) {
                let mut b = p(
                    "turbo2+boundary",
                    Turbo2,
                    Turbo2,
                    "q8_0 V on the first/last 2 layers (the fork's TURBO_LAYER_ADAPTIVE idea)",
                );
                b.spec.rules.push(LayerRule {
                    ranges,
                    k: None,
                    v: Some(Q8_0),
                });
                c.push(b);
            }
        }
        if kv::turbo_group(cfg.head_dim, TurboGroups::Native64) != 128 {
            // The fork pads a 64-wide head to one 128-group; 64-value groups with their own
            // Lloyd-Max tables cost half the bits, but only an engine built with `tq codebook
            // --head-dim 64` tables and that layout stores them.
            for (name, t) in [("turbo4-g64", Turbo4), ("turbo3-g64", Turbo3)] {
                let mut x = p(
                    name,
                    t,
                    t,
                    "64-value groups, Lloyd-Max tables for d = 64 (needs an engine built with `tq codebook` tables and that layout)",
                );
                x.spec.turbo4 = kv::Turbo4Table::HeadDim;
                x.spec.groups = TurboGroups::Native64;
                c.push(x);
            }
        }
    }
    c.retain(|p| p.fits(cfg));
    c
}

fn kv_presets_boundary(n_layer: usize) -> bool {
    boundary_layers(n_layer).is_some()
}

/// A recommendation from the model's shape alone, with the reasons.
pub struct Recommendation {
    pub preset: Preset,
    pub reasons: Vec<String>,
}

/// Recommend a preset without measuring, for a target engine: turbo4 for K and V; K at q8_0
/// when the GQA ratio is ≥ 6 (the fork's auto-asymmetric rule: with many query heads per KV
/// head, K error is shared by all of them); stock q8_0/q4_0 when the engine has no turbo types
/// or turbo's group padding makes turbo4 no smaller than q4_0 (64-wide heads on the fork).
pub fn recommend(cfg: &Config, profile: &Profile) -> Recommendation {
    use TensorType::*;
    let r = profile.kv;
    let mut reasons = Vec::new();
    let gqa = cfg.n_head / cfg.n_head_kv.max(1);
    let hd = cfg.head_dim;
    let stock = |note: &str| preset(profile, "q8_0/q4_0", Q8_0, Q4_0, note);
    let rot = if r.rotate_stock {
        "stock, rotated"
    } else {
        "stock, not rotated (the engine's default)"
    };
    if !r.turbo {
        reasons.push(format!(
            "target '{}' has no turbo cache types: stock q8_0 K / q4_0 V",
            profile.name
        ));
        return Recommendation {
            preset: stock(rot),
            reasons,
        };
    }
    let g = kv::turbo_group(hd, r.groups);
    let t4 = bits_per_value(Turbo4, hd, r.table, r.groups);
    reasons.push(format!(
        "head_dim {hd}: turbo groups of {g} values{}; turbo4 costs {t4:.3} bits per real value",
        if !hd.is_multiple_of(g) {
            format!(" (zero-padded to {})", hd.div_ceil(g) * g)
        } else {
            String::new()
        }
    ));
    let q4 = bits_per_value(Q4_0, hd, r.table, r.groups);
    let mut p = if t4 >= q4 && hd.is_multiple_of(32) {
        reasons.push(format!(
            "padding makes turbo4 ({t4:.3} bits) no smaller than q4_0 ({q4:.3}): q8_0 K / q4_0 V"
        ));
        stock(rot)
    } else {
        preset(
            profile,
            "turbo4",
            Turbo4,
            Turbo4,
            "fork: ~+0.2% PPL vs q8_0 published",
        )
    };
    if p.spec.k.is_turbo()
        && auto_asym_applies(
            KvLayer {
                k: p.spec.k,
                v: p.spec.v,
            },
            cfg.n_head,
            cfg.n_head_kv,
        )
    {
        reasons.push(format!(
            "GQA {}:{} = {gqa} >= 6: K at q8_0 (the fork's auto-asymmetric rule; symmetric turbo3 on Qwen2.5-7B gave PPL 4093)",
            cfg.n_head, cfg.n_head_kv
        ));
        p = preset(
            profile,
            "q8_0/turbo4",
            Q8_0,
            Turbo4,
            "K kept at 8 bits (GQA >= 6)",
        );
    } else if p.spec.k.is_turbo() {
        reasons.push(format!(
            "GQA {}:{} = {gqa} < 6: K may be turbo",
            cfg.n_head, cfg.n_head_kv
        ));
    }
    reasons.push(format!(
        "{} layers{}",
        cfg.n_layer,
        if cfg.n_layer >= 8 {
            ": for turbo2 V the fork keeps V at q8_0 on layers 0-1 and the last 2 by itself"
        } else {
            ""
        }
    ));
    Recommendation { preset: p, reasons }
}
