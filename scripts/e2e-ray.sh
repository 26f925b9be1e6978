#!/usr/bin/env bash
# End to end: sharded calibration + conversion across two Ray nodes, and the Slurm and Kubernetes
# files of docs/scale.md run as written. In CI (.ci/run). On SmolLM2, small enough for 2 cores:
# 512 tokens of Botchan in 2 windows of 256 (--batch 1), --weights tq4_1s --ldlq-band 16. Disk:
# SmolLM2's Hessian files are 805 MB each (f64); each run of the pipeline writes N shards + the
# merged file, deleted once checked (at most about 3.6 GB under $TQ_CACHE/e2e-ray at a time), and
# nothing large is left after a passing run.
#
#   bash scripts/e2e-ray.sh          (TQ_BIN=/path/to/tq to use a given binary)
#
# 1. Ray, two nodes on this machine: a head (`ray start --head --num-cpus 1`, custom resource
#    node_a) and a second raylet joining it (`ray start --address … --num-cpus 1`, node_b), each
#    with its own ports, in its own session (setsid) so that exactly these processes are stopped
#    at exit (never `ray stop`, which stops every Ray on the machine). The driver
#    (scripts/ray/tq_ray.py --place node_a,node_b) pins shard I of each stage to node_a (I even) or
#    node_b (I odd): 2 calib shards -> merge -> 4 convert shards -> assemble. Fails unless the task
#    metadata shows every shard on the node it was pinned to, and both node IDs in each stage.
# 2. Reference: one process, `tq convert --calib H.safetensors` of the merged Hessians. The Ray
#    output must be cmp-identical to it.
# 3. The Slurm job array of docs/scale.md (tq-shard.sbatch, extracted from the page): `bash -n`,
#    then its per-index body run here for SLURM_ARRAY_TASK_ID=0..N-1 (N=2, the calib shards of
#    step 1, so that the merged Hessians are the same bytes) of each stage (calib, merge,
#    convert, assemble) with local paths; the assembled file must be cmp-identical to the reference.
# 4. The Kubernetes Jobs of docs/scale.md (tq-shard.yaml): parsed with PyYAML, checked for
#    completionMode Indexed and JOB_COMPLETION_INDEX, and each Job's container command run here
#    with `sh -c` for JOB_COMPLETION_INDEX=0..completions-1 and the ConfigMap's settings (paths made
#    local); the assembled file must be cmp-identical to the reference.
source "$(dirname "$0")/common.sh"
cd "$TQ_ROOT"
t_start=$(date +%s.%N)
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
tq=$(tq_bin)
w="$TQ_CACHE/e2e-ray"
rm -rf "$w"; mkdir -p "$w/ray" "$w/check" "$w/slurm" "$w/k8s" "$w/bin"
tokens=512 ctx=256 batch=1
calib_shards=2 convert_shards=4   # Ray
shards=$calib_shards              # N of the Slurm and Kubernetes files: one N for both stages
convert=(--weights tq4_1s --ldlq-band 16)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# --- 1. Ray: two nodes on this host ----------------------------------------------------------
t0=$(date +%s.%N)
py_ray -c 'import ray; print("ray", ray.__version__)'   # builds the pinned venv when missing
ray="$TQ_CACHE/venv-ray/bin/ray"
export RAY_USAGE_STATS_ENABLED=0
# A short temp dir: Ray's Unix socket paths must stay under 108 bytes.
rt=$(mktemp -d /tmp/tq-ray.XXXXXX)
sids=()
stop_cluster() {
  local s pids i
  for s in "${sids[@]}"; do
    pids=$(ps -o pid= -s "$s" || true)
    [ -z "$pids" ] || kill $pids 2> /dev/null || true
  done
  for i in $(seq 20); do   # Ray's processes exit within seconds of SIGTERM; then SIGKILL
    pids=$(for s in "${sids[@]}"; do ps -o pid= -s "$s" || true; done)
    [ -n "$pids" ] || break
    [ "$i" -lt 20 ] && sleep 0.5 || kill -9 $pids 2> /dev/null || true
  done
  sids=()
  rm -rf "$rt"
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
# Token authentication with a token of this run only, for the nodes, the driver and the workers.
# Left unset, Ray 2.60 turns token mode on for `ray start --head` when ~/.ray/auth_token exists
# (any local ray.init() writes one) but not for a node joining it, which is then refused.
py_ray -c 'import secrets; print(secrets.token_hex(32), end="")' > "$rt/auth_token"
chmod 600 "$rt/auth_token"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$rt/auth_token"
# Free ports for what would otherwise be fixed defaults shared by both nodes or by another Ray on
# this machine (GCS 6379, dashboard 8265, dashboard agent 52365); every other port is 0 (any).
read -r gcs dash agent_a agent_b <<< "$(py_ray -c '
import socket
ss = [socket.socket() for _ in range(4)]
for s in ss: s.bind(("", 0))
print(*(s.getsockname()[1] for s in ss))')"
common=(--temp-dir "$rt" --num-cpus 1 --object-store-memory 100000000 --disable-usage-stats
        --min-worker-port 0 --max-worker-port 0)
# start_node LOG ARGS...: ray start in a session of its own (setsid without a fork: its pid is the
# session id, which the processes it leaves running keep).
start_node() {
  local log="$1"; shift
  setsid "$ray" start "$@" > "$log" 2>&1 < /dev/null &
  sids+=("$!")
  wait "$!" || { echo "e2e-ray: ray start failed:" >&2; tail -20 "$log" >&2; exit 1; }
  [ -n "$(ps -o pid= -s "${sids[-1]}")" ] \
    || { echo "e2e-ray: no process left in session ${sids[-1]} after ray start: cannot stop this node" >&2; exit 1; }
}
start_node "$w/ray/head.log" --head --port "$gcs" --dashboard-port "$dash" \
  --include-dashboard false --dashboard-agent-listen-port "$agent_a" \
  --resources '{"node_a": 1}' "${common[@]}"
start_node "$w/ray/node-b.log" --address "127.0.0.1:$gcs" --dashboard-agent-listen-port "$agent_b" \
  --resources '{"node_b": 1}' "${common[@]}"
echo "ray: two nodes up in $(since "$t0") s (venv included)"

t1=$(date +%s.%N)
py_ray scripts/ray/tq_ray.py --tq "$tq" --model "$smol" --text "$botchan" --tokens "$tokens" \
  --ctx "$ctx" --batch "$batch" --workdir "$w/ray" --calib-shards "$calib_shards" \
  --convert-shards "$convert_shards" --address "127.0.0.1:$gcs" --place node_a,node_b --threads 1 \
  -o "$w/ray/out.gguf" -- "${convert[@]}" > "$w/ray/timings.json"
t_ray=$(since "$t1")
stop_cluster
echo "ray: driver $t_ray s; cluster stopped"
# Every shard ran on the node it was pinned to, and each sharded stage used both nodes.
py_ray - "$w/ray/timings.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
nodes = t["nodes"]
by_res = {r: [n for n, v in nodes.items() if r in v["resources"]] for r in ("node_a", "node_b")}
for r, ids in by_res.items():
    if len(ids) != 1:
        sys.exit(f"e2e-ray: FAIL: {len(ids)} nodes hold {r}: {nodes}")
a, b = by_res["node_a"][0], by_res["node_b"][0]
if a == b:
    sys.exit("e2e-ray: FAIL: node_a and node_b are the same node")
for stage in ("calib", "convert"):
    seen = set()
    for task in t[stage]["tasks"]:
        i = int(task["shard"].split("/")[0])
        want = a if i % 2 == 0 else b
        if task["node_id"] != want:
            sys.exit(f"e2e-ray: FAIL: {stage} shard {task['shard']} ran on {task['node_id']}, "
                     f"pinned to {want}")
        seen.add(task["node_id"])
    if seen != {a, b}:
        sys.exit(f"e2e-ray: FAIL: {stage} ran on {sorted(seen)}, not on both nodes")
    print(f"ray: {stage}: " + ", ".join(f"{x['shard']} on {x['node_id'][:12]}… {x['seconds']} s"
                                        for x in t[stage]["tasks"]))
print(f"ray: PASS: shards ran on both nodes: node_a {a}, node_b {b}; stages "
      + ", ".join(f"{s} {t[s]['seconds']} s" for s in ("calib", "merge", "convert", "assemble")))
EOF

# --- 2. The reference: one process from the merged Hessians ----------------------------------
# The file keeps its name (H.safetensors): the name is part of the output's provenance.
t2=$(date +%s.%N)
rm -f "$w"/ray/calib-*.safetensors "$w"/ray/frag-*.tqfrag
ln "$w/ray/H.safetensors" "$w/check/H.safetensors" 2> /dev/null \
  || cp "$w/ray/H.safetensors" "$w/check/H.safetensors"
"$tq" convert "$smol" "${convert[@]}" --calib "$w/check/H.safetensors" --threads 2 -q \
  -o "$w/check/out.gguf"
echo "reference: one-process tq convert in $(since "$t2") s"
same() {  # same WHAT FILE: FILE must be the reference's bytes
  if cmp -s "$2" "$w/check/out.gguf"; then
    echo "$1: PASS: byte-identical to one-process tq convert of the merged Hessians"
  else
    echo "$1: FAIL: $2 differs from one-process tq convert of the merged Hessians" >&2
    exit 1
  fi
}
same ray "$w/ray/out.gguf"

# --- 3. The Slurm job array of docs/scale.md, run here index by index ------------------------
# doc_file NAME: the fenced block after the line `<!-- file: NAME … -->` of docs/scale.md.
doc_file() {
  awk -v name="$1" 'index($0, "<!-- file: " name " ") == 1 { f = 1; next }
    f == 1 && /^```/ { f = 2; next }  f == 2 && /^```$/ { exit }  f == 2 { print }' docs/scale.md
}
t3=$(date +%s.%N)
sb="$w/slurm/tq-shard.sbatch"
doc_file tq-shard.sbatch > "$sb"
[ -s "$sb" ] || { echo "e2e-ray: FAIL: no tq-shard.sbatch in docs/scale.md" >&2; exit 1; }
bash -n "$sb"
# The file's defaults hang together: #SBATCH --array is 0..N-1, and its calibration has at least
# N batches (more shards than batches is refused).
n_default=$(sed -n 's/^: "${N:=\([0-9]*\)}".*/\1/p' "$sb")
grep -qx "#SBATCH --array=0-$((n_default - 1))" "$sb" \
  || { echo "e2e-ray: FAIL: tq-shard.sbatch: #SBATCH --array is not 0-$((n_default - 1)) (N=$n_default)" >&2; exit 1; }
read -r tk cx bt <<< "$(sed -n 's/^: "${CALIB_FLAGS:=--tokens \([0-9]*\) --ctx \([0-9]*\) --batch \([0-9]*\)}".*/\1 \2 \3/p' "$sb")"
[ $(((tk / cx + bt - 1) / bt)) -ge "$n_default" ] \
  || { echo "e2e-ray: FAIL: tq-shard.sbatch: CALIB_FLAGS make fewer than N=$n_default batches" >&2; exit 1; }
export TQ="$tq" MODEL="$smol" TEXT="$botchan" RUN="$w/slurm/run" OUT="$w/slurm/out.gguf" N="$shards"
export CALIB_FLAGS="--tokens $tokens --ctx $ctx --batch $batch" CONVERT_FLAGS="${convert[*]}"
export SLURM_CPUS_PER_TASK=2
mkdir -p "$RUN"
for stage in calib merge convert assemble; do
  case $stage in calib | convert) ids=$(seq 0 $((N - 1))) ;; *) ids=0 ;; esac
  for i in $ids; do
    SLURM_ARRAY_TASK_ID=$i bash "$sb" "$stage" 2>> "$w/slurm/log" \
      || { tail -5 "$w/slurm/log" >&2; echo "e2e-ray: FAIL: tq-shard.sbatch $stage, index $i" >&2; exit 1; }
  done
