#!/usr/bin/env python3
"""Independent oracle for tq's Hugging Face reader (tests/hf.rs), from gguf-py, numpy,
safetensors and tokenizers only.

Writes OUT/hf/:

  smol2-f16/    a reduced (2-layer) Hugging Face directory rebuilt from the real SmolLM2 GGUF by
                scripts/dev/make_hf_dir.py: f16 matrices, f32 norms, 2 shards + index
  smol2-bf16/   the same in bf16 (norms too), 3 shards
  expect.json   per directory: gguf-py's Metadata.load + SpecialVocab results (the general.* and
                special-token keys convert_hf_to_gguf would write), the tokenizers library's ids for
                convert_hf_to_gguf's check text, and its sha256 (tokenizer.ggml.pre fingerprint)
  pretok/       the same vocabulary with other pre-tokenizers (llama3- and qwen2-style Split
                regexes, NFC normalizer, TemplateProcessing with a BOS): tokenizer.json files and
                the tokenizers library's ids for several texts, in pretok/expect.json
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import gguf  # noqa: E402
from safetensors import safe_open  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

spec = importlib.util.spec_from_file_location("make_hf_dir", os.path.join(_HERE, "..", "dev", "make_hf_dir.py"))
mk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mk)

LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

TEXTS = [
    mk.CHKTXT,
    "Hello world! It's 2024, isn't it?  Let's test   spaces\n\n\nand new lines.\t\tTabs too.",
    "def f(x):\n    return x**2  # comment\n\n\nclass A:\n\tpass\n",
    "Ünïcödé façade — naïve café; 東京 123456789 ١٢٣",
    "   leading and trailing   ",
    "<|im_start|>user\nhi<|im_end|>",
]


def kv_of(writer):
    out = {}
    for k, v in writer.kv_data[0].items():
        val = v.value
        if isinstance(val, (list, tuple)):
            if k == "tokenizer.ggml.merges":
                val = {"count": len(val), "sha256": hashlib.sha256("\n".join(val).encode()).hexdigest()}
            else:
                val = list(val)
        out[k] = {"type": v.type.name, "value": val}
    return out


def expectations(d):
    total = 0
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "np") as st:
                for n in st.keys():
                    total += int(__import__("numpy").prod(st.get_slice(n).get_shape()))
    meta = gguf.Metadata.load(None, Path(d), None, total)
    if meta.name is None:
        meta.name = Path(d).name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, total, 0, 0)
    w = gguf.GGUFWriter(path=None, arch="llama")
    meta.set_gguf_meta_model(w)
    general = kv_of(w)
    w2 = gguf.GGUFWriter(path=None, arch="llama")
    gguf.SpecialVocab(Path(d), load_merges=True).add_to_gguf(w2)
    special = kv_of(w2)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    ids = tok.encode(mk.CHKTXT).ids
    return {
        "total_params": total,
        "general": general,
        "special": special,
        "chktok": ids,
        "chkhsh": hashlib.sha256(str(ids).encode()).hexdigest(),
    }


def pretok_variants(src_dir, out):
    os.makedirs(out, exist_ok=True)
    base = json.load(open(os.path.join(src_dir, "tokenizer.json"), encoding="utf-8"))
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    variants = {
        "smollm": {},
        "llama3": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_RE}, "behavior": "Isolated", "invert": False}, bl]},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                        {"SpecialToken": {"id": "<|im_start|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}},
        "qwen2": {"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_RE}, "behavior": "Isolated", "invert": False}, bl]}},
        "gpt2-prefix": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
                        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}},
        "ignore-merges": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_RE}, "behavior": "Isolated", "invert": False}, bl]}},
    }
    expect = {}
    for name, patch in variants.items():
        t = dict(base)
        t.update(patch)
        if name == "ignore-merges":
            t["model"] = dict(t["model"], ignore_merges=True)
        path = os.path.join(out, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(t, f, ensure_ascii=False)
        tok = Tokenizer.from_file(path)
        expect[name] = [tok.encode(x).ids for x in TEXTS]
    with open(os.path.join(out, "expect.json"), "w", encoding="utf-8") as f:
        json.dump({"texts": TEXTS, "ids": expect}, f, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2", required=True)
    a = ap.parse_args()
    out = os.path.join(a.out, "hf")
    os.makedirs(out, exist_ok=True)
    expect = {}
    for name, dtype, norms, shards in [("smol2-f16", "f16", "f32", 2), ("smol2-bf16", "bf16", "same", 3)]:
        d = os.path.join(out, name)
        info = mk.build(a.smollm2, d, dtype=dtype, layers=2, shards=shards, norms_dtype=norms)
        e = expectations(d)
        assert e["chkhsh"] == info["chkhsh"]
        expect[name] = e
    with open(os.path.join(out, "expect.json"), "w", encoding="utf-8") as f:
        json.dump(expect, f, ensure_ascii=False)
    pretok_variants(os.path.join(out, "smol2-f16"), os.path.join(out, "pretok"))
    print(f"hf: wrote {out}")


if __name__ == "__main__":
    main()
