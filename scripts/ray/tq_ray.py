#!/usr/bin/env python3
"""Run a calibrated tq conversion as Ray tasks: calib shards -> merge -> convert shards -> assemble.

Every task runs the `tq` binary on files in --workdir, which must be storage that every Ray node
sees at the same path (NFS, a cluster file system, or one machine). The driver only orders the
tasks and moves nothing but paths: all bytes stay on the shared storage. The result is the GGUF
that `tq convert --calib H.safetensors` writes in one process from the merged Hessians, byte
for byte (see docs/scale.md).

    python tq_ray.py --tq /shared/bin/tq --model /shared/m.gguf --text /shared/calib.txt \
        --workdir /shared/run1 --calib-shards 8 --convert-shards 16 -o /shared/m-tq4.gguf \
        -- --weights tq4_1s --recipe hybrid

Flags after `--` go to every `tq convert` task (not --shard, -o, --calib, --threads).
Without --address a local Ray cluster of --num-cpus CPUs is started for the run.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import ray


@ray.remote
def run_tq(tq, args, threads):
    """One tq command; raises with tq's one-line error when it fails."""
    cmd = [tq] + args + (["--threads", str(threads)] if threads else [])
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return {"cmd": " ".join(args[:2]), "seconds": round(time.time() - t0, 2),
            "host": os.uname().nodename, "log": p.stderr.strip().splitlines()[-1:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tq", required=True, help="tq binary, at the same path on every node")
    ap.add_argument("--model", required=True, help="input GGUF (shared storage)")
    ap.add_argument("--text", required=True, help="calibration text (shared storage)")
    ap.add_argument("--workdir", required=True, help="shared directory for shards and fragments")
    ap.add_argument("-o", "--output", required=True, help="final GGUF")
    ap.add_argument("--calib-shards", type=int, default=2)
    ap.add_argument("--convert-shards", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1,
                    help="tq --threads per task (and Ray CPUs it reserves)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster address (e.g. auto); default: start a local one")
    ap.add_argument("--num-cpus", type=int, default=None,
                    help="CPUs of the local cluster (without --address)")
    ap.add_argument("convert_flags", nargs=argparse.REMAINDER,
                    help="-- then flags for tq convert (e.g. --weights tq4_1s)")
    a = ap.parse_args()
    flags = [f for f in a.convert_flags if f != "--"]
    for bad in ("--shard", "-o", "--output", "--calib", "--threads"):
        if bad in flags:
            sys.exit(f"tq_ray: {bad} is set by the driver; remove it from the convert flags")
    os.makedirs(a.workdir, exist_ok=True)
    if a.address:
        ray.init(address=a.address)
    else:
        ray.init(num_cpus=a.num_cpus, include_dashboard=False)
    task = run_tq.options(num_cpus=a.threads)
    timings = {}
    t_all = time.time()

    def stage(name, refs):
        t0 = time.time()
        out = ray.get(refs)
        timings[name] = {"seconds": round(time.time() - t0, 2), "tasks": out}
        print(f"tq_ray: {name}: {len(out)} task(s) in {timings[name]['seconds']} s",
              file=sys.stderr)

    w = a.workdir
    n = a.calib_shards
    shards = [os.path.join(w, f"calib-{i}-of-{n}.safetensors") for i in range(n)]
    stage("calib", [task.remote(a.tq, ["calib", a.model, "--text", a.text,
                                       "--tokens", str(a.tokens), "--ctx", str(a.ctx),
                                       "--batch", str(a.batch), "--shard", f"{i}/{n}",
                                       "-o", s], a.threads)
                    for i, s in enumerate(shards)])
    # The merged file's name is recorded in the output's provenance (--calib NAME): keep it.
    hess = os.path.join(w, "H.safetensors")
    stage("merge", [task.remote(a.tq, ["calib", "merge"] + shards + ["-o", hess], None)])
    m = a.convert_shards
    frags = [os.path.join(w, f"frag-{i}-of-{m}.tqfrag") for i in range(m)]
    stage("convert", [task.remote(a.tq, ["convert", a.model, "-q", "--calib", hess,
                                         "--shard", f"{i}/{m}", "-o", f] + flags, a.threads)
                      for i, f in enumerate(frags)])
    stage("assemble", [task.remote(a.tq, ["assemble", "-q"] + frags + ["-o", a.output], None)])
    timings["total_seconds"] = round(time.time() - t_all, 2)
    print(json.dumps(timings))


if __name__ == "__main__":
    main()
