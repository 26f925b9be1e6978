#!/usr/bin/env bash
# Issue 13: the Ray driver end to end on SmolLM2, on a local Ray cluster of 2 CPUs. Not in CI
# (a Ray install and several minutes on 2 cores); its recorded run is in docs/bench/sharding.md.
#
#   bash scripts/ray-smollm2.sh [TOKENS]
#
# 1. One process: tq calib (TOKENS of Botchan, ctx 256, batch 2) -> H; tq convert --weights tq4_1s
#    --calib H -> one.gguf.
# 2. Ray (scripts/ray/tq_ray.py): 2 calib shards -> merge -> 4 convert shards -> assemble.
# 3. Checks: the Ray output is cmp-identical to a one-process tq convert of the *merged* Hessians
#    (must hold: exit 1 otherwise), and reports how the merged Hessians and the Ray output compare
#    with the fully one-process pipeline of step 1 (max |dH| / max |H|; bytes equal or not).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
tokens=${1:-2048}
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
tq=$(tq_bin)
w="$TQ_CACHE/ray-smollm2"
rm -rf "$w"; mkdir -p "$w/one" "$w/ray" "$w/check"
calib=(--text "$botchan" --tokens "$tokens" --ctx 256 --batch 2)
t0=$(date +%s.%N)
"$tq" calib "$smol" "${calib[@]}" --threads 2 -o "$w/one/H.safetensors" 2> "$w/one/calib.log"
"$tq" convert "$smol" --weights tq4_1s --calib "$w/one/H.safetensors" --threads 2 -q -o "$w/one/out.gguf"
t1=$(date +%s.%N)
echo "one process: calib + convert in $(echo "$t1 - $t0" | bc) s" >&2

py_ray scripts/ray/tq_ray.py --tq "$tq" --model "$smol" --text "$botchan" --tokens "$tokens" \
  --ctx 256 --batch 2 --workdir "$w/ray" --calib-shards 2 --convert-shards 4 --num-cpus 2 \
  --threads 1 -o "$w/ray/out.gguf" -- --weights tq4_1s > "$w/ray/timings.json"
t2=$(date +%s.%N)
echo "ray (2 CPUs): $(echo "$t2 - $t1" | bc) s wall including cluster start; stages: $(cat "$w/ray/timings.json")" >&2

# The merged Hessians, converted in one process: the Ray output must be these bytes. The file
# keeps its name (H.safetensors): the name is part of the output's provenance.
cp "$w/ray/H.safetensors" "$w/check/H.safetensors"
"$tq" convert "$smol" --weights tq4_1s --calib "$w/check/H.safetensors" --threads 2 -q -o "$w/check/out.gguf"
if cmp -s "$w/ray/out.gguf" "$w/check/out.gguf"; then
  echo "PASS: Ray output is byte-identical to one-process tq convert of the merged Hessians" >&2
else
  echo "FAIL: Ray output differs from one-process tq convert of the merged Hessians" >&2
  exit 1
fi
if cmp -s "$w/ray/out.gguf" "$w/one/out.gguf"; then
  echo "Ray output is byte-identical to the fully one-process pipeline (tq calib + tq convert)" >&2
else
  n=$(cmp -l "$w/ray/out.gguf" "$w/one/out.gguf" | wc -l)
  echo "Ray output differs from the fully one-process pipeline in $n bytes (Hessian summation order; see docs/scale.md)" >&2
fi
py - "$w/one/H.safetensors" "$w/ray/H.safetensors" <<'EOF'
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys()
worst, exact = 0.0, 0
for k in a:
    d = abs(a[k] - b[k]).max() / abs(a[k]).max()
    worst = max(worst, d)
    exact += int((a[k] == b[k]).all())
print(f"merged vs one-process Hessians: {len(a)} groups, {exact} bit-identical, max |dH|/max|H| = {worst:.3e}", file=sys.stderr)
EOF
