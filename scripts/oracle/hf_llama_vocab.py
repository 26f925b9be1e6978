#!/usr/bin/env python3
# tq-venv: transformers
"""Independent oracle for tq's SentencePiece-style (byte-fallback BPE) tokenizer.json reader
(Llama 2 / Mistral style; tests/hf.rs `llama_hf_tokenizer_json_matches_gguf_py`).

Runs in the venv with transformers (scripts/common.sh `py_tf`: gguf 0.19.0 and transformers 4.57.6,
the version llama.cpp's convert requirements pin), because gguf-py's LlamaHfVocab asks
transformers' AutoTokenizer for the vocabulary and the special tokens.

Writes OUT/hf/llama-hf/<case>/: a tiny llama model directory (config.json, model.safetensors with
random f32 weights, tokenizer.json built here, tokenizer_config.json), and OUT/hf/llama-hf/
expect.json: per case, the tokenizer.ggml.* keys convert_hf_to_gguf's LlamaModel.set_vocab writes
for it (tokenizer_config's add_prefix_space, then `_set_vocab_llama_hf`: gguf.LlamaHfVocab's tokens,
scores and types, model "llama", pre "default", and gguf.SpecialVocab(n_vocab=len(tokens))), taken
from a gguf.GGUFWriter. The tokenizer.json's byte-fallback BPE is checked with the `tokenizers`
library (it loads, byte-falls-back, adds the BOS) before anything is written.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

SP = "\u2581"

# Pieces after <unk>, <s>, </s> and the 256 byte tokens, and merges that build them.
PIECES = [SP, "e", "h", "l", "o", "t", "a", "n", "r", "w", "d", "i", "s",
          SP + "t", "he", SP + "the", "ll", "llo", "he" + "llo", SP + "hello", SP + "w", "or",
          SP + "wor", SP + "world", "in", SP + "in", "er", "an", SP + "a", SP + "an", "d" + SP]
MERGES = [(SP, "t"), ("h", "e"), (SP + "t", "he"), ("l", "l"), ("ll", "o"), ("he", "llo"),
          (SP, "hello"), (SP, "w"), ("o", "r"), ("l", "d"), (SP + "w", "or"), (SP + "wor", "ld"), ("i", "n"),
          (SP, "in"), ("e", "r"), ("a", "n"), (SP, "a"), (SP + "a", "n"), ("d", SP)]


def tokenizer_json(added_beyond):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for p in PIECES:
        vocab[p] = len(vocab)
    # "ld" is used by a merge: it must be a token too.
    vocab["ld"] = len(vocab)
    merges = [f"{a} {b}" for a, b in MERGES if a + b in vocab]
    added = [
        {"id": 0, "content": "<unk>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
        {"id": 1, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
        {"id": 2, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
    ]
    for i, (content, special) in enumerate(added_beyond):
        added.append({"id": len(vocab) + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": not special, "special": special})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SP}, {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


# (case, tokens added beyond the model vocabulary (content, special), tokenizer_config.json)
CASES = [
    # Llama 2 style: BOS added by the post-processor and tokenizer_config, no added tokens.
    ("llama2", [], {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": None, "legacy": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 4096, "tokenizer_class": "LlamaTokenizer", "sp_model_kwargs": {},
        "chat_template": "{% for m in messages %}{{ bos_token + m['content'] }}{% endfor %}",
    }),
    # Mistral-instruct style with tokens added past the vocabulary: two special ones (also in
    # additional_special_tokens, CONTROL), one ordinary (USER_DEFINED); object-form special
    # tokens, pad = unk. (No add_prefix_space: with it transformers rebuilds the tokenizer from
    # tokenizer.model, so upstream cannot convert a tokenizer.json-only directory at all.)
    ("mistral-added", [("<|im_start|>", True), ("<|im_end|>", True), ("<tool>", False)], {
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "unk_token": "<unk>", "pad_token": "<unk>", "legacy": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "tokenizer_class": "LlamaTokenizer",
    }),
    # No special-token keys at all: transformers' LlamaTokenizerFast falls back to its defaults
    # <s> / </s> / <unk>, so those are CONTROL in gguf-py's token types.
    ("bare", [], {"add_bos_token": True, "tokenizer_class": "LlamaTokenizer"}),
]


def kv_of(writer):
    out = {}
    for k, v in writer.kv_data[0].items():
        val = v.value
        if isinstance(val, (list, tuple)):
            val = [x.decode("utf-8") if isinstance(x, (bytes, bytearray)) else x for x in val]
            val = [float(x) if isinstance(x, (float, np.floating)) else x for x in val]
            val = [int(x) if isinstance(x, (int, np.integer)) and not isinstance(x, bool) else x for x in val]
        out[k] = {"type": v.type.name, "sub": v.sub_type.name if v.sub_type else None, "value": val}
    return out


def write_model(d, n_vocab, seed):
    n_embd, n_head, n_kv, n_ff = 16, 2, 2, 32
    hd = n_embd // n_head
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": n_embd,
           "intermediate_size": n_ff, "num_hidden_layers": 1, "num_attention_heads": n_head,
           "num_key_value_heads": n_kv, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "vocab_size": n_vocab, "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    rng = np.random.default_rng(seed)
    shapes = {
        "model.embed_tokens.weight": (n_vocab, n_embd), "lm_head.weight": (n_vocab, n_embd),
        "model.norm.weight": (n_embd,), "model.layers.0.input_layernorm.weight": (n_embd,),
        "model.layers.0.post_attention_layernorm.weight": (n_embd,),
        "model.layers.0.self_attn.q_proj.weight": (n_head * hd, n_embd),
        "model.layers.0.self_attn.k_proj.weight": (n_kv * hd, n_embd),
        "model.layers.0.self_attn.v_proj.weight": (n_kv * hd, n_embd),
        "model.layers.0.self_attn.o_proj.weight": (n_embd, n_head * hd),
        "model.layers.0.mlp.gate_proj.weight": (n_ff, n_embd), "model.layers.0.mlp.up_proj.weight": (n_ff, n_embd),
        "model.layers.0.mlp.down_proj.weight": (n_embd, n_ff),
    }
    save_file({n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()},
              os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def expected(d, tc):
    """convert_hf_to_gguf LlamaModel.set_vocab for a tokenizer.json-only llama directory."""
    w = gguf.GGUFWriter(path=None, arch="llama")
    if tc.get("add_prefix_space") is not None:
        w.add_add_space_prefix(tc["add_prefix_space"])
    # _set_vocab_sentencepiece raises FileNotFoundError (no tokenizer.model), then:
    vocab = gguf.LlamaHfVocab(Path(d))
    tokens, scores, toktypes = [], [], []
    for text, score, toktype in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        toktypes.append(toktype)
    assert len(tokens) == vocab.vocab_size
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(toktypes)
    gguf.SpecialVocab(Path(d), n_vocab=len(tokens)).add_to_gguf(w)
    return kv_of(w), len(tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2", required=False)
    a = ap.parse_args()
    root = os.path.join(a.out, "hf", "llama-hf")
    os.makedirs(root, exist_ok=True)
    expect = {}
    for i, (case, added_beyond, tc) in enumerate(CASES):
        d = os.path.join(root, case)
        os.makedirs(d, exist_ok=True)
        tj = tokenizer_json(added_beyond)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False, indent=1)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tc, f, ensure_ascii=False, indent=1)
        # The tokenizers library reads it as a byte-fallback BPE with a BOS.
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        enc = tok.encode("hello world\u00e9")
        v = tj["model"]["vocab"]
        assert enc.ids[0] == 1, enc.tokens
        assert v[SP + "hello"] in enc.ids and v[SP + "world"] in enc.ids, enc.tokens
        assert enc.ids[-2:] == [v["<0xC3>"], v["<0xA9>"]], enc.tokens  # "é": byte fallback
        # The model (config.json with bos/eos ids) is written first: SpecialVocab reads it.
        n_vocab = len(tj["model"]["vocab"]) + len(added_beyond)
        write_model(d, n_vocab, seed=100 + i)
        kv, n_tokens = expected(d, tc)
        assert n_tokens == n_vocab, (n_tokens, n_vocab)
        expect[case] = kv
    with open(os.path.join(root, "expect.json"), "w", encoding="utf-8") as f:
        json.dump(expect, f, ensure_ascii=False, indent=1)
    print(f"hf_llama_vocab: wrote {root}")


if __name__ == "__main__":
    main()
