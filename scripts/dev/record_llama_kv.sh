#!/usr/bin/env bash
# Dev script: record upstream llama-perplexity's numbers with quantized KV caches (q8_0, q4_0 with
# and without upstream's Hadamard rotation) on SmolLM2 F16 / Botchan 8 x 256, into
# fixtures/llama_reference.json (runs with model "f16+kv:<K>/<V>[-norot]"), for tests/eval.rs.
source "$(dirname "$0")/../common.sh"
cd "$TQ_ROOT"
bin=$("$TQ_ROOT/scripts/build-llama.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
f16="${1:-$TQ_CACHE/bench/smollm2-f16.gguf}"
w="$TQ_CACHE/eval"; mkdir -p "$w"
base="$w/botchan-f16-256x8.kld"
"$bin/llama-perplexity" -m "$f16" -f "$botchan" -c 256 --chunks 8 -t 2 --kl-divergence-base "$base" > "$w/kvrec-base.log" 2>&1
for spec in q8_0:1 q4_0:1 q4_0:0; do
  t=${spec%:*}; rot=${spec#*:}
  env LLAMA_ATTN_ROT_DISABLE=$((1 - rot)) "$bin/llama-perplexity" -m "$f16" -f "$botchan" -c 256 --chunks 8 -t 2 \
    -ctk "$t" -ctv "$t" -fa on --kl-divergence-base "$base" --kl-divergence > "$w/kvrec-$t-$rot.log" 2>&1
  py - "$w/kvrec-$t-$rot.log" "f16+kv:$t/$t$([ "$rot" = 0 ] && echo -norot)" <<'PY'
import json, re, sys
log, model = sys.argv[1], sys.argv[2]
L = open(log, encoding="utf-8", errors="replace").read()
g = lambda p: float(re.search(p, L).group(1))
run = {"text": "botchan.txt", "ctx": 256, "chunks": 8, "model": model, "base": "f16",
       "ppl": g(r"Mean PPL\(Q\)\s*:\s*([\d.]+)"), "ppl_base": g(r"Mean PPL\(base\)\s*:\s*([\d.]+)"),
       "kld": g(r"Mean\s+KLD:\s*([-\d.]+)"), "same_top_pct": g(r"Same top p:\s*([-\d.]+)")}
p = "fixtures/llama_reference.json"
j = json.load(open(p))
j["runs"] = [r for r in j["runs"] if not (r["text"] == run["text"] and r["model"] == model)] + [run]
j["kv"] = ("runs 'f16+kv:K/V': llama-perplexity -ctk K -ctv V -fa on on the f16 model (upstream rotates "
           "quantized KV caches by default); '-norot': LLAMA_ATTN_ROT_DISABLE=1. Recorded by "
           "scripts/dev/record_llama_kv.sh")
json.dump(j, open(p, "w"), indent=1)
open(p, "a").write("\n")
print(model, run)
PY
done
