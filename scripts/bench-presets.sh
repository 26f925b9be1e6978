#!/usr/bin/env bash
# llama.cpp presets by name (docs/bench/presets.md): SmolLM2 `tq convert --preset Q4_K_M --calib
# botchan.txt` against llama-quantize Q4_K_M + an imatrix from llama-imatrix on the same text.
# Setup as scripts/bench-stock-ldlq.sh: SmolLM2 dequantized to F16 by tq (lossless from its Q4_1),
# 8,192 Botchan tokens (16 windows x 512) for both calibrations, evaluation on the first 10 windows
# (ctx 512) of wikitext-2-raw-test (never used for calibration), KLD vs the F16 model.
# Not part of CI (about 10-20 minutes on 2 loaded cores).
#
#   bash scripts/bench-presets.sh [CHUNKS] [CALIB_TOKENS]
# Outputs under $TQ_CACHE/presets are reused when present (delete to redo).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=${1:-10}; ctoks=${2:-8192}
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
bin=$("$TQ_ROOT/scripts/build-llama.sh")
w="$TQ_CACHE/presets"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")
smollm2_ref_logits "$tq" "$w" "$chunks"
[ -f "$w/imatrix.gguf" ] || "$bin/llama-imatrix" -m "$f16" -f "$botchan" -o "$w/imatrix.gguf" -c 512 --chunks $((ctoks / 512)) -t 2 >/dev/null 2>&1
[ -f "$w/llama-Q4_K_M.gguf" ] || "$bin/llama-quantize" "$f16" "$w/llama-Q4_K_M.gguf" Q4_K_M 2 > "$w/quantize-plain.log" 2>&1
[ -f "$w/llama-Q4_K_M-imatrix.gguf" ] || "$bin/llama-quantize" --imatrix "$w/imatrix.gguf" "$f16" "$w/llama-Q4_K_M-imatrix.gguf" Q4_K_M 2 > "$w/quantize.log" 2>&1

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

convert() { # OUT ARGS...: converts unless OUT exists; echoes the wall seconds (or "cached").
  local out=$1; shift
  if [ -f "$out" ]; then echo cached; return; fi
  local t0 t1; t0=$(date +%s.%N)
  "$tq" convert "$f16" --target upstream --preset Q4_K_M "$@" -q -o "$out"
  t1=$(date +%s.%N); echo "$t1 $t0" | awk '{printf "%.1f", $1 - $2}'
}

echo "| model | bytes | PPL | mean KLD vs F16 | same top-1 % | convert s |"
echo "|---|---|---|---|---|---|"
row "llama.cpp Q4_K_M" "$w/llama-Q4_K_M.gguf"
row "llama.cpp Q4_K_M + imatrix" "$w/llama-Q4_K_M-imatrix.gguf"
s=$(convert "$w/tq-Q4_K_M.gguf"); row "tq --preset Q4_K_M" "$w/tq-Q4_K_M.gguf" "$s"
s=$(convert "$w/tq-Q4_K_M-imatrix.gguf" --imatrix "$w/imatrix.gguf")
row "tq --preset Q4_K_M --imatrix (llama.cpp's)" "$w/tq-Q4_K_M-imatrix.gguf" "$s"
s=$(convert "$w/tq-Q4_K_M-calib.gguf" --calib "$botchan" --calib-tokens "$ctoks")
row "tq --preset Q4_K_M --calib botchan" "$w/tq-Q4_K_M-calib.gguf" "$s"
