#!/usr/bin/env bash
# Dev script (issue 14): generate the random-weight architecture fixtures (fixtures/arch_gen.rs,
# via examples/gen_arch.rs), run upstream llama-perplexity on each with --kl-divergence-base, and
# record the reference distributions (fixtures/arch/<name>.kld) and numbers
# (fixtures/arch/llama.json: final PPL, ctx, chunks, sha256 of the GGUF and of the text,
# llama.cpp commit) that tests/arch_fixtures.rs compares against. The logs stay in
# $TQ_CACHE/arch-fixtures/ for inspection.
#   scripts/dev/record-arch-fixtures.sh [NAMES...]
source "$(dirname "$0")/../common.sh"
cd "$TQ_ROOT"
bin=$(llama_bin)
ctx=128; chunks=6
w="$TQ_CACHE/arch-fixtures"; mkdir -p "$w" fixtures/arch
cargo run --release -q --example gen_arch -- "$w" "$@" >&2
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(gemma2 gemma3 phi3 phi3-short qwen3moe mixtral mixtral-ties)
for n in "${names[@]}"; do
  # llama.cpp logs from a background thread and, rarely, exits 0 before the last lines reach
  # the log: run again when the final estimate is missing.
  ppl=""
  for try in 1 2 3; do
    "$bin/llama-perplexity" -m "$w/$n.gguf" -f "$w/text.txt" -c $ctx --chunks $chunks -t 2 -v \
      --kl-divergence-base "fixtures/arch/$n.kld" > "$w/$n.log" 2>&1 || { tail -20 "$w/$n.log" >&2; exit 1; }
    ppl=$(grep -oP 'Final estimate: PPL = \K[0-9.]+' "$w/$n.log" || true)
    [ -n "$ppl" ] && break
  done
  [ -n "$ppl" ] || { echo "error: $n: no final PPL in $w/$n.log after 3 runs" >&2; exit 1; }
  python3 - "$n" "$ppl" "$(sha256sum "$w/$n.gguf" | cut -d' ' -f1)" "$(sha256sum "$w/text.txt" | cut -d' ' -f1)" $ctx $chunks <<'PY'
import json, os, sys
name, ppl, sha, text_sha, ctx, chunks = sys.argv[1:]
p = "fixtures/arch/llama.json"
j = json.load(open(p)) if os.path.exists(p) else {}
j["llama_cpp"] = ("llama-cpp-python==0.3.36 sdist, vendor/llama.cpp (commit 0c1e570), built by "
                  "scripts/build-llama.sh (Release, GGML_NATIVE, CPU backend)")
j["command"] = ("llama-perplexity -m NAME.gguf -f text.txt -c CTX --chunks CHUNKS -t 2 "
                "--kl-divergence-base fixtures/arch/NAME.kld (scripts/dev/record-arch-fixtures.sh)")
j["text_sha256"] = text_sha
j.setdefault("fixtures", {})[name] = {"ppl": float(ppl), "ctx": int(ctx), "chunks": int(chunks), "gguf_sha256": sha}
j["fixtures"] = dict(sorted(j["fixtures"].items()))
json.dump(j, open(p, "w"), indent=1)
open(p, "a").write("\n")
print(name, "PPL", ppl)
PY
done
