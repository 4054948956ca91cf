#!/usr/bin/env bash
# Runs the tests gathered by scripts/build-gpu-tests.sh on the GPU machine, the ignored GPU tests
# included: the integration binary's gpu group one module at a time (tests/gpu/<module>.rs), each
# in a process of its own, then the library's unit tests. Run from the repository root:
#   bash .device-carry/scripts/gpu-tests.sh [TEST-FILTER...]
# A filter keeps the tests whose name contains it (gpu::runtime, a_rank_killed, ...).
# PREPARE_TEST_SECONDS (default 300) bounds each module and the unit tests, so one that hangs
# cannot take the others' time.
# It sets up NVRTC (CUDA's lib64), requires GPUs (PREPARE_REQUIRE_GPU=1, so a run that finds
# none fails) and keeps NVLink multicast off; the tool finds NCCL (PyTorch's wheel) itself.
# Exits non-zero when any module or the unit tests fail.
set -uo pipefail

carry=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=gpu-env.sh
source "$carry/scripts/gpu-env.sh"

echo "== machine"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader || true
nvidia-smi topo -m 2>/dev/null | head -n 8 || true
echo "NVRTC: ${PREPARE_NVRTC:-none}; NCCL: ${nccl_dir:-none}"

failed=()

# run NAME COMMAND...: runs one test process within the time bound and records a failure.
run() {
    local name=$1 start
    shift
    echo
    echo "== $name"
    start=$(date +%s)
    if timeout --kill-after=10 "${PREPARE_TEST_SECONDS:-300}" "$@"; then
        echo "== $name passed in $(($(date +%s) - start)) s"
    else
        echo "== $name FAILED in $(($(date +%s) - start)) s"
        failed+=("$name")
    fi
}

# The names of the gpu group's tests that the filters (if any) keep, one a line.
gpu_tests() {
    local all
    all=$("$carry/tests/integration" --list --include-ignored | sed -n 's/^\(gpu::[A-Za-z0-9_:]*\): test$/\1/p')
    if [ "$#" -eq 0 ]; then
        printf '%s\n' "$all"
        return
    fi
    local filters=()
    for filter in "$@"; do
        filters+=(-e "$filter")
    done
    printf '%s\n' "$all" | grep -F "${filters[@]}" || true
}

if [ -x "$carry/tests/integration" ]; then
    mapfile -t tests < <(gpu_tests "$@")
    mapfile -t modules < <(printf '%s\n' "${tests[@]}" | sed -n 's/^\(gpu::[A-Za-z0-9_]*\)::.*/\1/p' | sort -u)
    if [ "${#modules[@]}" -eq 0 ] && [ "$#" -eq 0 ]; then
        echo "the integration binary lists no gpu tests" >&2
        failed+=("integration")
    fi
    for module in "${modules[@]}"; do
        mapfile -t names < <(printf '%s\n' "${tests[@]}" | grep "^$module::")
        # The ranks-on-one-GPU harness needs a hardware queue per stream (gpu-one-gpu.sh).
        queues=()
        [ "$module" = gpu::ranks_on_one_gpu ] && queues=(env CUDA_DEVICE_MAX_CONNECTIONS=32)
        run "$module" "${queues[@]}" "$carry/tests/integration" --exact "${names[@]}" \
            --include-ignored --test-threads=1 --nocapture
    done
else
    echo "no integration test binary in $carry/tests" >&2
    failed+=("integration")
fi
if [ -x "$carry/tests/unit-lib" ]; then
    run unit-lib "$carry/tests/unit-lib" --include-ignored --test-threads=1 --nocapture "$@"
fi

echo
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all GPU tests passed"
