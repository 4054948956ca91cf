"""The checks of gpu_rows.py (which see), imported only under torchrun: this module needs torch
and GPUs."""

from gpu_common import first_difference, init, random_bf16

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import prepare  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def rank_input(rows, width, dtype, seed, rank, device):
    """Rank `rank`'s message of `rows` x `width`: qualification-like bf16 values (zeros of
    both signs, subnormals, near-overflow, infinities, NaN), widened with extra fp32 bits."""
    values = random_bf16(rows * width, seed * 8 + rank, device)
    if dtype == torch.float32:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed * 8 + rank + 1)
        jitter = 1 + torch.rand(rows * width, generator=generator, device=device) * 2 ** -9
        values = values.float() * jitter
    return values.view(rows, width)


def reference_sum(inputs):
    """Every rank's input summed in fp32 in rank order from rank 0, rounded once."""
    accumulator = inputs[0].float()
    for other in inputs[1:]:
        accumulator = accumulator + other.float()
    return accumulator.to(inputs[0].dtype)


def same(got, expected):
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.numel() == 0:
        return None
    bits = torch.int16 if got.dtype == torch.bfloat16 else torch.int32
    if got.dtype == torch.float32:
        equal = (got.view(bits) == expected.view(bits)) | (torch.isnan(got) & torch.isnan(expected))
        if bool(equal.all()):
            return None
        return f"first difference at {int((~equal).flatten().nonzero()[0])}"
    where = first_difference(got.flatten(), expected.flatten())
    return None if where is None else f"first difference at {where}"


