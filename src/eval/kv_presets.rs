//! KV-cache presets: the candidate `-ctk/-ctv` settings an engine user would try, and a
//! recommendation from a model's shape alone (head dim, GQA ratio, layer count) following the
//! fork's published behaviour (FORMATS.md §3). `tq kv --measure` ranks them on real text instead.

use crate::model::config::Config;
use crate::model::kv::{self, auto_asym_applies, bits_per_value, KvLayer, KvSpec, LayerRule};
use crate::types::TensorType;

/// One candidate setting.
#[derive(Clone, Debug)]
pub struct Preset {
    pub name: String,
    pub spec: KvSpec,
    /// Why it is on the list / what it trades.
    pub note: String,
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

    /// Environment the engine needs for this preset.
    pub fn env(&self) -> Vec<String> {
        let mut e = Vec::new();
        let stock_quant = |t: TensorType| t.is_quantized() && !t.is_turbo();
        if !self.spec.rotate && (stock_quant(self.spec.k) || stock_quant(self.spec.v)) {
            e.push("LLAMA_ATTN_ROT_DISABLE=1".to_string());
        }
        e
    }

    /// `tq eval` flags that simulate it.
    pub fn tq_flags(&self) -> String {
        let mut s = format!("--ctk {} --ctv {}", self.spec.k.name(), self.spec.v.name());
        for r in &self.spec.rules {
            s += &format!(" --kv-layers {}", rule_text(r));
        }
        if !self.spec.rotate {
            s += " --no-kv-rotation";
        }
        if self.spec.turbo4 != kv::Turbo4Table::LloydMax {
            s += &format!(" --turbo-codebook {}", self.spec.turbo4.name());
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

fn preset(name: &str, k: TensorType, v: TensorType, note: &str) -> Preset {
    Preset {
        name: name.to_string(),
        spec: KvSpec {
            k,
            v,
            ..KvSpec::default()
        },
        note: note.to_string(),
    }
}

/// The candidates for a model: stock types (rotated as upstream does, and q4_0 unrotated as the
/// pre-April-2026 baseline), the fork's turbo types symmetric and with a q8_0 K, and turbo2 with
/// q8_0 V on the boundary layers. Candidates whose types do not fit the heads are left out.
pub fn candidates(cfg: &Config) -> Vec<Preset> {
    use TensorType::*;
    let mut c = vec![
        preset("f16", F16, F16, "llama.cpp's default; the reference"),
        preset(
            "q8_0",
            Q8_0,
            Q8_0,
            "stock, rotated (upstream default since April 2026)",
        ),
        preset("q4_0", Q4_0, Q4_0, "stock, rotated"),
        preset(
            "q8_0/turbo4",
            Q8_0,
            Turbo4,
            "K kept at 8 bits (K error is amplified by softmax)",
        ),
        preset(
            "turbo4",
            Turbo4,
            Turbo4,
            "fork: ~+0.2% PPL vs q8_0 published",
        ),
        preset("q8_0/turbo3", Q8_0, Turbo3, "K kept at 8 bits"),
        preset(
            "turbo3",
            Turbo3,
            Turbo3,
            "fork: ~+1.1% PPL vs q8_0 published",
        ),
        preset(
            "turbo4/turbo3",
            Turbo4,
            Turbo3,
            "asymmetric, fork types only",
        ),
        preset(
            "turbo3/turbo2",
            Turbo3,
            Turbo2,
            "asymmetric, fork types only",
        ),
        preset(
            "turbo2",
            Turbo2,
            Turbo2,
            "fork: ~+6.5% PPL vs q8_0 published",
        ),
    ];
    let mut q40 = preset(
        "q4_0-norot",
        Q4_0,
        Q4_0,
        "stock without upstream's rotation",
    );
    q40.spec.rotate = false;
    c.insert(3, q40);
    if let Some(ranges) = boundary_layers(cfg.n_layer) {
        let mut p = preset(
            "turbo2+boundary",
            Turbo2,
            Turbo2,
            "q8_0 V on the first/last 2 layers (the fork's TURBO_LAYER_ADAPTIVE idea)",
        );
        p.spec.rules.push(LayerRule {
            ranges,
            k: None,
            v: Some(Q8_0),
        });
        c.push(p);
    }
    if kv::turbo_group(cfg.head_dim) != 128 {
        // The fork's tables are fitted to 128-value groups; on other groups an engine built with
        // `tq codebook --head-dim G` tables does better at the same bits.
        for (name, t) in [("turbo4-hd", Turbo4), ("turbo3-hd", Turbo3)] {
            let mut p = preset(
                name,
                t,
                t,
                "Lloyd-Max tables for this group size (needs `tq codebook` tables in the engine)",
            );
            p.spec.turbo4 = kv::Turbo4Table::HeadDim;
            c.push(p);
        }
    }
    c.retain(|p| p.fits(cfg));
    c
}

/// A recommendation from the model's shape alone, with the reasons.
pub struct Recommendation {
    pub preset: Preset,
    pub reasons: Vec<String>,
}

/// Recommend a preset without measuring: turbo4 for K and V; K at q8_0 when the GQA ratio is ≥ 6
/// (the fork's auto-asymmetric rule: with many query heads per KV head, K error is shared by
/// all of them); stock q8_0/q4_0 when turbo's group padding makes it no smaller than q4_0.
pub fn recommend(cfg: &Config) -> Recommendation {
    use TensorType::*;
    let mut reasons = Vec::new();
    let gqa = cfg.n_head / cfg.n_head_kv.max(1);
    let hd = cfg.head_dim;
    let t4 = bits_per_value(Turbo4, hd, kv::Turbo4Table::LloydMax);
    reasons.push(format!(
        "head_dim {hd}: turbo groups of {} values{}; turbo4 costs {t4:.3} bits/value",
        kv::turbo_group(hd),
        if hd % 128 != 0 && hd != 64 {
            " (zero-padded)"
        } else {
            ""
        }
    ));
    let q4 = bits_per_value(Q4_0, hd, kv::Turbo4Table::LloydMax);
    let mut p = if t4 >= q4 && hd % 32 == 0 {
        reasons.push(format!(
            "padding makes turbo4 ({t4:.3} bits) no smaller than q4_0 ({q4:.3}): stock rotated q8_0 K / q4_0 V"
        ));
        preset("q8_0/q4_0", Q8_0, Q4_0, "stock, rotated")
    } else {
        preset(
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
        p = preset("q8_0/turbo4", Q8_0, Turbo4, "K kept at 8 bits (GQA >= 6)");
    } else {
        reasons.push(format!(
            "GQA {}:{} = {gqa} < 6: K may be turbo",
            cfg.n_head, cfg.n_head_kv
        ));
    }
    reasons.push(format!(
        "{} layers{}",
        cfg.n_layer,
        if cfg.n_layer >= 8 {
            ": for turbo2 V, keep V at q8_0 on layers 0-1 and the last 2 (preset turbo2+boundary)"
        } else {
            ""
        }
    ));
    Recommendation { preset: p, reasons }
}
