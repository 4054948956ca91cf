#!/usr/bin/env bash
# Runs every test binary gathered by scripts/build-gpu-tests.sh, the ignored GPU tests
# included, on the GPU machine. Run from the repository root:
#   bash .device-carry/scripts/gpu-tests.sh [TEST-FILTER...]
# PREPARE_TEST_SECONDS (default 300) bounds each test binary, so one that hangs cannot take the
# others' time.
# It sets up NVRTC (CUDA's lib64), requires GPUs (PREPARE_REQUIRE_GPU=1, so a run that finds
# none fails) and keeps NVLink multicast off; the tool finds NCCL (PyTorch's wheel) itself.
# Exits non-zero when any test binary fails.
set -uo pipefail

carry=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=gpu-env.sh
source "$carry/scripts/gpu-env.sh"

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
