#!/usr/bin/env python3
"""Independent oracle for tq's ggml block kernels, from gguf-py (llama.cpp's Python package).

Writes OUT/quants/ (read by tests/quants_oracle.rs):

  index.json       what is below, with gguf-py's version and GGML_QUANT_SIZES
  t<i>.f32         gguf-py's dequantization of row slices of real SmolLM2 tensors
                   (several Q4_1 tensors, the Q8_0 token_embd.weight); the Rust test takes the
                   raw bytes of the same rows from the GGUF file itself
  <type>.<set>.bin blocks of every block type gguf-py can dequantize:
                     set "quant":  gguf-py's own quantization of <type>.quant.in.f32
                                   (types gguf-py can quantize)
                     set "random": random bytes, f16 scale fields replaced by sane finite values,
                                   blocks whose dequantization is not finite are redrawn
  <type>.<set>.f32 gguf-py's dequantization of those blocks
  float.*          F16/BF16: an f32 input vector and gguf-py/numpy's f16 and bf16 encodings, and
                   the f32 decoding of all 65536 f16 and bf16 bit patterns

All files are raw little-endian arrays. Deterministic (fixed seeds). About 9 MB.
"""

import os
import sys

# This script's folder holds sibling oracle scripts (historically math.py) that would shadow standard
# modules when run as `python scripts/oracle/quants.py`: drop it from the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import GGML_QUANT_SIZES, dequantize, quantize  # noqa: E402

assert sys.byteorder == "little"

# Row slices of real tensors: (name, first row, rows or None for all).
REAL = [
    ("blk.0.attn_k.weight", 0, None),
    ("blk.0.attn_v.weight", 0, None),
    ("blk.14.attn_q.weight", 0, 256),
    ("blk.29.ffn_down.weight", 100, 128),
    ("blk.7.ffn_gate.weight", 1000, 256),
    ("token_embd.weight", 0, 256),
    ("token_embd.weight", 49152 - 256, 256),
]

# Byte offsets of the f16 scale fields of the block types whose layout tq decodes.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
    T.TQ1_0: [52], T.TQ2_0: [64],
}
SKIP = {T.F32, T.F16, T.BF16, T.I8, T.I16, T.I32, T.I64, T.F64}


def sane_f16(rng, n):
    """Finite f16 scales over many magnitudes, with some zeros, negatives and subnormals."""
    mag = 10.0 ** rng.uniform(-7, 2, n)
    v = (rng.choice([-1.0, 1.0], n) * mag).astype(np.float16)
    v[rng.random(n) < 0.02] = 0
    assert np.isfinite(v).all()
    return v.view(np.uint8).reshape(n, 2)


def random_blocks(rng, qt, n):
    _, size = GGML_QUANT_SIZES[qt]
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for off in F16_FIELDS.get(qt, []):
        blocks[:, off:off + 2] = sane_f16(rng, n)
    # Redraw blocks whose decoding is not finite (unknown layouts: exponent bits all ones).
    for _ in range(100):
        with np.errstate(all="ignore"):
            bad = ~np.isfinite(dequantize(blocks, qt)).all(axis=1)
        if not bad.any():
            return blocks
        blocks[bad] = rng.integers(0, 256, (int(bad.sum()), size), dtype=np.uint8)
    raise SystemExit(f"quants.py: could not draw finite random {qt.name} blocks")


