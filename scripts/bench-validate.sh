#!/usr/bin/env bash
# `tq validate --chunks auto` against a fixed 20 windows (docs/bench/validate.md): the pass/fail
# pair of scripts/e2e-validate.sh (TQ4_1S config-i + LDLQ passes, TQ3_1S pure fails) under its
# policy on Botchan, ctx 512. Prints windows used, verdict and seconds for both modes and the time
# saved, measured in the same run. Needs the artifacts of scripts/e2e-validate.sh (run it first).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
e2e="$TQ_CACHE/e2e-validate"
[ -f "$e2e/policy.json" ] || { echo "run scripts/e2e-validate.sh first" >&2; exit 1; }
for a in smollm2-tq4_1s-config-i-ldlq smollm2-tq3_1s-pure; do
  for mode in auto 20; do
    set +e
    "$tq" validate "$e2e/art/$a.gguf" --ref "$smol" --text "$botchan" --policy "$e2e/policy.json" \
      --chunks "$mode" --max-chunks 20 --gen-prompts 0 --kernels none --json -q > "$e2e/bench-$a-$mode.json"
    set -e
  done
  py - "$e2e/bench-$a-auto.json" "$e2e/bench-$a-20.json" "$a" <<'PY'
import json, sys
a, f = (json.load(open(p)) for p in sys.argv[1:3])
qa, qf = a["quality"], f["quality"]
# whole command (structure checks, loading, evaluation); the evaluation alone in parentheses
print(f"{sys.argv[3]}: auto {qa['windows']} windows {a['verdict']} {a['seconds']:.1f} s ({qa['seconds']:.1f}) | "
      f"fixed {qf['windows']} windows {f['verdict']} {f['seconds']:.1f} s ({qf['seconds']:.1f}) | "
      f"time saved {100 * (1 - a['seconds'] / f['seconds']):.0f}% (x{f['seconds'] / a['seconds']:.1f})")
assert a["verdict"] == f["verdict"], "auto and fixed 20 disagree"
PY
done
