#!/usr/bin/env bash
# First run of the CUDA kernels on a machine with an NVIDIA GPU and no network (issue 8):
# parity harness + decode throughput, a log, and markdown rows for docs/bench/gpu-kernels.md.
#
# Needs, carried to the machine (nothing is downloaded or built there):
#   - a release binary built elsewhere:  cargo build --release --features cuda
#     (cudarc loads libcuda/libnvrtc at run time, so it runs on any driver);
#   - libnvrtc, unless the machine has its own (preferred: /usr/local/cuda*/lib64, ldconfig).
#     The cached wheel's library is 106 MB; zstd brings it under a 64 MiB transfer limit
#     (level 3: 42 MB; libnvrtc-builtins is needed too, 0.4 MB compressed):
#       L=~/.cache/tq/nvrtc-12.9.86/nvidia/cuda_nvrtc/lib     # unpacked by scripts/ci-gpu.sh
#       mkdir -p carry && zstd -19 -T0 $L/libnvrtc.so.12 $L/libnvrtc-builtins.so.12.9 --output-dir-flat carry
#     or xz (31 MB; for machines without zstd: xz -6 -c FILE > carry/FILE.xz).
#     This script decompresses carry/*.zst / *.xz (or takes plain .so files) into a temp directory.
#   - the conformance vectors (shared/conformance, or TQ_CONFORMANCE).
#
# Usage: scripts/gpu-cuda.sh [TQ_BINARY] [NVRTC_DIR]
#   TQ_BINARY  default: $TQ_BIN, else target/release/tq, else ./tq
#   NVRTC_DIR  directory with libnvrtc.so.12[.zst|.xz] + libnvrtc-builtins.so.12.*[.zst|.xz]
#              (default: $TQ_NVRTC_DIR, else ./carry); only used when the machine has no libnvrtc
# Output: the log in $TQ_LOG (default ./gpu-cuda-<date>.log) and markdown rows on stdout.
# Exit status: non-zero when the harness fails (the bench still runs and is logged).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-${TQ_BIN:-}}"
if [ -z "$BIN" ]; then
  for b in "$ROOT/target/release/tq" ./tq; do [ -x "$b" ] && BIN="$b" && break; done
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || { echo "error: no tq binary (pass its path; build with --release --features cuda)" >&2; exit 1; }
CARRY="${2:-${TQ_NVRTC_DIR:-./carry}}"
LOG="${TQ_LOG:-./gpu-cuda-$(date -u +%Y%m%dT%H%M%SZ).log}"
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }

# --- driver and GPU -------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null; then
  say "error: nvidia-smi not found (no NVIDIA driver?)"; exit 1
fi
say "== driver / GPU =="
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv 2>&1 | tee -a "$LOG"
# The driver's CUDA version: NVRTC must not be newer than this for PTX (tq loads a CUBIN for the
# device's sm_XY, which avoids that limit; the device line below says which it used).
nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | tee -a "$LOG" || true
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)

# --- libnvrtc: the machine's own first, else the carried copy ---------------------------------
own=""
for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu; do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then own="$d"; break; fi
done
if [ -z "$own" ] && ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then own="(ldconfig)"; fi
if [ -n "$own" ]; then
  say "libnvrtc: the machine's own ($own)"
  [ "$own" != "(ldconfig)" ] && export LD_LIBRARY_PATH="$own${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  [ -d "$CARRY" ] || { say "error: no libnvrtc on this machine and no carried copy in $CARRY"; exit 1; }
  NV=$(mktemp -d)
  trap 'rm -rf "$NV"' EXIT
  for f in "$CARRY"/libnvrtc*; do
    case "$f" in
      *.zst) zstd -q -d "$f" -o "$NV/$(basename "${f%.zst}")" || { say "error: zstd -d $f failed"; exit 1; } ;;
      # xz through Python's lzma: the GPU machines seen so far have python3 but no zstd or xz.
      *.xz) python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
              "$f" "$NV/$(basename "${f%.xz}")" || { say "error: cannot unpack $f"; exit 1; } ;;
      *) cp "$f" "$NV/" ;;
    esac
  done
  ls "$NV"/libnvrtc.so.12 >/dev/null 2>&1 || { say "error: $CARRY has no libnvrtc.so.12[.zst|.xz]"; exit 1; }
  ls "$NV"/libnvrtc-builtins.so.* >/dev/null 2>&1 || say "warning: no libnvrtc-builtins in $CARRY: NVRTC will fail to compile"
  # cudarc also looks for the unversioned name.
  ln -sf libnvrtc.so.12 "$NV/libnvrtc.so"
  export LD_LIBRARY_PATH="$NV${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "libnvrtc: carried copy from $CARRY (unpacked in $NV)"
fi

# --- harness, then bench ----------------------------------------------------------------------
say "== tq kernels check --backend cuda =="
"$BIN" kernels check --backend cuda 2>&1 | tee -a "$LOG"
check_rc=${PIPESTATUS[0]}
say "exit status: $check_rc"
say "== tq kernels check --backend cuda --bench --types tq4_1s,tq3_1s,turbo2,turbo3,turbo4 =="
"$BIN" kernels check --backend cuda --bench 2>&1 | tee -a "$LOG.bench"
cat "$LOG.bench" >> "$LOG"
rm -f "$LOG.bench"

# --- markdown rows for docs/bench/gpu-kernels.md -----------------------------------------------------
# Lines parsed (src/gpu/harness/report.rs format_report):
#   backend cuda on <device> (NVRTC a.b, sm_XY CUBIN)
#   N passed, M failed
#   throughput <type> <values> values <ms> ms <GB/s> GB/s  (<pct>% of <peak> GB/s peak)
echo
echo "Markdown for docs/bench/gpu-kernels.md ($(date -u +%Y-%m-%d), driver $DRIVER):"
echo
DEVICE=$(grep -m1 '^backend cuda on ' "$LOG" | sed 's/^backend cuda on //')
SUMMARY=$(grep -m1 -E '^[0-9]+ passed, [0-9]+ failed' "$LOG" || echo "harness did not complete (exit $check_rc)")
echo "| device | driver | harness (\`tq kernels check --backend cuda\`) |"
echo "|---|---|---|"
echo "| ${DEVICE:-$GPU_NAME} | $DRIVER | $SUMMARY |"
echo
echo "| type | values | ms per dequantize | GB/s (blocks read + f32 written) | % of peak |"
echo "|---|---:|---:|---:|---:|"
grep '^throughput ' "$LOG" | awk '{
  pct = "n/a"; peak = "";
  for (i = 9; i <= NF; i++) if ($i ~ /^\(/) { pct = substr($i, 2); peak = $(i + 2) }
  if (peak != "") pct = pct " of " peak " GB/s";
  printf "| %s | %s | %s | %s | %s |\n", $2, $3, $5, $7, pct
}'
echo
echo "Log: $LOG"
exit "$check_rc"
