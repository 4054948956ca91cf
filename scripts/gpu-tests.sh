#!/usr/bin/env bash
# Runs every test binary gathered by scripts/build-gpu-tests.sh, the ignored GPU tests
# included, on the GPU machine. Run from the repository root:
#   bash .device-carry/scripts/gpu-tests.sh [TEST-FILTER...]
# PREPARE_TEST_SECONDS (default 300) bounds each test binary, so one that hangs cannot take the
# others' time.
# It sets up NVRTC (CUDA's lib64), NCCL (PyTorch's wheel, linked as libnccl.so for cudarc's
# loader), requires GPUs (PREPARE_REQUIRE_GPU=1, so a run that finds none fails) and keeps
# NVLink multicast off. Exits non-zero when any test binary fails.
set -uo pipefail

carry=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PREPARE_REQUIRE_GPU=1
# NVLink multicast can take a shared host's GPUs out of service: never turn it on.
export NCCL_NVLS_ENABLE=0
export INSTA_UPDATE=no
# Snapshots are inline; this keeps insta from looking for the build machine's checkout.
export INSTA_WORKSPACE_ROOT=$PWD
# Tests that compile kernels fail instead of skipping when NVRTC is missing.
export PREPARE_REQUIRE_NVRTC=1
# NVRTC answers repeated compiles from the CUDA compute cache without ptxas's report.
export CUDA_CACHE_DISABLE=1
export RUST_BACKTRACE=1

cuda_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
if [ -e "$cuda_lib/libnvrtc.so.13" ]; then
    export PREPARE_NVRTC=$cuda_lib/libnvrtc.so.13
    export LD_LIBRARY_PATH=$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    echo "warning: no libnvrtc.so.13 in $cuda_lib; kernels cannot be compiled" >&2
fi

nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null ||
    python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
if [ -n "$nccl_dir" ] && [ -e "$nccl_dir/lib/libnccl.so.2" ]; then
    links=$(mktemp -d)
    trap 'rm -rf "$links"' EXIT
    ln -s "$nccl_dir/lib/libnccl.so.2" "$links/libnccl.so"
    export LD_LIBRARY_PATH=$links:$nccl_dir/lib:$LD_LIBRARY_PATH
else
    echo "warning: NCCL (python3 -c 'import nvidia.nccl') not found; NCCL tests will fail" >&2
fi

if [ -x "$carry/bin/prepare" ]; then
    export PREPARE_BIN=$carry/bin/prepare
fi
if [ -x "$carry/bin/serve" ]; then
    export PREPARE_SERVE=$carry/bin/serve
fi
if [ -d "$carry/ladders" ]; then
    export PREPARE_LADDERS=$carry/ladders
fi

echo "== machine"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader || true
nvidia-smi topo -m 2>/dev/null | head -n 8 || true
echo "NVRTC: ${PREPARE_NVRTC:-none}; NCCL: ${nccl_dir:-none}"

failed=()
for test in "$carry"/tests/*; do
    [ -x "$test" ] || continue
    name=$(basename "$test")
    echo
    echo "== $name"
    start=$(date +%s)
    if timeout --kill-after=10 "${PREPARE_TEST_SECONDS:-300}" \
        "$test" --include-ignored --test-threads=1 --nocapture "$@"; then
        echo "== $name passed in $(($(date +%s) - start)) s"
    else
        echo "== $name FAILED in $(($(date +%s) - start)) s"
        failed+=("$name")
    fi
done

echo
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all test binaries passed"
