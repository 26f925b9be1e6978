#!/usr/bin/env python3
"""Build a Hugging Face-style model directory from a llama-architecture GGUF, independently of tq.

Uses only gguf (gguf-py), numpy, safetensors and tokenizers from PyPI. The weights are the GGUF's
tensors dequantized by gguf-py, stored as --dtype (f16 or bf16; 1-D norms stay f32 unless
--norms-dtype says otherwise), with the attn_q / attn_k rows put back in Hugging Face order (the
inverse of llama.cpp's rope permutation), under Hugging Face names, sharded in --shards files with
a model.safetensors.index.json. config.json, tokenizer.json, tokenizer_config.json,
generation_config.json and a README.md model card are reconstructed from the GGUF metadata so that
llama.cpp's convert_hf_to_gguf.py would write the same metadata back.

  python make_hf_dir.py MODEL.gguf OUT_DIR [--dtype f16|bf16] [--layers N] [--shards 2]

--layers N keeps the first N layers only (a reduced copy for fast tests). The directory name
matters to convert_hf_to_gguf's naming heuristics only when config.json has no _name_or_path.
Checks done here with the `tokenizers` library: tokenizer.json loads and round-trips text; its
pre-tokenizer fingerprint (convert_hf_to_gguf's chkhsh: sha256 of the ids of the check text) is
printed with the summary (855059...6249 = "smollm" for SmolLM2).
"""

import argparse
import hashlib
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

# convert_hf_to_gguf's check text for the pre-tokenizer fingerprint (get_vocab_base_pre).
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f "
    "(multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 "
    "33333333 3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785"
    "\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= "
    "\u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure "
    "I'll make it, 'D you like some tea? We'Ve a'lL"
)

HF_NAME = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output.weight":
        return "lm_head.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    blk, n, part, suffix = name.split(".")
    assert blk == "blk", name
    return f"model.layers.{n}.{HF_NAME[part]}.{suffix}"


