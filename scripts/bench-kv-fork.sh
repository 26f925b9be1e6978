#!/usr/bin/env bash
# Issue 20 measurement: `tq eval`'s KV-cache simulation under a target profile against the PPL the
# TurboQuant fork itself gave (recorded: FORMATS.md §3, the fork @69d8e4be4 on CPU, 2 threads,
# SmolLM2 F16, wikitext-2 test, -c 512 --chunks 20 -fa on). Prints both, the ratio, and whether
# each is within 0.5%. Not part of CI (the wikitext file lives only in this workplace's shared
# folder; ~2 minutes on 2 cores).
#
#   bash scripts/bench-kv-fork.sh [TARGET] [EXTRA tq eval FLAGS...]   # default fork-69d8e4be4
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
target=${1:-fork-69d8e4be4}; shift || true
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
[ -f "$wiki" ] || { echo "error: $wiki missing (the workplace's shared data)" >&2; exit 2; }
tq=$(tq_bin)
w="$TQ_CACHE/kv-fork"; mkdir -p "$w"
f16=$(smollm2_f16 "$tq" "$w")
printf '%-14s %10s %12s %8s %6s  %s\n' "K/V" "fork PPL" "tq PPL" "ratio" "<0.5%" "bits/real value K,V"
fail=0
# K V fork-PPL (the fork's own numbers, FORMATS.md §3)
while read -r k v want; do
  out=$("$tq" eval "$f16" -f "$wiki" -c 512 --chunks 20 --ctk "$k" --ctv "$v" --target "$target" \
    "$@" --json -q)
  py - "$k/$v" "$want" "$out" <<'PY' || fail=1
import json, sys
name, want, j = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
got = j["result"]["ppl"]["value"]
ok = abs(got / want - 1) < 0.005
print(f"{name:<14} {want:>10.4f} {got:>12.4f} {got / want:>8.4f} {'yes' if ok else 'NO':>6}  "
      f"{j['kv']['bits_per_value_k']:.3f},{j['kv']['bits_per_value_v']:.3f} ({j['kv']['target']}, "
      f"groups {j['kv']['turbo_groups']}, tables {j['kv']['turbo_codebook']}, rotation {j['kv']['rotation']})")
sys.exit(0 if ok else 1)
PY
done <<'ROWS'
f16 f16 29.1401
turbo4 turbo4 32.2444
turbo3 turbo3 37.2405
q8_0 turbo3 29.9162
ROWS
exit $fail
