"""Every candidate of every bucket, forced one at a time through the Python path, equals the
reference sum bit for bit; messages above the ladder equal the reference sum when they go in
pieces, NCCL's result when NCCL takes them.

    torchrun --nproc-per-node 2 tests/python/gpu_exactness.py PACKAGE_DIR [--json OUT]

For each bucket and each candidate the choice lists (`Collectives.force`; a candidate dropped
on this machine is reported as such), at the bucket's smallest message (one element above the
previous bucket), an odd size inside and its largest, on qualification-like data (negative
zeros, subnormals, values near the largest bf16, infinities, NaN), in eight modes: eager and
CUDA-graph replay (two replays on fresh data) x in place and out of place (the input must be
kept) x the zero-copy region (`Collectives.empty`) and an ordinary tensor. The reference:
all-gather the inputs, sum in fp32 in rank order from rank 0's value, round once to bf16; NaN
matches NaN. Then 128 MiB and 256 MiB, by the handle's route above the ladder: in pieces
against the reference, or NCCL on the handle's communicator against
`torch.distributed.all_reduce` on the same data. Prints a table, writes JSON, exits non-zero
on any difference.
"""

import argparse
import json
import sys
import time

from gpu_common import any_rank, first_difference, init, random_bf16, reference_sum

import torch  # noqa: E402  (gpu_common sets the multicast variables first)
import torch.distributed as dist  # noqa: E402

import prepare  # noqa: E402

MODES = [(eager, place, memory)
         for eager in ("eager", "graph")
         for place in ("in_place", "out_of_place")
         for memory in ("zero_copy", "any_tensor")]
LARGE = [128 << 20, 256 << 20]


def sizes_of(bucket):
    """Elements at the bucket's smallest, an odd size inside, and its largest."""
    low = bucket["min_bytes"] // 2 if bucket["min_bytes"] > 0 else 1
    low = max(low, 1)
    high = bucket["max_bytes"] // 2
    odd = (low + high) // 2 | 1
    return sorted({low, min(max(odd, low), high), high})


class Case:
    """One mode's buffers and data at one size."""

    def __init__(self, collectives, mode, elements, seed, rank, device):
        _, place, memory = mode
        self.mode, self.elements = mode, elements
        self.data = [random_bf16(elements, seed + 7919 * rank + replay * 104729, device)
                     for replay in range(2)]
        self.expected = [reference_sum(data) for data in self.data]
        if memory == "zero_copy":
            self.input = collectives.empty(elements, torch.bfloat16)
        else:
            self.input = torch.empty(elements, dtype=torch.bfloat16, device=device)
        self.output = self.input if place == "in_place" else torch.empty_like(self.input)

    def fill(self, replay):
        self.input.copy_(self.data[replay])
        if self.output is not self.input:
            self.output.fill_(float("nan"))

    def outcome(self, replay):
        """None when exact and the input kept, else what differs."""
        got = first_difference(self.output, self.expected[replay])
        if got is not None:
            return f"DIFFERS at element {got}"
        if self.output is not self.input:
            changed = first_difference(self.input, self.data[replay])
            if changed is not None:
                return f"INPUT CHANGED at element {changed}"
        return None