def unpermute(w, n_head):
    """Inverse of llama.cpp's permute: GGUF row h*hd + 2i + j came from HF row h*hd + j*hd/2 + i."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    v = f.contents()
    return v


def bf16_bytes(a32):
    """Round-to-nearest-even f32 -> bf16, as uint16 (numpy has no bfloat16)."""
    u = a32.astype(np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded


def save_bf16(tensors_u16, path, metadata):
    """safetensors.numpy cannot write BF16: write the header ourselves (same layout rules)."""
    header = {"__metadata__": metadata}
    offset = 0
    order = sorted(tensors_u16.items(), key=lambda kv: (-kv[1][0].itemsize, kv[0]))
    blobs = []
    for name, (arr, dtype) in order:
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    ap.add_argument("--norms-dtype", choices=["f32", "same"], default="f32")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--shards", type=int, default=2)
    a = ap.parse_args()
    info = build(a.gguf, a.out, a.dtype, a.layers, a.shards, a.norms_dtype)
    print(json.dumps({k: v for k, v in info.items() if k != "chktok"}))


def build(gguf_path, out, dtype="f16", layers=None, shards=2, norms_dtype="f32"):
    r = gguf.GGUFReader(gguf_path)
    arch = field(r, "general.architecture")
    assert arch == "llama", f"only llama GGUFs are supported here, not {arch}"
    n_layer = int(field(r, "llama.block_count"))
    keep = n_layer if layers is None else layers
    n_head = int(field(r, "llama.attention.head_count"))
    n_head_kv = int(field(r, "llama.attention.head_count_kv"))
    os.makedirs(out, exist_ok=True)

    # Weights.
    weights = {}
    for t in r.tensors:
        name = t.name
        if name.startswith("blk.") and int(name.split(".")[1]) >= keep:
            continue
        shape = [int(d) for d in reversed(t.shape.tolist())]  # PyTorch order
        w = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        if name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif name.endswith("attn_k.weight"):
            w = unpermute(w, n_head_kv)
        weights[hf_name(name)] = w
    names = sorted(weights)
    per = (len(names) + shards - 1) // shards
    parts = [names[i * per:(i + 1) * per] for i in range(shards)]
    weight_map = {}
    total = 0
    for i, part in enumerate(parts):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        blob = {}
        for n in part:
            w = weights[n]
            keep32 = w.ndim == 1 and norms_dtype == "f32"
            if keep32:
                blob[n] = (w, "F32")
            elif dtype == "f16":
                blob[n] = (w.astype(np.float16), "F16")
            else:
                blob[n] = (bf16_bytes(w).reshape(w.shape), "BF16")
            total += blob[n][0].nbytes
            weight_map[n] = fname
        if all(d != "BF16" for _, d in blob.values()):
            save_file({n: v for n, (v, _) in blob.items()}, os.path.join(out, fname), metadata={"format": "pt"})
        else:
            save_bf16(blob, os.path.join(out, fname), {"format": "pt"})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)

    # Tokenizer.
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    pre = field(r, "tokenizer.ggml.pre")
    assert pre in ("smollm", "starcoder"), f"no tokenizer.json recipe for pre '{pre}'"
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, (t, ty) in enumerate(zip(tokens, types)) if int(ty) == 3
    ]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [m.split(" ") for m in merges],
        },
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)

    def tok_of(key):
        v = field(r, key)
        return None if v is None else tokens[int(v)]

    tc = {
        "add_prefix_space": bool(field(r, "tokenizer.ggml.add_space_prefix")),
        "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")} for t in added},
        "additional_special_tokens": [t["content"] for t in added],
        "bos_token": tok_of("tokenizer.ggml.bos_token_id"),
        "chat_template": field(r, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": tok_of("tokenizer.ggml.eos_token_id"),
        "model_max_length": int(field(r, "llama.context_length")),
        "pad_token": tok_of("tokenizer.ggml.padding_token_id"),
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tok_of("tokenizer.ggml.unknown_token_id"),
        "vocab_size": len(tokens),
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=2)

    # config.json: _name_or_path rebuilt from the naming metadata convert_hf_to_gguf derived from it.
    org = field(r, "general.organization")
    parts_ = [field(r, k) for k in ("general.basename", "general.size_label", "general.finetune")]
    name_or_path = "-".join(p for p in parts_ if p)
    if org:
        name_or_path = f"{org}/{name_or_path}"
    n_embd = int(field(r, "llama.embedding_length"))
    cfg = {
        "_name_or_path": name_or_path,
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": int(field(r, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(r, "tokenizer.ggml.eos_token_id")),
        "hidden_act": "silu",
        "hidden_size": n_embd,
        "initializer_range": 0.02,
        "intermediate_size": int(field(r, "llama.feed_forward_length")),
        "max_position_embeddings": int(field(r, "llama.context_length")),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": n_head,
        "num_hidden_layers": keep,
        "num_key_value_heads": n_head_kv,
        "pretraining_tp": 1,
        "rms_norm_eps": float(field(r, "llama.attention.layer_norm_rms_epsilon")),
        "rope_scaling": None,
        "rope_theta": float(field(r, "llama.rope.freq_base")),
        "tie_word_embeddings": "output.weight" not in [t.name for t in r.tensors],
        "torch_dtype": {"f16": "float16", "bf16": "bfloat16"}[dtype],
        "transformers_version": "4.42.3",
        "use_cache": True,
        "vocab_size": int(field(r, "llama.vocab_size")),
    }
    rope_dim = field(r, "llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != n_embd // n_head:
        cfg["head_dim"] = int(rope_dim)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": cfg["bos_token_id"],
                   "eos_token_id": cfg["eos_token_id"], "transformers_version": "4.42.3"}, f, indent=2)

    # Model card: the keys convert_hf_to_gguf takes from it.
    card = ["---"]
    lic = field(r, "general.license")
    if lic:
        card.append(f"license: {lic}")
    langs = field(r, "general.languages")
    if langs:
        card.append("language:")
        card += [f"- {x}" for x in langs]
    card += ["---", "", "Reconstructed from a GGUF by tq's scripts/dev/make_hf_dir.py (test data).", ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(card))

    # Independent checks with the tokenizers library.
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    ids = t.encode(CHKTXT).ids
    chkhsh = hashlib.sha256(str(ids).encode()).hexdigest()
    sample = "Hello world! 1234 The quick brown fox.\n  Indented  code\tend"
    assert t.decode(t.encode(sample).ids) == sample
    return {"chkhsh": chkhsh, "chktok": ids, "n_tensors": len(weights), "layers": keep}


if __name__ == "__main__":
    main()
