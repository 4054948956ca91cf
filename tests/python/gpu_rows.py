"""The reduce-scatter and the all-gather through `prepare.Collectives` on GPUs: every output
against PyTorch's `reduce_scatter_tensor` / `all_gather_into_tensor` where the rows divide
evenly (bit for bit; the reduce-scatter only at two ranks, where any sum of two terms is the
rank-order sum) and against the reference (fp32 in rank order from rank 0, rounded once; the
all-gather's bytes as given) for every shape, uneven rows and ranks owning none included; in
place and out of place (the input unchanged); captured in a CUDA graph and replayed on new
data; under `torch.compile` (full graph, and mode="reduce-overhead"); and the all-gather of the
reduce-scatter equal to the reference all-reduce.

    python3 tests/python/gpu_rows.py --write-ladders DIR [--world 2]   # no torch needed
    # export each DIR/*.json with `prepare export --arch sm_90 --collective-ladder FILE --out P`
    torchrun --nproc-per-node 2 tests/python/gpu_rows.py PACKAGE_DIR... [--cache-dir DIR]

The packages: a reduce-scatter and an all-gather package per dtype to check (the ladders
`--write-ladders` writes: NCCL, the exact NCCL reduce-scatter and the one-shot kernels). Prints
one line per check; exits non-zero when any fails.
"""

import argparse
import json
import os
import sys

failures = []


def ladder(collective, dtype, world):
    """A reduce-scatter or all-gather ladder for H200s at `world` ranks: NCCL (and the exact
    NCCL reduce-scatter) and the one-shot pull and push kernels in two buckets."""
    profiles = [{"id": "nccl", "algorithm": "nccl"},
                {"id": "one_shot_pull", "algorithm": "one_shot", "transfer": "pull"},
                {"id": "one_shot_push", "algorithm": "one_shot", "transfer": "push"}]
    if collective == "reduce_scatter":
        profiles.insert(1, {"id": "nccl_rank_order", "algorithm": "nccl", "order": "rank"})
    candidates = [profile["id"] for profile in profiles]
    step = 16 * world
    return {
        "format_version": 1,
        "name": f"h200_nvlink_{collective}_{dtype}_tp{world}",
        "collective": collective,
        "dtype": dtype,
        "world_size": world,
        "targets": ["sm_90"],
        "profiles": profiles,
        "buckets": [{"max_bytes": max_bytes, "threads": 256, "blocks": 8,
                     "candidates": candidates, "default": "nccl"}
                    for max_bytes in (step * 1024, step * 65536)],
    }


def write_ladders(directory, world):
    os.makedirs(directory, exist_ok=True)
    for collective in ("reduce_scatter", "all_gather"):
        for dtype in ("bf16", "fp32"):
            value = ladder(collective, dtype, world)
            path = os.path.join(directory, f"{value['name']}.json")
            with open(path, "w") as file:
                json.dump(value, file, indent=2)
                file.write("\n")
            print(path)


def expect(what, condition, detail=""):
    print(f"{'ok  ' if condition else 'FAIL'} {what}{': ' + detail if detail else ''}",
          flush=True)
    if not condition:
        failures.append(what)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--write-ladders", metavar="DIR",
                        help="write the ladders to export for this script, then exit")
    parser.add_argument("--world", type=int, default=2, help="the world of --write-ladders")
    args = parser.parse_args()
    if args.write_ladders:
        write_ladders(args.write_ladders, args.world)
        return 0
    if not args.packages:
        parser.error("give the packages (or --write-ladders DIR)")
    from gpu_rows_checks import run

    return run(args.packages, args.cache_dir, expect, failures)


if __name__ == "__main__":
    sys.exit(main())
