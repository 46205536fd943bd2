#!/usr/bin/env bash
# The paper's cluster on this machine: dist_sync, dist_async and dist_odsgd with
# accelerator-paced workers (V100 step times, the real parameter shapes) on emulated hosts,
# a NIC per worker and per server, bytes and link scaled down together (docs/benchmarks.md,
# "Accelerator-paced workers and the planner"). Each configuration: medians of 3 repeats,
# the modes interleaved; JSON and PNG per configuration under runs/paper_cluster/ (or $1;
# runs/ is not tracked: copy a run of record into results/ by hand), then one picture of
# measured against predicted samples/s. Root and sshd (network namespaces); about 2 hours
# on a quiet 2-core machine.
#
# Overrides for a smoke test: REPEATS, STEPS, SKIP (per configuration), ONLY (names of the
# configurations to run, space-separated), BYTE_SCALE (ResNet-50's, default 64), BANDWIDTHS
# (ResNet-50's Mbit/s, default 10000,25000).
set -euo pipefail
PY=${PY:-python}
OUT=${1:-runs/paper_cluster}
REPEATS=${REPEATS:-3}
ONLY=${ONLY:-}
SCALE=${BYTE_SCALE:-64}
mkdir -p "$OUT"
written=()

bench() {
    name=$1; steps=$2; skip=$3; shift 3
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    echo "== $name: $*"
    "$PY" -m odsgd.bench throughput --topology hosts --repeats "$REPEATS" \
        --steps "${STEPS:-$steps}" --skip "${SKIP:-$skip}" --overlap-interval 0 \
        --json "$OUT/paper_cluster_$name.json" "$@"
    written+=("$OUT/paper_cluster_$name.json")
}

# ResNet-50 v1 (193 arrays, 102.3 MB), V100 FP32 at batch 128 (333 ms a step), 10 and 25
# Gbit/s per NIC direction; byte scale 64: 1.6 MB a worker, NICs shaped to 156 and 391 Mbit/s.
RN50=(--model resnet50_v1 --device-profile v100 --batch-size 128 --byte-scale "$SCALE"
      --bandwidth-mbit "${BANDWIDTHS:-10000,25000}")
bench rn50_8w1s 20 5 "${RN50[@]}" --workers 8 --servers 1
bench rn50_12w1s 20 5 "${RN50[@]}" --workers 12 --servers 1
bench rn50_8w4s 20 5 "${RN50[@]}" --workers 8 --servers 4
bench rn50_12w4s 20 5 "${RN50[@]}" --workers 12 --servers 4
# ResNet-20 for CIFAR (65 arrays, 1.1 MB), V100 by multiply-adds (3.5 ms a step at batch
# 128), 1 Gbit/s, where the link binds; byte scale 4 (NICs at 250 Mbit/s).
bench resnet20_8w1s 60 10 --model cifar_resnet20_v1 --device-profile v100 --batch-size 128 \
    --byte-scale 4 --bandwidth-mbit 1000 --workers 8 --servers 1

if [ ${#written[@]} -gt 0 ]; then
    "$PY" -m odsgd.bench.prediction_plot "${written[@]}" --out "$OUT/paper_cluster.png"
fi
