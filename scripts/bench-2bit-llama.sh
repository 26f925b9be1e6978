#!/usr/bin/env bash
# Issue 17, the llama.cpp side: Q2_K / IQ2_XXS / IQ2_XS / IQ2_S of the same SmolLM2 F16 made by
# upstream llama-quantize with an imatrix from the same Botchan tokens (llama-imatrix, 512-token
# windows), scored by llama-perplexity's own KLD mode on the same wikitext-2 windows (tq has no IQ2
# decoder yet); Q2_K also by `tq eval`, which decodes it, as a cross-check of the two evaluators.
# Fallback tensors (576 is not a multiple of 256) are counted from llama-quantize's log.
#
#   bash scripts/bench-2bit-llama.sh [CHUNKS] [CALIB_TOKENS]     (after scripts/bench-2bit.sh)
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=${1:-10}; ctoks=${2:-8192}
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
bin=$("$TQ_ROOT/scripts/build-llama.sh")
w="$TQ_CACHE/bench2bit"; f16="$w/smollm2-f16.gguf"
[ -f "$w/imatrix.gguf" ] || "$bin/llama-imatrix" -m "$f16" -f "$botchan" -o "$w/imatrix.gguf" -c 512 --chunks $((ctoks / 512)) -t 2 > "$w/imatrix.log" 2>&1
[ -f "$w/llama-base.kld" ] || "$bin/llama-perplexity" -m "$f16" -f "$wiki" -c 512 --chunks "$chunks" -t 2 --kl-divergence-base "$w/llama-base.kld" > "$w/llama-f16.log" 2>&1
echo "| model | bytes | bpw (file) | fallback tensors | PPL (llama-perplexity) | mean KLD (llama-perplexity) | same top-1 % |"
echo "|---|---|---|---|---|---|---|"
for t in Q2_K IQ2_XXS IQ2_XS IQ2_S; do
  out="$w/llama-$t-imatrix.gguf"
  [ -f "$out" ] || "$bin/llama-quantize" --imatrix "$w/imatrix.gguf" "$f16" "$out" "$t" 2 > "$w/quantize-$t.log" 2>&1
  [ -s "$w/kld-$t.log" ] || "$bin/llama-perplexity" -m "$out" -c 512 --chunks "$chunks" -t 2 --kl-divergence-base "$w/llama-base.kld" --kl-divergence > "$w/kld-$t.log" 2>&1
  fb=$(grep -c "falling back" "$w/quantize-$t.log")
  ppl=$(grep -E "^Mean PPL\(Q\) +:" "$w/kld-$t.log" | awk '{print $4, $5, $6}')
  kld=$(grep -E "^Mean +KLD:" "$w/kld-$t.log" | awk '{print $3, $4, $5}')
  top=$(grep -E "^Same top p:" "$w/kld-$t.log" | awk '{print $4, $5, $6}')
  sz=$(stat -c %s "$out")
  echo "| llama.cpp $t + imatrix | $sz | $(awk "BEGIN{printf \"%.3f\", $sz*8/134515008}") | $fb | $ppl | $kld | $top |"
done
# The evaluator cross-check: Q2_K (tq decodes it) through tq eval against tq's F16 logits.
"$tq" eval "$w/llama-Q2_K-imatrix.gguf" --ref-logits "$w/ref.logits" -q --json > "$w/eval-llama-Q2_K.json" 2>/dev/null &&
  py - "$w/eval-llama-Q2_K.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["result"]; k = r["kld"]
print(f"\ntq eval of the Q2_K file: PPL {r['ppl']['value']:.3f}, mean KLD {k['kld']['value']:.5f} ± {k['kld']['err']:.5f}, same top-1 {100 * k['same_top']['value']:.2f} %")
PY
