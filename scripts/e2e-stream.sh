#!/usr/bin/env bash
# Block-major streaming evaluation under a memory limit (issue 29, item 2): a 4-block
# Llama-2-7B-wide f16 model (hidden 4096, FFN 11008; ~2.1 GB, random weights, llama-spm
# tokenizer) made by examples/gen_gguf.rs is evaluated by `tq eval` inside a memory cgroup whose
# limit (1.75 GiB, LIMIT_MIB) is below the file's size. Fails if tq fails (an OOM kill included),
# or if tq's peak RSS passes the limit. The limit is a memory cgroup where one can be made (cgroup
# v2 memory.max, v1 memory.limit_in_bytes, or systemd-run --scope; root); elsewhere only the
# peak RSS is checked. About 2-3 minutes on 2 cores.
source "$(dirname "$0")/common.sh"
LIMIT_MIB="${LIMIT_MIB:-1792}"
TQ="$(tq_bin)"
work="$(mktemp -d "${TMPDIR:-/tmp}/tq-e2e-stream.XXXXXX")"
cg=""
cleanup() {
  if [ -n "$cg" ] && [ -d "$cg" ]; then rmdir "$cg" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

vocab="$TQ_CACHE/vocabs/ggml-vocab-llama-spm.gguf"
text="$TQ_CACHE/text/botchan.txt"
for f in "$vocab" "$text"; do
  [ -f "$f" ] || { echo "e2e-stream: $f missing (scripts/fetch-data.sh)" >&2; exit 1; }
done
# $GEN_GGUF: a built examples/gen_gguf (else the release one is built).
gen="${GEN_GGUF:-}"
if [ -z "$gen" ]; then
  (cd "$TQ_ROOT" && cargo build --release -q --example gen_gguf >&2)
  gen="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/examples/gen_gguf"
fi
"$gen" "$work/7b-4.gguf" \
  --shape 7b --layers 4 --vocab "$vocab" >&2
size=$(stat -c %s "$work/7b-4.gguf")
limit=$((LIMIT_MIB * 1024 * 1024))
[ "$limit" -lt "$size" ] || { echo "e2e-stream: limit $limit is not below the model's $size bytes" >&2; exit 1; }

cmd=(/usr/bin/time -f "%M %e %U %S" -o "$work/time" "$TQ" eval "$work/7b-4.gguf" -f "$text"
     --ctx 64 --chunks 4 --batch 2 --json -q)
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  cg=/sys/fs/cgroup/tq-e2e-stream-$$; mkdir "$cg"
  echo "$limit" > "$cg/memory.max"; echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
  mech="cgroup v2 memory.max"
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "${cmd[@]}" > "$work/out.json"
  peak_cg=$(cat "$cg/memory.peak" 2>/dev/null || echo 0)
elif [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/tq-e2e-stream-$$; mkdir "$cg"
  echo "$limit" > "$cg/memory.limit_in_bytes"
  mech="cgroup v1 memory.limit_in_bytes"
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "${cmd[@]}" > "$work/out.json"
  peak_cg=$(cat "$cg/memory.max_usage_in_bytes")
elif command -v systemd-run >/dev/null && systemd-run --scope -q -p MemoryMax=1G true 2>/dev/null; then
  mech="systemd-run --scope -p MemoryMax"
  systemd-run --scope -q -p "MemoryMax=$limit" -p MemorySwapMax=0 "${cmd[@]}" > "$work/out.json"
  peak_cg=0
else
  # The closest thing without a cgroup: the same run, held to the limit by its peak RSS.
  mech="no cgroup here (not root?): peak RSS checked against"
  "${cmd[@]}" > "$work/out.json"
  peak_cg=0
fi
read -r rss_kib wall user sys < "$work/time"
rss=$((rss_kib * 1024))
ppl=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["result"]["ppl"]["value"])' "$work/out.json")
echo "e2e-stream: $mech $LIMIT_MIB MiB, model $((size / 1048576)) MiB: peak RSS $((rss / 1048576)) MiB, cgroup peak (page cache included) $((peak_cg / 1048576)) MiB, wall ${wall} s, CPU $(python3 -c "print(round($user + $sys, 1))") s, PPL $ppl"
if [ "$rss" -ge "$limit" ]; then
  echo "e2e-stream: FAIL: peak RSS $rss >= limit $limit" >&2; exit 1
fi
echo "e2e-stream: ok"