done
unset TQ MODEL TEXT RUN OUT N CALIB_FLAGS CONVERT_FLAGS SLURM_CPUS_PER_TASK
echo "slurm: tq-shard.sbatch, $shards array tasks per stage, in $(since "$t3") s"
cmp -s "$w/slurm/run/H.safetensors" "$w/ray/H.safetensors" \
  && echo "slurm: merged Hessians byte-identical to Ray's" \
  || echo "slurm: merged Hessians differ in bytes from Ray's (the outputs are compared next)"
rm -rf "$w/slurm/run"
same slurm "$w/slurm/out.gguf"

# --- 4. The Kubernetes Jobs of docs/scale.md, their commands run here -------------------------
t4=$(date +%s.%N)
doc_file tq-shard.yaml > "$w/k8s/tq-shard.yaml"
ln -s "$tq" "$w/bin/tq"   # the pods run `tq` from PATH
py_ray - "$w/k8s/tq-shard.yaml" "$w" "$smol" "$botchan" "$shards" \
  "--tokens $tokens --ctx $ctx --batch $batch" "${convert[*]}" 2>> "$w/k8s/log" <<'EOF' \
  || { tail -5 "$w/k8s/log" >&2; echo "e2e-ray: FAIL: tq-shard.yaml (log: $w/k8s/log)" >&2; exit 1; }
