#!/usr/bin/env bash
# Issue 13 measurement: what LDLQ loses when tq calib stores Hessians in f32 (--store f32 /
# f32-upper) instead of f64. SmolLM2 F16, 4,096 Botchan tokens, TQ4_1S and q4_K with full-band
# LDLQ from each store, evaluated on wikitext-2 windows against the F16 logits: bytes that differ
# between the outputs, mean KLD, file sizes. Not part of CI (about 10 minutes on 2 cores).
#
#   bash scripts/bench-hessian-store.sh [CHUNKS]
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=${1:-10}
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
w="$TQ_CACHE/hstore"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")
smollm2_ref_logits "$tq" "$w" "$chunks"
# Each store's file is named H.safetensors in its own folder, so the outputs' provenance (which
# records the --calib name) is the same length and `cmp` counts tensor bytes only.
echo "| store | Hessian file bytes | weights | output bytes differing from f64's | mean KLD vs F16 | same top-1 % |"
echo "|---|---|---|---|---|---|"
for store in f64 f32 f32-upper; do
  mkdir -p "$w/$store"; h="$w/$store/H.safetensors"
  [ -f "$h" ] || "$tq" calib "$f16" --text "$botchan" --tokens 4096 --store "$store" -o "$h" 2> "$w/calib-$store.log"
  for wt in tq4_1s q4_K; do
    o="$w/$store/$wt.gguf"
    [ -f "$o" ] || "$tq" convert "$f16" --weights "$wt" --calib "$h" -q -o "$o"
    [ -s "$w/$store/eval-$wt.json" ] || "$tq" eval "$o" --ref-logits "$w/ref.logits" -q --json > "$w/$store/eval-$wt.json"
    diff=$( (cmp -l "$w/f64/$wt.gguf" "$o" 2>/dev/null || true) | wc -l)
    py - "$store" "$h" "$wt" "$diff" "$w/$store/eval-$wt.json" <<'PY'
import json, os, sys
store, h, wt, diff, r = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.load(open(sys.argv[5]))["result"]
k = r["kld"]
print(f"| {store} | {os.path.getsize(h)} | {wt} | {diff} | {k['kld']['value']:.5f} ± {k['kld']['err']:.5f} | {100 * k['same_top']['value']:.2f} |")
PY
  done
done
