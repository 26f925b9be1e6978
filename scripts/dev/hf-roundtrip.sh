#!/usr/bin/env bash
# Dev check (issue 5), the full-model Hugging Face round trip on the real SmolLM2 (30 layers):
#
#   1. scripts/dev/make_hf_dir.py rebuilds SmolLM2-135M-Instruct as a Hugging Face directory
#      (f16 shards + index, q/k rows un-permuted, config/tokenizer files reconstructed) with
#      gguf-py / numpy / safetensors / tokenizers only;
#   2. tq converts the original GGUF (a.gguf: its dequantized tensors) and the directory (b.gguf)
#      with --weights f16 --no-provenance;
#   3. gguf-py compares them: same tensor names, order, shapes, types and bytes (every tensor
#      bit-exact), the same metadata (every key and value; the order may differ), and b.gguf has
#      every key of the original Q4_1 file with the same value (but general.file_type: 3 there, 1
#      here);
#   4. upstream llama-perplexity (scripts/build-llama.sh) runs on both with the same text and
#      settings and the two PPLs must be equal.
#
#   scripts/dev/hf-roundtrip.sh [--chunks N] [--ctx N] [--threads N] [TEXT]
#
# Defaults: docs/DATA.md's reference setting (-c 512 --chunks 20 -t 2) on the wikitext-2 test text
# in ../shared/data. Work files go to $TQ_CACHE/hf-roundtrip/ (logs: ppl-a.log, ppl-b.log).
source "$(dirname "$0")/../common.sh"
chunks=20; ctx=512; threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --chunks) chunks="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    *) break ;;
  esac
done
text="${1:-$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt}"
[ -f "$text" ] || { echo "error: $text: no such text file (pass one)" >&2; exit 2; }
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
bin=$(llama_bin)
TQ_BIN=$(tq_bin)
work="$TQ_CACHE/hf-roundtrip"; mkdir -p "$work"
dir="$work/smol-f16"

hf_dir "$smol" "$dir" --dtype f16 --shards 2
"$TQ_BIN" convert "$smol" --weights f16 --no-provenance -q -o "$work/a.gguf"
"$TQ_BIN" convert "$dir" --weights f16 --no-provenance -q -o "$work/b.gguf"

py - "$smol" "$work/a.gguf" "$work/b.gguf" <<'PY'
import sys
import numpy as np
import gguf

orig, a, b = (gguf.GGUFReader(p) for p in sys.argv[1:4])

def fields(r):
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        v = f.contents()
        out[k] = (f.types, v)
    return out

# Tensors: bit-exact.
assert [t.name for t in a.tensors] == [t.name for t in b.tensors], "tensor names/order differ"
for ta, tb in zip(a.tensors, b.tensors):
    assert ta.tensor_type == tb.tensor_type, f"{ta.name}: type {ta.tensor_type.name} vs {tb.tensor_type.name}"
    assert list(ta.shape) == list(tb.shape), f"{ta.name}: shape {ta.shape} vs {tb.shape}"
    assert np.array_equal(np.asarray(ta.data).view(np.uint8), np.asarray(tb.data).view(np.uint8)), f"{ta.name}: data differs"
print(f"tensors: {len(b.tensors)} of {len(orig.tensors)} (original), names/order/shapes/types equal, data bit-exact")

# Metadata: a and b identical; b has every key of the original (but the file type).
fa, fb, fo = fields(a), fields(b), fields(orig)
# Key order carries no meaning in GGUF: a.gguf keeps the original file's order (an older
# convert_hf_to_gguf's), b.gguf the order the vendored convert_hf_to_gguf writes; shown, not checked.
assert set(fa) == set(fb), f"keys differ: {sorted(set(fa) ^ set(fb))}"
moved = [k for i, k in enumerate(fb) if i >= len(fa) or list(fa)[i] != k]
for k in fa:
    assert fa[k] == fb[k], f"{k}: {str(fa[k][1])[:80]} vs {str(fb[k][1])[:80]}"
diff = [k for k in fo if k != "general.file_type" and fo[k] != fb.get(k)]
assert not diff, f"keys of the original written differently or not at all: {diff}"
assert fo["general.file_type"][1] == 3 and fb["general.file_type"][1] == 1
extra = sorted(set(fb) - set(fo))
print(f"metadata: {len(fb)} keys, a.gguf == b.gguf for all; all {len(fo)} keys of the original equal "
      f"(general.file_type 3 -> 1); keys not in the original: {extra or 'none'}; "
      f"in another position than in a.gguf: {moved or 'none'}")
PY

ppl() {
  "$bin/llama-perplexity" -m "$1" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" > "$2" 2>&1 \
    || { tail -5 "$2" >&2; echo "error: llama-perplexity failed on $1 (log: $2)" >&2; exit 1; }
  sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 \2/p' "$2"
}
t0=$(date +%s)
pa=$(ppl "$work/a.gguf" "$work/ppl-a.log")
pb=$(ppl "$work/b.gguf" "$work/ppl-b.log")
t1=$(date +%s)
echo "llama-perplexity -c $ctx --chunks $chunks -t $threads $(basename "$text"): dequantized GGUF $pa, HF directory $pb ($((t1 - t0)) s for both)"
[ -n "$pa" ] && [ "$pa" = "$pb" ] || { echo "error: perplexities differ (logs: $work/ppl-a.log, $work/ppl-b.log)" >&2; exit 1; }
ca=$(grep -o '\[[0-9]*\][0-9.]*' "$work/ppl-a.log" | tr '\n' ' ')
cb=$(grep -o '\[[0-9]*\][0-9.]*' "$work/ppl-b.log" | tr '\n' ' ')
[ "$ca" = "$cb" ] || { echo "error: per-chunk perplexities differ" >&2; exit 1; }
echo "hf-roundtrip: OK (per-chunk PPLs identical too)"
