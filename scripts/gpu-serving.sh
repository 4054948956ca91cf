#!/usr/bin/env bash
# The serving checks on a machine with two or more GPUs and PyTorch, from a folder that holds
# the release `prepare` binary (bin/), the Python wheel (dist/) and packages exported for the
# machine (packages/<ladder>/). A machine without a Rust toolchain or a package registry can
# take such a folder built elsewhere:
#
#   cargo build --release --bin prepare
#   python3 -m pip wheel --no-deps -w CARRY/dist ./python
#   for name in h200_nvlink_tp2 h200_nvlink_tp2_{reduce_scatter,all_gather}{,_fp32}; do
#       prepare export --collective-ladder ladders/$name.json --arch sm_90 \
#           --out CARRY/packages/$name
#   done
#
# then, on the GPU machine, from the repository root:
#
#   bash scripts/gpu-serving.sh CARRY OUT [LADDER]
#
# It installs the wheel into the Python that has torch (no index), then runs, on LADDER's
# package (default h200_nvlink_tp2): the exactness of every candidate through the Python path,
# a peer killed while serving, the TP MLP decode example; on the packages of LADDER's
# reduce-scatter and all-gather (LADDER_reduce_scatter, LADDER_all_gather and their _fp32):
# the row collectives through the Python path (tests/python/gpu_rows.py) and the decode
# example's sequence-parallel end (bf16); then in one lease `prepare bench` (its serving-path
# table included) and benches/pytorch_allreduce.py with prepare's Python path beside PyTorch's
# all-reduces. Logs and JSON go to OUT. Exits non-zero when a check fails.
set -uo pipefail

carry=$(cd "$1" && pwd)
out=$2
ladder=${3:-h200_nvlink_tp2}
package=$carry/packages/$ladder
reduce_scatter=$carry/packages/${ladder}_reduce_scatter
all_gather=$carry/packages/${ladder}_all_gather
gpus=$(nvidia-smi -L | wc -l)
mkdir -p "$out"
# shellcheck source=gpu-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh"
export PYTHONUNBUFFERED=1
cache=$(mktemp -d)

python3 -m pip install --quiet --no-index --no-deps --force-reinstall "$carry"/dist/*.whl || exit 1
python3 -c 'import prepare; print("prepare", prepare.__version__, "from", prepare.__file__)'

failed=()
step() {
    local name=$1
    shift
    echo "== $name"
    local start
    start=$(date +%s)
    if "$@" >"$out/$name.txt" 2>&1; then
        echo "== $name passed in $(($(date +%s) - start)) s"
    else
        echo "== $name FAILED in $(($(date +%s) - start)) s"
        failed+=("$name")
    fi
    grep -v "torch/distributed/run.py" "$out/$name.txt" | tail -n "${TAIL_LINES:-12}"
}

torchrun=(torchrun --nproc-per-node "$gpus" --master-port 29620)
step exactness "${torchrun[@]}" tests/python/gpu_exactness.py "$package" --cache-dir "$cache" \
    --json "$out/exactness.json"
step peer_death python3 tests/python/gpu_peer_death.py "$package" --cache-dir "$cache"
step torch_tp_mlp "${torchrun[@]}" examples/torch_tp_mlp.py "$package" --cache-dir "$cache"
step rows "${torchrun[@]}" tests/python/gpu_rows.py "$reduce_scatter" "${reduce_scatter}_fp32" \
    "$all_gather" "${all_gather}_fp32" --cache-dir "$cache"
step torch_tp_mlp_sequence_parallel "${torchrun[@]}" examples/torch_tp_mlp.py "$package" \
    "$reduce_scatter" "$all_gather" --sequence-parallel --cache-dir "$cache"
sizes=1K,8K,64K,256K,1M,4M,16M,64M
TAIL_LINES=70 step prepare_bench "$carry/bin/prepare" bench --package "$package" \
    --gpus "$(seq -s, 0 $((gpus - 1)))" --sizes "$sizes" --batches 1 --cache-dir "$cache" \
    --out "$out/bench"
TAIL_LINES=70 step python_bench "${torchrun[@]}" benches/pytorch_allreduce.py --prepare "$package" \
    --prepare-cache-dir "$cache" --sizes "$sizes,128M,256M" --json "$out/python_allreduce.json"

if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "every serving check passed"
