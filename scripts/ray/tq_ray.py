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

Placement: by default Ray puts each task where CPUs are free. --place RES,RES,... pins the shard
tasks of each sharded stage (calib, convert) round-robin to nodes that hold those custom resources
(give each node one with `ray start --resources '{"node_a": 1}'`); --spread asks Ray's SPREAD
strategy to spread them over the nodes (best effort). The JSON printed at the end gives every
task's wall and CPU seconds and the node (Ray node ID) it ran on, and every node's custom resources.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import ray


# Fraction of a --place resource each task asks for: small enough never to limit how many tasks
# a node runs at once (its CPUs do that), nonzero so that only nodes holding it qualify.
PLACE_AMOUNT = 0.001

# Resources every Ray node has; what remains in a node's resources are the custom ones.
BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


@ray.remote
def run_tq(tq, args, threads, shard=None):
    """One tq command; raises with tq's one-line error when it fails."""
    cmd = [tq] + args + (["--threads", str(threads)] if threads else [])
    t0, r0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"cmd": " ".join(args[:2]), "shard": shard, "seconds": round(time.time() - t0, 2),
            "cpu_seconds": round(cpu, 2), "host": os.uname().nodename,
            "node_id": ray.get_runtime_context().get_node_id(),
            "log": p.stderr.strip().splitlines()[-1:]}


def custom_resources(node):
    """The custom resources of one entry of ray.nodes() (not CPU, memory, node:IP, ...)."""
    return sorted(k for k in node["Resources"]
                  if k not in BUILTIN_RESOURCES and not k.startswith("node:")
                  and not k.startswith("accelerator_type:"))


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
    ap.add_argument("--place", default=None, metavar="RES[,RES...]",
                    help="pin shard I of each sharded stage to a node holding custom resource "
                         "RES[I mod count] (e.g. node_a,node_b from ray start --resources)")
    ap.add_argument("--spread", action="store_true",
                    help="schedule the shard tasks with Ray's SPREAD strategy (best effort)")
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
    nodes = {n["NodeID"]: {"resources": custom_resources(n), "cpus": n["Resources"].get("CPU", 0)}
             for n in ray.nodes() if n["Alive"]}
    place = [r for r in (a.place or "").split(",") if r]
    for r in place:
        # A resource no node can serve would leave its tasks pending forever: refuse it now.
        if not any(r in v["resources"] and v["cpus"] >= a.threads for v in nodes.values()):
            sys.exit(f"tq_ray: --place {r}: no node of the cluster has resource {r!r} and "
                     f"{a.threads} CPU(s) (nodes: {json.dumps(nodes)})")
    task = run_tq.options(num_cpus=a.threads)

    def shard_task(i):
        """The task options of shard i of a sharded stage (--place, --spread)."""
        opts = {"num_cpus": a.threads}
        if place:
            opts["resources"] = {place[i % len(place)]: PLACE_AMOUNT}
        if a.spread:
            opts["scheduling_strategy"] = "SPREAD"
        return run_tq.options(**opts)

    timings = {"nodes": nodes}
    t_all = time.time()

    def stage(name, refs):
        t0 = time.time()
        out = ray.get(refs)
        timings[name] = {"seconds": round(time.time() - t0, 2), "tasks": out}
        on = len({t["node_id"] for t in out})
        print(f"tq_ray: {name}: {len(out)} task(s) on {on} node(s) in "
              f"{timings[name]['seconds']} s", file=sys.stderr)

    w = a.workdir
    n = a.calib_shards
    shards = [os.path.join(w, f"calib-{i}-of-{n}.safetensors") for i in range(n)]
    stage("calib", [shard_task(i).remote(a.tq, ["calib", a.model, "--text", a.text,
                                                 "--tokens", str(a.tokens), "--ctx", str(a.ctx),
                                                 "--batch", str(a.batch), "--shard", f"{i}/{n}",
                                                 "-o", s], a.threads, f"{i}/{n}")
                    for i, s in enumerate(shards)])
    # The merged file's name is recorded in the output's provenance (--calib NAME): keep it.
    hess = os.path.join(w, "H.safetensors")
    stage("merge", [task.remote(a.tq, ["calib", "merge"] + shards + ["-o", hess], None)])
    m = a.convert_shards
    frags = [os.path.join(w, f"frag-{i}-of-{m}.tqfrag") for i in range(m)]
    stage("convert", [shard_task(i).remote(a.tq, ["convert", a.model, "-q", "--calib", hess,
                                                   "--shard", f"{i}/{m}", "-o", f] + flags,
                                         a.threads, f"{i}/{m}")
                      for i, f in enumerate(frags)])
    stage("assemble", [task.remote(a.tq, ["assemble", "-q"] + frags + ["-o", a.output], None)])
    timings["total_seconds"] = round(time.time() - t_all, 2)
    print(json.dumps(timings))


if __name__ == "__main__":
    main()
