#!/usr/bin/env python3
"""Issue 30: an imatrix GGUF (llama-imatrix, or tq calib --imatrix-out) against the diagonal of a
tq Hessian file made from the same tokens: per tensor, in_sum2 / counts vs diag(H) / tokens.

    python3 scripts/dev/cmp-imatrix.py IMATRIX.gguf H.safetensors   (needs gguf-py, numpy)
"""
import gguf, numpy as np, json, struct, sys
lp, hp = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(lp)
lt = {t.name: np.array(t.data, dtype=np.float64) for t in r.tensors}
f = open(hp, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; hdr = json.loads(f.read(n)); base = 8 + n
meta = hdr.pop('__metadata__')
worst = 0; rel = []
for key, v in hdr.items():
    dim = v['shape'][0]; a, b = v['data_offsets']
    m = np.memmap(hp, dtype='<f8', mode='r', offset=base + a, shape=(dim, dim))
    d = np.diag(m).copy() / float(meta['tokens:' + key])
    for name in key.split(','):
        li = lt[name + '.in_sum2'] / lt[name + '.counts'][0]
        e = np.abs(li - d).max() / np.abs(li).max()
        rel.append(np.linalg.norm(li - d) / np.linalg.norm(li)); worst = max(worst, e)
print(f"{len(rel)} tensors: relative L2 difference median {np.median(rel):.2e}, max {max(rel):.2e}; worst max-abs/max {worst:.2e}")
