#!/usr/bin/env bash
# `make bench`: the throughput benchmark on the models of docs/benchmarks.md, each side by side
# in all three modes (3 interleaved repeats), JSON and PNG under runs/bench/ (or $1; runs/ is not tracked: copy a run of record into results/ by hand).
# About 30 minutes on a 2-core machine. Needs root for the shaped bandwidths.
set -euo pipefail
PY=${PY:-python}
OUT=${1:-runs/bench}
mkdir -p "$OUT"
bench() { name=$1; shift; echo "== $name: $*"; "$PY" -m odsgd.bench throughput --repeats 3 --json "$OUT/throughput_$name.json" "$@"; }
# 162 parameter arrays of 16x16: the per-array cost of a step, nothing else.
bench dense162 --model dense --dense-layers 81 --dense-width 16 --batch-size 4 --steps 40 --skip 6 --bandwidth-mbit 0
# ResNet-20 (the authors' CIFAR model), 65 arrays, 0.27 M parameters; 200 Mbit/s: t_comm ~ t_comp.
bench resnet20 --model cifar_resnet20_v1 --image-size 32 --batch-size 16 --steps 15 --skip 5 --bandwidth-mbit 200,0
# A small MLP with millisecond steps (1024-128-128-10, batch 16).
bench mlp128 --model mlp --mlp-hidden 128 --batch-size 16 --steps 200 --skip 20 --bandwidth-mbit 0
# The 2.1 M MLP; 4000 Mbit/s: t_comm ~ t_comp.
bench mlp2m --model mlp --batch-size 1024 --steps 30 --skip 8 --bandwidth-mbit 4000,0
# ResNet-50 at 32x32, 161 arrays (193 with BatchNorm's), 25.6 M parameters.
bench resnet50 --model resnet50_v1 --image-size 32 --batch-size 8 --steps 8 --skip 4 --bandwidth-mbit 0