def run_case(collectives, case, stream):
    """Runs one case (eager, or a captured graph replayed twice); the first problem or None."""
    eager = case.mode[0] == "eager"
    out = None if case.output is case.input else case.output
    if eager:
        case.fill(0)
        collectives.all_reduce(case.input, out=out)
        torch.cuda.synchronize()
        return case.outcome(0)
    case.fill(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        collectives.all_reduce(case.input, out=out)
    for replay in range(2):
        case.fill(replay)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        problem = case.outcome(replay)
        if problem:
            return f"{problem} (replay {replay})"
    del graph
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()

    rank, world, device = init()
    started = time.monotonic()
    collectives = prepare.Collectives(args.package, cache_dir=args.cache_dir,
                                      timeout=args.timeout)
    choice = collectives.choice()[torch.bfloat16]
    if rank == 0:
        print(f"{collectives}: selected in {time.monotonic() - started:.1f} s, "
              f"ladder {choice['ladder']}, zero-copy region "
              f"{collectives.zero_copy_bytes()} bytes", flush=True)
    # The comparison itself must see a one-bit difference and a changed NaN-free element.
    probe = random_bf16(4096, 5, device)
    flipped = probe.clone()
    flipped.view(torch.int16)[1234] ^= 1
    assert first_difference(flipped, probe) == 1234 or bool(torch.isnan(probe[1234])), \
        "the comparison misses a one-bit difference"
    assert first_difference(probe, probe.clone()) is None
    stream = torch.cuda.Stream()
    results = []
    failures = 0
    for bucket in choice["buckets"]:
        index = bucket["index"]
        profiles = [candidate["profile"] for candidate in bucket["candidates"]]
        for size_index, elements in enumerate(sizes_of(bucket)):
            seed = 1_000_003 * (index + 1) + 101 * size_index
            cases = {mode: Case(collectives, mode, elements, seed + 11 * number, rank, device)
                     for number, mode in enumerate(MODES)}
            for profile in profiles:
                try:
                    collectives.force(index, profile)
                except prepare.InvalidArgument as error:
                    results.append(dict(bucket=index, profile=profile, elements=elements,
                                        mode="all", outcome=f"not run: {error}"))
                    continue
                route = collectives.route(elements * 2)
                for mode, case in cases.items():
                    problem = run_case(collectives, case, stream)
                    differs = any_rank(problem is not None, device)
                    outcome = problem or ("differs on another rank" if differs else "exact")
                    failures += differs
                    results.append(dict(bucket=index, profile=profile, route=route,
                                        elements=elements, mode="/".join(mode),
                                        outcome=outcome))
            del cases
            torch.cuda.empty_cache()
        # Back to the agreed winner before the next bucket.
        collectives.force(index, bucket["winner"])
        if rank == 0:
            done = [r for r in results if r["bucket"] == index]
            bad = [r for r in done if r["outcome"] not in ("exact",)
                   and not r["outcome"].startswith("not run")]
            print(f"bucket {index} ({bucket['min_bytes']}..{bucket['max_bytes']} B): "
                  f"{len(done)} checks, {len(bad)} not exact", flush=True)

    # Above the ladder: pieces against the reference, NCCL against torch's NCCL.
    for nbytes in LARGE:
        elements = nbytes // 2
        data = random_bf16(elements, 424242 + rank + nbytes, device)
        route = collectives.route(nbytes)
        pieces = "in pieces" in route
        if pieces:
            expected = reference_sum(data)
        else:
            expected = data.clone()
            dist.all_reduce(expected)
        for place in ("in_place", "out_of_place"):
            for eager in ("eager", "graph"):
                tensor = data.clone()
                out = None if place == "in_place" else torch.empty_like(tensor)
                if eager == "eager":
                    collectives.all_reduce(tensor, out=out)
                else:
                    graph = torch.cuda.CUDAGraph()
                    torch.cuda.synchronize()
                    with torch.cuda.graph(graph, stream=stream):
                        collectives.all_reduce(tensor, out=out)
                    graph.replay()
                torch.cuda.synchronize()
                result = tensor if out is None else out
                got = first_difference(result, expected)
                against = "the reference" if pieces else "NCCL"
                problem = None if got is None else f"DIFFERS from {against} at element {got}"
                if problem is None and out is not None and first_difference(tensor, data):
                    problem = "INPUT CHANGED"
                differs = any_rank(problem is not None, device)
                failures += differs
                results.append(dict(bucket="above",
                                    profile=("pieces (reference sum)" if pieces
                                             else "nccl (torch reference)"),
                                    route=route, elements=elements,
                                    mode=f"{eager}/{place}/any_tensor",
                                    outcome=problem or ("differs on another rank"
                                                        if differs else "exact")))
                del tensor, out
        del data, expected
        torch.cuda.empty_cache()

    collectives.check()
    if rank == 0:
        print()
        print(f"{'bucket':>6} {'candidate':<22} {'elements':>10} {'mode':<30} outcome")
        for r in results:
            print(f"{r['bucket']!s:>6} {r['profile']:<22} {r['elements']:>10} "
                  f"{r['mode']:<30} {r['outcome']}")
        ran = [r for r in results if not r["outcome"].startswith("not run")]
        skipped = len(results) - len(ran)
        print(f"\n{len(ran)} checks, {failures} not exact, {skipped} candidates not run "
              f"(dropped on this machine); {time.monotonic() - started:.0f} s")
        if args.json_out:
            with open(args.json_out, "w") as handle:
                json.dump(dict(package=args.package, ladder=choice["ladder"], world=world,
                               torch=torch.__version__, results=results,
                               failures=failures), handle, indent=1)
    collectives.close()
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
