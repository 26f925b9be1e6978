#!/usr/bin/env bash
# Issue 13: how far `tq calib merge` of N shards is from a one-process `tq calib` (f64 summation
# order), and whether the converted GGUF changes. Not part of CI (≈10 minutes on 2 cores).
#
#   bash scripts/bench-shard-merge.sh [TOKENS] [SHARDS] [BATCH]
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
tokens=${1:-8192}; n=${2:-4}; batch=${3:-1}
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
tq=$(tq_bin)
w="$TQ_CACHE/bench-shard-merge"; rm -rf "$w"; mkdir -p "$w/one" "$w/m"
c=(--text "$botchan" --tokens "$tokens" --ctx 256 --batch "$batch" --threads 2)
"$tq" calib "$smol" "${c[@]}" -o "$w/one/H.safetensors" 2>/dev/null
shards=()
for ((i = n - 1; i >= 0; i--)); do   # merged from the command line in reverse order
  "$tq" calib "$smol" "${c[@]}" --shard "$i/$n" -o "$w/s$i.safetensors" 2>/dev/null
  shards+=("$w/s$i.safetensors")
done
"$tq" calib merge "${shards[@]}" -o "$w/m/H.safetensors"
rm -f "${shards[@]}"
py - "$w/one/H.safetensors" "$w/m/H.safetensors" <<'PY'
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
worst, exact, nd = 0.0, 0, 0
for k in a:
    d = abs(a[k] - b[k]).max() / abs(a[k]).max()
    worst = max(worst, d); exact += int((a[k] == b[k]).all()); nd += int((a[k] != b[k]).sum())
print(f"groups {len(a)}, bit-identical {exact}, differing elements {nd}, max |dH|/max|H| = {worst:.3e}")
PY
# Same file name in both: it is part of the output's provenance.
for d in one m; do
  "$tq" convert "$smol" --weights tq4_1s --calib "$w/$d/H.safetensors" --threads 2 -q -o "$w/$d/out.gguf"
done
if cmp -s "$w/one/out.gguf" "$w/m/out.gguf"; then
  echo "converted GGUFs byte-identical"
else
  echo "converted GGUFs differ in $(cmp -l "$w/one/out.gguf" "$w/m/out.gguf" | wc -l) bytes"
fi
