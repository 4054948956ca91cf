"""The Python API on GPUs: bad use raises clear exceptions before reaching the library,
`torch.compile` traces the custom op (full graph) and gives the eager bits, and the handle's
lifetime rules hold (context manager, idempotent close, use after close raises).

    torchrun --nproc-per-node 2 tests/python/gpu_api.py PACKAGE_DIR

Prints one line per check; exits non-zero when any fails.
"""

import argparse
import sys

from gpu_common import first_difference, init, random_bf16

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import prepare  # noqa: E402

failures = []


def expect_raises(what, error_type, needle, action):
    try:
        action()
    except error_type as error:
        if needle not in str(error):
            failures.append(f"{what}: message {str(error)!r} lacks {needle!r}")
            print(f"FAIL {what}: {error}", flush=True)
        else:
            print(f"ok   {what}: {type(error).__name__}: {error}", flush=True)
        return
    except Exception as error:  # the wrong kind
        failures.append(f"{what}: raised {type(error).__name__}: {error}")
        print(f"FAIL {what}: {type(error).__name__}: {error}", flush=True)
        return
    failures.append(f"{what}: nothing raised")
    print(f"FAIL {what}: nothing raised", flush=True)


def expect(what, condition, detail=""):
    print(f"{'ok  ' if condition else 'FAIL'} {what}{': ' + detail if detail else ''}",
          flush=True)
    if not condition:
        failures.append(what)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    rank, world, device = init()

    with prepare.Collectives(args.package, cache_dir=args.cache_dir) as collectives:
        elements = 3 * 7168 + 5
        tensor = random_bf16(elements, 17 + rank, device)
        for name, action, needle in [
            ("a CPU tensor", lambda: collectives.all_reduce(tensor.cpu()), "is on cpu"),
            ("a non-contiguous tensor",
             lambda: collectives.all_reduce(tensor[: 2 * 1000].view(1000, 2).t()),
             "not contiguous"),
            ("a dtype no package holds",
             lambda: collectives.all_reduce(tensor.to(torch.float16)), "no package holds"),
            ("an integer dtype",
             lambda: collectives.all_reduce(tensor.view(torch.int16)), "no package holds"),
            ("out of another shape",
             lambda: collectives.all_reduce(tensor, out=torch.empty_like(tensor)[:-1]),
             "must match"),
            ("out of another dtype",
             lambda: collectives.all_reduce(tensor, out=torch.empty_like(tensor).float()),
             "must match"),
            ("a region larger than the zero-copy region",
             lambda: collectives.empty(collectives.zero_copy_bytes() // 2 + 1),
             "do not fit"),
            ("forcing a profile the bucket lacks",
             lambda: collectives.force(0, "no_such_profile"), "not a candidate"),
            ("a route for fp32", lambda: collectives.route(64, torch.float32),
             "no package holds"),
        ]:
            expect_raises(name, prepare.InvalidArgument, needle, action)
        if torch.cuda.device_count() > 1:
            other = torch.device("cuda", (device.index + 1) % torch.cuda.device_count())
            expect_raises("a tensor on another GPU", prepare.InvalidArgument, "drives",
                          lambda: collectives.all_reduce(tensor.to(other)))

        expect("choice is a dict per dtype",
               list(collectives.choice()) == [torch.bfloat16]
               and "buckets" in collectives.choice()[torch.bfloat16])
        expect("route names a bucket or NCCL", "bucket" in collectives.route(elements * 2)
               and collectives.route(1 << 30).startswith("nccl"),
               collectives.route(elements * 2))

        # torch.compile traces the custom op in one graph and gives the eager bits.
        def step(x):
            y = x * 2
            collectives.all_reduce(y)
            return y + 1

        eager = step(tensor.clone())
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True)
        got = compiled(tensor.clone())
        torch.cuda.synchronize()
        where = first_difference(got, eager)
        expect("torch.compile(fullgraph=True) equals eager", where is None,
               f"first difference at {where}")
        reduce_overhead = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            got = reduce_overhead(tensor.clone())
        torch.cuda.synchronize()
        where = first_difference(got, eager)
        expect("torch.compile(mode='reduce-overhead') (CUDA graphs) equals eager",
               where is None, f"first difference at {where}")
        expect("the op is registered", hasattr(torch.ops.prepare, "all_reduce"))

        view = collectives.empty((4, 7168))
        expect(".empty gives a bf16 CUDA view", view.dtype == torch.bfloat16
               and view.device == device and view.shape == (4, 7168))
        collectives.check()

    expect("the context manager closed it", collectives.closed)
    collectives.close()
    expect("close is idempotent", collectives.closed)
    expect_raises("use after close", prepare.InvalidArgument, "closed",
                  lambda: collectives.all_reduce(tensor))
    # The zero-copy view keeps its memory after close: writing it must not crash.
    view.fill_(1.0)
    torch.cuda.synchronize()
    expect("a zero-copy view outlives close", float(view[0, 0]) == 1.0)
    del view

    flag = torch.tensor([len(failures)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("every check passed" if flag.item() == 0 else f"{flag.item()} checks failed",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if flag.item() else 0


if __name__ == "__main__":
    sys.exit(main())
