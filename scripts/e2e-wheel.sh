#!/usr/bin/env bash
# End to end: tq installed from its Python wheel, no Rust toolchain involved. Builds the wheel
# (scripts/build-wheel.sh: after a release build only maturin's packing runs), installs it with pip
# into a fresh venv in a temporary directory (offline: the wheel has no dependencies), checks that
# the venv's `tq` prints Cargo.toml's version and is byte for byte the release binary maturin packed,
# then runs the quickstart's TQ4_1S conversion with it, from a clean environment (PATH the venv's):
# the file must equal, byte for byte, the one the quickstart wrote with the release binary (the
# quickstart runs first when its file is missing), and `tq validate` passes its structure checks.
# (Until 2026-11-28 the whole quickstart ran again here with the installed binary: the same bytes
# as the release binary that had just run it, 2.5 minutes of CI for no new check.)
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
want="$TQ_CACHE/out/smollm2-tq4_1s.gguf"
[ -f "$want" ] || bash "$TQ_ROOT/scripts/quickstart.sh"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
env -i PATH="$tmp/venv/bin:/usr/bin:/bin" HOME="$tmp" tq convert "$smol" --weights tq4_1s -q \
  -o "$tmp/smollm2-tq4_1s.gguf"
cmp "$tmp/smollm2-tq4_1s.gguf" "$want"
echo "the installed tq's TQ4_1S conversion equals the quickstart's, byte for byte"
env -i PATH="$tmp/venv/bin:/usr/bin:/bin" HOME="$tmp" tq validate "$tmp/smollm2-tq4_1s.gguf" -q
echo "e2e-wheel: OK"