def quant_input(rng, bs, n):
    """Rows that exercise the quantizers: many scales, ties, constant and zero blocks,
    exact .5 rounding cases. No signed zeros (ggml and numpy may pick a different zero)."""
    x = rng.standard_normal((n, bs)).astype(np.float32)
    x *= (10.0 ** rng.uniform(-6, 3, (n, 1))).astype(np.float32)
    k = n // 16
    x[0] = 0.0                                        # all zero
    x[1] = 1.25                                       # constant
    x[2] = -3.0
    x[3] = np.linspace(-1, 1, bs, dtype=np.float32)  # symmetric: max-abs tie, first wins
    x[4] = np.float32(0.5) * (np.arange(bs) - bs // 2).astype(np.float32)
    x[4, 0] = 127.0                                   # Q8_0: id = 1 -> exact .5 values
    x[5] = rng.uniform(-1, 1, bs).astype(np.float32) * np.float32(1e-7)  # f16 scale underflow
    # f32-subnormal scales: 1/d overflows to inf, the (int8) casts see inf/NaN (x86: 0)
    for i, m in enumerate([1e-39, 1e-38, 2e-37, 3e-38]):
        x[6 + i] = rng.uniform(-1, 1, bs).astype(np.float32) * np.float32(m)
    x[9, ::3] = 0.0
    s = 10
    x[s:s + k] = rng.uniform(-1, 1, (k, bs)).astype(np.float32)
    x[s + k:s + 2 * k] = rng.integers(-8, 8, (k, bs)).astype(np.float32)  # on the grid
    x[s + 2 * k:s + 3 * k] = np.abs(x[s + 2 * k:s + 3 * k])               # one-sided
    x[x == 0] = 0.0                                   # drop any -0.0
    return x


def write(out, name, arr):
    arr = np.ascontiguousarray(arr)
    arr.tofile(os.path.join(out, name))
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2", required=True)
    a = ap.parse_args()
    out = os.path.join(a.out, "quants")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20260521)

    index = {
        "generator": "scripts/oracle/quants.py",
        "gguf_py_version": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "numpy_version": np.__version__,
        "sizes": [
            {"name": qt.name, "id": int(qt.value), "block_size": bs, "type_size": ts}
            for qt, (bs, ts) in GGML_QUANT_SIZES.items()
        ],
        "tensors": [],
        "blocks": [],
    }

    # (a) real tensors
    reader = gguf.GGUFReader(a.smollm2)
    by_name = {t.name: t for t in reader.tensors}
    for i, (name, r0, nr) in enumerate(REAL):
        t = by_name[name]
        rows = t.data if nr is None else t.data[r0:r0 + nr]
        f = dequantize(np.asarray(rows), t.tensor_type).astype(np.float32, copy=False)
        index["tensors"].append({
            "name": name, "type": t.tensor_type.name, "row_start": r0, "n_rows": int(f.shape[0]),
            "row_len": int(f.shape[1]), "f32": write(out, f"t{i}.f32", f),
        })

    # (b) blocks of every type gguf-py can decode
    for qt, (bs, _) in GGML_QUANT_SIZES.items():
        if qt in SKIP:
            continue
        nb = 512 if bs <= 64 else 128
        base = qt.name.lower()
        try:
            blocks = random_blocks(rng, qt, nb)
        except NotImplementedError:
            print(f"quants.py: gguf-py cannot dequantize {qt.name}; skipped", file=sys.stderr)
            continue
        sets = [("random", blocks, None)]
        x = quant_input(rng, bs, nb)
        try:
            with np.errstate(all="ignore"):
                q = quantize(x, qt)
            sets.append(("quant", q, x))
        except NotImplementedError:
            pass
        for set_name, b, x in sets:
            with np.errstate(all="ignore"):
                f = dequantize(b, qt)
            e = {
                "type": qt.name, "set": set_name, "n_blocks": int(b.shape[0]),
                "blocks": write(out, f"{base}.{set_name}.bin", b),
                "f32": write(out, f"{base}.{set_name}.f32", f.astype(np.float32)),
            }
            if x is not None:
                e["input"] = write(out, f"{base}.{set_name}.in.f32", x)
            index["blocks"].append(e)

    # F16 / BF16
    real = dequantize(np.asarray(by_name["blk.3.attn_q.weight"].data[:8]), T.Q4_1).ravel()
    edge = np.array([
        0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e6, 6.1035156e-05, 6.0e-08,
        2.9e-08, 3.0e-08, 1e-9, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8,
        1.0 + 3 * 2.0 ** -8, 3.4e38, -3.4e38, 1e-40, -1e-45, np.pi, -np.e,
    ], dtype=np.float32)
    rnd = (rng.standard_normal(8192) * 10.0 ** rng.uniform(-10, 6, 8192)).astype(np.float32)
    fx = np.concatenate([edge, real.astype(np.float32), rnd]).astype(np.float32)
    with np.errstate(all="ignore"):
        all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        index["float"] = {
            "input": write(out, "float.in.f32", fx),
            "f16": write(out, "float.f16", quantize(fx, T.F16).view(np.uint16)),
            "bf16": write(out, "float.bf16", quantize(fx, T.BF16).view(np.uint16)),
            "f16_all_f32": write(out, "float.f16_all.f32", dequantize(all16.view(np.uint8), T.F16)),
            "bf16_all_f32": write(out, "float.bf16_all.f32",
                                  dequantize(all16.view(np.uint8), T.BF16).astype(np.float32)),
        }

    with open(os.path.join(out, "index.json"), "w") as fh:
        json.dump(index, fh, indent=1)
    total = sum(os.path.getsize(os.path.join(out, p)) for p in os.listdir(out))
    print(f"quants.py: {len(index['tensors'])} tensor slices, {len(index['blocks'])} block sets, "
          f"{total / 1e6:.1f} MB in {out}", file=sys.stderr)


def _dist_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
