#!/usr/bin/env bash
# The ranks-on-one-GPU checks (tests/gpu/ranks_on_one_gpu.rs) on a machine with one GPU or more:
# every rank of a world as a stream of GPU 0, for every shipped sm_90 ladder at its own world
# size (2, 4 and 8), the GB202 ladders retargeted to sm_90, the planted mutations at 2, 4 and
# 8 ranks, batch invariance (tests/gpu/one_gpu/invariance.rs), the reduce-scatter and all-gather
# kernels at 2, 4 and 8 ranks (the all-gather of the reduce-scatter the all-reduce, and ranks
# that disagree on the shape, each aborting), the
# epilogue's add + RMSNorm kernel, the fused kernels (and the residual added before the sum is
# rounded, caught in them) at 2, 4 and 8 ranks, and the rank-order sum (of slices, of owned runs
# of rows, and of per-rank rows given by the caller). Each test prints a table per
# ladder: candidates run, exact, geometry (own or reduced), the multi-size sequence, the rank
# that never launches, the time taken; per mutation and world what was caught; and per ladder
# the messages whose rows were the same bytes. Run from the repository root after
# scripts/build-gpu-tests.sh:
#   bash .device-carry/scripts/gpu-one-gpu.sh [OUT [TEST...]]
# OUT (optional) receives one.log, the whole output; TESTs (optional, after OUT) run only those
# of the list, the guard first, when a run must fit a time limit. PREPARE_TEST_SECONDS (default 600) bounds
# each test. Exits non-zero when the guard or any test fails.
set -uo pipefail

carry=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=gpu-env.sh
source "$carry/scripts/gpu-env.sh"
# A hardware queue for every stream (8 ranks and the capture stream): with the driver's default
# of 8, a rank's kernel queued behind a peer's on a shared queue starts only after the peer's
# deadline. The harness refuses to run without it.
export CUDA_DEVICE_MAX_CONNECTIONS=32
out=${1:-}
log=${out:+$out/one.log}
log=${log:-/dev/null}
[ -n "$out" ] && mkdir -p "$out"

echo "== machine" | tee -a "$log"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"

tests=(
    gpu::guard::a_run_that_requires_gpus_finds_one
    gpu::ranks_on_one_gpu::every_shipped_sm90_all_reduce_ladder_is_exact_at_its_world_on_one_gpu
    gpu::ranks_on_one_gpu::every_shipped_sm90_row_ladder_is_exact_at_its_world_on_one_gpu
    gpu::ranks_on_one_gpu::every_shipped_sm90_epilogue_ladder_s_fused_candidates_are_exact_at_their_buckets_on_one_gpu
    gpu::ranks_on_one_gpu::gb202_ladders_retargeted_to_sm90_are_exact_on_one_gpu
    gpu::ranks_on_one_gpu::planted_mutations_are_caught_at_every_world_on_one_gpu
    gpu::ranks_on_one_gpu::rows_are_the_same_bytes_in_every_message_and_candidate_on_one_gpu
    gpu::ranks_on_one_gpu::a_sum_order_that_depends_on_the_message_size_is_caught_on_one_gpu
    gpu::ranks_on_one_gpu::row_collectives_are_exact_at_every_world_on_one_gpu
    gpu::ranks_on_one_gpu::the_all_gather_of_the_reduce_scatter_is_the_all_reduce_on_one_gpu
    gpu::ranks_on_one_gpu::ranks_that_disagree_on_the_shape_abort_on_one_gpu
    gpu::rows_v::the_exact_reduce_scatter_s_passes_over_per_rank_rows_sum_every_rank_s_rows_in_rank_order
    gpu::one_gpu::norm::the_epilogue_kernel_gives_the_reference_on_one_gpu
    gpu::one_gpu::fused::every_fused_kernel_gives_the_reference_on_every_rank_on_one_gpu
    gpu::one_gpu::fused::the_residual_added_before_the_sum_is_rounded_is_caught_in_every_fused_kernel_on_one_gpu
    gpu::rows::the_rank_order_sum_kernel_sums_an_owned_run_given_as_the_last_slice
    gpu::rank_order::the_rank_order_sum_kernel_gives_the_reference_sum_on_one_gpu
)
if [ "$#" -gt 1 ]; then
    chosen=("${tests[0]}")
    for name in "${@:2}"; do
        if ! printf '%s\n' "${tests[@]}" | grep -qx -- "$name"; then
            echo "not a ranks-on-one-GPU check: $name" >&2
            exit 2
        fi
        chosen+=("$name")
    done
    tests=("${chosen[@]}")
fi
failed=()
for test in "${tests[@]}"; do
    echo "== $test" | tee -a "$log"
    start=$(date +%s)
    if timeout --kill-after=10 "${PREPARE_TEST_SECONDS:-600}" "$carry/tests/integration" --exact "$test" \
        --include-ignored --test-threads=1 --nocapture 2>&1 | tee -a "$log"; then
        echo "== $test passed in $(($(date +%s) - start)) s" | tee -a "$log"
    else
        echo "== $test FAILED in $(($(date +%s) - start)) s" | tee -a "$log"
        failed+=("$test")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}" | tee -a "$log"
    exit 1
fi
echo "every ranks-on-one-GPU check passed" | tee -a "$log"
