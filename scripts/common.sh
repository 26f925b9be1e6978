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

# venv_python NAME REQUIREMENTS ARGS...: run python in the cached venv $TQ_CACHE/NAME, (re)built
# whenever the hash-pinned requirements file changes (pip --require-hashes checks every wheel).
venv_python() {
  local venv="$TQ_CACHE/$1" reqs="$TQ_ROOT/scripts/requirements/$2"; shift 2
  local stamp; stamp="$venv/.ok-$(sha256sum "$reqs" | cut -c1-16)"
  if [ ! -x "$venv/bin/python" ] || [ ! -f "$stamp" ]; then
    rm -rf "$venv" && python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
      --only-binary=:all: -r "$reqs" >&2
    touch "$stamp"
  fi
  "$venv/bin/python" "$@"
}

# The Python used by oracle/dev scripts: gguf 0.19.0, numpy 2.4.6, scipy 1.17.1, safetensors
# 0.8.0, mpmath 1.3.0, tokenizers 0.23.3 and their dependencies.
py() { venv_python venv oracle.txt "$@"; }

# A second venv for the oracles that need transformers (gguf-py's LlamaHfVocab asks its
# AutoTokenizer): gguf 0.19.0 and transformers 4.57.6, the version llama.cpp's convert
# requirements pin (it brings its own tokenizers). Separate so that the main venv's set, which
# stamps every oracle's output, is unchanged.
py_tf() { venv_python venv-tf oracle-transformers.txt "$@"; }

# The Ray venv for the distributed driver (scripts/ray/tq_ray.py): ray 2.60.0 and its dependencies.
py_ray() { venv_python venv-ray ray.txt "$@"; }

# The plot venv (scripts/plot-2bit.py): matplotlib 3.10.7 and its dependencies.
py_plot() { venv_python venv-plot plot.txt "$@"; }

# llama_bin: the directory of llama.cpp's tools ($LLAMA_BIN, else the cached build, built if missing).
llama_bin() {
  local bin="${LLAMA_BIN:-$TQ_CACHE/llama.cpp/build/bin}"
  [ -x "$bin/llama-perplexity" ] || bin="$("$TQ_ROOT/scripts/build-llama.sh")"
  echo "$bin"
}

# tq_bin: $TQ_BIN, else the release binary of this checkout (built first).
tq_bin() {
  if [ -n "${TQ_BIN:-}" ]; then echo "$TQ_BIN"; return; fi
  (cd "$TQ_ROOT" && cargo build --release -q >&2)
  echo "${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
}

# smollm2_f16 TQ DIR: DIR/smollm2-f16.gguf, TQ's F16 of the fetched SmolLM2 (lossless from its Q4_1),
# made if absent; prints its path. The benchmarks' common starting point.
smollm2_f16() {
  local f="$2/smollm2-f16.gguf"
  if [ ! -f "$f" ]; then
    "$1" convert "$("$TQ_ROOT/scripts/fetch-data.sh")" --weights f16 -q -o "$f" >&2 || return 1
  fi
  echo "$f"
}

# smollm2_ref_logits TQ DIR CHUNKS: DIR/ref.logits, the F16's distributions on the first CHUNKS
# windows of wikitext-2-raw-test (and DIR/eval-f16.json), made if absent: what `tq eval
# --ref-logits` compares every benchmark file against.
smollm2_ref_logits() {
  [ -f "$2/ref.logits" ] && return 0
  "$1" eval "$2/smollm2-f16.gguf" -f "$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt" --chunks "$3" \
    --save-logits "$2/ref.logits" -q --json > "$2/eval-f16.json"
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
