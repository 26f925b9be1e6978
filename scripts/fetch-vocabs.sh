#!/usr/bin/env bash
# Fetch llama.cpp's tokenizer golden tests: the vocab-only GGUFs and their .inp/.out pairs
# (vendor/llama.cpp/models/ggml-vocab-*) from the PyPI sdist llama-cpp-python==0.3.36,
# sha256-checked, into $TQ_CACHE/vocabs/. Used by tests/tokenizer.rs. Prints the directory.
source "$(dirname "$0")/common.sh"
vocabs="$TQ_CACHE/vocabs"
sdist_name=llama_cpp_python-0.3.36.tar.gz
sdist_sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
if [ ! -f "$vocabs/.ok" ]; then
  # build-llama.sh and earlier runs may have left a verified copy in the cache.
  sdist=""
  for c in "$TQ_CACHE/dl/$sdist_name" "/tmp/sd/$sdist_name"; do
    if [ -f "$c" ] && verify "$c" "$sdist_sha" 2>/dev/null; then sdist="$c"; break; fi
  done
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if [ -z "$sdist" ]; then
    pip download -q --no-deps --no-binary llama-cpp-python --disable-pip-version-check \
      -d "$tmp" llama-cpp-python==0.3.36 >&2
    sdist="$tmp/$sdist_name"
    verify "$sdist" "$sdist_sha"
  fi
  mkdir -p "$tmp/x"
  tar -xzf "$sdist" -C "$tmp/x" --wildcards 'llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*'
  mkdir -p "$vocabs"
  mv "$tmp"/x/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-* "$vocabs/"
  touch "$vocabs/.ok"
fi
echo "$vocabs"
