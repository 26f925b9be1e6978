#!/usr/bin/env bash
# End-to-end check of `tq convert` on the real SmolLM2 (issue 4): dequantize to F16 with tq itself,
# convert to TQ4_1S with `pure` and `config-i`, then re-read each output with `tq inspect` and with
# gguf-py (fork type ids registered) and decode the TQ tensors with an independent numpy decoder
# (checked bit-exact against the conformance vectors first).
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
echo "e2e-convert: OK"
