#!/usr/bin/env python3
"""Independent oracle for the rope scaling metadata tq writes from config.json (tests/hf.rs
`rope_scaling_keys_match_convert_hf_to_gguf`), from gguf-py and numpy only.

For each case (llama3, yarn with the old "type" key, linear) writes to OUT/hf/rope/expect.json:
the config.json entries, the model shape, and what convert_hf_to_gguf writes for them: the
{arch}.rope.* keys, named and typed by gguf-py's GGUFWriter calls in the order
TextModel.set_gguf_parameters makes them (rope_parameters / rope_scaling with "type" mirrored to
"rope_type" and rope_theta mirrored in), plus llama's rope.dimension_count; for llama3, the
rope_freqs.weight values of LlamaModel.generate_extra_tensors computed with numpy in float32 (as
torch does there). Scalar float32 arithmetic; torch's vectorized pow may differ in the last bit,
which the test allows.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402

CASES = {
    # Llama 3.1 style rope scaling, head_dim 64 (32 factors: all three regimes).
    "llama3": {"n_embd": 128, "n_head": 2, "n_kv": 1, "config": {
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}},
    # Qwen2.5 / DeepSeek style yarn, given with the older "type" key.
    "yarn": {"n_embd": 64, "n_head": 4, "n_kv": 2, "config": {
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                         "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 0.5, "extrapolation_factor": 1.0}}},
    "linear": {"n_embd": 64, "n_head": 4, "n_kv": 4, "config": {
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}}},
}


def rope_params(cfg):
    """TextModel.__init__'s rope_parameters (the part these configs reach)."""
    rp = dict(cfg.get("rope_parameters", cfg.get("rope_scaling")) or {})
    if "rope_theta" not in rp and cfg.get("rope_theta") is not None:
        rp["rope_theta"] = cfg["rope_theta"]
    if "rope_type" not in rp and rp.get("type") is not None:
        rp["rope_type"] = rp["type"]
    return rp


def rope_keys(cfg, head_dim):
    """The rope keys of TextModel.set_gguf_parameters + LlamaModel.set_gguf_parameters."""
    w = gguf.GGUFWriter(path=None, arch="llama")
    rp = rope_params(cfg)
    rope_type = rp.get("rope_type")
    factor = rp.get("factor")
    if rope_type == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif rope_type == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        if (v := rp.get("extrapolation_factor")) is not None:
            w.add_rope_scaling_yarn_ext_factor(v)
        if (v := rp.get("attention_factor", rp.get("attn_factor"))) is not None:
            w.add_rope_scaling_yarn_attn_factor(v)
        if (v := rp.get("beta_fast")) is not None:
            w.add_rope_scaling_yarn_beta_fast(v)
        if (v := rp.get("beta_slow")) is not None:
            w.add_rope_scaling_yarn_beta_slow(v)
    if (theta := rp.get("rope_theta")) is not None:
        w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    out = {}
    for k, v in w.kv_data[0].items():
        val = v.value
        if isinstance(val, gguf.RopeScalingType):
            val = val.value
        out[k] = {"type": v.type.name, "value": val}
    return out


def llama3_factors(rp, dim):
    """LlamaModel.generate_extra_tensors, float32 as torch computes it."""
    base = rp.get("rope_theta", 10000.0)
    factor = rp.get("factor", 8.0)
    low_freq_factor = rp.get("low_freq_factor", 1.0)
    high_freq_factor = rp.get("high_freq_factor", 4.0)
    old_context_len = rp.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    f32 = np.float32
    out = []
    for i in range(0, dim, 2):
        freq = f32(1.0) / (f32(base) ** (f32(i) / f32(dim)))
        wavelen = f32(2 * math.pi) / freq
        if wavelen < f32(high_freq_wavelen):
            out.append(1.0)
        elif wavelen > f32(low_freq_wavelen):
            out.append(float(f32(factor)))
        else:
            smooth = (f32(old_context_len) / wavelen - f32(low_freq_factor)) / f32(high_freq_factor - low_freq_factor)
            out.append(float(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2", required=False)
    a = ap.parse_args()
    root = os.path.join(a.out, "hf", "rope")
    os.makedirs(root, exist_ok=True)
    expect = {}
    for name, c in CASES.items():
        hd = c["n_embd"] // c["n_head"]
        e = dict(c)
        e["keys"] = rope_keys(c["config"], hd)
        rp = rope_params(c["config"])
        if rp.get("rope_type", "").lower() == "llama3":
            e["rope_freqs"] = llama3_factors(rp, hd)
            regimes = {v == 1.0 for v in e["rope_freqs"]} | {v == rp["factor"] for v in e["rope_freqs"]}
            assert len(e["rope_freqs"]) == hd // 2 and regimes == {True, False}
        expect[name] = e
    with open(os.path.join(root, "expect.json"), "w") as f:
        json.dump(expect, f, indent=1)
    print(f"hf_rope: wrote {root}")


if __name__ == "__main__":
    main()
