#!/usr/bin/env bash
# Record llama.cpp's k-quant (Q2_K .. Q6_K) output with an imatrix as facts for
# tests/kquants_imatrix_llama.rs.
#
# Runs the live tests in record mode: they write the synthetic F32 GGUF (and SmolLM2's ffn_down
# tensors decoded to F32; run scripts/fetch-data.sh first) and an imatrix (written by tq), run
# `llama-quantize --pure --imatrix im.gguf in.gguf out.gguf {Q2_K,Q3_K,Q4_K,Q5_K,Q6_K}` (and the whole
# Q4_K_M preset on SmolLM2), store the blake3 of every output tensor's data bytes — hashed from
# llama.cpp's output, not ours — in fixtures/kquants_imatrix_expected.json, and compare every
# byte with tq's encoders.
# Usage: bash scripts/dev/kquants_imatrix_llama_oracle.sh
source "$(dirname "$0")/../common.sh"
"$TQ_ROOT/scripts/build-llama.sh" >/dev/null
cd "$TQ_ROOT"
TQ_KQ_IMX_RECORD=1 TQ_REQUIRE_DATA=1 cargo test --test kquants_imatrix_llama -- \
  --test-threads=1 --nocapture synthetic_matches_llama_quantize_live smollm2_ffn_down_matches_llama \
  smollm2_q4_k_m_imatrix_k_quant_tensors_match_llama
git diff --stat -- fixtures/kquants_imatrix_expected.json || true
