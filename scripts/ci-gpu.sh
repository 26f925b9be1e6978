#!/usr/bin/env bash
# GPU decode kernels in CI (issue 8; tq2_r's in issue 17, tq2_t's in issue 19), on a machine with no GPU:
#  1. WGSL kernels run for real on Mesa's lavapipe (software Vulkan): the parity harness
#     (tests/kernels.rs with TQ_REQUIRE_GPU=1), `tq kernels check --backend wgpu` (every type,
#     tq2_r included) and `tq conformance --backend wgpu` on the six shared vector files.
#  2. CUDA: the host code builds (`--features cuda`, cudarc loads libcuda/libnvrtc at run time)
#     and the CUDA sources compile with NVRTC from the nvidia-cuda-nvrtc-cu12 wheel (PyPI,
#     sha256-checked, cached); running them needs an NVIDIA GPU (docs/kernels.md).
#  3. `tq kernels check --backend auto` shows what it picks and what it skips and why.
#  4. Metal sources: a host C++ syntax check through a shim header (no Metal compiler here; see
#     docs/kernels.md). Missing g++, libnvrtc or the lavapipe ICD fails the script (no silent skip).
#  5. `--backend wgpu` (issue 16 item 4): SmolLM2 TQ4_1S evaluated with its linear layers through the
#     WGSL mat-mul kernels on lavapipe, by `tq validate` (ggml numerics: the backend/kld_vs_cpu check
#     must pass) and `tq eval --numerics f32` (the tight bound); the KLD between the CPU run and the
#     kernel run is asserted within the stated bound from the JSON reports.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"

if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  echo "installing mesa-vulkan-drivers (lavapipe)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers >/dev/null
fi
# The lavapipe ICD must be there now, or "wgpu" below would test whatever else the loader finds.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  echo "FAIL: no lavapipe ICD (/usr/share/vulkan/icd.d/lvp_icd*.json) after installing mesa-vulkan-drivers" >&2
  exit 1
fi
ls /usr/share/vulkan/icd.d/lvp_icd*.json
# Test lavapipe, by name (src/gpu/wgpu.rs: TQ_WGPU_ADAPTER picks the adapter whose name contains it).
export TQ_WGPU_ADAPTER=llvmpipe

# NVRTC for the CUDA compile check (no driver, no GPU needed).
NVRTC_VER=12.9.86
NVRTC_WHL=nvidia_cuda_nvrtc_cu12-$NVRTC_VER-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
NVRTC_SHA=210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4
NVRTC_DIR="$TQ_CACHE/nvrtc-$NVRTC_VER"
if [ ! -f "$NVRTC_DIR/.ok" ]; then
  mkdir -p "$TQ_CACHE/wheels"
  if [ ! -f "$TQ_CACHE/wheels/$NVRTC_WHL" ]; then
    python3 -m pip download -q --disable-pip-version-check --no-deps \
      "nvidia-cuda-nvrtc-cu12==$NVRTC_VER" -d "$TQ_CACHE/wheels"
  fi
  verify "$TQ_CACHE/wheels/$NVRTC_WHL" "$NVRTC_SHA"
  rm -rf "$NVRTC_DIR" && mkdir -p "$NVRTC_DIR"
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
    "$TQ_CACHE/wheels/$NVRTC_WHL" "$NVRTC_DIR"
  touch "$NVRTC_DIR/.ok"
fi
export LD_LIBRARY_PATH="$NVRTC_DIR/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The Vulkan loader complains when XDG_RUNTIME_DIR is unset (CI has no session); give it one.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

