#!/usr/bin/env bash
# The test command. First every oracle the tests read is prepared (all cached in $TQ_CACHE):
#  - the real test data (models, text, vocabularies; sha256-verified),
#  - the independent oracles' outputs (gguf-py / numpy / scipy / transformers in pinned venvs),
#  - llama.cpp (llama-quantize, llama-perplexity, llama-imatrix and its sources; scripts/build-llama.sh:
#    about 13 minutes on 2 cores the first time, nothing after) and ggml's k-quant reference harness
#    (scripts/build-ggml-ref.sh, TQ_KQ_GGML_REF),
# then every Rust test runs with a missing prerequisite treated as a failure (TQ_REQUIRE_DATA=1).
# A test that does not run appends "CRATE::TEST: reason" to $TQ_SKIP_LOG (fixtures::not_run /
# no_device); run on its own (no TQ_SKIP_LOG given, as .ci/run gives one), this script prints them
# at the end (scripts/not-run.sh) and fails if any did not run, GPU-device tests with no device
# visible aside.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
"$TQ_ROOT/scripts/fetch-data.sh" >/dev/null
"$TQ_ROOT/scripts/oracle.sh"
llama="$("$TQ_ROOT/scripts/build-llama.sh")"
echo "llama.cpp: $llama" >&2
TQ_KQ_GGML_REF="$("$TQ_ROOT/scripts/build-ggml-ref.sh")"
export TQ_KQ_GGML_REF
own_log=0
if [ -z "${TQ_SKIP_LOG:-}" ]; then
  TQ_SKIP_LOG="$(mktemp -t tq-not-run.XXXXXX)"; own_log=1
fi
export TQ_SKIP_LOG
status=0
TQ_REQUIRE_DATA=1 cargo test --locked "$@" || status=$?
if [ "$own_log" = 1 ]; then
  echo "== tests not run ==" >&2
  bash "$TQ_ROOT/scripts/not-run.sh" "$TQ_SKIP_LOG" >&2 || { [ "$status" != 0 ] || status=1; }
  rm -f "$TQ_SKIP_LOG"
fi
exit "$status"
