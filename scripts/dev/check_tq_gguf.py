"""Independent check of a TQ GGUF written by tq (gguf-py + numpy only; no tq code).

usage: check_tq_gguf.py SOURCE.gguf OUTPUT.gguf [--max-rel-mse X] [--conformance DIR]

- Registers the fork's type ids (TQ3_1S=45, TQ4_1S=46) with gguf-py so GGUFReader can read the file.
- Decodes TQ blocks with a numpy implementation written from FORMATS.md (validated here first against
  the fork's conformance vectors, bit for bit).
- For every tensor: same name/shape as the source; tensors of the source's type are byte-identical;
  TQ tensors decode within the expected relative MSE of the source's (dequantized) values; other
  quantized tensors decode (via gguf-py) close to the source.
"""
import argparse, enum, json, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

TQ = {45: ("TQ3_1S", 32, 16), 46: ("TQ4_1S", 32, 20)}


def register_tq_types():
    members = {m.name: m.value for m in T}
    for tid, (name, _, _) in TQ.items():
        members[name] = tid
    New = enum.IntEnum("GGMLQuantizationType", members)
    for mod in (gguf.gguf_reader, gguf.constants, gguf):
        if hasattr(mod, "GGMLQuantizationType"):
            mod.GGMLQuantizationType = New
    sizes = {New[k.name]: v for k, v in gguf.constants.GGML_QUANT_SIZES.items()}
    for tid, (name, bs, bb) in TQ.items():
        sizes[New[name]] = (bs, bb)
    gguf.constants.GGML_QUANT_SIZES.clear()
    gguf.constants.GGML_QUANT_SIZES.update(sizes)
    gguf.gguf_reader.GGML_QUANT_SIZES = gguf.constants.GGML_QUANT_SIZES
    return New


C4 = np.array([-2.732590, -2.069017, -1.618046, -1.256231, -0.942340, -0.656759, -0.388048, -0.128395,
               0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.732590], np.float32)
C3 = np.array([-1.996684, -1.291398, -0.740341, -0.247508, 0.230106, 0.725222, 1.277503, 1.988943], np.float32)
SIGNS = np.array([-1.0 if ((i * 0x9E3779B9) & 0xFFFFFFFF) >> 31 else 1.0 for i in range(32)], np.float32)


def inverse_rotation(b):
    """Unnormalized butterfly (step 1,2,4,8,16) then * (1/sqrt(32)) * s, in float32."""
    b = b.astype(np.float32).copy()
    step = 1
    while step < 32:
        v = b.reshape(b.shape[0], 32 // (2 * step), 2, step)
        a, c = v[:, :, 0, :].copy(), v[:, :, 1, :].copy()
        v[:, :, 0, :] = a + c
        v[:, :, 1, :] = a - c
        step *= 2
    return b * (np.float32(0.17677669529663688) * SIGNS)


def dequant_tq(raw, tid):
    bb = TQ[tid][2]
    blk = np.frombuffer(raw, np.uint8).reshape(-1, bb)
    d = blk[:, :4].copy().view(np.float16).astype(np.float32)  # (n, 2)
    if tid == 46:
        q = blk[:, 4:]
        idx = np.stack([q & 15, q >> 4], axis=-1).reshape(-1, 32)
        c = C4[idx]
    else:
        g = blk[:, 4:].reshape(-1, 4, 3).astype(np.uint32)
        w = g[:, :, 0] | (g[:, :, 1] << 8) | (g[:, :, 2] << 16)
        idx = np.stack([(w >> (3 * i)) & 7 for i in range(8)], axis=-1).reshape(-1, 32)
        c = C3[idx]
    scale = np.repeat(d, 16, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        return inverse_rotation(c * scale).reshape(-1)


def check_conformance(cdir):
    """The numpy decoder must reproduce the fork's dequantized floats bit for bit."""
    for tid, fname in ((46, "tq4_1s.json"), (45, "tq3_1s.json")):
        cases = json.load(open(f"{cdir}/{fname}"))["cases"]
        nblk = 0
        for case in cases:
            raw = bytes.fromhex(case["expected_bytes"])
            want = np.array([int(h, 16) for h in case["expected_dequant_f32"]], np.uint32)
            got = dequant_tq(raw, tid).view(np.uint32)
            nan = np.isnan(want.view(np.float32))
            assert np.array_equal(np.isnan(got.view(np.float32)), nan), case["id"]
            assert np.array_equal(got[~nan], want[~nan]), f"{fname} {case['id']}"
            nblk += len(raw) // TQ[tid][2]
        print(f"numpy decoder: {fname} {len(cases)} cases / {nblk} blocks bit-exact")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("output")
    ap.add_argument("--max-rel-mse", type=float, default=0.02)
    ap.add_argument("--conformance")
    a = ap.parse_args()
    register_tq_types()
    if a.conformance:
        check_conformance(a.conformance)
    src = {t.name: t for t in gguf.GGUFReader(a.source).tensors}
    out = gguf.GGUFReader(a.output)
    assert len(out.tensors) == len(src), "tensor count differs"
    stats = {"copied": 0, "tq": 0, "other": 0}
    rel = []
    for t in out.tensors:
        s = src[t.name]
        assert list(t.shape) == list(s.shape), t.name
        tid = int(t.tensor_type)
        if tid == int(s.tensor_type):
            assert bytes(t.data.tobytes()) == bytes(s.data.tobytes()), f"{t.name}: copied bytes differ"
            stats["copied"] += 1
            continue
        ref = gguf.quants.dequantize(s.data, s.tensor_type).astype(np.float32).reshape(-1)
        if tid in TQ:
            got = dequant_tq(t.data.tobytes(), tid)
            stats["tq"] += 1
        else:
            got = gguf.quants.dequantize(t.data, tid).astype(np.float32).reshape(-1)
            stats["other"] += 1
        r = float(np.mean((got - ref) ** 2) / max(np.mean(ref ** 2), 1e-30))
        rel.append((r, t.name, TQ[tid][0] if tid in TQ else T(tid).name))
        assert r < a.max_rel_mse, f"{t.name}: relative MSE {r:.5f} above {a.max_rel_mse}"
    by = {}
    for r, _, ty in rel:
        by.setdefault(ty, []).append(r)
    for ty, v in sorted(by.items()):
        print(f"{ty}: {len(v)} tensors, relative MSE mean {np.mean(v):.5f} max {np.max(v):.5f}")
    print(f"OK: {stats['copied']} copied byte-identical, {stats['tq']} TQ decoded, {stats['other']} other decoded")


if __name__ == "__main__":
    main()