TARGET="${CARGO_TARGET_DIR:-target}"
echo "== kernels: parity harness on wgpu (lavapipe) + CUDA NVRTC compile =="
# TQ_REQUIRE_GPU / TQ_REQUIRE_NVRTC: no adapter / no libnvrtc is a failure here, not a skip.
TQ_REQUIRE_GPU=1 TQ_REQUIRE_NVRTC=1 TQ_REQUIRE_DATA=1 cargo test --locked --features wgpu,cuda --test kernels -- --nocapture
echo "== tq kernels check --backend wgpu (tq4_1s, tq3_1s, turbo2/3/4, tq2_r, tq2_t) =="
"$TARGET/debug/tq" kernels check --backend wgpu | tee "$TQ_CACHE/ci-gpu-kernels.txt"
# tq2_r (issue 17): its decode, rotation (both paths) and GEMV lines must be there and pass.
for want in "tq2_r    dequantize seed2bit.json, design layout" "tq2_r    rotate     K=8192" \
            "tq2_r    matvec     smollm2.ffn_down"; do
  grep "$want" "$TQ_CACHE/ci-gpu-kernels.txt" | grep -q PASS \
    || { echo "FAIL: no passing '$want' line in tq kernels check" >&2; exit 1; }
done
# tq2_t (issue 19): decode (every scale byte, the CPU encoder's rows), row decode through the
# multi-pass rotation, the GEMV at SmolLM2's shape.
for want in "tq2_t    dequantize random-bytes (every scale byte)" \
            "tq2_t    dequantize gaussian 8x576, CPU Viterbi encoder" \
            "tq2_t    row-decode llama3-8b.ffn_down 14336" "tq2_t    matvec     smollm2.ffn_down"; do
  grep -F "$want" "$TQ_CACHE/ci-gpu-kernels.txt" | grep -q PASS \
    || { echo "FAIL: no passing '$want' line in tq kernels check" >&2; exit 1; }
done
echo "== tq conformance --backend wgpu: the shared vectors through the kernels (issue 17) =="
conf="${TQ_CONFORMANCE:-$TQ_ROOT/../shared/conformance}"
"$TARGET/debug/tq" conformance --backend wgpu "$conf/seed2bit.json" "$conf/tq4_1s.json" \
  "$conf/tq3_1s.json" "$conf/turbo2_0.json" "$conf/turbo3_0.json" "$conf/turbo4_0.json" \
  | tee "$TQ_CACHE/ci-gpu-conformance.txt"
grep -q "reconstruct\[wgpu\]  *42/42 " "$TQ_CACHE/ci-gpu-conformance.txt"
grep -q "matvec\[wgpu\]  *42/42 " "$TQ_CACHE/ci-gpu-conformance.txt"
echo "== Metal sources: host C++ syntax check with kernels/metal/check/msl_shim.h (not a Metal compile) =="
if command -v g++ >/dev/null; then
  for f in tq turbo tq2r; do
    { echo "#include \"$TQ_ROOT/kernels/metal/check/msl_shim.h\""
      grep -v '#include <metal_stdlib>' kernels/metal/common.metal
      cat "kernels/metal/$f.metal"; } > "$TQ_CACHE/msl_$f.cpp"
    g++ -std=c++17 -fsyntax-only -Wall -Wno-attributes -Wno-unknown-pragmas "$TQ_CACHE/msl_$f.cpp"
    echo "kernels/metal/$f.metal: syntax ok (host C++ shim)"
  done
else
  echo "FAIL: g++ not found: the Metal syntax check cannot run (install g++)" >&2
  exit 1
fi
echo "== tq kernels check --backend auto --quick =="
"$TARGET/debug/tq" kernels check --backend auto --quick --types tq4_1s
echo "== tq validate --kernels wgpu: a TQ4_1S artifact's own blocks through the kernels (issue 16) =="
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
"$TARGET/debug/tq" convert "$smol" --weights tq4_1s -q -o "$TQ_CACHE/ci-gpu-tq4_1s.gguf"
"$TARGET/debug/tq" validate "$TQ_CACHE/ci-gpu-tq4_1s.gguf" --kernels wgpu --gen-prompts 0 -q \
  | tee "$TQ_CACHE/ci-gpu-validate.txt"
