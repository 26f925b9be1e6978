#!/usr/bin/env python3
"""KLD vs bits per weight for SmolLM2's 2-bit files: tq2_t and tq2_r (RTN and
LDLQ), the tq mixes, and llama.cpp's Q2_K / IQ2_XXS / IQ2_XS / IQ2_S with an imatrix.

Reads the table committed as CSV (docs/data/kld-vs-bpw-2bit.csv, one row per file of the
tables of docs/bench/two-bit.md), checks that every row's bytes, bpw and KLD are written in
docs/bench/two-bit.md (so the plot cannot drift from the tables), and writes the PNG.

Usage (the pinned venv of scripts/requirements/plot.txt):
    source scripts/common.sh && py_plot scripts/plot-2bit.py \\
        docs/data/kld-vs-bpw-2bit.csv docs/bench/two-bit.md docs/img/kld-vs-bpw-2bit.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    # family -> (colour, marker)
    "tq2_t": ("#d62728", "o"),
    "tq2_r": ("#1f77b4", "s"),
    "mix": ("#2ca02c", "^"),  # tq2_r / tq4_1s mixes (issue 17)
    "mix tq2_t": ("#ff7f0e", "v"),  # ffn_down tq2_t, the rest tq4_1s (issue 19)
    "llama.cpp": ("#7f7f7f", "D"),
}


def main(csv_path, md_path, out_path):
    rows = list(csv.DictReader(open(csv_path, newline="")))
    md = open(md_path).read()
    for r in rows:
        for k in ("bytes", "bpw_file", "kld"):
            if r[k] not in md:
                sys.exit(f"error: {csv_path}: {r['label']}: {k} {r[k]} is not in {md_path}; "
                         "update the CSV from the tables")
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    seen = set()
    placed = []
    for r in rows:
        colour, marker = STYLE[r["family"]]
        x, y, e = float(r["bpw_file"]), float(r["kld"]), float(r["kld_err"])
        # Filled: calibrated (LDLQ / imatrix); hollow: round-to-nearest (or a band-64 LDLQ).
        filled = r["method"] in ("LDLQ", "imatrix")
        leg = f"{r['family']} ({'calibrated' if filled else 'RTN / band 64'})"
        ax.errorbar(x, y, yerr=e, fmt=marker, color=colour, ms=7,
                    mfc=colour if filled else "white", mec=colour, capsize=2,
                    label=None if leg in seen else leg)
        seen.add(leg)
        # Points within 20% of ones already labelled at the same x: labels alternate sides
        # (left, then right level with the point), so a cluster's labels do not overlap.
        near = sum(px == x and abs(py / y - 1) < 0.2 for px, py in placed)
        placed.append((x, y))
        left = near % 2 == 1
        ax.annotate(r["label"], (x, y), textcoords="offset points",
                    xytext=(-6 if left else 6, 3 if near == 0 else -3),
                    ha="right" if left else "left", fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight of the whole file (token_embd included)")
    ax.set_ylabel("mean KLD vs F16 (log scale), 10 wikitext-2 windows of 512")
    ax.set_title("SmolLM2-135M, 2-bit types: KLD vs file size (docs/bench/two-bit.md)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlim(2.9, 5.6)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    # No timestamp or version in the file: the same CSV gives the same bytes.
    fig.savefig(out_path, metadata={"Software": None})
    print(f"{out_path}: {len(rows)} files")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
