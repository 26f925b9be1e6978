#!/usr/bin/env bash
# Issue 7: calibration time, `tq calib` vs upstream `llama-imatrix`, on the same model (SmolLM2 F16),
# text (Botchan), windows (CHUNKS x 512 tokens) and threads. Not part of CI. Prints wall seconds,
# tokens/s, peak RSS and the ratio (goal: tq <= 1.5x llama-imatrix's time).
#
#   bash scripts/bench-calib.sh [THREADS] [CHUNKS]
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
threads=${1:-2}; chunks=${2:-16}
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
bin=$("$TQ_ROOT/scripts/build-llama.sh")
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
w="$TQ_CACHE/bench"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")

timed() { # NAME CMD...: prints "NAME seconds peak_MiB"
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$w/time.txt" "$@" > "$w/$name.log" 2>&1 || { echo "$name failed: see $w/$name.log" >&2; exit 1; }
  read -r t m < "$w/time.txt"; echo "$name $t $((m / 1024))"
}
rm -f "$w/H-bench.safetensors"
{
  timed llama-imatrix "$bin/llama-imatrix" -m "$f16" -f "$botchan" -o "$w/imatrix.gguf" -c 512 --chunks "$chunks" -t "$threads"
  timed tq-calib "$tq" calib "$f16" --text "$botchan" --tokens $((chunks * 512)) --ctx 512 --threads "$threads" -o "$w/H-bench.safetensors"
} | tee "$w/calib-res.txt"
awk -v n=$((chunks * 512)) '{t[$1]=$2; r[$1]=$3} END {
  printf "| tool | wall s | tokens/s | peak RSS MiB |\n|---|---|---|---|\n";
  printf "| llama-imatrix | %.1f | %.0f | %d |\n", t["llama-imatrix"], n / t["llama-imatrix"], r["llama-imatrix"];
  printf "| tq calib | %.1f | %.0f | %d |\n", t["tq-calib"], n / t["tq-calib"], r["tq-calib"];
  printf "ratio tq / llama-imatrix: %.2f (goal <= 1.5)\n", t["tq-calib"] / t["llama-imatrix"] }' "$w/calib-res.txt"
