#!/usr/bin/env bash
# The benchmarks behind docs/benchmarks.md, on the GPU machine, one after the other: for each
# ladder, `prepare export` for the local GPUs (which qualifies every candidate in CUDA graphs), then
# `prepare bench` (every candidate, NCCL and the tuned choice, plus the decode emulation); then
# benches/pytorch_allreduce.py (PyTorch's NCCL and symmetric-memory all-reduces, and NCCL's
# symmetric kernels), its reduce-scatter and all-gather (`--collective`) and its
# sequence-parallel step (`--sequence-parallel`). Run from the repository root after
# scripts/build-gpu-tests.sh:
#   bash .device-carry/scripts/gpu-bench.sh OUT LADDER.json... [-- BENCH-OPTIONS...]
# OUT/<ladder name>/ gets the package, bench.json and the plots; OUT/torch.json PyTorch's
# all-reduce rows, OUT/torch_reduce_scatter.json, OUT/torch_all_gather.json and
# OUT/torch_sequence_parallel.json the others.
set -euo pipefail

carry=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=gpu-env.sh
source "$carry/scripts/gpu-env.sh"

out=$1
shift
ladders=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    ladders+=("$1")
    shift
done
[ $# -gt 0 ] && shift
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
count=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv,noheader
mkdir -p "$out"
for ladder in "${ladders[@]}"; do
    name=$(basename "$ladder" .json)
    start=$(date +%s)
    "$PREPARE_BIN" export --gpus "$gpus" --collective-ladder "$ladder" --out "$out/$name/package"
    echo "== $name: exported and qualified in $(($(date +%s) - start)) s"
    start=$(date +%s)
    "$PREPARE_BIN" bench --package "$out/$name/package" --gpus "$gpus" \
        --cache-dir "$out/cache" --out "$out/$name" "$@"
    echo "== $name: bench in $(($(date +%s) - start)) s"
done
start=$(date +%s)
python3 -m torch.distributed.run --nproc-per-node "$count" benches/pytorch_allreduce.py \
    --json "$out/torch.json"
echo "== PyTorch bench in $(($(date +%s) - start)) s"
for collective in reduce_scatter all_gather; do
    start=$(date +%s)
    python3 -m torch.distributed.run --nproc-per-node "$count" benches/pytorch_allreduce.py \
        --collective "$collective" --json "$out/torch_$collective.json"
    echo "== PyTorch $collective bench in $(($(date +%s) - start)) s"
done
start=$(date +%s)
python3 -m torch.distributed.run --nproc-per-node "$count" benches/pytorch_allreduce.py \
    --sequence-parallel --json "$out/torch_sequence_parallel.json"
echo "== PyTorch sequence-parallel bench in $(($(date +%s) - start)) s"
