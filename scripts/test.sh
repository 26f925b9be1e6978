#!/usr/bin/env bash
# The test command: fetch the real test data (sha256-verified, cached), produce the independent
# oracle outputs (gguf-py / numpy / scipy in a pinned venv), then run every Rust test with
# missing data treated as a failure.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
"$TQ_ROOT/scripts/fetch-data.sh" >/dev/null
"$TQ_ROOT/scripts/oracle.sh"
TQ_REQUIRE_DATA=1 cargo test --locked "$@"
