#!/usr/bin/env bash
# End to end: `tq eval` on llama.cpp's own IQ quants (issue 16, "any artifact").
#
# SmolLM2 (F16 written by `tq convert --weights f16` from the cached Q4_1 file) is quantized by
# upstream llama-quantize to IQ2_XS and IQ3_XXS with an imatrix that llama-imatrix computes on the
# second half of Botchan. Both tools then score the same Botchan windows (the start of the text,
# ctx 512): PPL, and KLD against the F16 model.
#
# Oracles, in order:
#  0. gguf-py: every tensor of each artifact, decoded by tq (`tq convert --weights f32`), must equal
#     gguf-py's numpy dequantization bit for bit.
#  1. llama-perplexity, run here on the same file and windows: tq's PPL must agree within
#     PPL_TOL (0.5%) and its mean KLD within KLD_TOL (5%) + 1e-3 absolute.
#  2. the llama.cpp numbers recorded in fixtures/llama_reference.json (model "llama-iq2_xs-imatrix"
#     / "llama-iq3_xxs-imatrix"): this run's llama-perplexity PPL must be within REC_TOL (3%), so a
#     llama.cpp or text change that moves the artifact is noticed (imatrix sums depend on the CPU's
#     SIMD path, so the artifact itself is not byte-reproducible across machines).
#
#   scripts/e2e-iq.sh [--chunks N] [--record]
#
# --record prints the llama.cpp numbers as JSON runs for fixtures/llama_reference.json.
# Needs llama.cpp (scripts/build-llama.sh; built if missing). Artifacts are cached in
# $TQ_CACHE/e2e-iq/ keyed by the F16 model and the imatrix text.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
chunks=8; ctx=512; threads=2; record=0
while [ $# -gt 0 ]; do
  case "$1" in
    --chunks) chunks="$2"; shift 2 ;;
    --record) record=1; shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "usage: $0 [--chunks N] [--record]" >&2; exit 2 ;;
  esac
done
PPL_TOL=0.005; KLD_TOL=0.05; REC_TOL=0.03
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
text=$("$TQ_ROOT/scripts/fetch-botchan.sh")
bin=$(llama_bin)
for t in llama-quantize llama-imatrix llama-perplexity; do
  [ -x "$bin/$t" ] || bin="$("$TQ_ROOT/scripts/build-llama.sh")"
done
tq=$(tq_bin)
out="$TQ_CACHE/e2e-iq"; mkdir -p "$out"

f16="$out/smollm2-f16.gguf"
[ -f "$f16" ] || "$tq" convert "$smol" --weights f16 -q -o "$f16"
# imatrix text: the second half of Botchan (the scored windows come from the first half).
calib="$out/botchan-second-half.txt"
tail -c +$(( $(wc -c < "$text") / 2 )) "$text" > "$calib"
key=$(cat "$f16" "$calib" | sha256sum | cut -c1-12)
imat="$out/imatrix-$key.gguf"
if [ ! -f "$imat" ]; then
  "$bin/llama-imatrix" -m "$f16" -f "$calib" -c 512 --chunks 16 -t "$threads" -o "$out/imatrix-$key.tmp.gguf" \
    > "$out/imatrix.log" 2>&1 || { tail -5 "$out/imatrix.log" >&2; exit 1; }
  mv "$out/imatrix-$key.tmp.gguf" "$imat"
fi
# Base logits of the F16 model for both tools' KLD (llama.cpp's and tq's own formats).
base_llama="$out/f16-$chunks.kld"
[ -f "$base_llama" ] || "$bin/llama-perplexity" -m "$f16" -f "$text" -c "$ctx" --chunks "$chunks" \
  -t "$threads" --kl-divergence-base "$base_llama" > "$out/base.log" 2>&1
base_tq="$out/f16-$chunks.tql"
[ -f "$base_tq" ] || "$tq" eval "$f16" --text "$text" --ctx "$ctx" --chunks "$chunks" \
  --threads "$threads" --save-logits "$base_tq" -q > /dev/null

status=0
for ty in IQ2_XS IQ3_XXS; do
  lo=$(echo "$ty" | tr 'A-Z' 'a-z')
  m="$out/smollm2-$lo-imatrix-$key.gguf"
  if [ ! -f "$m" ]; then
    "$bin/llama-quantize" --imatrix "$imat" "$f16" "$m.tmp" "$ty" "$threads" > "$out/quantize-$lo.log" 2>&1 \
      || { tail -5 "$out/quantize-$lo.log" >&2; exit 1; }
    mv "$m.tmp" "$m"
  fi
  # 0. tq's decoding of the whole artifact against gguf-py's, bit for bit.
  "$tq" convert "$m" --weights f32 -q -o "$out/decoded-$lo.gguf"
  py - "$m" "$out/decoded-$lo.gguf" <<'PY' || status=1
