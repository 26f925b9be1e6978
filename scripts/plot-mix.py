"""Plot docs/mix-curve.png from docs/mix-curve.tsv (rows of scripts/bench-mix.sh).

    bash -c 'source scripts/common.sh; venv_python venv-plot plot.txt scripts/plot-mix.py'

Columns: name, bytes, bpw, PPL, mean KLD, its standard error, same top-1 %, predicted KLD, fit R2,
mix seconds. Names: tq-<profile>-<bpw|q4km>, llama-<TYPE>[-imatrix].
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "docs", "mix-curve.tsv")
dst = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "docs", "mix-curve.png")

series = {}
for line in open(src):
    f = line.rstrip("\n").split("\t")
    if len(f) < 6 or not f[1].isdigit():
        continue
    name, size, kld, err = f[0], int(f[1]) / 1e6, float(f[4]), float(f[5])
    if name.startswith("tq-"):
        key = "tq --target-bpw, " + name.split("-")[1] + " profile"
        label = name.split("-")[2]
        label = label if label == "q4km" else label + " bpw"
    elif name.endswith("-imatrix"):
        key, label = "llama.cpp + imatrix", name[len("llama-"):-len("-imatrix")]
    else:
        key, label = "llama.cpp", name[len("llama-"):]
    series.setdefault(key, []).append((size, kld, err, label))

style = {
    "llama.cpp": ("tab:gray", "s", "--"),
    "llama.cpp + imatrix": ("tab:blue", "D", "--"),
    "tq --target-bpw, upstream profile": ("tab:red", "o", "-"),
    "tq --target-bpw, fork profile": ("tab:green", "^", "-"),
}
fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
for key in sorted(series, key=lambda k: list(style).index(k) if k in style else 9):
    pts = sorted(series[key])
    c, m, ls = style.get(key, ("black", "x", ":"))
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    ax.errorbar(xs, ys, yerr=[p[2] for p in pts], color=c, marker=m, linestyle=ls, label=key, capsize=2)
    for x, y, _, lab in pts:
        ax.annotate("Q4_K_M size" if lab == "q4km" else lab, (x, y), textcoords="offset points",
                    xytext=(4, 4), fontsize=7, color=c)
ax.set_yscale("log")
ax.set_xlabel("file size (MB)")
ax.set_ylabel("mean KLD vs F16 (10 wikitext-2 windows, log scale)")
ax.set_title("SmolLM2-135M: tq's measured mix vs llama.cpp types, by file size")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(dst)
print(dst)
