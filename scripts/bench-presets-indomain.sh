#!/usr/bin/env bash
# llama.cpp's presets with in-domain calibration for both tools (docs/bench/presets.md, "In-domain
# calibration"): llama-imatrix + llama-quantize --imatrix against tq calib + tq convert --preset P
# --calib, both calibrated on the SAME 8,192 tokens of wikitext-2-raw-test taken far past the
# evaluation windows (bytes 401,586-500,966 of the file, cut at line ends), evaluated as
# scripts/bench-presets.sh does: KLD vs the F16 model on the first 10 windows (ctx 512) of the same
# file. `botchan` runs the same commands on Botchan (the out-of-domain rows of the notebook).
#
# wikitext-2-raw-test.txt is present only in this workplace's shared folder (../shared/data next to
# the checkout); no script fetches it, and this one stops with an error where it is absent.
# Not part of CI (per preset one LDLQ conversion, 3-10 CPU-minutes, and two evaluations).
#
#   bash scripts/bench-presets-indomain.sh [CAL...]      CAL: wiki (default), botchan
#   TQ_INDOMAIN_PRESETS="Q4_K_M Q3_K_M IQ3_XXS IQ2_XS"   the presets (this is the default list)
#   TQ_INDOMAIN_MIX=1                                    also the upstream mix at Q4_K_M + imatrix's bytes
# Outputs under $TQ_CACHE/presets-indomain/CAL are reused when present (delete to redo); the table
# is printed and kept in $TQ_CACHE/presets-indomain/CAL/table.md.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
cals=("$@"); [ ${#cals[@]} -gt 0 ] || cals=(wiki)
read -r -a presets <<< "${TQ_INDOMAIN_PRESETS:-Q4_K_M Q3_K_M IQ3_XXS IQ2_XS}"
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
if [ ! -f "$wiki" ]; then
  echo "error: $wiki is absent: wikitext-2-raw-test is in this workplace's shared folder only" >&2
  echo "(no script fetches it); this benchmark needs it for the evaluation and the calibration" >&2
  exit 1
fi
verify "$wiki" 696cca6b65a171b0a358a4be6732cdfdf2dd6164a32e20fd70e3c13fc4dfae83
tq=$(tq_bin)
bin=$(llama_bin)
w="$TQ_CACHE/presets"; mkdir -p "$w"
# The F16 model and the reference logits, as scripts/bench-presets.sh makes them.
f16=$(smollm2_f16 "$tq" "$w")
smollm2_ref_logits "$tq" "$w" 10
top="$TQ_CACHE/presets-indomain"; mkdir -p "$top"

# The calibration text: bytes [401586, 500966) of wikitext-2-raw-test (characters 400,964-500,195;
# it starts and ends after a newline), about 23,000 tokens of which both tools take the first 8,192.
cal_text() { # NAME: prints the path of the calibration text
  case $1 in
    wiki)
      local t="$top/wiki-cal.txt"
      if [ ! -f "$t" ]; then
        tail -c +401587 "$wiki" | head -c 99380 > "$t.tmp" && mv "$t.tmp" "$t"
      fi
      verify "$t" 1ae7586605f3663fb10f033bd65ea496b249608aa9f662997bdd8bf3078695e4
      # No evaluation window's text may occur in it (examples/text_overlap.rs).
      if [ ! -s "$top/overlap.txt" ]; then
        cargo build --release --locked --quiet --example text_overlap >&2
        "${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/examples/text_overlap" "$f16" "$wiki" "$t" --chunks 10 --ctx 512 > "$top/overlap.txt"
      fi
      cat "$top/overlap.txt" >&2
      grep -q '^windows whose text occurs in the calibration text: 0$' "$top/overlap.txt" ||
        { echo "error: an evaluation window's text occurs in $t" >&2; exit 1; }
      echo "$t" ;;
    botchan) "$TQ_ROOT/scripts/fetch-botchan.sh" ;;
    *) echo "error: unknown calibration $1 (wiki or botchan)" >&2; exit 2 ;;
  esac
}

cputime() { # TIMEFILE: user+sys seconds of a /usr/bin/time -v log
  awk -F': ' '/User time|System time/ { s += $2 } END { printf "%.0f", s }' "$1"
}

# timed OUT LOG CMD...: runs CMD (writing OUT.tmp.gguf or OUT.tmp) unless OUT exists; CPU time in LOG.time.
timed() {
  local out=$1 log=$2; shift 2
  [ -f "$out" ] && return 0
  /usr/bin/time -v -o "$log.time" "$@" > "$log.log" 2>&1 || { echo "error: failed, see $log.log" >&2; tail -5 "$log.log" >&2; exit 1; }
}

