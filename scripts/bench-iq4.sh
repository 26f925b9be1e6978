#!/usr/bin/env bash
# Issue 18, IQ4_NL: tq's encoders (round-to-nearest, llama.cpp's imatrix, LDLQ) against llama.cpp's
# IQ4_NL with and without its imatrix on SmolLM2, at the same tensor types (so the same bytes).
# Reuses the setup of scripts/bench-stock-ldlq.sh (run it first: F16 model, Hessians, llama.cpp's
# imatrix and the F16 reference logits in $TQ_CACHE/i18), then checks that upstream
# llama-perplexity loads tq's LDLQ file and agrees with `tq eval`'s PPL.
#   bash scripts/bench-iq4.sh [TYPE]      (TYPE: IQ4_NL (default) or IQ4_XS)
# Rows whose model and evaluation already exist in $TQ_CACHE/i18 are reused (delete to redo).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
T=${1:-IQ4_NL}; t=$(echo "$T" | tr 'A-Z' 'a-z')
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
[ -f "$wiki" ] || wiki="$TQ_CACHE/text/wikitext-2-raw-test.txt"
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
bin=$("$TQ_ROOT/scripts/build-llama.sh")
w="$TQ_CACHE/i18"
f16="$w/smollm2-f16.gguf"
for f in "$f16" "$w/ref.logits" "$w/H.safetensors" "$w/imatrix.gguf"; do
  [ -e "$f" ] || { echo "error: $f missing; run scripts/bench-stock-ldlq.sh first" >&2; exit 1; }
done
[ -f "$w/llama-$T.gguf" ] || "$bin/llama-quantize" "$f16" "$w/llama-$T.gguf" "$T" 2 > "$w/quantize-$t-plain.log" 2>&1
[ -f "$w/llama-$T-imatrix.gguf" ] || "$bin/llama-quantize" --imatrix "$w/imatrix.gguf" "$f16" "$w/llama-$T-imatrix.gguf" "$T" 2 > "$w/quantize-$t.log" 2>&1

# llama.cpp's per-tensor types from its log (token_embd and the 576-column fallbacks included).
types="$w/$t-types.txt"
grep -oE "\] +[a-z0-9_.]+ +- .*converting to [a-zA-Z0-9_]+" "$w/quantize-$t.log" |
  awk '{n=$2; t=$NF; gsub(/\./,"\\.",n); print "^" n "$=" t}' > "$types"
echo "llama.cpp $T types: $(cut -d= -f2 "$types" | sort | uniq -c | tr '\n' ' ')" >&2

row() { # NAME FILE CONVERT_SECONDS
  [ -s "$w/eval-$(basename "$2" .gguf).json" ] && [ "$w/eval-$(basename "$2" .gguf).json" -nt "$2" ] ||
    "$tq" eval "$2" --ref-logits "$w/ref.logits" -q --json > "$w/eval-$(basename "$2" .gguf).json"
  python3 - "$1" "$2" "$w/eval-$(basename "$2" .gguf).json" "${3:-}" <<'PY'
import json, os, sys
name, path, r, secs = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))["result"], sys.argv[4]
k = r["kld"]
print(f"| {name} | {os.path.getsize(path)} | {r['ppl']['value']:.3f} | {k['kld']['value']:.5f} ± {k['kld']['err']:.5f} | {100 * k['same_top']['value']:.2f} | {secs or '-'} |", flush=True)
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
row "llama.cpp $T" "$w/llama-$T.gguf"
row "llama.cpp $T + imatrix" "$w/llama-$T-imatrix.gguf"
s=$(convert "$w/tq-$t-rtn.gguf"); row "tq, same types, round-to-nearest" "$w/tq-$t-rtn.gguf" "$s"
s=$(convert "$w/tq-$t-imatrix.gguf" --imatrix "$w/imatrix.gguf")
row "tq, same types, --imatrix (llama.cpp's)" "$w/tq-$t-imatrix.gguf" "$s"
s=$(convert "$w/tq-$t-ldlq0.gguf" --calib "$w/H.safetensors" --ldlq-band 0)
row "tq, same types, LDLQ full band" "$w/tq-$t-ldlq0.gguf" "$s"
lp="$w/lp-tq-$t-ldlq0.log"
[ -s "$lp" ] || "$bin/llama-perplexity" -m "$w/tq-$t-ldlq0.gguf" -f "$wiki" -c 512 --chunks 10 -t 2 > "$lp" 2>&1
echo "llama-perplexity on tq-$t-ldlq0.gguf: $(grep -oE 'Final estimate: PPL = [0-9.]+ \+/- [0-9.]+' "$lp")"
