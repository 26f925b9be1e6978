#!/usr/bin/env bash
# Run every independent-oracle script in scripts/oracle/ (gguf-py, numpy, scipy) with the pinned
# venv. Each writes its reference outputs under $TQ_CACHE/oracle/, which the Rust tests read.
source "$(dirname "$0")/common.sh"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
out="$TQ_CACHE/oracle"; mkdir -p "$out"
for s in "$TQ_ROOT"/scripts/oracle/*.py; do
  [ -e "$s" ] || continue
  echo "oracle: $(basename "$s")" >&2
  py "$s" --out "$out" --smollm2 "$smol"
done