evaljson() { # FILE JSON
  [ -s "$2" ] && [ "$2" -nt "$1" ] || "$tq" eval "$1" --ref-logits "$w/ref.logits" -q --json > "$2"
}

for c in "${cals[@]}"; do
  text=$(cal_text "$c")
  d="$top/$c"; mkdir -p "$d"
  # Both tools: the first 16 windows of 512 tokens of the text, BOS in place.
  timed "$d/H.safetensors" "$d/calib" \
    sh -c '"$1" calib "$2" --text "$3" --tokens 8192 -q -o "$4.tmp" && mv "$4.tmp" "$4"' - "$tq" "$f16" "$text" "$d/H.safetensors"
  timed "$d/imatrix.gguf" "$d/imatrix" \
    sh -c '"$1/llama-imatrix" -m "$2" -f "$3" -o "$4.tmp.gguf" -c 512 --chunks 16 -t 2 && mv "$4.tmp.gguf" "$4"' - "$bin" "$f16" "$text" "$d/imatrix.gguf"
  rows=()
  for p in "${presets[@]}"; do
    timed "$d/llama-$p-imatrix.gguf" "$d/quantize-$p" \
      sh -c '"$1/llama-quantize" --imatrix "$2" "$3" "$4.tmp.gguf" "$5" 2 && mv "$4.tmp.gguf" "$4"' - "$bin" "$d/imatrix.gguf" "$f16" "$d/llama-$p-imatrix.gguf" "$p"
    timed "$d/tq-$p.gguf" "$d/convert-$p" \
      sh -c '"$1" convert "$2" --preset "$3" --calib "$4" -q -o "$5.tmp.gguf" && mv "$5.tmp.gguf" "$5"' - "$tq" "$f16" "$p" "$d/H.safetensors" "$d/tq-$p.gguf"
    evaljson "$d/llama-$p-imatrix.gguf" "$d/eval-llama-$p.json"
    evaljson "$d/tq-$p.gguf" "$d/eval-tq-$p.json"
    rows+=("$p $d/llama-$p-imatrix.gguf $d/eval-llama-$p.json $d/tq-$p.gguf $d/eval-tq-$p.json $(cputime "$d/convert-$p.time" 2>/dev/null || echo -)")
  done
  if [ "${TQ_INDOMAIN_MIX:-0}" = 1 ]; then
    bytes=$(stat -L -c %s "$d/llama-Q4_K_M-imatrix.gguf")
    timed "$d/mix-Q4_K_M.gguf" "$d/convert-mix-Q4_K_M" \
      sh -c '"$1" convert "$2" --target upstream --target-size "$3" --calib "$4" --kld-text "$5" -q -o "$6.tmp.gguf" && mv "$6.tmp.gguf" "$6"' - "$tq" "$f16" "$bytes" "$d/H.safetensors" "$text" "$d/mix-Q4_K_M.gguf"
    evaljson "$d/mix-Q4_K_M.gguf" "$d/eval-mix-Q4_K_M.json"
    rows+=("mix@Q4_K_M $d/llama-Q4_K_M-imatrix.gguf $d/eval-llama-Q4_K_M.json $d/mix-Q4_K_M.gguf $d/eval-mix-Q4_K_M.json $(cputime "$d/convert-mix-Q4_K_M.time")")
  fi
  py - "$c" "$text" "${rows[@]}" <<'PY' | tee "$d/table.md"
import json, os, sys
from gguf import GGUFReader
cal, text, rows = sys.argv[1], sys.argv[2], sys.argv[3:]

def tensors(path):  # name -> (type, bytes): the files differ in metadata only where these agree
    return {t.name: (t.tensor_type.name, int(t.n_bytes)) for t in GGUFReader(path).tensors}

print(f"calibration: {cal} ({text}), 8,192 tokens for both tools; evaluation: 10 wikitext-2 windows, KLD vs F16")
print()
print("| preset | bytes llama.cpp | bytes tq | tensor types and bytes | llama.cpp + imatrix KLD | PPL | tq `--calib` KLD | PPL | tq / llama.cpp | tq convert CPU s |")
print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
for row in rows:
    p, lf, lj, tf, tj, cpu = row.split()
    l, t = json.load(open(lj))["result"], json.load(open(tj))["result"]
    lk, tk = l["kld"]["kld"], t["kld"]["kld"]
    same = "same" if tensors(lf) == tensors(tf) else "differ"
    print(f"| {p} | {os.path.getsize(lf):,} | {os.path.getsize(tf):,} | {same} | {lk['value']:.5f} ± {lk['err']:.5f} | "
          f"{l['ppl']['value']:.3f} | {tk['value']:.5f} ± {tk['err']:.5f} | {t['ppl']['value']:.3f} | "
          f"{tk['value'] / lk['value']:.3f}× | {cpu} |")
PY
done
