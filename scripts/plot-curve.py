"""Plot docs/img/presets-curve.svg: KLD vs bits per weight for every llama.cpp preset, from rows
of scripts/bench-curve.sh / scripts/bench-mix.sh (their mix.tsv), and print the table.

    bash -c 'source scripts/common.sh; py_plot scripts/plot-curve.py CURVE.TSV [MIX.TSV ...] [-o OUT.svg]'

Every TSV has bench-mix.sh's columns: name, bytes, bpw, PPL, mean KLD, its standard error, same
top-1 %, predicted KLD, fit R2, mix seconds. Names: llama-P-imatrix (llama-quantize + imatrix),
llama-P (no imatrix), tq-P-ldlq (tq --preset P --calib), tq-mix-P (tq's mix at llama-P-imatrix's
bytes). Further TSVs (e.g. another run's mix points) join the same series; a later file's row
replaces an earlier one of the same name. Columns a row does not know may be "-". bpw = file bytes x 8 / SmolLM2's 134,515,008 weights
(the whole file: metadata and the F32 norms included).
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "tq"  # the same SVG bytes for the same rows
import matplotlib.pyplot as plt  # noqa: E402

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]
dst = os.path.join(root, "docs", "img", "presets-curve.svg")
if "-o" in args:
    i = args.index("-o")
    dst = args[i + 1]
    del args[i : i + 2]
if not args:
    sys.exit("usage: plot-curve.py CURVE.TSV [MORE.TSV ...] [-o OUT.svg]")

PARAMS = 134515008
SERIES = {  # key: (label, colour, marker, line)
    "imatrix": ("llama.cpp preset + imatrix", "tab:blue", "D", "--"),
    "plain": ("llama.cpp preset, no imatrix", "tab:gray", "s", ":"),
    "ldlq": ("tq --preset P --calib (LDLQ, same types)", "tab:red", "o", "-"),
    "mix": ("tq mix at the preset + imatrix bytes", "tab:green", "^", "-"),
}

rows = {}
for src in args:
    for line in open(src):
        f = line.rstrip("\n").split("\t")
        if len(f) < 6 or not f[1].isdigit():
            continue
        rows[f[0]] = f


def classify(name):
    if name.startswith("llama-") and name.endswith("-imatrix"):
        return "imatrix", name[len("llama-") : -len("-imatrix")]
    if name.startswith("tq-mix-"):
        return "mix", name[len("tq-mix-") :]
    if name.startswith("tq-") and name.endswith("-ldlq"):
        return "ldlq", name[len("tq-") : -len("-ldlq")]
    if name.startswith("llama-"):
        return "plain", name[len("llama-") :]
    return None, None


pts = {k: {} for k in SERIES}
for name, f in rows.items():
    key, preset = classify(name)
    if key is None:
        continue
    size, kld = int(f[1]), float(f[4])
    err = float(f[5]) if f[5] not in ("", "-") else 0.0
    pts[key][preset] = (size * 8 / PARAMS, kld, err, size)

fig, ax = plt.subplots(figsize=(9, 6), dpi=100)
for key, (label, c, m, ls) in SERIES.items():
    p = sorted(pts[key].items(), key=lambda kv: kv[1][0])
    if not p:
        continue
    xs = [v[0] for _, v in p]
    ys = [v[1] for _, v in p]
    ax.errorbar(xs, ys, yerr=[v[2] for _, v in p], color=c, marker=m, linestyle=ls,
                label=label, capsize=2, markersize=4, linewidth=1)
    if key == "imatrix":
        for preset, v in p:
            ax.annotate(preset, (v[0], v[1]), textcoords="offset points", xytext=(4, 3),
                        fontsize=6, color=c)
ax.set_yscale("log")
ax.set_xlabel("bits per weight (file bytes x 8 / 134,515,008 weights)")
ax.set_ylabel("mean KLD vs F16 (10 wikitext-2 windows, log scale)")
ax.set_title("SmolLM2-135M: every llama.cpp preset, llama-quantize vs tq at the same types")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(dst, metadata={"Date": None})
print(dst, file=sys.stderr)

# The table: one row a preset, by llama.cpp + imatrix's size.
order = sorted(pts["imatrix"], key=lambda p: pts["imatrix"][p][3])
print("| preset | bytes (llama.cpp + imatrix) | bpw | llama.cpp, no imatrix | llama.cpp + imatrix "
      "| tq preset + LDLQ | LDLQ / imatrix | tq mix at these bytes | mix / imatrix |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def cell(key, p):
    v = pts[key].get(p)
    return f"{v[1]:.5f}" if v else "-"


def ratio(key, p):
    v, b = pts[key].get(p), pts["imatrix"][p]
    return f"{v[1] / b[1]:.2f}x" if v else "-"


for p in order:
    b = pts["imatrix"][p]
    print(f"| {p} | {b[3]:,} | {b[0]:.2f} | {cell('plain', p)} | {b[1]:.5f} | {cell('ldlq', p)} "
          f"| {ratio('ldlq', p)} | {cell('mix', p)} | {ratio('mix', p)} |")
