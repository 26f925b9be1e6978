"""gguf-hybrid.py A.gguf B.gguf REGEX OUT.gguf: A's file with the tensors whose name matches REGEX taken
from B (same names, shapes; types may differ). Metadata from A. Needs gguf-py (scripts/common.sh: py)."""
import re, sys
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType
a, b, rx, out = sys.argv[1:5]
ra, rb = GGUFReader(a), GGUFReader(b)
tb = {t.name: t for t in rb.tensors}
arch = bytes(ra.fields['general.architecture'].parts[-1]).decode()
w = GGUFWriter(out, arch)
for k, f in ra.fields.items():
    if k.startswith('GGUF.') or k == 'general.architecture':
        continue
    vt = f.types[0]
    if vt == GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == GGUFValueType.STRING:
            val = [bytes(f.parts[i]).decode('utf-8', 'replace') for i in f.data]
        else:
            val = [f.parts[i].tolist()[0] for i in f.data]
        w.add_key_value(k, val, vt, sub_type=sub)
    elif vt == GGUFValueType.STRING:
        w.add_key_value(k, bytes(f.parts[-1]).decode('utf-8', 'replace'), vt)
    else:
        w.add_key_value(k, f.parts[-1].tolist()[0], vt)
n = 0
for t in ra.tensors:
    src = tb[t.name] if re.search(rx, t.name) else t
    n += src is not t
    shape = [int(x) for x in reversed(src.shape.tolist())]
    w.add_tensor(t.name, np.asarray(src.data), raw_dtype=src.tensor_type)
print(f"{n} tensors from {b}", file=sys.stderr)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
