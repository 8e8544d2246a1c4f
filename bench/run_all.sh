#!/usr/bin/env bash
# Every benchmark behind docs/RESULTS.md, one after the other; raw JSON, the printed
# tables (.txt) and the PNG plots land in bench/results/.
#
#   sudo bench/run_all.sh                 # or: sudo make bench
#   sudo PYTHON=/path/to/python SEEDS=3 STEPS=20 bench/run_all.sh
#
# 1. wire_bytes.py   bytes per step per scheme for real models' shapes (no training)
# 2. kernels.py      single-core codec throughput against size, and the per-pass
#                    profile of the encoders (kernels.json/.png)
# 3. cluster.py      step time and communication share on the emulated cluster:
#                    2 workers, 1 server, vgg + resnet, every scheme, RATE and 4x RATE
# 4. accuracy.py     MNIST time to accuracy: 4 workers, 2 servers, every scheme, SEEDS
#                    seeds x EPOCHS epochs at ACC_RATE
# 5. plots.py        cluster.png, accuracy.png
#
# cluster.py and accuracy.py need root (network namespaces). Without root the cluster
# step is skipped and accuracy runs on loopback (no bandwidth limit: the times then
# say nothing about compression). A failing step does not stop the others; the exit
# code is then 1. With the defaults the whole run took 19 minutes on an idle 2-core
# machine (kernels 4.5, cluster 5, accuracy 10); expect more on a busy one.
# Namespace prefixes kvxb (cluster) and kvxa (accuracy): a bench/cluster.py started by
# hand (prefix kvxc) at the same time is left alone.
set -u
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
OUT=${OUT:-bench/results}
RATE=${RATE:-100mbit}          # cluster.py: docs/CLUSTER.md "Choosing the link rate"
STEPS=${STEPS:-6}              # cluster.py timed steps per job (its default is 20)
WARMUP=${WARMUP:-1}
ACC_RATE=${ACC_RATE:-200mbit}  # accuracy.py: see docs/RESULTS.md, "Time to accuracy"
SEEDS=${SEEDS:-2}
EPOCHS=${EPOCHS:-8}

mkdir -p "$OUT"
LOG="$OUT/run_all.txt"
failed=()
start_all=$(date +%s)

{
    echo "bench/run_all.sh started $(date '+%Y-%m-%d %H:%M:%S %Z')"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "machine: $(uname -sr), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
         "$(awk '/MemTotal/ {printf "%.1f GB RAM", $2 / 1048576}' /proc/meminfo)"
    echo "python: $("$PYTHON" -c 'import sys, mxnet, numpy; print(sys.version.split()[0], "mxnet", mxnet.__version__, "numpy", numpy.__version__)' 2>&1 | tail -1)"
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "settings: RATE=$RATE STEPS=$STEPS WARMUP=$WARMUP ACC_RATE=$ACC_RATE SEEDS=$SEEDS EPOCHS=$EPOCHS"
} | tee "$LOG"

# step NAME OUTPUT.txt COMMAND...: run, show and keep the output, time it
step() {
    local name=$1 txt=$2
    shift 2
    echo "== $name: $*" | tee -a "$LOG"
    local t0
    t0=$(date +%s)
    if [ -n "$txt" ]; then
        "$@" | tee "$OUT/$txt"
    else
        "$@"
    fi
    local code=${PIPESTATUS[0]}
    echo "   $name: exit $code, $(( $(date +%s) - t0 )) s, load average $(cut -d' ' -f1-3 /proc/loadavg)" \
        | tee -a "$LOG"
    [ "$code" -eq 0 ] || failed+=("$name")
}

step wire_bytes wire_bytes.txt \
    "$PYTHON" bench/wire_bytes.py --workers 4 --json "$OUT/wire_bytes.json"

step kernels kernels.txt \
    "$PYTHON" bench/kernels.py --profile --json "$OUT/kernels.json" --plot "$OUT/kernels.png"

if [ "$(id -u)" -eq 0 ]; then
    step cluster cluster.txt \
        "$PYTHON" bench/cluster.py -n 2 -s 1 --rate "$RATE" --rate-multipliers 1,4 \
        --models vgg resnet --steps "$STEPS" --warmup "$WARMUP" --prefix kvxb \
        --json "$OUT/cluster.json"
    step accuracy accuracy.txt \
        "$PYTHON" bench/accuracy.py -n 4 -s 2 --rate "$ACC_RATE" --seeds "$SEEDS" \
        --epochs "$EPOCHS" --prefix kvxa --json "$OUT/accuracy.json"
else
    echo "== not root: no emulated cluster; cluster.py skipped, accuracy.py on loopback" \
        | tee -a "$LOG"
    step accuracy accuracy.txt \
        "$PYTHON" bench/accuracy.py --loopback -n 4 -s 2 --seeds "$SEEDS" \
        --epochs "$EPOCHS" --json "$OUT/accuracy.json"
fi

plots=()
[ -f "$OUT/cluster.json" ] && plots+=(--cluster "$OUT/cluster.json")
[ -f "$OUT/accuracy.json" ] && plots+=(--accuracy "$OUT/accuracy.json")
if [ ${#plots[@]} -gt 0 ]; then
    step plots "" "$PYTHON" bench/plots.py "${plots[@]}" --out-dir "$OUT"
fi

echo "bench/run_all.sh finished $(date '+%Y-%m-%d %H:%M:%S %Z') after $(( $(date +%s) - start_all )) s;" \
     "failed: ${failed[*]:-none}" | tee -a "$LOG"
[ ${#failed[@]} -eq 0 ]
