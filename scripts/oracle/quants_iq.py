#!/usr/bin/env python3
"""Independent oracle for tq's IQ, ternary and FP4 decoders: structured blocks, from gguf-py.

quants.py already writes random blocks of every type; random bytes may miss a grid row, a sign
pattern or a scale code, and never hit the edge scales. This script builds blocks field by field
so that, for each type, every grid index, every sign pattern (7-bit sign index or sign byte),
every sub-block scale code, every delta sign and every scale byte (E8M0, UE4M3) occurs, with the
f16 super-block scale cycling through edge values (±0, ±1, smallest subnormal, smallest normal,
65504, negatives) and random finite ones. It asserts that coverage and records it.

Writes OUT/quants_iq/ (read by tests/quants_oracle.rs):

  index.json         {"blocks": [{type, set: "structured", n_blocks, blocks, f32, coverage}]}
  <type>.bin / .f32  the blocks and gguf-py's dequantization of them (raw little-endian)

Deterministic (fixed seed). About 3 MB.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import GGML_QUANT_SIZES, dequantize  # noqa: E402

assert sys.byteorder == "little"
QK_K = 256

# Edge f16 scales (bit patterns): +0, -0, 1, -1, smallest subnormal, largest subnormal,
# smallest normal, 65504, -65504, 0.5, -2.
EDGE_F16 = np.array([0x0000, 0x8000, 0x3C00, 0xBC00, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF,
                     0x3800, 0xC000], dtype=np.uint16)


def f16_scales(rng, n):
    """n f16 bit patterns: the edge values first and every 8th block, random finite ones of
    many magnitudes (both signs) elsewhere."""
    mag = 10.0 ** rng.uniform(-6, 3, n)
    v = (rng.choice([-1.0, 1.0], n) * mag).astype(np.float16).view(np.uint16)
    k = min(n, len(EDGE_F16))
    v[:k] = EDGE_F16[:k]
    v[k::8] = EDGE_F16[np.arange(len(v[k::8])) % len(EDGE_F16)]
    assert np.isfinite(v.view(np.float16)).all()
    return v


def cycle(n_slots, period, rng, stride=1):
    """Slot values covering 0..period: a permuted ramp (every value at least once if
    n_slots >= period), so neighbouring slots do not always hold neighbouring values."""
    perm = rng.permutation(period)
    return perm[(np.arange(n_slots) * stride) % period]


def n_blocks_for(slots_per_block, period, extra=8):
    return -(-period // slots_per_block) + extra


def u16le(a):
    return np.ascontiguousarray(a.astype(np.uint16)).view(np.uint8)


def u32le(a):
    return np.ascontiguousarray(a.astype(np.uint32)).view(np.uint8)


def build(qt, rng):
    """Blocks of type qt and the coverage they achieve (name -> (values seen, values possible))."""
    if qt == T.IQ2_XXS:
        nb = n_blocks_for(32, 256)
        grid = cycle(nb * 32, 256, rng).reshape(nb, 8, 4)
        sign = cycle(nb * 32, 128, rng, 5).reshape(nb, 8, 4)
        scale = cycle(nb * 8, 16, rng).reshape(nb, 8)
        aux1 = (sign[..., 0] | sign[..., 1] << 7 | sign[..., 2] << 14 | sign[..., 3] << 21
                | scale << 28).astype(np.uint32)
        body = np.concatenate([grid.astype(np.uint8), u32le(aux1).reshape(nb, 8, 4)], axis=2)
        blocks = np.concatenate([u16le(f16_scales(rng, nb)).reshape(nb, 2), body.reshape(nb, 64)], 1)
        return blocks, {"grid": grid, "sign": sign, "scale": scale}, (256, 128, 16)
    if qt == T.IQ2_XS:
        nb = n_blocks_for(32, 512)
        grid = cycle(nb * 32, 512, rng).reshape(nb, 32)
        sign = cycle(nb * 32, 128, rng, 3).reshape(nb, 32)
        scale = cycle(nb * 16, 16, rng).reshape(nb, 16)
        qs = (grid | sign << 9).astype(np.uint16)
        sc = (scale[:, 0::2] | scale[:, 1::2] << 4).astype(np.uint8)
        blocks = np.concatenate([u16le(f16_scales(rng, nb)).reshape(nb, 2), u16le(qs).reshape(nb, 64), sc], 1)
        return blocks, {"grid": grid, "sign": sign, "scale": scale}, (512, 128, 16)
    if qt == T.IQ2_S:
        nb = n_blocks_for(32, 1024)
        grid = cycle(nb * 32, 1024, rng).reshape(nb, 32)
        sign = cycle(nb * 32, 256, rng, 3).reshape(nb, 32)
        scale = cycle(nb * 16, 16, rng).reshape(nb, 16)
        hi = (grid >> 8).reshape(nb, 8, 4)
        qh = (hi[..., 0] | hi[..., 1] << 2 | hi[..., 2] << 4 | hi[..., 3] << 6).astype(np.uint8)
        sc = (scale[:, 0::2] | scale[:, 1::2] << 4).astype(np.uint8)
        blocks = np.concatenate([u16le(f16_scales(rng, nb)).reshape(nb, 2), (grid & 255).astype(np.uint8),
                                 sign.astype(np.uint8), qh, sc], 1)
        return blocks, {"grid": grid, "sign": sign, "scale": scale}, (1024, 256, 16)
    if qt == T.IQ3_XXS:
        nb = n_blocks_for(64, 256)
        grid = cycle(nb * 64, 256, rng).reshape(nb, 64)
        sign = cycle(nb * 32, 128, rng, 5).reshape(nb, 8, 4)
        scale = cycle(nb * 8, 16, rng).reshape(nb, 8)
        aux = (sign[..., 0] | sign[..., 1] << 7 | sign[..., 2] << 14 | sign[..., 3] << 21
               | scale << 28).astype(np.uint32)
        blocks = np.concatenate([u16le(f16_scales(rng, nb)).reshape(nb, 2), grid.astype(np.uint8),
                                 u32le(aux).reshape(nb, 32)], 1)
        return blocks, {"grid": grid, "sign": sign, "scale": scale}, (256, 128, 16)
    if qt == T.IQ3_S:
        nb = n_blocks_for(64, 512)
        grid = cycle(nb * 64, 512, rng).reshape(nb, 64)
        sign = cycle(nb * 32, 256, rng, 3).reshape(nb, 32)
        scale = cycle(nb * 8, 16, rng).reshape(nb, 8)
        hi = (grid >> 8).reshape(nb, 8, 8)
        qh = np.zeros((nb, 8), dtype=np.uint8)
        for k in range(8):
            qh |= (hi[..., k] << k).astype(np.uint8)
        sc = (scale[:, 0::2] | scale[:, 1::2] << 4).astype(np.uint8)
        blocks = np.concatenate([u16le(f16_scales(rng, nb)).reshape(nb, 2), (grid & 255).astype(np.uint8), qh,
                                 sign.astype(np.uint8), sc], 1)
        return blocks, {"grid": grid, "sign": sign, "scale": scale}, (512, 256, 16)
    if qt == T.IQ1_S:
        nb = n_blocks_for(32, 2048)
        grid = cycle(nb * 32, 2048, rng).reshape(nb, 8, 4)
        scale = cycle(nb * 8, 8, rng).reshape(nb, 8)
        neg = cycle(nb * 8, 2, rng).reshape(nb, 8)
        hi = grid >> 8
        qh = (hi[..., 0] | hi[..., 1] << 3 | hi[..., 2] << 6 | hi[..., 3] << 9 | scale << 12
              | neg << 15).astype(np.uint16)
        blocks = np.concatenate([u16le(f16_scales(rng, nb)).reshape(nb, 2),
                                 (grid & 255).astype(np.uint8).reshape(nb, 32), u16le(qh).reshape(nb, 16)], 1)
        return blocks, {"grid": grid, "scale": scale, "delta": neg}, (2048, 8, 2)
    if qt == T.IQ1_M:
        nb = n_blocks_for(32, 2048)
        grid = cycle(nb * 32, 2048, rng).reshape(nb, 8, 4)
        scale = cycle(nb * 16, 8, rng).reshape(nb, 4, 4)  # 4 words x 4 three-bit scales
        neg = cycle(nb * 32, 2, rng).reshape(nb, 8, 4)
        hi = grid >> 8
        # qh byte 2*ib + h: rows 2h (low nibble) and 2h+1 (high nibble): 3 grid bits + delta sign.
        nib = (hi | neg << 3).reshape(nb, 8, 2, 2)
        qh = (nib[..., 0] | nib[..., 1] << 4).astype(np.uint8).reshape(nb, 16)
        d = f16_scales(rng, nb).astype(np.uint32)
        words = (scale[..., 0] | scale[..., 1] << 3 | scale[..., 2] << 6 | scale[..., 3] << 9).astype(np.uint32)
        for w in range(4):
            words[:, w] |= ((d >> (4 * w)) & 0xF) << 12
        blocks = np.concatenate([(grid & 255).astype(np.uint8).reshape(nb, 32), qh,
                                 u16le(words).reshape(nb, 8)], 1)
        return blocks, {"grid": grid, "scale": scale, "delta": neg}, (2048, 8, 2)
    if qt == T.TQ1_0:
        nb = 64
        qs = cycle(nb * 48, 256, rng, 7).reshape(nb, 48)
        qh = cycle(nb * 4, 256, rng).reshape(nb, 4)
        blocks = np.concatenate([qs.astype(np.uint8), qh.astype(np.uint8),
                                 u16le(f16_scales(rng, nb)).reshape(nb, 2)], 1)
        return blocks, {"qs byte": qs, "qh byte": qh}, (256, 256)
    if qt == T.TQ2_0:
        nb = 16
        body = cycle(nb * 64, 256, rng, 3).reshape(nb, 64)
        blocks = np.concatenate([body.astype(np.uint8), u16le(f16_scales(rng, nb)).reshape(nb, 2)], 1)
        return blocks, {"byte": body}, (256,)
    if qt == T.MXFP4:
        nb = 512
        e = cycle(nb, 256, rng)
        qs = cycle(nb * 16, 256, rng, 5).reshape(nb, 16)
        blocks = np.concatenate([e.reshape(nb, 1).astype(np.uint8), qs.astype(np.uint8)], 1)
        return blocks, {"e8m0": e, "byte": qs}, (256, 256)
    if qt == T.NVFP4:
        nb = 256
        d = cycle(nb * 4, 256, rng, 3).reshape(nb, 4)
        qs = cycle(nb * 32, 256, rng, 5).reshape(nb, 32)
        blocks = np.concatenate([d.astype(np.uint8), qs.astype(np.uint8)], 1)
        return blocks, {"ue4m3": d, "byte": qs}, (256, 256)
    raise SystemExit(f"quants_iq.py: no builder for {qt.name}")


TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0,
         T.MXFP4, T.NVFP4]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2")  # accepted for scripts/oracle.sh; unused
    a = ap.parse_args()
    out = os.path.join(a.out, "quants_iq")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261124)
    index = {"generator": "scripts/oracle/quants_iq.py", "gguf_py_version": _version("gguf"),
             "numpy_version": np.__version__, "blocks": []}
    for qt in TYPES:
        blocks, fields, sizes = build(qt, rng)
        bs, ts = GGML_QUANT_SIZES[qt]
        blocks = np.ascontiguousarray(blocks.astype(np.uint8))
        assert blocks.shape[1] == ts, (qt.name, blocks.shape, ts)
        coverage = {}
        for (name, vals), size in zip(fields.items(), sizes):
            seen = len(np.unique(vals))
            assert seen == size, f"{qt.name} {name}: {seen} of {size} values covered"
            coverage[name] = [seen, size]
        with np.errstate(all="ignore"):
            f = dequantize(blocks, qt).astype(np.float32)
        assert f.shape == (blocks.shape[0], bs)
        base = qt.name.lower()
        blocks.tofile(os.path.join(out, f"{base}.structured.bin"))
        f.tofile(os.path.join(out, f"{base}.structured.f32"))
        index["blocks"].append({
            "type": qt.name, "set": "structured", "n_blocks": int(blocks.shape[0]),
            "blocks": f"{base}.structured.bin", "f32": f"{base}.structured.f32",
            "finite": bool(np.isfinite(f).all()), "coverage": coverage,
        })
    with open(os.path.join(out, "index.json"), "w") as fh:
        json.dump(index, fh, indent=1)
    print(f"quants_iq.py: {len(index['blocks'])} structured block sets in {out}", file=sys.stderr)


def _version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
