#!/usr/bin/env bash
# Record llama.cpp's Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 output, with and without an imatrix, as
# facts for tests/legacy_imatrix_llama.rs.
#
# Runs the live tests in record mode: they write the synthetic F32 GGUF (and SmolLM2's 576-wide
# tensors of blocks 0 and 17 decoded to F32, MiniLM's first layer; run scripts/fetch-data.sh first) and an imatrix
# (written by tq), run `llama-quantize --pure [--imatrix im.gguf] in.gguf out.gguf TYPE` for TYPE
# in Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 and the whole SmolLM2 presets Q4_0 / Q5_0 / Q8_0 (and Q5_K_M's
# q5_1 tensors) with the imatrix,
# store the blake3 of every output tensor's data bytes — hashed from llama.cpp's output, not
# ours — in fixtures/legacy_imatrix_expected.json, and compare every byte with tq's encoders.
# Usage: bash scripts/dev/legacy_imatrix_llama_oracle.sh
source "$(dirname "$0")/../common.sh"
"$TQ_ROOT/scripts/build-llama.sh" >/dev/null
cd "$TQ_ROOT"
TQ_LEGACY_IMX_RECORD=1 TQ_REQUIRE_DATA=1 cargo test --test legacy_imatrix_llama -- \
  --test-threads=1 --nocapture synthetic_matches_llama_quantize_live smollm2_576_matches_llama minilm_matches_llama \
  smollm2_q5_k_m_imatrix_q5_1_tensors_match_llama smollm2_q4_0_imatrix_file_matches_llama \
  smollm2_q5_0_imatrix_file_matches_llama smollm2_q8_0_imatrix_file_matches_llama
git diff --stat -- fixtures/legacy_imatrix_expected.json || true