import os, subprocess, sys, yaml
path, w, model, text, n, calib_flags, convert_flags = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
cms = [d for d in docs if d["kind"] == "ConfigMap"]
jobs = {d["metadata"]["labels"]["tq-stage"]: d for d in docs if d["kind"] == "Job"}
def fail(msg):
    sys.exit(f"e2e-ray: FAIL: tq-shard.yaml: {msg}")
if len(cms) != 1 or sorted(jobs) != ["assemble", "calib", "convert", "merge"]:
    fail(f"want one ConfigMap and Jobs for calib, merge, convert, assemble; have {kinds}")
cm = cms[0]["data"]
f = cm["CALIB_FLAGS"].split()
tk, cx, bt = (int(f[f.index(k) + 1]) for k in ("--tokens", "--ctx", "--batch"))
if -(-(tk // cx) // bt) < int(cm["N"]):
    fail(f"CALIB_FLAGS {cm['CALIB_FLAGS']!r} make fewer than N={cm['N']} batches")
for stage in ("calib", "convert"):
    spec = jobs[stage]["spec"]
    if spec.get("completionMode") != "Indexed":
        fail(f"Job tq-{stage} is not completionMode: Indexed")
    if spec["completions"] != int(cm["N"]):
        fail(f"Job tq-{stage}: completions {spec['completions']} != the ConfigMap's N {cm['N']}")
    if "$JOB_COMPLETION_INDEX" not in " ".join(spec["template"]["spec"]["containers"][0]["args"]):
        fail(f"Job tq-{stage} does not use JOB_COMPLETION_INDEX")
env = dict(os.environ, **{k: str(v) for k, v in cm.items()})
env.update(MODEL=model, TEXT=text, RUN=f"{w}/k8s/run", OUT=f"{w}/k8s/out.gguf", N=n,
           CALIB_FLAGS=calib_flags, CONVERT_FLAGS=convert_flags, THREADS="2",
           PATH=f"{w}/bin:" + os.environ["PATH"])
for stage in ("calib", "merge", "convert", "assemble"):
    spec = jobs[stage]["spec"]
    c = spec["template"]["spec"]["containers"][0]
    assert c["envFrom"] == [{"configMapRef": {"name": cms[0]["metadata"]["name"]}}], c["envFrom"]
    if spec.get("completionMode") == "Indexed":
        runs = [dict(env, JOB_COMPLETION_INDEX=str(i)) for i in range(int(n))]
    else:
        runs = [env]
    for e in runs:
        if subprocess.run(c["command"] + c["args"], env=e).returncode != 0:
            fail(f"Job tq-{stage}, index {e.get('JOB_COMPLETION_INDEX', '-')}: its command failed")
print(f"k8s: {len(docs)} documents parsed ({', '.join(k for k, _ in kinds)}); "
      f"Jobs run for {n} indices each")
EOF
echo "k8s: tq-shard.yaml, $shards indices per Indexed Job, in $(since "$t4") s"
rm -rf "$w/k8s/run"
same k8s "$w/k8s/out.gguf"
rm -f "$w"/*/*.gguf "$w"/*/*.safetensors   # logs and the driver's JSON stay
echo "e2e-ray: OK in $(since "$t_start") s (ray driver $t_ray s)"
