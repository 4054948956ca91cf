#!/usr/bin/env bash
# The checks of one world size on the GPU machine, at as many ranks as GPUs are visible (2, 4 or
# 8), with that world's ladder, ladders/h200_nvlink_tp<N>.json. Run from the repository root after
# scripts/build-gpu-tests.sh:
#   bash .device-carry/scripts/gpu-world.sh OUT [STEP...]
# The steps, in this order (all of them when none is named):
#   export     `prepare export --gpus` of the ladder into OUT/package: every candidate must
#              qualify; the counts, the multi-size graph sequence's memory lines and NCCL's
#              exactness go into the summary
#   tune       `prepare tune` cold (a fresh OUT/cache), then from the cache: the choice files of
#              every rank byte-identical, the cached choice the cold one; the selection times
#   bench      `prepare bench` into OUT/bench (bench.json and the plots)
#   torch      benches/pytorch_allreduce.py on N processes into OUT/torch.json, with whether
#              PyTorch's NCCL was bit-exact
#   exact      the default choice bit-exact in every bucket; `prepare tune --allow-inexact`:
#              the buckets whose winner changes from the default choice, and NCCL's bit-exact
#              column
#   faults     the fault tests at N ranks (PREPARE_TEST_WORLD=N): a rank killed or stopped
#              during tuning and serving, a rank that never starts
#   mutations  the planted mutations at N ranks
# Every step but export needs OUT/package; tune, bench and exact share OUT/cache, and exact
# compares with OUT/tune-cold. A later run with the same OUT can run the remaining steps.
# Each step is bounded by PREPARE_STEP_SECONDS (default 540), its commands' output kept in
# OUT/<step>.log; OUT/summary.txt gets one line per step with its result (details indented
# below it). PREPARE_BENCH_OPTIONS adds options to `prepare bench` (`--batches 0`). Exits
# non-zero when any step failed.
set -uo pipefail

carry=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=gpu-env.sh
source "$carry/scripts/gpu-env.sh"

all_steps=(export tune bench torch exact faults mutations)
if [ $# -lt 1 ]; then
    echo "usage: gpu-world.sh OUT [STEP...]; steps: ${all_steps[*]}" >&2
    exit 2
fi
out=$1
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=("${all_steps[@]}")
for name in "${steps[@]}"; do
    case " ${all_steps[*]} " in
    *" $name "*) ;;
    *)
        echo "no step $name; steps: ${all_steps[*]}" >&2
        exit 2
        ;;
    esac
done
bin=${PREPARE_BIN:-}
if [ ! -x "$bin" ]; then
    echo "no prepare binary: run scripts/build-gpu-tests.sh and this from .device-carry/scripts" >&2
    exit 2
fi
world=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
case $world in
2 | 4 | 8) ;;
*)
    echo "$world GPU(s) visible; the checks run at 2, 4 or 8" >&2
    exit 2
    ;;
esac
gpus=$(seq -s, 0 $((world - 1)))
ladder=${PREPARE_LADDERS:-ladders}/h200_nvlink_tp$world.json
package=$out/package
cache=$out/cache
seconds=${PREPARE_STEP_SECONDS:-540}
read -ra bench_options <<<"${PREPARE_BENCH_OPTIONS:-}"
mkdir -p "$out"
summary=$out/summary.txt
{
    nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.mem,temperature.gpu \
        --format=csv,noheader
    nvidia-smi topo -m
} >"$out/machine.txt" 2>&1
echo "world $world on GPUs $gpus, ladder $(basename "$ladder"), $(date -u +%FT%TZ)" >>"$summary"
echo "NVRTC: ${PREPARE_NVRTC:-none}; NCCL: ${nccl_dir:-none}; prepare: $bin" >>"$summary"

failed=()
log=
deadline=0
details=()

# note LINE: a detail for the summary, under the step's line.
note() {
    details+=("$1")
}

# run COMMAND...: runs one command of the current step into its log, bounded by what is left of
# the step's time; returns its status, which the summary gets when it is not 0.
run() {
    local left=$((deadline - $(date +%s))) status
    echo "\$ $*" >>"$log"
    if [ "$left" -le 0 ]; then
        note "no time left in the step for: $*"
        return 124
    fi
    timeout --kill-after=10 "$left" "$@" >>"$log" 2>&1
    status=$?
    case $status in
    0) ;;
    124 | 137) note "ran past the step's $seconds s: $*" ;;
    *) note "exited $status: $*" ;;
    esac
    return $status
}

# Each step_NAME runs its commands with `run`, says what it found with `note`, and returns
# non-zero when a check failed.

# The package's candidates listed by `prepare show`, per outcome of NCCL's.
nccl_qualified() {
    local shown=$out/show.txt
    timeout 60 "$bin" show --wide "$package" >"$shown" 2>&1 || return 1
    note "NCCL qualified bit-exact in $(grep -c 'nccl .*qualified, bit-exact' "$shown") bucket(s), \
not bit-exact in $(grep -c 'nccl .*not bit-exact' "$shown") (prepare show: $shown)"
}

step_export() {
    rm -rf "$package"
    run "$bin" export --gpus "$gpus" --collective-ladder "$ladder" --out "$package" || return 1
    local counts
    counts=$(grep -o 'qualified [0-9]* of [0-9]* candidates on [0-9]* GPUs' "$log")
    note "${counts:-no qualified count}"
    while IFS= read -r line; do
        note "$line"
    done < <(grep 'multi-size sequence:' "$log")
    nccl_qualified || return 1
    if ! grep -q 'multi-size sequence:' "$log"; then
        note "the multi-size sequence did not run"
        return 1
    fi
    if ! [[ $counts =~ qualified\ ([0-9]+)\ of\ ([0-9]+) ]] ||
        [ "${BASH_REMATCH[1]}" -ne "${BASH_REMATCH[2]}" ]; then
        note "not every candidate qualified (prepare show lists why)"
        return 1
    fi
}

