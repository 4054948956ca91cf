"""A tensor-parallel MLP decode step served with prepare, next to torch.distributed.

    torchrun --nproc-per-node 2 examples/torch_tp_mlp.py PACKAGE_DIR... [--cache-dir DIR]
    torchrun --nproc-per-node 2 examples/torch_tp_mlp.py PACKAGE_DIR... --sequence-parallel

Each rank holds a column-parallel slice of the up projection and a row-parallel slice of the
down projection (hidden 7168, intermediate 18432 split over the ranks, bf16). One decode step:
h = silu(x @ W_up), y = h @ W_down (a partial sum), then the all-reduce of y. The step is
captured in CUDA graphs at batch 1, 2, 4, 8, 16, 32 and 64, twice: with prepare (y is written
by `torch.matmul(..., out=y)` straight into the zero-copy region from `Collectives.empty`, then
`Collectives.all_reduce(y)` in place) and with `torch.distributed.all_reduce(y)`. Graph
replays of both are timed interleaved (each sample a replay of several steps after a barrier,
the slowest rank's time per round, the median over rounds). prepare's output is checked bit
for bit against the reference (all-gather the partial sums, add in fp32 in rank order, round
once to bf16). Prints one line per batch and exits non-zero on any difference.

`--sequence-parallel` serves the step's end as vLLM's sequence parallelism rewrites
all-reduce then RMSNorm: y is reduce-scattered (each rank gets its own rows of the sum, the
first `batch % world` ranks one row more, `prepare.owned_rows`), RMSNorm normalizes only those
rows, and the all-gather puts every rank's normalized rows together. Its output is checked bit
for bit against the all-reduce then RMSNorm (the reference sum, which prepare's exact
all-reduce gives, then the same RMSNorm of every row), at every batch, uneven ones and ranks
owning no row included; it is timed beside prepare's all-reduce then RMSNorm (when a package
serves the bf16 all-reduce) and torch.distributed's. The packages must then hold the bf16
reduce-scatter and all-gather. The RMSNorm here is batch-invariant: each row's sum of squares
is a fixed tree of element-wise fp32 additions, so a row's bits do not depend on how many rows
are normalized together (PyTorch's own reductions choose their order by the tensor's shape).
"""

import argparse
import datetime
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the arguments are parsed without torch; running needs it
    torch = dist = None

import prepare  # noqa: E402

HIDDEN = 7168
INTERMEDIATE = 18432
BATCHES = (1, 2, 4, 8, 16, 32, 64)
STEPS_PER_REPLAY = 10
ROUNDS = 60
EPS = 1e-6


def reference_sum(partial):
    """The partial sums of every rank added in fp32 in rank order, rounded once to bf16."""
    gathered = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, partial)
    accumulator = gathered[0].float()
    for other in gathered[1:]:
        accumulator = accumulator + other.float()
    return accumulator.to(torch.bfloat16)


def same_bits(got, expected):
    return bool(((got.view(torch.int16) == expected.view(torch.int16))
                 | (torch.isnan(got) & torch.isnan(expected))).all())


def rms_norm(x, weight):
    """RMSNorm of every row of `x` in fp32, rounded once to bf16: x * rsqrt(mean(x^2) + eps) *
    weight. The sum of squares halves the row with element-wise additions down to its odd
    factor, then adds those terms in order: the same operations on every row whatever the
    number of rows, so normalizing some rows gives the bits of normalizing all of them."""
    squares = x.float() * x.float()
    while squares.shape[-1] % 2 == 0:
        half = squares.shape[-1] // 2
        squares = squares[..., :half] + squares[..., half:]
    total = squares[..., :1]
    for index in range(1, squares.shape[-1]):
        total = total + squares[..., index:index + 1]
    scale = torch.rsqrt(total / x.shape[-1] + EPS)
    return (x.float() * scale * weight.float()).to(torch.bfloat16)


def capture(step, stream):
    """A graph of STEPS_PER_REPLAY decode steps, after warm-up on the capture stream."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(STEPS_PER_REPLAY):
            step()
    torch.cuda.synchronize()
    return graph


def time_replay(graph, barrier):
    """Microseconds per step of one replay, the slowest rank's."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    dist.all_reduce(barrier)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    slowest = torch.tensor([start.elapsed_time(end) * 1e3 / STEPS_PER_REPLAY],
                           device=barrier.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", metavar="PACKAGE_DIR",
                        help="packages to serve: the bf16 all-reduce, and with "
                        "--sequence-parallel the bf16 reduce-scatter and all-gather")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="reduce-scatter, RMSNorm on the owned rows, all-gather, checked "
                        "against all-reduce then RMSNorm")
    return parser.parse_args(argv)


