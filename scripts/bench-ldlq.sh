#!/usr/bin/env bash
# Issue 7 measurement: SmolLM2 F16 -> TQ4_1S, round-to-nearest vs LDLQ (bands 16/64/256/full),
# calibrated on Botchan (registry text), evaluated on wikitext-2 windows (never used for
# calibration): mean KLD vs F16 and PPL, file sizes. Also llama.cpp's Q4_K_M and Q5_0 on the same
# input for reference. Not part of CI (about 20-40 minutes on 2 cores).
#
#   bash scripts/bench-ldlq.sh [CHUNKS] [CALIB_TOKENS]
#   TYPES="tq3_1s" RECIPES=pure BANDS="64 256" bash scripts/bench-ldlq.sh   # a subset
# Rows whose model and evaluation already exist in $TQ_CACHE/ldlq are reused (delete to redo).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=${1:-10}; ctoks=${2:-8192}
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
w="$TQ_CACHE/ldlq"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")
smollm2_ref_logits "$tq" "$w" "$chunks"
[ -f "$w/H.safetensors" ] || "$tq" calib "$f16" --text "$botchan" --tokens "$ctoks" -o "$w/H.safetensors"

row() { # NAME FILE CONVERT_SECONDS
  [ -s "$w/eval-$1.json" ] && [ "$w/eval-$1.json" -nt "$2" ] ||
    "$tq" eval "$2" --ref-logits "$w/ref.logits" -q --json > "$w/eval-$1.json"
  py - "$1" "$2" "$w/eval-$1.json" "${3:-}" <<'PY'
import json, os, sys
name, path, r, secs = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))["result"], sys.argv[4]
k = r["kld"]
print(f"| {name} | {os.path.getsize(path)} | {r['ppl']['value']:.3f} | {k['kld']['value']:.5f} ± {k['kld']['err']:.5f} | {100 * k['same_top']['value']:.2f} | {secs or '-'} |")
PY
}

# convert OUT ARGS...: converts unless OUT exists; echoes the wall seconds (or "cached").
convert() {
  local out=$1; shift
  if [ -f "$out" ]; then echo cached; return; fi
  local t0 t1; t0=$(date +%s.%N)
  "$tq" convert "$f16" "$@" -q -o "$out"
  t1=$(date +%s.%N); echo "$t1 $t0" | awk '{printf "%.1f", $1 - $2}'
}

echo "| model | bytes | PPL | mean KLD vs F16 | same top-1 % | convert s |"
echo "|---|---|---|---|---|---|"
for type in ${TYPES-tq4_1s tq3_1s}; do
  for recipe in ${RECIPES:-pure config-i}; do
    [ "$type" = tq4_1s ] && sfx="" || sfx="-$type"
    s=$(convert "$w/rtn-$recipe$sfx.gguf" --weights "$type" --recipe "$recipe")
    row "$type $recipe RTN" "$w/rtn-$recipe$sfx.gguf" "$s"
    for band in ${BANDS:-16 64 256 0}; do
      s=$(convert "$w/ldlq-$recipe-$band$sfx.gguf" --weights "$type" --recipe "$recipe" --calib "$w/H.safetensors" --ldlq-band "$band")
      row "$type $recipe LDLQ band $([ "$band" = 0 ] && echo full || echo "$band")" "$w/ldlq-$recipe-$band$sfx.gguf" "$s"
    done
  done
done
bin=$("$TQ_ROOT/scripts/build-llama.sh")
# llama.cpp's imatrix from the same calibration windows, for the fair "calibrated vs calibrated" rows.
[ -f "$w/imatrix.gguf" ] || "$bin/llama-imatrix" -m "$f16" -f "$botchan" -o "$w/imatrix.gguf" -c 512 --chunks $((ctoks / 512)) -t 2 >/dev/null 2>&1
for t in Q4_K_M Q5_0; do
  [ -f "$w/llama-$t.gguf" ] || "$bin/llama-quantize" "$f16" "$w/llama-$t.gguf" "$t" 2 >/dev/null 2>&1
  row "llama.cpp $t" "$w/llama-$t.gguf"
  [ -f "$w/llama-$t-imatrix.gguf" ] || "$bin/llama-quantize" --imatrix "$w/imatrix.gguf" "$f16" "$w/llama-$t-imatrix.gguf" "$t" 2 >/dev/null 2>&1
  row "llama.cpp $t + imatrix" "$w/llama-$t-imatrix.gguf"
done
