#!/usr/bin/env bash
# Issue 14 measurement: tq's runtime against upstream llama-perplexity on the wide (speed-only)
# variants of the architecture fixtures (fixtures/arch_gen.rs: gemma2-wide, gemma3-wide,
# phi3-wide; hidden 768, FFN 1536), same text, same windows (8 x 512), same threads (2).
# For each model: llama.cpp's distributions (--kl-divergence-base), tq eval against them (mean
# KLD, PPL, peak RSS), then speed: llama-perplexity (plain PPL) and tq eval alternated, RUNS
# times each, tokens per second of evaluation (llama.cpp: wall time after its set-up; tq: its own
# timing line; both exclude model loading).
#   bash scripts/bench-arch.sh [RUNS]
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
runs=${1:-2}
cargo build --release --locked --quiet --example gen_arch
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
gen="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/examples/gen_arch"
bin=$("$TQ_ROOT/scripts/build-llama.sh")
w="$TQ_CACHE/bench-arch"; mkdir -p "$w"
names=(gemma2-wide gemma3-wide phi3-wide)
"$gen" "$w" "${names[@]}" 2>/dev/null
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in "${names[@]}"; do
  m="$w/$n.gguf"
  [ -f "$w/$n.kld" ] || "$bin/llama-perplexity" -m "$m" -f "$w/text.txt" -c 512 --chunks 8 -t 2 \
    --kl-divergence-base "$w/$n.kld" > "$w/$n-base.log" 2>&1
  /usr/bin/time -f "%M" -o "$w/$n.rss" "$tq" eval "$m" --ref-logits "$w/$n.kld" -t 2 --json -q > "$w/$n.json"
  python3 - "$n" "$w/$n.json" "$(cat "$w/$n.rss")" <<'PY'
import json, sys
n, p, rss = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(p))["result"]
print(f"{n}: tq vs llama.cpp mean KLD {r['kld']['kld']['value']:.2e}, PPL {r['ppl']['value']:.4f} "
      f"(llama.cpp {r['kld']['ppl_base']['value']:.4f}), tq peak RSS {rss/1024:.0f} MB")
PY
  for r in $(seq "$runs"); do
    t0=$(date +%s.%N)
    "$bin/llama-perplexity" -m "$m" -f "$w/text.txt" -c 512 --chunks 8 -t 2 > "$w/$n-llama.log" 2>&1
    t1=$(date +%s.%N)
    # Wall time less the set-up before "calculating perplexity" (llama.cpp's log timestamps are
    # minutes.seconds.ms.us since start; its last lines are sometimes not flushed, so the end is
    # taken from the clock).
    lt=$(python3 - "$w/$n-llama.log" "$t0" "$t1" <<'PY'
import re, sys
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(\d+)\.(\d+)\.(\d+)\.(\d+) ", line)
    if m and "calculating perplexity" in line:
        setup = int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
        print(f"{float(sys.argv[3]) - float(sys.argv[2]) - setup:.3f}")
        break
PY
)
    tt=$("$tq" eval "$m" -f "$w/text.txt" --ctx 512 --chunks 8 -t 2 2>&1 | grep -oP 'tokens scored, \K[0-9.]+(?= s)')
    python3 -c "
lt, tt = $lt, $tt
print(f'$n run $r: llama-perplexity {4096/lt:.0f} tok/s ({lt:.2f} s), tq eval {4096/tt:.0f} tok/s ({tt:.2f} s), tq/llama speed {lt/tt:.2f}x')"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