def same_everywhere(problem, device):
    """The worst rank's verdict: None when every rank's output matched."""
    flag = torch.tensor([0 if problem is None else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return problem if problem is not None else (None if flag.item() == 0 else "another rank")


def run(packages, cache_dir, expect, failures):
    rank, world, device = init()
    with prepare.Collectives(packages, cache_dir=cache_dir) as collectives:
        served = {(collective, dtype) for collective, dtype in collectives.served}
        dtypes = [dtype for dtype in DTYPES.values()
                  if ("reduce_scatter", dtype) in served and ("all_gather", dtype) in served]
        expect("a package serves both row collectives in some dtype", bool(dtypes),
               str(collectives))
        for dtype in dtypes:
            check_dtype(collectives, dtype, rank, world, device, expect)
        collectives.check()
    flag = torch.tensor([len(failures)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("every check passed" if flag.item() == 0 else f"{flag.item()} checks failed",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if flag.item() else 0


def check_dtype(collectives, dtype, rank, world, device, expect):
    name = str(dtype).replace("torch.", "")
    shapes = [(rows, width) for rows in (0, 1, world - 1, world + 1, 2 * world, 2047, 2048)
              for width in (1, 7, 4096)]
    shapes += [(64 * world, 7168), (4096 * world, 1024)]
    seed = 1
    for rows, width in shapes:
        seed += 1
        inputs = [rank_input(rows, width, dtype, seed, q, device) for q in range(world)]
        mine = inputs[rank]
        owned = prepare.owned_rows(rows, world, rank)
        expected_rs = reference_sum(inputs)[owned.start:owned.stop]
        whole = inputs[0]
        what = f"{name} {rows} x {width}"

        kept = mine.clone()
        got = collectives.reduce_scatter(mine)
        problem = same(got, expected_rs) or (None if torch.equal(mine.view(torch.uint8),
                                                               kept.view(torch.uint8))
                                             else "the input changed")
        expect(f"reduce_scatter {what} out of place", same_everywhere(problem, device) is None,
               problem or "")
        if rows % world == 0:
            torch_rs = torch.empty_like(expected_rs)
            dist.reduce_scatter_tensor(torch_rs, mine)
            if world == 2:
                problem = same(got, torch_rs)
                expect(f"reduce_scatter {what} equals reduce_scatter_tensor at two ranks",
                       same_everywhere(problem, device) is None, problem or "")

        # In place: the output is this rank's rows of the input.
        buffer = mine.clone()
        result = collectives.reduce_scatter(buffer, out=buffer[owned.start:owned.stop])
        problem = same(result, expected_rs) or (
            None if result.data_ptr() == buffer[owned.start:owned.stop].data_ptr()
            or result.numel() == 0 else "not written in place")
        expect(f"reduce_scatter {what} in place", same_everywhere(problem, device) is None,
               problem or "")

        # The all-gather of rank 0's message cut by the rule: every rank ends with it.
        own = whole[owned.start:owned.stop].clone()
        gathered = collectives.all_gather(own, rows=rows)
        problem = same(gathered, whole)
        expect(f"all_gather {what} out of place", same_everywhere(problem, device) is None,
               problem or "")
        if rows % world == 0:
            torch_ag = torch.empty_like(whole)
            dist.all_gather_into_tensor(torch_ag, own)
            problem = same(gathered, torch_ag)
            expect(f"all_gather {what} equals all_gather_into_tensor",
                   same_everywhere(problem, device) is None, problem or "")
        out = torch.full_like(whole, float("nan"))
        out[owned.start:owned.stop] = own
        result = collectives.all_gather(out[owned.start:owned.stop], out=out)
        problem = same(result, whole) or (None if result is out else "not the given out")
        expect(f"all_gather {what} in place", same_everywhere(problem, device) is None,
               problem or "")

        # The identity: the all-gather of the reduce-scatter is the all-reduce.
        if rows:
            identity = collectives.all_gather(collectives.reduce_scatter(mine), rows=rows)
            problem = same(identity, reference_sum(inputs))
            expect(f"all_gather(reduce_scatter) {what} is the reference all-reduce",
                   same_everywhere(problem, device) is None, problem or "")
    check_graph(collectives, dtype, rank, world, device, expect)
    check_compile(collectives, dtype, rank, world, device, expect)


def check_graph(collectives, dtype, rank, world, device, expect):
    """A reduce-scatter then an all-gather of uneven rows, captured once and replayed on new
    data copied into the captured inputs."""
    name = str(dtype).replace("torch.", "")
    rows, width = 3 * world + 1, 1000
    owned = prepare.owned_rows(rows, world, rank)
    message = torch.empty(rows, width, dtype=dtype, device=device)
    reduced = torch.empty(len(owned), width, dtype=dtype, device=device)
    gathered = torch.empty(rows, width, dtype=dtype, device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        collectives.reduce_scatter(message, out=reduced)
        collectives.all_gather(reduced, out=gathered)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        collectives.reduce_scatter(message, out=reduced)
        collectives.all_gather(reduced, out=gathered)
    problems = []
    for replay in range(6):
        inputs = [rank_input(rows, width, dtype, 500 + replay, q, device) for q in range(world)]
        message.copy_(inputs[rank])
        graph.replay()
        torch.cuda.synchronize()
        expected = reference_sum(inputs)
        problem = same(reduced, expected[owned.start:owned.stop]) or same(gathered, expected)
        if problem:
            problems.append(f"replay {replay}: {problem}")
    problem = same_everywhere("; ".join(problems) or None, device)
    expect(f"{name} reduce_scatter then all_gather in a CUDA graph, 6 replays", problem is None,
           problem or "")
    del graph


def check_compile(collectives, dtype, rank, world, device, expect):
    """The custom ops under torch.compile (full graph, and CUDA graphs) give the eager bits."""
    name = str(dtype).replace("torch.", "")
    rows, width = 2 * world + 1, 512
    inputs = [rank_input(rows, width, dtype, 900, q, device) for q in range(world)]

    def step(x):
        mine = collectives.reduce_scatter(x * 2)
        return collectives.all_gather(mine + 1, rows=rows)

    def step_out(x):
        out = torch.empty(rows, width, dtype=x.dtype, device=x.device)
        collectives.all_gather(collectives.reduce_scatter(x), out=out)
        return out * 3

    for label, function in (("rows=", step), ("out=", step_out)):
        eager = function(inputs[rank].clone())
        torch._dynamo.reset()
        compiled = torch.compile(function, fullgraph=True)
        got = compiled(inputs[rank].clone())
        torch.cuda.synchronize()
        problem = same_everywhere(same(got, eager), device)
        expect(f"{name} torch.compile(fullgraph=True) with {label} equals eager",
               problem is None, problem or "")
        overhead = torch.compile(function, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            got = overhead(inputs[rank].clone())
        torch.cuda.synchronize()
        problem = same_everywhere(same(got, eager), device)
        expect(f"{name} torch.compile(mode='reduce-overhead') with {label} equals eager",
               problem is None, problem or "")
    expect("the ops are registered", hasattr(torch.ops.prepare, "reduce_scatter")
           and hasattr(torch.ops.prepare, "all_gather"))
