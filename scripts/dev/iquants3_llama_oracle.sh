#!/usr/bin/env bash
# Record llama.cpp's IQ3_XXS / IQ3_S / IQ1_S / IQ1_M output as facts for tests/iquants3_llama.rs.
#
# Runs the live tests in record mode: they write the synthetic F32 GGUF (and SmolLM2's ffn_down
# tensors decoded to F32; run scripts/fetch-data.sh first) and an imatrix (written by tq), run
# `llama-quantize --pure [--imatrix im.gguf] in.gguf out.gguf {IQ3_XXS,IQ3_S,IQ1_S,IQ1_M}` (without
# an imatrix, IQ3_XXS / IQ1_M as a lone output.weight, IQ1_S with an imatrix of ones), store the
# blake3 of every output tensor's data bytes — hashed from llama.cpp's output, not ours — in
# fixtures/iquants3_expected.json, and compare every byte with tq's encoders.
# Usage: bash scripts/dev/iquants3_llama_oracle.sh
source "$(dirname "$0")/../common.sh"
"$TQ_ROOT/scripts/build-llama.sh" >/dev/null
cd "$TQ_ROOT"
TQ_IQ3_RECORD=1 TQ_REQUIRE_DATA=1 cargo test --release --test iquants3_llama -- \
  --test-threads=1 --nocapture synthetic_matches_llama_quantize_live smollm2_ffn_down_matches_llama
git diff --stat -- fixtures/iquants3_expected.json || true
