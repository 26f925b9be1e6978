#!/usr/bin/env bash
# Dev script: run upstream llama-perplexity and `tq eval` side by side on the same model, text,
# windows and threads, and print both (PPL, and with --base the KL divergence from a base model),
# with wall-clock times and tokens/s.
#
#   scripts/eval-vs-llama.sh [--base BASE.gguf] [--chunks N] [--ctx N] [--threads N]
#                            [--kv KTYPE VTYPE] [--no-kv-rot] MODEL TEXT
#
# --kv runs both tools with that KV cache (llama.cpp: -ctk/-ctv -fa on; tq: the simulator);
# --no-kv-rot turns upstream's KV rotation off in both (LLAMA_ATTN_ROT_DISABLE=1 / --no-kv-rotation).
#
# llama.cpp comes from scripts/build-llama.sh ($TQ_CACHE/llama.cpp/build/bin, or $LLAMA_BIN);
# tq is built in release mode (or $TQ_BIN). llama's base logits (--kl-divergence-base) are cached
# under $TQ_CACHE/eval/. Timings include model load and tokenization for both tools.
source "$(dirname "$0")/common.sh"
chunks=20; ctx=512; threads=2; base=""; llama_kv=(); tq_kv=(); rot_env=(); tq_rot=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift 2 ;;
    --chunks) chunks="$2"; shift 2 ;;
    --ctx) ctx="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --kv) llama_kv=(-ctk "$2" -ctv "$3" -fa on); tq_kv=(--ctk "$2" --ctv "$3"); shift 3 ;;
    --no-kv-rot) rot_env=(env LLAMA_ATTN_ROT_DISABLE=1); tq_rot=(--no-kv-rotation); shift ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || { echo "usage: $0 [--base BASE.gguf] [--chunks N] [--ctx N] [--threads N] MODEL TEXT" >&2; exit 2; }
model="$1"; text="$2"
bin=$(llama_bin)
TQ_BIN=$(tq_bin)
work="$TQ_CACHE/eval"; mkdir -p "$work"
now() { date +%s.%N; }

# llama.cpp
if [ -n "$base" ]; then
  key=$( (sha256sum "$base" "$text" | cut -d' ' -f1; echo "$chunks $ctx") | sha256sum | cut -c1-16)
  kld="$work/llama-base-$key.kld"
  if [ ! -f "$kld" ]; then
    "$bin/llama-perplexity" -m "$base" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
      --kl-divergence-base "$kld.tmp" > "$work/llama-base-$key.log" 2>&1
    mv "$kld.tmp" "$kld"
  fi
  t0=$(now)
  "${rot_env[@]}" "$bin/llama-perplexity" -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
    "${llama_kv[@]}" --kl-divergence-base "$kld" --kl-divergence > "$work/llama.log" 2>&1
  t1=$(now)
else
  t0=$(now)
  "${rot_env[@]}" "$bin/llama-perplexity" -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
    "${llama_kv[@]}" > "$work/llama.log" 2>&1
  t1=$(now)
fi
# tq
t2=$(now)
if [ -n "$base" ]; then
  "$TQ_BIN" eval "$model" --text "$text" --ctx "$ctx" --chunks "$chunks" --threads "$threads" --ref "$base" "${tq_kv[@]}" "${tq_rot[@]}" --json -q > "$work/tq.json"
else
  "$TQ_BIN" eval "$model" --text "$text" --ctx "$ctx" --chunks "$chunks" --threads "$threads" "${tq_kv[@]}" "${tq_rot[@]}" --json -q > "$work/tq.json"
fi
t3=$(now)

python3 - "$work/llama.log" "$work/tq.json" "$t0" "$t1" "$t2" "$t3" "$chunks" "$ctx" <<'EOF'
import json, re, sys
log, tqj, t0, t1, t2, t3, chunks, ctx = sys.argv[1:]
L = open(log, encoding="utf-8", errors="replace").read()
r = json.load(open(tqj))["result"]
def grab(pat):
    m = re.search(pat, L)
    return (float(m.group(1)), float(m.group(2)) if m.lastindex and m.lastindex > 1 else None) if m else (None, None)
rows = []
ppl = grab(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")
if ppl[0] is None:
    ppl = grab(r"Mean PPL\(Q\)\s*:\s*([\d.]+) ±\s*([\d.]+)")
rows.append(("PPL", ppl[0], r["ppl"]["value"], "%.4f"))
k = r.get("kld")
if k:
    rows.append(("PPL(base)", grab(r"Mean PPL\(base\)\s*:\s*([\d.]+)")[0], k["ppl_base"]["value"], "%.4f"))
    rows.append(("mean KLD", grab(r"Mean\s+KLD:\s*([-\d.]+)")[0], k["kld"]["value"], "%.6f"))
    rows.append(("median KLD", grab(r"Median\s+KLD:\s*([-\d.]+)")[0], k["kld_median"], "%.6f"))
    rows.append(("99% KLD", grab(r"99\.0%\s+KLD:\s*([-\d.]+)")[0], k["kld_p99"], "%.6f"))
    rows.append(("max KLD", grab(r"Maximum KLD:\s*([-\d.]+)")[0], k["kld_max"], "%.6f"))
    rows.append(("RMS dp %", grab(r"RMS Δp\s*:\s*([-\d.]+)")[0], 100 * k["p_diff_rms"]["value"], "%.3f"))
    rows.append(("same top %", grab(r"Same top p:\s*([-\d.]+)")[0], 100 * k["same_top"]["value"], "%.3f"))
tl, tt = float(t1) - float(t0), float(t3) - float(t2)
ntok = int(chunks) * int(ctx)
print(f"{'':12} {'llama.cpp':>12} {'tq':>12} {'tq/llama-1':>11}")
for name, a, b, fmt in rows:
    rel = f"{(b / a - 1) * 100:+.3f}%" if a not in (None, 0) else ""
    print(f"{name:12} {fmt % a if a is not None else '?':>12} {fmt % b:>12} {rel:>11}")
print(f"{'seconds':12} {tl:12.1f} {tt:12.1f}")
print(f"{'tokens/s':12} {ntok / tl:12.1f} {ntok / tt:12.1f}   speed ratio tq/llama = {tl / tt:.2f}x")
EOF
