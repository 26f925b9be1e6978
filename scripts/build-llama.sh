#!/usr/bin/env bash
# Build upstream llama.cpp (vendored in the PyPI sdist llama-cpp-python==0.3.36, commit 0c1e570) into
# $TQ_CACHE/llama.cpp — the peer for benchmarks and oracles (llama-quantize, llama-perplexity).
# ~13 minutes on 2 cores; cached. Needs cmake (apt-get install -y cmake).
source "$(dirname "$0")/common.sh"
dst="$TQ_CACHE/llama.cpp"
targets="llama-quantize llama-perplexity llama-imatrix"
missing=""; for t in $targets; do [ -x "$dst/build/bin/$t" ] || missing="$missing $t"; done
[ -z "$missing" ] && { echo "$dst/build/bin"; exit 0; }
if [ -f "$dst/build/CMakeCache.txt" ] && [ -d "$dst/src" ]; then
  # Sources already verified and configured: build only what is missing.
  cmake --build "$dst/build" -j 2 --target $missing >&2
  echo "$dst/build/bin"; exit 0
fi
command -v cmake >/dev/null || { apt-get update -qq >&2 && apt-get install -y -qq cmake >&2; }
tmp=$(mktemp -d)
pip download -q --no-deps --no-binary llama-cpp-python --disable-pip-version-check -d "$tmp" llama-cpp-python==0.3.36 >&2
sd="$tmp/llama_cpp_python-0.3.36.tar.gz"
verify "$sd" 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
mkdir -p "$dst" && tar -xzf "$sd" -C "$tmp"
rm -rf "$dst/src" && mv "$tmp/llama_cpp_python-0.3.36/vendor/llama.cpp" "$dst/src"
cmake -S "$dst/src" -B "$dst/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$dst/build" -j 2 --target $targets >&2
rm -rf "$tmp"
echo "$dst/build/bin"
