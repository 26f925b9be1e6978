#!/usr/bin/env bash
# Build the Python wheel that carries the `tq` binary (pyproject.toml: maturin, bindings = "bin"),
# so that `pip install` gives `tq` where there is no Rust toolchain. maturin 1.16.0 runs in its own
# venv under $TQ_CACHE (scripts/requirements/maturin.txt, pinned by version and sha256).
# Prints the wheel's path, dist/tq_gguf-<version>-py3-none-<platform>.whl with Cargo.toml's
# version: on Linux always dist/tq_gguf-<version>-py3-none-manylinux_2_34_<arch>.whl (e.g.
# tq_gguf-0.1.0-py3-none-manylinux_2_34_x86_64.whl): the tag is pinned, and maturin's auditwheel
# check fails the build if the binary needs a glibc newer than 2.34 (a toolchain on glibc >= 2.34
# links __libc_start_main@GLIBC_2.34, so the wheel runs on glibc 2.34+: Debian 12, Ubuntu 22.04,
# RHEL 9 and later). Elsewhere maturin names the platform (macosx_…). Older tq_gguf wheels in the
# output directory are removed first.
#
# maturin runs cargo itself (`cargo rustc --release --locked`) in the same target directory as
# `cargo build --release` ($CARGO_TARGET_DIR, else target/) with the same fingerprints: after a
# release build (quickstart, CI) cargo finds everything fresh (0.3 s) and maturin only packs the
# binary; before one, it builds what `cargo build --release` would, which then finds it fresh.
# WHEEL_OUT=DIR writes the wheel there instead of dist/; TQ_WHEEL_COMPAT=TAG another Linux tag.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
out="${WHEEL_OUT:-$TQ_ROOT/dist}"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
[ -n "$version" ] || { echo "build-wheel: no version in Cargo.toml" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$TQ_ROOT/target}"
mkdir -p "$out"
rm -f "$out"/tq_gguf-*.whl
compat=()
[ "$(uname -s)" = Linux ] && compat=(--compatibility "${TQ_WHEEL_COMPAT:-manylinux_2_34}")
venv_python venv-maturin maturin.txt -m maturin build --release --locked "${compat[@]}" --out "$out" >&2
shopt -s nullglob
wheels=("$out"/tq_gguf-"$version"-py3-none-*.whl)
if [ "${#wheels[@]}" != 1 ]; then
  echo "build-wheel: expected one $out/tq_gguf-$version-py3-none-*.whl, found ${#wheels[@]}" >&2
  exit 1
fi
echo "${wheels[0]}"