grep -q "kernels/wgpu  *pass" "$TQ_CACHE/ci-gpu-validate.txt"
echo "== --backend wgpu: SmolLM2 TQ4_1S's linear layers through the mat-mul kernels on lavapipe (issue 16) =="
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
# 1 window x 128 tokens: the kernel run is the slow part on lavapipe (docs/bench/gpu-kernels.md;
# 2 windows took 191 s of CI, 2026-11-28).
"$TARGET/debug/tq" validate "$TQ_CACHE/ci-gpu-tq4_1s.gguf" --ref "$smol" --text "$botchan" \
  --ctx 128 --chunks 1 --backend wgpu --kernels wgpu --gen-prompts 0 --json -q \
  > "$TQ_CACHE/ci-gpu-backend.json"
# --backend auto: no CUDA driver and no Metal here, so it must pick wgpu (asserted below).
"$TARGET/debug/tq" eval "$TQ_CACHE/ci-gpu-tq4_1s.gguf" --text "$botchan" --ctx 128 --chunks 1 \
  --backend auto --numerics f32 --json -q > "$TQ_CACHE/ci-gpu-backend-f32.json"
python3 - "$TQ_CACHE/ci-gpu-backend.json" "$TQ_CACHE/ci-gpu-backend-f32.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
e = json.load(open(sys.argv[2]))
check = next(c for c in v["checks"] if (c["group"], c["name"]) == ("backend", "kld_vs_cpu"))
assert check["status"] == "pass" and v["verdict"] == "pass", check
runs = [("tq validate (ggml numerics)", v["backend"], v["quality"]["ppl"]["value"]),
        ("tq eval --numerics f32", e["result"]["backend"], e["result"]["ppl"]["value"])]
assert runs[1][1]["comparison"]["bound"] == {"mean": 1e-8, "max": 1e-6}, runs[1][1]
for name, b, ppl in runs:
    c = b["comparison"]
    assert b["backend"] == "wgpu" and b["on_backend"] == {"tq4_1s": 210}, b
    assert c["within_bound"], c
    assert c["kld"]["value"] <= c["bound"]["mean"] and c["kld_max"] <= c["bound"]["max"], c
    print(f"{name}: 210 tq4_1s weights on wgpu ({b['device']}); PPL {ppl:.4f}, CPU run "
          f"{c['ppl_cpu']['value']:.4f}; KLD(cpu||wgpu) mean {c['kld']['value']:.3e} <= "
          f"{c['bound']['mean']:.0e}, max {c['kld_max']:.3e} <= {c['bound']['max']:.0e}; "
          f"{c['seconds_backend']:.1f} s kernel run, {c['seconds_cpu']:.1f} s CPU run")
PY
echo "== tq validate --kernels wgpu: a tq2_r artifact's own blocks through the tq2_r kernels (issue 17) =="
"$TARGET/debug/tq" convert "$smol" --weights tq2_r -q -o "$TQ_CACHE/ci-gpu-tq2_r.gguf"
"$TARGET/debug/tq" validate "$TQ_CACHE/ci-gpu-tq2_r.gguf" --kernels wgpu --gen-prompts 0 -q \
  | tee "$TQ_CACHE/ci-gpu-validate-tq2r.txt"
grep -q "kernels/wgpu  *pass" "$TQ_CACHE/ci-gpu-validate-tq2r.txt"
echo "== tq validate --kernels wgpu: a tq2_t artifact's own blocks through the tq2_t kernels (issue 19) =="
# Layer 0 only in tq2_t (the Viterbi encoder is slow in a debug build), the rest q8_0.
"$TARGET/debug/tq" convert "$smol" --weights q8_0 --tensor-type '^blk\.0\.=tq2_t' -q \
  -o "$TQ_CACHE/ci-gpu-tq2_t.gguf"
"$TARGET/debug/tq" validate "$TQ_CACHE/ci-gpu-tq2_t.gguf" --kernels wgpu --gen-prompts 0 -q \
  | tee "$TQ_CACHE/ci-gpu-validate-tq2t.txt"
grep -q "kernels/wgpu  *pass" "$TQ_CACHE/ci-gpu-validate-tq2t.txt"
