#!/usr/bin/env bash
# Issue 19 measurement: SmolLM2 F16 -> tq2_t (trellis-coded 2-bit) by Viterbi round-to-nearest and
# by block-LDLQ (full band), evaluated exactly as scripts/bench-2bit.sh evaluates tq2_r (the F16
# model, reference logits and Botchan Hessians it leaves in $TQ_CACHE/bench2bit are reused; run it
# first). Outputs go to $TQ_CACHE/bench2bit-trellis. Not part of CI.
#
#   bash scripts/bench-2bit-trellis.sh [ROW...]     (default: every row below)
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
[ -n "${TQ_SKIP_BUILD:-}" ] || cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
b="$TQ_CACHE/bench2bit"; w="$TQ_CACHE/bench2bit-trellis"; mkdir -p "$w"
f16="$b/smollm2-f16.gguf"
for f in "$f16" "$b/ref.logits" "$b/H.safetensors"; do
  [ -f "$f" ] || { echo "missing $f: run scripts/bench-2bit.sh first" >&2; exit 1; }
done

row() { # NAME FILE CONVERT_SECONDS
  [ -s "$w/eval-$1.json" ] && [ "$w/eval-$1.json" -nt "$2" ] ||
    "$tq" eval "$2" --ref-logits "$b/ref.logits" -q --json > "$w/eval-$1.json"
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
while IFS=';' read -r name flags; do
  [ -z "$name" ] && continue
  [ $# -gt 0 ] && [[ " $* " != *" $name "* ]] && continue
  flags=${flags//\$b/$b}
  s=$(convert "$w/$name.gguf" $flags)
  row "$name" "$w/$name.gguf" "$s"
done <<'ROWS'
tq2_t-ldlqfull;--weights tq2_t --calib $b/H.safetensors --ldlq-band 0
tq2_t;--weights tq2_t
mix-down2t-e4-ldlqfull;--weights tq4_1s --tensor-type ffn_down=tq2_t --token-embedding-type q4_0 --calib $b/H.safetensors --ldlq-band 0
tq2_t-ldlqfull-quad;--weights tq2_t --calib $b/H.safetensors --ldlq-band 0
mix-down2t-e4-ldlqfull-quad;--weights tq4_1s --tensor-type ffn_down=tq2_t --token-embedding-type q4_0 --calib $b/H.safetensors --ldlq-band 0
tq2_t-ldlqfull-beam;--weights tq2_t --calib $b/H.safetensors --ldlq-band 0
tq2_t-e4-ldlqfull;--weights tq2_t --token-embedding-type q4_0 --calib $b/H.safetensors --ldlq-band 0
ROWS
