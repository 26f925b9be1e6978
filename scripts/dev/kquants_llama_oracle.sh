#!/usr/bin/env bash
# Record llama.cpp's k-quant and IQ4_NL / IQ4_XS output as facts for tests/kquants_llama.rs.
#
# 1-2. Builds llama.cpp and a tiny harness around ggml's quantize_row_q*_K_ref from the same
#    llama.cpp source (scripts/build-ggml-ref.sh, cached), for the extreme rows llama-quantize
#    refuses to write (non-finite f16 scales).
# 3. Runs the k-quant tests in record mode: they write the synthetic F32 GGUF (and SmolLM2's
#    ffn_down tensors decoded to F32; run scripts/fetch-data.sh first), run
#    `llama-quantize --pure in.gguf out.gguf {Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS}` (no imatrix,
#    so ggml's quantize_row_q*_K_ref and quantize_iq4_nl/_xs with x² weights), store the blake3 of every output tensor's data bytes — hashed from
#    llama.cpp's output, not ours — in fixtures/kquants_expected.json, and compare every byte with
#    tq's quantizers (the first differing block is reported on a mismatch).
# 4. Runs tests/iquants_llama.rs in record mode: IQ2_XXS / IQ2_XS / IQ2_S (llama-quantize --pure
#    {IQ2_XXS,IQ2_XS,IQ2_M}, with an imatrix tq writes: ones, a 1/100..100 spread; and IQ2_S
#    without one for token_embd/output), hashes into fixtures/iq2_expected.json.
# Usage: bash scripts/dev/kquants_llama_oracle.sh
source "$(dirname "$0")/../common.sh"
h="$("$TQ_ROOT/scripts/build-ggml-ref.sh")"
cd "$TQ_ROOT"
TQ_KQ_RECORD=1 TQ_REQUIRE_DATA=1 TQ_KQ_GGML_REF="$h" cargo test --release --test kquants_llama -- \
  --test-threads=1 --nocapture synthetic_matches_llama_quantize_live smollm2_ffn_down_matches_llama \
  extreme_rows_match_recorded_ggml_ref iq4_synthetic_matches_llama_quantize_live \
  iq4_smollm2_ffn_down_matches_llama
TQ_KQ_RECORD=1 TQ_REQUIRE_DATA=1 cargo test --release --test iquants_llama -- --test-threads=1 --nocapture
git diff --stat -- fixtures/kquants_expected.json fixtures/iq2_expected.json || true
