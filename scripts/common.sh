# Shared by the scripts: cache location and sha256-verified fetches from the package registries.
# Everything downloaded or built lives under $TQ_CACHE (default ~/.cache/tq), never in the repo.
set -euo pipefail
export TQ_CACHE="${TQ_CACHE:-$HOME/.cache/tq}"
mkdir -p "$TQ_CACHE"
TQ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# verify FILE SHA256: exit non-zero with a clear message on mismatch.
verify() {
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "error: $1: sha256 $got, expected $2 (corrupt or changed download; delete it and retry)" >&2
    return 1
  fi
}

# The Python used by oracle/dev scripts: a venv in the cache with pinned packages.
py() {
  local venv="$TQ_CACHE/venv"
  if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.ok-v4" ]; then
    rm -rf "$venv" && python3 -m venv "$venv" >&2
    # gguf 0.19.0, numpy 2.4.6, scipy 1.17.1, safetensors 0.8.0, mpmath 1.3.0, tokenizers
    # 0.23.3 and their dependencies, every wheel sha256-checked.
    "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
      --only-binary=:all: -r "$TQ_ROOT/scripts/requirements/oracle.txt" >&2
    touch "$venv/.ok-v4"
  fi
  "$venv/bin/python" "$@"
}

# A second venv for the oracles that need transformers (gguf-py's LlamaHfVocab asks its
# AutoTokenizer): gguf 0.19.0 and transformers 4.57.6, the version llama.cpp's convert
# requirements pin (it brings its own tokenizers). Separate so that the main venv's set, which
# stamps every oracle's output, is unchanged.
py_tf() {
  local venv="$TQ_CACHE/venv-tf"
  if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.ok-v2" ]; then
    rm -rf "$venv" && python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
      --only-binary=:all: -r "$TQ_ROOT/scripts/requirements/oracle-transformers.txt" >&2
    touch "$venv/.ok-v2"
  fi
  "$venv/bin/python" "$@"
}

# hf_dir GGUF OUT [make_hf_dir.py options]: a Hugging Face directory rebuilt from GGUF by
# scripts/dev/make_hf_dir.py (gguf-py, numpy, safetensors, tokenizers; independent of tq), cached:
# rebuilt only when the script, the input or the options change.
hf_dir() {
  local src="$1" out="$2"; shift 2
  local want; want="$(sha256sum "$TQ_ROOT/scripts/dev/make_hf_dir.py" | cut -c1-16) $(stat -c %s.%Y "$src") $*"
  if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$want" ]; then
    return 0
  fi
  rm -rf "$out"
  py "$TQ_ROOT/scripts/dev/make_hf_dir.py" "$src" "$out" "$@" >&2
  echo "$want" > "$out/.stamp"
}

# peak_rss_kib CMD...: run CMD under /usr/bin/time and print its peak RSS in KiB (stdout of CMD
# goes to stderr so that only the number is printed).
peak_rss_kib() {
  local t; t=$(mktemp)
  /usr/bin/time -f %M -o "$t" "$@" >&2
  cat "$t"; rm -f "$t"
}
