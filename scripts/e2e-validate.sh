#!/usr/bin/env bash
# End-to-end check of `tq validate` on the real SmolLM2 (issue 16): q8_0 and TQ4_1S config-i + LDLQ
# (Hessians from Botchan) pass a policy that TQ3_1S pure round-to-nearest fails (exit 3), in one
# directory run on Botchan windows with --chunks auto; the JUnit report is parsed with Python's xml
# module; a file with one tensor's blocks set to NaN (located with gguf-py) fails structure naming
# the tensor; a truncated file exits 2; a stale reference (another model) is refused with exit 2.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
cargo build --release --locked --quiet
tq="${CARGO_TARGET_DIR:-$TQ_ROOT/target}/release/tq"
out="$TQ_CACHE/e2e-validate"; rm -rf "$out"; mkdir -p "$out/art"

"$tq" convert "$smol" --weights q8_0 -q -o "$out/art/smollm2-q8_0.gguf"
"$tq" convert "$smol" --weights tq4_1s --recipe config-i --calib "$botchan" --calib-tokens 2048 \
  -q -o "$out/art/smollm2-tq4_1s-config-i-ldlq.gguf"
"$tq" convert "$smol" --weights tq3_1s --recipe pure -q -o "$out/art/smollm2-tq3_1s-pure.gguf"

cat > "$out/policy.json" <<'JSON'
{"policy_version": 1,
 "rules": [{"match": "*", "thresholds": {"max_kld": 0.05, "max_p99_kld": 0.3,
                                         "max_ppl_ratio": 1.05, "min_top1": 85}}]}
JSON

expect() { # expect CODE COMMAND...: run, require exit CODE
  local want=$1; shift
  set +e; "$@"; local rc=$?; set -e
  if [ "$rc" != "$want" ]; then echo "e2e-validate: expected exit $want, got $rc: $*" >&2; exit 1; fi
}

echo "== one policy, three artifacts: q8_0 and TQ4_1S config-i+LDLQ pass, TQ3_1S pure fails =="
expect 3 "$tq" validate "$out/art" --policy "$out/policy.json" --ref "$smol" --text "$botchan" \
  --gen-prompts 2 --json --junit "$out/junit.xml" -q > "$out/report.json"
py - "$out/report.json" "$out/junit.xml" <<'PY'
import json, sys, xml.etree.ElementTree as E
r = json.load(open(sys.argv[1]))
got = {x["artifact"].rsplit("/", 1)[1]: x for x in r["reports"]}
want = {"smollm2-q8_0.gguf": "pass", "smollm2-tq4_1s-config-i-ldlq.gguf": "pass",
        "smollm2-tq3_1s-pure.gguf": "fail"}
for name, v in want.items():
    q = got[name]["quality"]
    print(f"{name}: {got[name]['verdict']}, {q['windows']} of {q['windows_available']} windows, "
          f"KLD {q['kld']['value']:.4f} ± {q['kld']['err']:.4f}, top-1 {q['top1']['value']:.1f}%, "
          f"PPL ratio {q['ppl_ratio']['value']:.3f}")
    assert got[name]["verdict"] == v, (name, got[name]["checks"])
root = E.parse(sys.argv[2]).getroot()
suites = {s.get("name").rsplit("/", 1)[1]: s for s in root.findall("testsuite")}
assert set(suites) == set(want), suites.keys()
for name, s in suites.items():
    fails = [c for c in s.findall("testcase") if c.find("failure") is not None]
    assert (len(fails) > 0) == (want[name] == "fail"), (name, len(fails))
    for c in fails:
        m = c.find("failure").get("message")
        if c.get("classname") == "tq.validate.quality":
            assert " = " in m and "limit" in m, m  # the numbers are in the failure
        print(f"  {name}: {c.get('classname')}.{c.get('name')} failed: {m[:110]}")
print(f"junit: {len(root.findall('./testsuite/testcase'))} testcases, failures {root.get('failures')}")
PY

echo "== a tensor's blocks set to NaN: structure fails, the tensor named =="
py - "$out/art/smollm2-q8_0.gguf" "$out/nan.gguf" <<'PY'
import shutil, sys
from gguf import GGUFReader
src, dst = sys.argv[1], sys.argv[2]
t = next(t for t in GGUFReader(src).tensors if t.name == "blk.7.ffn_down.weight")
shutil.copyfile(src, dst)
with open(dst, "r+b") as f:  # q8_0 blocks are 34 bytes, f16 scale first: NaN = 0x7E00
    for b in range(40, 48):
        f.seek(t.data_offset + 34 * b); f.write(b"\x00\x7e")
PY
# Structure only (no --text): the NaN fails before any window would be evaluated.
expect 3 "$tq" validate "$out/nan.gguf" --ref "$smol" --json -q > "$out/nan.json"
py - "$out/nan.json" <<'PY'
import json, sys
c = next(c for c in json.load(open(sys.argv[1]))["checks"] if c["name"] == "finite")
assert c["status"] == "fail" and "blk.7.ffn_down.weight" in c["detail"] and "block 40" in c["detail"], c
print("finite:", c["detail"])
PY

echo "== a truncated file: exit 2 =="
head -c 50000000 "$out/art/smollm2-q8_0.gguf" > "$out/cut.gguf"
expect 2 "$tq" validate "$out/cut.gguf" --ref "$smol" --text "$botchan" -q

echo "== a stale reference (another model than the artifact was made from): exit 2 =="
expect 2 "$tq" validate "$out/art/smollm2-tq3_1s-pure.gguf" --ref "$out/art/smollm2-q8_0.gguf" \
  --text "$botchan" -q
echo "e2e-validate: OK"
