#!/usr/bin/env bash
# Benchmark `tq convert` against upstream `llama-quantize` on the same input and thread count
# (issue 4). Not part of CI. Prints medians of RUNS runs, the ratios, and peak RSS of each.
#
#   bash scripts/bench-convert.sh [THREADS] [RUNS]          # SmolLM2-135M F16
#   BIG=1 bash scripts/bench-convert.sh [THREADS] 1         # also a >= 4 GB 7B-shaped GGUF (memory bound)
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
threads=${1:-2}; runs=${2:-3}
bin=$("$TQ_ROOT/scripts/build-llama.sh")
cargo build --release --locked --quiet
cargo build --release --locked --quiet --example gen_gguf
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
w="$TQ_CACHE/bench"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")

# One timed run: "NAME seconds peak_rss_KiB" appended to $w/raw.txt.
once() {
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$w/time.txt" "$@" >/dev/null 2>&1 || { echo "$name: command failed: $*" >&2; return 1; }
  echo "$name $(cat "$w/time.txt")" >> "$w/raw.txt"
}

# The tools are interleaved (run 1 of each, run 2 of each, ...) so that a change in machine load
# affects all of them alike; medians and the largest peak RSS per tool are reported.
bench() {
  local in=$1 label=$2
  echo "## $label ($(du -h "$in" | cut -f1), $threads threads, median of $runs, interleaved)"
  : > "$w/raw.txt"
  for _ in $(seq "$runs"); do
    once llama-quantize_Q4_0   "$bin/llama-quantize" "$in" "$w/lq-q4_0.gguf" Q4_0 "$threads"
    once llama-quantize_Q4_K_M "$bin/llama-quantize" "$in" "$w/lq-q4_k_m.gguf" Q4_K_M "$threads"
    once tq_q4_0               "$tq" convert "$in" --weights q4_0 --threads "$threads" -q -o "$w/tq-q4_0.gguf"
    once tq_tq4_1s             "$tq" convert "$in" --weights tq4_1s --threads "$threads" -q -o "$w/tq-tq4_1s.gguf"
  done
  rm -f "$w/lq-q4_0.gguf" "$w/lq-q4_k_m.gguf" "$w/tq-q4_0.gguf" "$w/tq-tq4_1s.gguf"
  sort -k1,1 -k2,2n "$w/raw.txt" | awk '
    { n[$1]++; v[$1, n[$1]] = $2; if ($3 > r[$1]) r[$1] = $3 }
    END {
      split("llama-quantize_Q4_0 llama-quantize_Q4_K_M tq_q4_0 tq_tq4_1s", k, " ");
      for (i = 1; i <= 4; i++) { c = n[k[i]]; m[k[i]] = (c % 2) ? v[k[i], (c + 1) / 2] : (v[k[i], c / 2] + v[k[i], c / 2 + 1]) / 2 }
      b = m["llama-quantize_Q4_0"];
      printf "| tool / type | median s | ratio to llama-quantize Q4_0 | peak RSS MiB |\n|---|---|---|---|\n";
      for (i = 1; i <= 4; i++) printf "| %s | %.2f | %.2f | %d |\n", k[i], m[k[i]], m[k[i]] / b, r[k[i]] / 1024;
    }'
}

bench "$f16" "SmolLM2-135M F16 -> 4-bit"
if [ "${BIG:-0}" = 1 ]; then
  big="$w/synthetic-7b-10layers-f16.gguf"
  [ -f "$big" ] || "${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/examples/gen_gguf" "$big" --layers 10
  runs=${BIG_RUNS:-1} bench "$big" "7B-shaped, 10 layers, F16"
  echo "largest tensor: token_embd/output 4096 x 32000 = $((4096 * 32000 * 4 / 1048576)) MiB as f32"
fi
