#!/usr/bin/env bash
# Issue 17 measurement: SmolLM2 F16 -> tq2_r (the seed design's 2-bit rotated weights),
# round-to-nearest vs LDLQ (band 64, full) at identical bytes, plus mixed recipes; calibrated on
# Botchan, evaluated on wikitext-2 windows (never used for calibration): mean KLD vs F16, PPL, file
# size, convert seconds. llama.cpp Q2_K/IQ2_* rows when its tools are built and tq decodes them.
# Not part of CI.
#
#   bash scripts/bench-2bit.sh [CHUNKS] [CALIB_TOKENS]
# Rows whose model and evaluation already exist in $TQ_CACHE/bench2bit are reused.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=${1:-10}; ctoks=${2:-8192}
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
w="$TQ_CACHE/bench2bit"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")
smollm2_ref_logits "$tq" "$w" "$chunks"
[ -f "$w/H.safetensors" ] || "$tq" calib "$f16" --text "$botchan" --tokens "$ctoks" -o "$w/H.safetensors" > "$w/calib.log" 2>&1

row() { # NAME FILE CONVERT_SECONDS
  [ -s "$w/eval-$1.json" ] && [ "$w/eval-$1.json" -nt "$2" ] ||
    "$tq" eval "$2" --ref-logits "$w/ref.logits" -q --json > "$w/eval-$1.json"
  py - "$1" "$2" "$w/eval-$1.json" "${3:-}" <<'PY'
import json, os, sys
name, path, r, secs = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))["result"], sys.argv[4]
k = r["kld"]
print(f"| {name} | {os.path.getsize(path)} | {os.path.getsize(path) * 8 / 134515008:.3f} | {r['ppl']['value']:.3f} | {k['kld']['value']:.5f} ± {k['kld']['err']:.5f} | {100 * k['same_top']['value']:.2f} | {secs or '-'} |")
PY
}

convert() { # OUT ARGS...: echoes the wall seconds (or "cached")
  local out=$1; shift
  if [ -f "$out" ]; then echo cached; return; fi
  local t0 t1; t0=$(date +%s.%N)
  "$tq" convert "$f16" "$@" -q -o "$out"
  t1=$(date +%s.%N); echo "$t1 $t0" | awk '{printf "%.1f", $1 - $2}'
}

echo "| model | bytes | bpw (file) | PPL | mean KLD vs F16 | same top-1 % | convert s |"
echo "|---|---|---|---|---|---|---|"
# name ; convert flags ; LDLQ bands (the mixed rows keep some tensors at 4 bits; the -e4 rows store
# token_embd as q4_0 instead of q8_0 to reach ≈3 bpw of the whole file)
while IFS=';' read -r name flags bands; do
  [ -z "$name" ] && continue
  s=$(convert "$w/$name.gguf" $flags)
  row "$name" "$w/$name.gguf" "$s"
  for band in ${BANDS:-$bands}; do
    b=$([ "$band" = 0 ] && echo full || echo "$band")
    s=$(convert "$w/$name-ldlq$b.gguf" $flags --calib "$w/H.safetensors" --ldlq-band "$band")
    row "$name LDLQ band $b" "$w/$name-ldlq$b.gguf" "$s"
  done
done <<'ROWS'
tq2_r;--weights tq2_r;64 0
mix-ffn2-attn4;--weights tq2_r --tensor-type attn_=tq4_1s;64 0
mix-gateup2;--weights tq4_1s --tensor-type ffn_(gate|up)=tq2_r;64 0
tq2_r-e4;--weights tq2_r --token-embedding-type q4_0;0
mix-down2-e4;--weights tq4_1s --tensor-type ffn_down=tq2_r --token-embedding-type q4_0;0
ROWS
