#!/usr/bin/env bash
# Run every independent-oracle script in scripts/oracle/ (gguf-py, numpy, scipy) with the pinned
# venv. Each writes its reference outputs under $TQ_CACHE/oracle/, which the Rust tests read.
source "$(dirname "$0")/common.sh"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
out="$TQ_CACHE/oracle"; mkdir -p "$out"
# Outputs are deterministic: a script whose stamp (its own sha256 + the venv's package set) is
# unchanged since its last successful run is skipped.
# A script with a "# tq-venv: transformers" line runs in the transformers venv (py_tf).
venv_id=$(py -m pip freeze 2>/dev/null | sha256sum | cut -c1-16)
for s in "$TQ_ROOT"/scripts/oracle/*.py; do
  [ -e "$s" ] || continue
  name=$(basename "$s" .py)
  stamp="$out/.stamp-$name"
  run=py; vid=$venv_id
  if grep -q '^# tq-venv: transformers' "$s"; then
    run=py_tf; vid=$(py_tf -m pip freeze 2>/dev/null | sha256sum | cut -c1-16)
  fi
  want="$(sha256sum "$s" | cut -c1-64)-$vid"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "oracle: $name.py (cached)" >&2
    continue
  fi
  echo "oracle: $name.py" >&2
  "$run" "$s" --out "$out" --smollm2 "$smol"
  echo "$want" > "$stamp"
done
