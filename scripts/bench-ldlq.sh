#!/usr/bin/env bash
# Issue 7 measurement: SmolLM2 F16 -> TQ4_1S, round-to-nearest vs LDLQ (bands 16/64/256/full),
# calibrated on Botchan (registry text), evaluated on wikitext-2 windows (never used for
# calibration): mean KLD vs F16 and PPL, file sizes. Also llama.cpp's Q4_K_M and Q5_0 on the same
# input for reference. Not part of CI (about 20-40 minutes on 2 cores).
#
#   bash scripts/bench-ldlq.sh [CHUNKS] [CALIB_TOKENS]
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=${1:-10}; ctoks=${2:-8192}
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
w="$TQ_CACHE/ldlq"; mkdir -p "$w"
f16="$w/smollm2-f16.gguf"
[ -f "$f16" ] || "$tq" convert "$smol" --weights f16 -q -o "$f16"
[ -f "$w/ref.logits" ] || "$tq" eval "$f16" -f "$wiki" --chunks "$chunks" --save-logits "$w/ref.logits" -q --json > "$w/eval-f16.json"
[ -f "$w/H.safetensors" ] || "$tq" calib "$f16" --text "$botchan" --tokens "$ctoks" -o "$w/H.safetensors"

row() { # NAME FILE
  "$tq" eval "$2" --ref-logits "$w/ref.logits" -q --json > "$w/eval-$1.json"
  py - "$1" "$2" "$w/eval-$1.json" <<'PY'
import json, os, sys
name, path, r = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))["result"]
k = r["kld"]
print(f"| {name} | {os.path.getsize(path)} | {r['ppl']['value']:.3f} | {k['kld']['value']:.5f} ± {k['kld']['err']:.5f} | {100 * k['same_top']['value']:.2f} |")
PY
}

echo "| model | bytes | PPL | mean KLD vs F16 | same top-1 % |"
echo "|---|---|---|---|---|"
for recipe in pure config-i; do
  "$tq" convert "$f16" --weights tq4_1s --recipe "$recipe" -q -o "$w/rtn-$recipe.gguf"
  row "tq4_1s $recipe RTN" "$w/rtn-$recipe.gguf"
  for band in 16 64 256 0; do
    "$tq" convert "$f16" --weights tq4_1s --recipe "$recipe" --calib "$w/H.safetensors" --ldlq-band "$band" -q -o "$w/ldlq-$recipe-$band.gguf"
    row "tq4_1s $recipe LDLQ band $([ "$band" = 0 ] && echo full || echo "$band")" "$w/ldlq-$recipe-$band.gguf"
  done
done
bin=$("$TQ_ROOT/scripts/build-llama.sh")
for t in Q4_K_M Q5_0; do
  [ -f "$w/llama-$t.gguf" ] || "$bin/llama-quantize" "$f16" "$w/llama-$t.gguf" "$t" 2 >/dev/null 2>&1
  row "llama.cpp $t" "$w/llama-$t.gguf"
done
