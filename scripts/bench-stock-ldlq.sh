#!/usr/bin/env bash
# Issue 18 measurement: LDLQ into stock GGUF types, at the same tensor types (so the same bytes)
# as llama.cpp's Q4_K_M + imatrix on SmolLM2. Same setup as the issue-7 rows of
# docs/bench/stock-ldlq.md: SmolLM2 dequantized to F16 by tq, Hessians from `tq calib` on 8,192 Botchan
# tokens (16 windows x 512), llama.cpp's imatrix from the same 16 windows, evaluation on the first
# 10 windows (ctx 512) of wikitext-2-raw-test (never used for calibration), KLD vs the F16 model.
# Not part of CI (about 15-25 minutes on 2 loaded cores).
#
#   bash scripts/bench-stock-ldlq.sh [CHUNKS] [CALIB_TOKENS]
# Rows whose model and evaluation already exist in $TQ_CACHE/i18 are reused (delete to redo).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=${1:-10}; ctoks=${2:-8192}
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
bin=$("$TQ_ROOT/scripts/build-llama.sh")
w="$TQ_CACHE/i18"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")
smollm2_ref_logits "$tq" "$w" "$chunks"
[ -f "$w/H.safetensors" ] || "$tq" calib "$f16" --text "$botchan" --tokens "$ctoks" -o "$w/H.safetensors" --imatrix-out "$w/tq-imatrix.gguf"
[ -f "$w/imatrix.gguf" ] || "$bin/llama-imatrix" -m "$f16" -f "$botchan" -o "$w/imatrix.gguf" -c 512 --chunks $((ctoks / 512)) -t 2 >/dev/null 2>&1
[ -f "$w/llama-Q4_K_M.gguf" ] || "$bin/llama-quantize" "$f16" "$w/llama-Q4_K_M.gguf" Q4_K_M 2 > "$w/quantize-plain.log" 2>&1
[ -f "$w/llama-Q4_K_M-imatrix.gguf" ] || "$bin/llama-quantize" --imatrix "$w/imatrix.gguf" "$f16" "$w/llama-Q4_K_M-imatrix.gguf" Q4_K_M 2 > "$w/quantize.log" 2>&1

# llama.cpp's Q4_K_M types, tensor by tensor, from its log (q4_K/q6_K fall back to q5_0/q8_0 on
# SmolLM2's 576-column matrices; token_embd is q8_0).
types="$w/q4km-types.txt"
grep -oE "\] +[a-z0-9_.]+ +- .*converting to [a-zA-Z0-9_]+" "$w/quantize.log" |
  awk '{n=$2; t=$NF; gsub(/\./,"\\.",n); print "^" n "$=" t}' > "$types"
grep -q '^\^token_embd' "$types" || echo '^token_embd\.weight$=q8_0' >> "$types"

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
  "$tq" convert "$f16" --target upstream --tensor-type-file "$types" "$@" -q -o "$out"
  t1=$(date +%s.%N); echo "$t1 $t0" | awk '{printf "%.1f", $1 - $2}'
}

echo "| model | bytes | PPL | mean KLD vs F16 | same top-1 % | convert s |"
echo "|---|---|---|---|---|---|"
row "llama.cpp Q4_K_M" "$w/llama-Q4_K_M.gguf"
row "llama.cpp Q4_K_M + imatrix" "$w/llama-Q4_K_M-imatrix.gguf"
s=$(convert "$w/tq-q4km-rtn.gguf"); row "tq Q4_K_M types RTN" "$w/tq-q4km-rtn.gguf" "$s"
s=$(convert "$w/tq-q4km-imatrix.gguf" --imatrix "$w/imatrix.gguf")
row "tq Q4_K_M types + llama.cpp imatrix (diagonal)" "$w/tq-q4km-imatrix.gguf" "$s"
for band in ${BANDS:-64 0}; do
  s=$(convert "$w/tq-q4km-ldlq$band.gguf" --calib "$w/H.safetensors" --ldlq-band "$band")
  row "tq Q4_K_M types + LDLQ band $([ "$band" = 0 ] && echo full || echo "$band")" "$w/tq-q4km-ldlq$band.gguf" "$s"
done
