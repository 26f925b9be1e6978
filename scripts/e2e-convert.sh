#!/usr/bin/env bash
# End-to-end check of `tq convert` on the real SmolLM2 (issue 4): dequantize to F16 with tq itself,
# convert to TQ4_1S with `pure` and `config-i`, then re-read each output with `tq inspect` and with
# gguf-py (fork type ids registered) and decode the TQ tensors with an independent numpy decoder
# (checked bit-exact against the conformance vectors first). Then the streaming bound on peak RSS
# for GGUF input and for a Hugging Face directory rebuilt from the same model (issue 5).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
out="$TQ_CACHE/e2e"; mkdir -p "$out"
conf="$TQ_ROOT/../shared/conformance"

"$tq" convert "$smol" --weights f16 -q -o "$out/smollm2-f16.gguf"
for recipe in pure config-i; do
  f="$out/smollm2-tq4_1s-$recipe.gguf"
  "$tq" convert "$out/smollm2-f16.gguf" --weights tq4_1s --recipe "$recipe" -q -o "$f"
  "$tq" inspect "$f" --json > "$f.json"
  py - "$f.json" "$recipe" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); recipe = sys.argv[2]
tot = {t["type"]: t["tensors"] for t in r["totals"]}
meta = {m["key"]: m["value"] for m in r["metadata"]}
assert meta["general.file_type"] == 44, meta["general.file_type"]
assert meta["tq.recipe"] == recipe
if recipe == "pure":
    assert tot == {"tq4_1s": 210, "q8_0": 1, "f32": 61}, tot
else:
    # 26 middle layers x 6 TQ tensors; ffn_down q4_K (1536 = 6 x 256); 4 boundary layers x 7 + token_embd q8_0
    assert tot.get("tq4_1s") == 26 * 6 and tot.get("q4_K") == 26 and tot.get("q8_0") == 4 * 7 + 1, tot
print(f"inspect {recipe}: {tot}, {r['bpw_2d']:.3f} bpw (2-D weights)")
PY
  py "$TQ_ROOT/scripts/dev/check_tq_gguf.py" "$out/smollm2-f16.gguf" "$f" --max-rel-mse 0.008 --conformance "$conf"
done

# Peak RSS: the goal (docs/bench/convert-throughput.md) is <= 3 x the largest tensor in f32 + 256 MiB, for GGUF
# input and for the same model as a Hugging Face directory (f16 shards). The HF reader must also
# drop each tensor's pages like the GGUF reader does: its peak may exceed the GGUF one by at most
# 64 MiB (before HfSource::release it was 312 MB vs 121 MB).
hf="$out/smollm2-hf-f16"
hf_dir "$smol" "$hf" --dtype f16 --shards 2
largest=$(py - "$out/smollm2-f16.gguf" <<'PY'
import sys, gguf, numpy as np
print(max(int(np.prod(t.shape)) for t in gguf.GGUFReader(sys.argv[1]).tensors) * 4)
PY
)
bound=$(( (3 * largest + 256 * 1024 * 1024) / 1024 ))
rss_gguf=$(peak_rss_kib "$tq" convert "$out/smollm2-f16.gguf" --weights q8_0 -q -o "$out/rss.gguf")
rss_hf=$(peak_rss_kib "$tq" convert "$hf" --weights q8_0 -q -o "$out/rss.gguf")
rm -f "$out/rss.gguf"
echo "peak RSS f16 -> q8_0: GGUF input $((rss_gguf / 1024)) MiB, HF directory $((rss_hf / 1024)) MiB (bound $((bound / 1024)) MiB)"
[ "$rss_gguf" -le "$bound" ] || { echo "error: GGUF input: peak RSS $rss_gguf KiB > $bound KiB" >&2; exit 1; }
[ "$rss_hf" -le "$bound" ] || { echo "error: HF input: peak RSS $rss_hf KiB > $bound KiB" >&2; exit 1; }
[ "$rss_hf" -le $(( rss_gguf + 64 * 1024 )) ] || { echo "error: HF input: peak RSS $rss_hf KiB, more than 64 MiB over the GGUF input's $rss_gguf KiB (pages not released?)" >&2; exit 1; }
echo "e2e-convert: OK"