import collections, sys
import numpy as np, gguf
from gguf.quants import dequantize
q, f = gguf.GGUFReader(sys.argv[1]), {t.name: t for t in gguf.GGUFReader(sys.argv[2]).tensors}
n, bad = collections.Counter(), []
for t in q.tensors:
    want = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).ravel()
    got = np.asarray(f[t.name].data, dtype=np.float32).ravel()
    if f[t.name].tensor_type != gguf.GGMLQuantizationType.F32 or got.shape != want.shape \
            or not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        bad.append(t.name)
    n[t.tensor_type.name.lower()] += 1
if not bad:
    print(f"{sys.argv[1].rsplit('/', 1)[-1]}: tq decodes all {sum(n.values())} tensors {dict(n)} "
          "bit-identical with gguf-py")
for name in bad[:5]:
    print(f"error: e2e-iq: {name}: tq's decoding differs from gguf-py's", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
  rm -f "$out/decoded-$lo.gguf"
  t0=$(date +%s.%N)
  "$bin/llama-perplexity" -m "$m" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" \
    --kl-divergence-base "$base_llama" --kl-divergence > "$out/llama-$lo.log" 2>&1
  t1=$(date +%s.%N)
  "$tq" eval "$m" --text "$text" --ctx "$ctx" --chunks "$chunks" --threads "$threads" \
    --ref-logits "$base_tq" --json -q > "$out/tq-$lo.json"
  t2=$(date +%s.%N)
  "$tq" inspect "$m" --json > "$out/inspect-$lo.json"
  py - "$ty" "$out/llama-$lo.log" "$out/tq-$lo.json" "$out/inspect-$lo.json" "$chunks" "$ctx" \
    "$PPL_TOL" "$KLD_TOL" "$REC_TOL" "$record" "$t0" "$t1" "$t2" <<'PY' || status=1
import json, re, sys
ty, log, tqj, insp, chunks, ctx, ppl_tol, kld_tol, rec_tol, record, t0, t1, t2 = sys.argv[1:]
chunks, ctx = int(chunks), int(ctx)
ppl_tol, kld_tol, rec_tol = float(ppl_tol), float(kld_tol), float(rec_tol)
L = open(log, encoding="utf-8", errors="replace").read()
def grab(pat):
    m = re.search(pat, L)
    if not m:
        sys.exit(f"e2e-iq: {ty}: '{pat}' not found in {log}")
    return float(m.group(1))
lp, lk = grab(r"Mean PPL\(Q\)\s*:\s*([\d.]+)"), grab(r"Mean\s+KLD:\s*([-\d.]+)")
r = json.load(open(tqj))["result"]
tp, tk = r["ppl"]["value"], r["kld"]["kld"]["value"]
types = {t["type"]: t["tensors"] for t in json.load(open(insp))["totals"]}
name = f"llama-{ty.lower()}-imatrix"
if record == "1":
    print(json.dumps({"text": "botchan.txt", "ctx": ctx, "chunks": chunks, "model": name,
                      "base": "f16", "ppl": lp, "kld": lk}))
print(f"{ty}: tensor types {types}")
print(f"{ty}: PPL llama.cpp {lp:.4f}, tq {tp:.4f} ({(tp / lp - 1) * 100:+.3f}%); "
      f"KLD llama.cpp {lk:.6f}, tq {tk:.6f} ({(tk / lk - 1) * 100:+.2f}%); "
      f"seconds llama.cpp {float(t1) - float(t0):.1f}, tq {float(t2) - float(t1):.1f}")
bad = []
if abs(tp / lp - 1) > ppl_tol:
    bad.append(f"PPL {tp:.4f} vs llama.cpp {lp:.4f}: more than {ppl_tol:.1%} apart")
if abs(tk - lk) > kld_tol * lk + 1e-3:
    bad.append(f"KLD {tk:.6f} vs llama.cpp {lk:.6f}: more than {kld_tol:.0%} + 1e-3 apart")
ref = json.load(open("fixtures/llama_reference.json"))["runs"]
rec = [x for x in ref if x["model"] == name and x["text"] == "botchan.txt" and x["ctx"] == ctx
       and x["chunks"] == chunks]
if rec:
    rp = rec[0]["ppl"]
    print(f"{ty}: recorded llama.cpp PPL {rp:.4f} ({(lp / rp - 1) * 100:+.3f}% this run)")
    if abs(lp / rp - 1) > rec_tol:
        bad.append(f"llama.cpp PPL {lp:.4f} vs recorded {rp:.4f}: more than {rec_tol:.0%} apart "
                   "(artifact changed: re-record with --record)")
elif record != "1":
    bad.append(f"no recorded run for {name} ctx {ctx} x {chunks} in fixtures/llama_reference.json")
for b in bad:
    print(f"error: e2e-iq: {ty}: {b}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
done
[ "$status" -eq 0 ] && echo "e2e-iq: OK"
exit "$status"
