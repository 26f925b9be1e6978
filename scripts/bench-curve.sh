#!/usr/bin/env bash
# Issue 30, "the curve": KLD vs file size on SmolLM2 for every llama-quantize preset tq writes,
# three methods per preset, on the setup of scripts/bench-presets.sh (its cache $TQ_CACHE/presets:
# smollm2-f16.gguf, ref.logits of 10 wikitext-2 windows, imatrix.gguf from 8,192 Botchan tokens):
#   llama:P:imatrix  llama-quantize --imatrix imatrix.gguf F16 P
#   preset:P         tq convert F16 --preset P --calib H.safetensors (LDLQ, default settings)
#   llama:P          llama-quantize F16 P, no imatrix (skipped where llama-quantize refuses)
# Every row is a point of scripts/bench-mix.sh (same names, same $W/mix.tsv, so the mix points
# `mix:P` of that script join the same table); the plot is scripts/plot-curve.py.
# Resumable: a file or an evaluation already made is reused (delete it to redo). Not part of CI
# (one LDLQ conversion and up to three evaluations per preset: hours on 2 loaded cores; the
# points run preset by preset, so a shorter TQ_CURVE_PRESETS list or order gets the chosen ones
# first).
#
#   bash scripts/bench-curve.sh [PHASE...]     PHASE: imatrix ldlq plain (default: all three)
# Env: TQ_BIN (the tq binary; default: this checkout's, built), TQ_MIX_DIR (default
# $TQ_CACHE/presets), TQ_MIX_H (default $TQ_MIX_DIR/H.safetensors, made by `tq calib` on the same
# 8,192 Botchan tokens when missing), TQ_CURVE_PRESETS (the presets, in the order to measure).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
export TQ_MIX_DIR="${TQ_MIX_DIR:-$TQ_CACHE/presets}"
w="$TQ_MIX_DIR"
export TQ_MIX_H="${TQ_MIX_H:-$w/H.safetensors}"
phases=("$@"); [ ${#phases[@]} -gt 0 ] || phases=(imatrix ldlq plain)
presets=(${TQ_CURVE_PRESETS:-Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_0 Q4_1 Q4_K_S Q4_K_M Q5_0 Q5_1
  Q5_K_S Q5_K_M Q6_K Q8_0 IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ4_NL
  IQ4_XS TQ1_0 TQ2_0})
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
bin=$("$TQ_ROOT/scripts/build-llama.sh")
f16="$w/smollm2-f16.gguf"
for f in "$f16" "$w/ref.logits" "$w/imatrix.gguf"; do
  [ -e "$f" ] || { echo "error: $f missing: run scripts/bench-presets.sh first" >&2; exit 1; }
done

# llama-quantize P [imatrix] into llama-P[-imatrix].gguf (through a temporary name: an interrupted
# run leaves no file that looks done). A refusal is recorded in $w/curve-refused.txt and skipped.
quantize() {
  local p=$1 name="llama-$1${2:+-imatrix}"
  [ -f "$w/$name.gguf" ] && return 0
  grep -qx "$name" "$w/curve-refused.txt" 2>/dev/null && return 1
  if nice "$bin/llama-quantize" ${2:+--imatrix "$w/imatrix.gguf"} "$f16" "$w/$name.tmp.gguf" "$p" 2 \
    > "$w/quantize-$name.log" 2>&1; then
    mv "$w/$name.tmp.gguf" "$w/$name.gguf"
  else
    rm -f "$w/$name.tmp.gguf"; echo "$name" >> "$w/curve-refused.txt"
    echo "llama-quantize refuses $p${2:+ with imatrix}: $(grep -m1 -i 'error\|please\|fail' "$w/quantize-$name.log")" >&2
    return 1
  fi
}

# Presets whose tensors get the same types as an earlier preset's (llama-quantize + imatrix's
# file, per-tensor types) collapse onto it: measured once. "P SAME_AS" lines, kept in
# $w/curve-collapsed.txt.
for p in "${presets[@]}"; do quantize "$p" imatrix || true; done
files=(); for p in "${presets[@]}"; do [ -f "$w/llama-$p-imatrix.gguf" ] && files+=("$p=$w/llama-$p-imatrix.gguf"); done
same=$(mktemp); trap 'rm -f "$same"' EXIT   # this run's list (two runs may share $w)
py - "${files[@]}" > "$same" <<'PY'
import sys
from gguf import GGUFReader
seen = {}
for arg in sys.argv[1:]:
    p, path = arg.split("=", 1)
    sig = tuple(sorted((t.name, int(t.tensor_type)) for t in GGUFReader(path).tensors))
    if sig in seen:
        print(p, seen[sig])
    else:
        seen[sig] = p
PY
cp "$same" "$w/curve-collapsed.txt"
collapsed() { grep -q "^$1 " "$same"; }
[ -s "$same" ] && sed 's/^/same per-tensor types as: /' "$same" >&2

tq=$(tq_bin)   # $TQ_BIN, else this checkout's release build
[ -e "$TQ_MIX_H" ] || nice "$tq" calib "$f16" --text "$botchan" --tokens 8192 -q -o "$TQ_MIX_H"
points=()   # preset by preset, in the list's order (TQ_CURVE_PRESETS puts the important ones first)
for p in "${presets[@]}"; do
  [ -f "$w/llama-$p-imatrix.gguf" ] || continue
  collapsed "$p" && continue
  for ph in "${phases[@]}"; do
    case $ph in
      imatrix) points+=("llama:$p:imatrix") ;;
      ldlq) points+=("preset:$p") ;;
      plain) quantize "$p" && points+=("llama:$p") ;;
      *) echo "error: unknown phase $ph (imatrix, ldlq or plain)" >&2; exit 2 ;;
    esac
  done
done
nice bash "$TQ_ROOT/scripts/bench-mix.sh" "${points[@]}"
