#!/usr/bin/env bash
# Issue 18, part 2: `tq convert --target-bpw / --target-size` on SmolLM2 against llama.cpp's types
# by file size. Same setup as scripts/bench-stock-ldlq.sh (whose cache in $TQ_CACHE/i18 it reuses):
# SmolLM2 F16, Hessians from `tq calib` on 8,192 Botchan tokens, llama.cpp's imatrix from the same
# windows, evaluation on the first 10 wikitext-2 windows (never used for calibration or for the
# mix's KLD fit, which runs on Botchan), KLD vs the F16 model's saved distributions.
# Not part of CI (each tq point: sensitivity + fit + LDLQ conversion + evaluation, minutes on 2 cores).
#
#   bash scripts/bench-mix.sh [POINTS...]
# POINTS: upstream:3.5 fork:4.0 upstream:q4km fork:q4km llama:Q4_K_M llama:Q4_K_M:imatrix ...
# and, per llama.cpp preset P: preset:P (tq --preset P --calib H: LDLQ at the preset's types) and
# mix:P (the upstream mix at llama.cpp P + imatrix's bytes; all mix:P points share one
# --mix-cache, so the sensitivity, the fit and every measured plan are measured once).
# (default: the whole curve). Rows whose files exist are reused; results go to $W/mix.tsv, where
# W=${TQ_MIX_DIR:-$TQ_CACHE/i18} holds smollm2-f16.gguf, ref.logits, imatrix.gguf and
# H.safetensors (or TQ_MIX_H=FILE).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
tq=$(tq_bin)   # $TQ_BIN, else this checkout's release build
bin=$("$TQ_ROOT/scripts/build-llama.sh")
w="${TQ_MIX_DIR:-$TQ_CACHE/i18}"
f16="$w/smollm2-f16.gguf"
H="${TQ_MIX_H:-$w/H.safetensors}"
for f in "$f16" "$H" "$w/ref.logits" "$w/imatrix.gguf"; do
  [ -e "$f" ] || { echo "error: $f missing: run scripts/bench-stock-ldlq.sh first" >&2; exit 1; }
done
q4km=$(stat -L -c %s "$w/llama-Q4_K_M-imatrix.gguf")
out="$w/mix.tsv"; touch "$out"

evalrow() { # NAME FILE EXTRA_JSON
  local j="$w/eval-$1.json"
  [ -s "$j" ] && [ "$j" -nt "$2" ] || "$tq" eval "$2" --ref-logits "$w/ref.logits" -q --json > "$j"
  # flock: two runs of this script may share the table.
  flock "$out.lock" bash -c 'source "$0"/scripts/common.sh; py - "$@"' "$TQ_ROOT" "$1" "$2" "$j" "${3:-}" "$out" <<'PY'
import json, os, sys
name, path, r, extra, out = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))["result"], sys.argv[4], sys.argv[5]
k = r["kld"]
m = json.load(open(extra)).get("mix") if extra else None
pred = f"{m['predicted_kld']:.5f}" if m and m.get("predicted_kld") is not None else "-"
t = f"{m['sensitivity_seconds'] + m['fit_seconds'] + m['dp_seconds'] + m.get('plans_seconds', 0):.1f}" if m else "-"
r2 = f"{m['r2_roles']:.3f}" if m and m.get("r2_roles") is not None else "-"
size = os.path.getsize(path)
row = [name, size, f"{size * 8 / 134515008:.3f}", f"{r['ppl']['value']:.3f}", f"{k['kld']['value']:.5f}", f"{k['kld']['err']:.5f}", f"{100 * k['same_top']['value']:.2f}", pred, r2, t]
lines = [l for l in open(out).read().splitlines() if l and not l.startswith(name + "\t")]
lines.append("\t".join(map(str, row)))
open(out, "w").write("\n".join(sorted(lines)) + "\n")
print("| " + " | ".join(map(str, row)) + " |")
PY
}

tqpoint() { # PROFILE BPW|q4km
  local prof=$1 x=$2 name="tq-$1-$2" flag
  if [ "$x" = q4km ]; then flag=(--target-size "$q4km"); else flag=(--target-bpw "$x"); fi
  if [ ! -f "$w/$name.gguf" ]; then
    /usr/bin/time -v "$tq" convert "$f16" --target "$prof" "${flag[@]}" --calib "$H" \
      --kld-text "$botchan" --json -q -o "$w/$name.gguf" > "$w/$name.json" 2> "$w/$name.time"
  fi
  evalrow "$name" "$w/$name.gguf" "$w/$name.json"
}

llamapoint() { # TYPE [imatrix]
  local t=$1 name="llama-$1${2:+-imatrix}"
  if [ ! -f "$w/$name.gguf" ]; then
    "$bin/llama-quantize" ${2:+--imatrix "$w/imatrix.gguf"} "$f16" "$w/$name.gguf" "$t" 2 > "$w/quantize-$name.log" 2>&1
  fi
  evalrow "$name" "$w/$name.gguf"
}

presetpoint() { # PRESET: tq --preset P, LDLQ'd
  local name="tq-$1-ldlq"
  if [ ! -f "$w/$name.gguf" ]; then
    /usr/bin/time -v "$tq" convert "$f16" --preset "$1" --calib "$H" -q -o "$w/$name.gguf" 2> "$w/$name.time"
  fi
  evalrow "$name" "$w/$name.gguf"
}

mixpoint() { # PRESET: the upstream mix at llama.cpp PRESET + imatrix's bytes
  local name="tq-mix-$1"
  llamapoint "$1" imatrix
  if [ ! -f "$w/$name.gguf" ]; then
    /usr/bin/time -v "$tq" convert "$f16" --target upstream --target-size "$(stat -L -c %s "$w/llama-$1-imatrix.gguf")" \
      --calib "$H" --kld-text "$botchan" --mix-cache "$w/mix-cache.json" --json -q -o "$w/$name.gguf" \
      > "$w/$name.json" 2> "$w/$name.time"
  fi
  evalrow "$name" "$w/$name.gguf" "$w/$name.json"
}

points=("$@")
if [ ${#points[@]} = 0 ]; then
  points=(upstream:q4km fork:q4km)
  for b in 3.0 3.5 4.0 4.5 5.0 6.0; do points+=("upstream:$b"); done
  for t in Q3_K_M Q4_K_M Q5_K_M Q6_K Q8_0; do points+=("llama:$t" "llama:$t:imatrix"); done
  for b in 3.0 3.5 4.0 4.5 5.0 6.0; do points+=("fork:$b"); done
fi
echo "| model | bytes | bpw | PPL | mean KLD | ± | same top-1 % | predicted KLD | fit R² (per role, ln) | mix s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for p in "${points[@]}"; do
  IFS=: read -r a b c <<< "$p"
  case $a in
    llama) llamapoint "$b" "$c" ;;
    preset) presetpoint "$b" ;;
    mix) mixpoint "$b" ;;
    *) tqpoint "$a" "$b" ;;
  esac
done