# identical DIR: every rank's choice file in DIR exists and all are byte-identical.
identical() {
    local rank
    for rank in $(seq 0 $((world - 1))); do
        if ! cmp -s "$1/choice.rank0.json" "$1/choice.rank$rank.json"; then
            note "$1/choice.rank$rank.json is missing or differs from rank 0's"
            return 1
        fi
    done
}

tune() {
    run "$bin" tune --package "$package" --gpus "$gpus" --cache-dir "$cache" "$@"
}

step_tune() {
    rm -rf "$cache" "$out/tune-cold" "$out/tune-cached"
    local ok=0
    tune --out "$out/tune-cold" || return 1
    identical "$out/tune-cold" || ok=1
    tune --out "$out/tune-cached" || return 1
    identical "$out/tune-cached" || ok=1
    if ! cmp -s "$out/tune-cold/choice.rank0.json" "$out/tune-cached/choice.rank0.json"; then
        note "the cached choice differs from the cold one"
        ok=1
    fi
    while IFS= read -r line; do
        note "$line"
    done < <(grep -e 'selected in' -e 'cache hit on every rank' "$log")
    if ! grep -q 'selected in' "$log" || ! grep -q 'cache hit on every rank' "$log"; then
        note "the cold run did not time or the cached run did not hit"
        ok=1
    fi
    return $ok
}

step_bench() {
    run "$bin" bench --package "$package" --gpus "$gpus" --cache-dir "$cache" --out "$out/bench" \
        "${bench_options[@]}" || return 1
    note "bench.json and the plots in $out/bench"
}

step_torch() {
    run python3 -m torch.distributed.run --nproc-per-node "$world" benches/pytorch_allreduce.py \
        --json "$out/torch.json" || return 1
    note "$(jq -r '[.rows[] | select(.contender == "torch_nccl" and .exact != null)]
        | "torch_nccl bit-exact at \(map(select(.exact)) | length) of \(length) sizes"' \
        "$out/torch.json")"
}

# winners FILE: each bucket's winner in a choice, one a line.
winners() {
    jq -r '.buckets[] | .winner' "$1"
}

step_exact() {
    local default=$out/tune-cold/choice.rank0.json inexact=$out/tune-inexact/choice.rank0.json
    if [ ! -e "$default" ]; then
        note "no default choice in $out/tune-cold: run the tune step first"
        return 1
    fi
    rm -rf "$out/tune-inexact"
    tune --allow-inexact --out "$out/tune-inexact" || return 1
    identical "$out/tune-inexact" || return 1
    note "$(jq -r '[.buckets[] | .candidates[] | select(.profile == "nccl")]
        | "NCCL bit-exact in \(map(select(.exact)) | length) of \(length) buckets"' \
        "$default")"
    note "default (exact) winners: $(winners "$default" | paste -sd' ' -)"
    note "--allow-inexact winners: $(winners "$inexact" | paste -sd' ' -)"
    note "$(paste -d' ' <(winners "$default") <(winners "$inexact") | awk '$1 != $2 { n++ }
        END { print n + 0 " bucket(s) change winner under --allow-inexact" }')"
    local not_exact
    not_exact=$(jq '[.buckets[] | select(.bit_exact | not)] | length' "$default")
    if [ "$not_exact" -ne 0 ]; then
        note "$not_exact bucket(s) of the default (exact) choice are not bit-exact"
        return 1
    fi
}

# gpu_tests FILTER...: the GPU tests the filters keep (scripts/gpu-tests.sh), at this world.
gpu_tests() {
    run env PREPARE_TEST_WORLD="$world" PREPARE_TEST_SECONDS="${PREPARE_TEST_SECONDS:-$seconds}" \
        bash "$carry/scripts/gpu-tests.sh" gpu::guard::a_run_that_requires_gpus_finds_one "$@"
    local status=$? passed
    passed=$(sed -n 's/^test result: .* \([0-9]*\) passed;.*/\1/p' "$log" | awk '{ n += $1 } END { print n + 0 }')
    note "$passed test(s) passed at $world ranks; $(grep -c '^test .* FAILED$' "$log") failed"
    if grep -q '^skipped:' "$log"; then
        note "a test skipped"
        return 1
    fi
    [ "$status" -eq 0 ] && [ "$passed" -gt 0 ]
}

step_faults() {
    gpu_tests gpu::tune::a_rank_ gpu::runtime::a_rank_killed_during \
        gpu::runtime::a_rank_stopped_during gpu::runtime::a_rank_that_never_starts
}

step_mutations() {
    gpu_tests gpu::mutations::
}

for name in "${steps[@]}"; do
    log=$out/$name.log
    : >"$log"
    details=()
    start=$(date +%s)
    deadline=$((start + seconds))
    echo "== $name"
    if [ "$name" != export ] && [ ! -d "$package" ]; then
        note "no package in $package: run the export step first"
        result=FAILED
    elif "step_$name"; then
        result=passed
    else
        result=FAILED
    fi
    [ "$result" = passed ] || failed+=("$name")
    line="$name: $result in $(($(date +%s) - start)) s (log $log)"
    echo "== $line"
    echo "$line" >>"$summary"
    for detail in "${details[@]}"; do
        echo "   $detail"
        echo "   $detail" >>"$summary"
    done
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}" | tee -a "$summary"
    exit 1
fi
echo "every step passed" | tee -a "$summary"
