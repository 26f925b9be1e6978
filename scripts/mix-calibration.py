#!/usr/bin/env python3
"""Predicted vs actual KLD of the mix over sizes, and the calibration validated leave-one-size-out.

    python3 scripts/mix-calibration.py NAME=MIX.json:EVAL.json ...

MIX.json: `tq convert --target-size ... --kld-text ... --json` (its `mix.plans`: every measured
plan's summed prediction and KLD on the --kld-text windows); EVAL.json: `tq eval OUT --ref-logits
REF --json` of the written file (held-out text). The calibration is calibrate.rs's: ln KLD =
ln scale + power ln sum over the measured plans (a scale only below 3 points or a span of the sums
under 1.5x; power clamped to [0.5, 1.5]); for each size it is fitted on the other sizes' plans only.
"""
import json, math, sys

def fit(pts):
    pts = [(math.log(s), math.log(k)) for s, k in pts if s > 0 and k > 0]
    if not pts:
        return None
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    span = max(p[0] for p in pts) - min(p[0] for p in pts)
    if n < 3 or span < math.log(1.5):
        power = 1.0
    else:
        sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
        sxx = sum((p[0] - mx) ** 2 for p in pts)
        power = min(1.5, max(0.5, sxy / sxx))
    return math.exp(my - power * mx), power

rows = []
for arg in sys.argv[1:]:
    name, files = arg.split("=", 1)
    mj, ej = files.split(":")
    m = json.load(open(mj))["mix"]
    e = json.load(open(ej))["result"]["kld"]["kld"]["value"]
    chosen = next(p for p in m["plans"] if p["plan"] == m["chosen"])
    raw = chosen.get("predicted_kld_uncalibrated", chosen["predicted_kld"])
    pts = [(p.get("predicted_kld_uncalibrated", p["predicted_kld"]), p["measured_kld"]) for p in m["plans"]
           if p.get("predicted_kld_uncalibrated", p["predicted_kld"]) is not None]
    rows.append(dict(name=name, bytes=m["file_bytes"], plan=m["chosen"], raw=raw, botchan=chosen["measured_kld"], wiki=e, pts=pts))

print("| size | file bytes | bpw | plan written | summed prediction | calibrated (other sizes) | scale, power (points) | measured, kld-text (Botchan, 2 windows) | file, wikitext (10 windows) | calibrated / Botchan | calibrated / wikitext | summed / wikitext |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
worst = [1, 1, 1]
for r in sorted(rows, key=lambda r: r["bytes"]):
    others = [p for o in rows if o is not r for p in o["pts"]]
    c = fit(others) if r["raw"] is not None else None
    cal = c[0] * r["raw"] ** c[1] if c else None
    f = lambda x: "-" if x is None else f"{x:.5f}"
    ratio = lambda a, b: "-" if a is None or b is None else f"{a / b:.2f}"
    print(f"| {r['name']} | {r['bytes']} | {r['bytes'] * 8 / 134515008:.3f} | {r['plan']} | {f(r['raw'])} | {f(cal)} | "
          + (f"{c[0]:.3f}, {c[1]:.3f} ({len(others)})" if c else "-")
          + f" | {f(r['botchan'])} | {f(r['wiki'])} | {ratio(cal, r['botchan'])} | {ratio(cal, r['wiki'])} | {ratio(r['raw'], r['wiki'])} |")
all_pts = [p for r in rows for p in r["pts"]]
c = fit(all_pts)
print(f"\nall {len(all_pts)} points: scale {c[0]:.4f}, power {c[1]:.4f}")