def main():
    args = parse_args()
    if torch is None:
        raise SystemExit("this example needs PyTorch with CUDA")

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if INTERMEDIATE % world:
        raise SystemExit(f"the intermediate size {INTERMEDIATE} does not split over {world}")

    collectives = prepare.Collectives(args.packages, cache_dir=args.cache_dir)
    generator = torch.Generator(device=device)
    generator.manual_seed(1234 + rank)
    shard = INTERMEDIATE // world
    w_up = (torch.randn(HIDDEN, shard, generator=generator, device=device)
            / HIDDEN ** 0.5).to(torch.bfloat16)
    w_down = (torch.randn(shard, HIDDEN, generator=generator, device=device)
              / INTERMEDIATE ** 0.5).to(torch.bfloat16)
    stream = torch.cuda.Stream()
    barrier = torch.zeros(1, device=device)
    if args.sequence_parallel:
        failures = sequence_parallel(collectives, w_up, w_down, stream, barrier)
        collectives.close()
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0 and failures:
            print(f"{failures} batches differ from all-reduce then RMSNorm", flush=True)
        return 1 if failures else 0
    if rank == 0:
        print(f"{collectives}; hidden {HIDDEN}, intermediate {INTERMEDIATE} over {world} "
              f"ranks; {STEPS_PER_REPLAY} steps per replay, {ROUNDS} rounds", flush=True)
        print(f"{'batch':>5} {'prepare us':>11} {'torch us':>9} {'speedup':>8}  "
              f"{'prepare route':<34} result", flush=True)

    failures = 0
    for batch in BATCHES:
        # Every rank draws the same activations: the step's input is replicated in TP.
        torch.manual_seed(batch)
        x = torch.randn(batch, HIDDEN, device=device).to(torch.bfloat16)
        h = torch.empty(batch, shard, dtype=torch.bfloat16, device=device)
        y_prepare = collectives.empty((batch, HIDDEN), torch.bfloat16)
        y_torch = torch.empty(batch, HIDDEN, dtype=torch.bfloat16, device=device)

        def step_prepare():
            torch.matmul(x, w_up, out=h)
            torch.nn.functional.silu(h, inplace=True)
            torch.matmul(h, w_down, out=y_prepare)
            collectives.all_reduce(y_prepare)

        def step_torch():
            torch.matmul(x, w_up, out=h)
            torch.nn.functional.silu(h, inplace=True)
            torch.matmul(h, w_down, out=y_torch)
            dist.all_reduce(y_torch)

        graphs = {"prepare": capture(step_prepare, stream), "torch": capture(step_torch, stream)}

        # Exactness of the captured step: the partial sum as the same kernels write it,
        # then one replay, against the reference sum of the partials.
        torch.matmul(x, w_up, out=h)
        torch.nn.functional.silu(h, inplace=True)
        torch.matmul(h, w_down, out=y_prepare)
        partial = y_prepare.clone()
        expected = reference_sum(partial)
        graphs["prepare"].replay()
        torch.cuda.synchronize()
        collectives.check()
        exact = same_bits(y_prepare, expected)
        flag = torch.tensor([0 if exact else 1], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        exact = flag.item() == 0
        failures += not exact

        times = {"prepare": [], "torch": []}
        for _ in range(3):
            for name in times:
                time_replay(graphs[name], barrier)
        for round_index in range(ROUNDS):
            order = ("prepare", "torch") if round_index % 2 == 0 else ("torch", "prepare")
            for name in order:
                times[name].append(time_replay(graphs[name], barrier))
        medians = {name: statistics.median(values) for name, values in times.items()}
        if rank == 0:
            route = collectives.route(batch * HIDDEN * 2)
            print(f"{batch:>5} {medians['prepare']:>11.2f} {medians['torch']:>9.2f} "
                  f"{medians['torch'] / medians['prepare']:>7.2f}x  {route:<34} "
                  f"{'exact' if exact else 'DIFFERS from the reference'}", flush=True)
        del graphs, y_prepare
        torch.cuda.synchronize()

    collectives.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and failures:
        print(f"{failures} batches differ from the reference", flush=True)
    return 1 if failures else 0


def sequence_parallel(collectives, w_up, w_down, stream, barrier):
    """The step ending in reduce-scatter, RMSNorm on the owned rows, all-gather, per batch:
    checked against all-reduce then RMSNorm and timed beside it. Returns the batches that
    differ."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = w_up.device
    torch.manual_seed(4321)
    weight = (1 + torch.randn(HIDDEN, device=device) / 8).to(torch.bfloat16)
    prepare_all_reduce = torch.bfloat16 in collectives.dtypes
    shard = w_up.shape[1]
    if rank == 0:
        print(f"{collectives}; sequence parallel: reduce-scatter, RMSNorm on the owned rows, "
              f"all-gather; hidden {HIDDEN}, {STEPS_PER_REPLAY} steps per replay, {ROUNDS} "
              "rounds", flush=True)
        print(f"{'batch':>5} {'owned':>5} {'sp us':>8} {'prepare ar us':>14} "
              f"{'torch ar us':>12}  result", flush=True)
    failures = 0
    for batch in BATCHES:
        torch.manual_seed(batch)
        x = torch.randn(batch, HIDDEN, device=device).to(torch.bfloat16)
        h = torch.empty(batch, shard, dtype=torch.bfloat16, device=device)
        owned = prepare.owned_rows(batch, world, rank)
        # The partial sum written straight into the reduce-scatter's zero-copy region.
        y = collectives.empty((batch, HIDDEN), torch.bfloat16, collective="reduce_scatter")
        mine = torch.empty(len(owned), HIDDEN, dtype=torch.bfloat16, device=device)
        z_sp = torch.empty(batch, HIDDEN, dtype=torch.bfloat16, device=device)
        y_ar = torch.empty(batch, HIDDEN, dtype=torch.bfloat16, device=device)
        z_ar = torch.empty(batch, HIDDEN, dtype=torch.bfloat16, device=device)

        def partial(out):
            torch.matmul(x, w_up, out=h)
            torch.nn.functional.silu(h, inplace=True)
            torch.matmul(h, w_down, out=out)

        def step_sp():
            partial(y)
            collectives.reduce_scatter(y, out=mine)
            collectives.all_gather(rms_norm(mine, weight), out=z_sp)

        def step_prepare_ar():
            partial(y_ar)
            collectives.all_reduce(y_ar)
            z_ar.copy_(rms_norm(y_ar, weight))

        def step_torch_ar():
            partial(y_ar)
            dist.all_reduce(y_ar)
            z_ar.copy_(rms_norm(y_ar, weight))

        steps = {"sp": step_sp, "torch ar": step_torch_ar}
        if prepare_all_reduce:
            steps["prepare ar"] = step_prepare_ar
        graphs = {name: capture(step, stream) for name, step in steps.items()}

        # Exactness: one replay of the captured step against all-reduce then RMSNorm of the
        # same partial sums (the reference sum, prepare's all-reduce's bits).
        partial(y)
        expected = rms_norm(reference_sum(y.clone()), weight)
        graphs["sp"].replay()
        torch.cuda.synchronize()
        collectives.check()
        exact = same_bits(z_sp, expected)
        if prepare_all_reduce:
            graphs["prepare ar"].replay()
            torch.cuda.synchronize()
            exact = exact and same_bits(z_ar, expected)
        flag = torch.tensor([0 if exact else 1], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        exact = flag.item() == 0
        failures += not exact

        times = {name: [] for name in graphs}
        for _ in range(3):
            for name in times:
                time_replay(graphs[name], barrier)
        names = list(times)
        for round_index in range(ROUNDS):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(time_replay(graphs[name], barrier))
        medians = {name: statistics.median(values) for name, values in times.items()}
        if rank == 0:
            prepare_ar = (f"{medians['prepare ar']:>14.2f}" if prepare_all_reduce
                          else f"{'-':>14}")
            print(f"{batch:>5} {len(owned):>5} {medians['sp']:>8.2f} {prepare_ar} "
                  f"{medians['torch ar']:>12.2f}  "
                  f"{'exact' if exact else 'DIFFERS from all-reduce then RMSNorm'}",
                  flush=True)
        del graphs
        torch.cuda.synchronize()
    return failures


if __name__ == "__main__":
    sys.exit(main())
