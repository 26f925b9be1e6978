#!/usr/bin/env bash
# End to end: tq installed from its Python wheel, no Rust toolchain involved. Builds the wheel
# (scripts/build-wheel.sh: after a release build only maturin's packing runs), installs it with pip
# into a fresh venv in a temporary directory (offline: the wheel has no dependencies), checks that
# the venv's `tq` prints Cargo.toml's version and is byte for byte the release binary maturin packed,
# then runs the quickstart with it (TQ_BIN; downloads cached). QUICKSTART_REUSE=1: the LDLQ file of
# the quickstart that ran before it (same binary bytes, model, text and flags) is reused instead
# of calibrating again; everything else (conversions, both validations) runs with the wheel's tq.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
wheel=$(bash "$TQ_ROOT/scripts/build-wheel.sh")
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --disable-pip-version-check --no-index --no-deps "$wheel"
tq="$tmp/venv/bin/tq"
[ -x "$tq" ] || { echo "e2e-wheel: the wheel installed no $tq" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
got=$(env -i PATH="$tmp/venv/bin:/usr/bin:/bin" tq --version)
echo "installed: $got"
[ "$got" = "tq $version" ] || { echo "e2e-wheel: tq --version says '$got', Cargo.toml says $version" >&2; exit 1; }
cmp "$tq" "${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
echo "the venv's tq is the release binary, byte for byte ($(sha256sum "$tq" | cut -c1-16)…)"
TQ_BIN="$tq" QUICKSTART_REUSE=1 bash "$TQ_ROOT/scripts/quickstart.sh"
echo "e2e-wheel: OK"
